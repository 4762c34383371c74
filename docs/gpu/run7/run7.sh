#!/bin/bash
# session 7 device phases (issue 11): results under $OUT
export PATH=$PWD/.device/issue11/bin:$PATH PYTHONUNBUFFERED=1
set -o pipefail
UNREACHED="static_call_counter_runs_unchecked or torch_compute_runtime or disable_current_modes_then_torch or work_in_stage_phase or (cuda_redteam and illegal_address) or hang_in_kernel or numpy_via_tensor or fork_in_forward or read_host_secrets or honest-after"
pt() {  # name timeout args...
  local name=$1 lim=$2; shift 2; local t0=$(date +%s)
  echo "+ timeout $lim python3 -m pytest $*" > $OUT/$name.log
  timeout $lim python3 -m pytest "$@" 2>&1 | tee -a $OUT/$name.log
  echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/$name.log
}
mkdir -p $OUT
for phase in "$@"; do
  case $phase in
  env) { date -u; nvidia-smi; nvcc --version | tail -2; bwrap --version; python3 -c "import torch,sys;print(sys.version, torch.__version__, torch.version.cuda)"; nproc; free -g; } > $OUT/env.txt 2>&1 ;;
  cli) pt cli_alone ${CLI_S:-170} -m gpu tests/sandbox/test_cuda_build.py::test_cli_on_shipped_cuda_example -x -vv --tb=long -l -rA --durations=10 -p no:cacheprovider ;;
  rest) pt unreached ${REST_S:-230} -m gpu tests/sandbox -v --tb=long -rA --durations=25 -p no:cacheprovider -k "$UNREACHED" ;;
  build) pt cuda_build_file ${BUILD_S:-170} -m gpu tests/sandbox/test_cuda_build.py -v --tb=long -l -rA --durations=10 -p no:cacheprovider ;;
  prefix) pt prefix ${PREFIX_S:-240} -m gpu tests/sandbox/test_binpolicy.py tests/sandbox/test_cuda_build.py -vv --tb=long -l -rA --durations=20 -p no:cacheprovider ;;
  hangcli) pt hang_then_cli ${HC_S:-150} -m gpu tests/sandbox/test_cuda_build.py -vv --tb=long -l -rA --durations=20 -p no:cacheprovider -k "hang-deadline or cli_on" ;;
  direct) timeout ${DIRECT_S:-120} python3 .device/issue11/cli_direct.py $OUT ${DTAG:-quiet} 2>&1 | tee $OUT/cli_direct_${DTAG:-quiet}.log ;;
  repeat) t0=$(date +%s); for i in $(seq 1 ${REPS:-10}); do [ $(( $(date +%s) - t0 )) -gt ${REP_S:-420} ] && break; timeout 120 python3 .device/issue11/cli_direct.py $OUT rep$i 2>&1 | tee -a $OUT/cli_repeat.log; done; echo "wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/cli_repeat.log ;;
  smi) nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm --format=csv -lms 500 > $OUT/smi_gpu.csv 2>&1 & echo $! >> /tmp/smi.pids
       nvidia-smi --query-compute-apps=timestamp,pid,used_memory --format=csv -lms 500 > $OUT/smi_apps.csv 2>&1 & echo $! >> /tmp/smi.pids ;;
  smistop) kill $(cat /tmp/smi.pids) 2>/dev/null; rm -f /tmp/smi.pids ;;
  suite) pt suite ${SUITE_S:-560} -m gpu tests/sandbox -v --tb=long -rA --durations=25 -p no:cacheprovider ;;
  esac
done
# headtree: the same phases on a copy of the tree with the files others are editing restored to HEAD
if [ -n "$HEAD_PHASES" ]; then
  rm -rf /tmp/headtree && mkdir /tmp/headtree && cp -a . /tmp/headtree/ && cp -a .device/issue11/head/. /tmp/headtree/
  rm -f /tmp/headtree/cluster/json_stdout.py /tmp/headtree/tests/cluster/test_json_stdout.py
  ( cd /tmp/headtree && for phase in $HEAD_PHASES; do HEAD_PHASES= OUT=$OUT/head bash .device/issue11/run7.sh $phase; done )
fi
