#!/bin/bash
# session 8 device phases (issue 11: the output snapshot and the in-session probe): results under $OUT
export PATH=$PWD/.device/run9/bin:$PATH PYTHONUNBUFFERED=1
set -o pipefail
pt() {  # name timeout args...
  local name=$1 lim=$2; shift 2; local t0=$(date +%s)
  echo "+ timeout $lim python3 -m pytest $*" > $OUT/$name.log
  timeout $lim python3 -m pytest "$@" 2>&1 | tee -a $OUT/$name.log
  echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/$name.log
}
mkdir -p $OUT
for phase in "$@"; do
  t0=$(date +%s)
  case $phase in
  env) { date -u; nvidia-smi; nvcc --version | tail -2; bwrap --version; python3 -c "import torch,sys;print(sys.version, torch.__version__, torch.version.cuda)"; nproc; free -g; } > $OUT/env.txt 2>&1 ;;
  gpucuda) pt gpucuda ${GC_S:-150} -m gpu tests/sandbox/test_gpu_cuda.py -v --tb=short -rA -p no:cacheprovider ;;
  suite) pt suite ${SUITE_S:-400} -m gpu tests/sandbox -v --tb=long -rA --durations=25 -p no:cacheprovider ;;
  big) timeout ${BIG_S:-150} python3 .device/run9/probe_big.py $OUT/probe_big.jsonl ${BIG_DIMS:-4096} 2>&1 | tee $OUT/probe_big.log
       echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/probe_big.log ;;
  repeat) for i in $(seq 1 ${REPS:-5}); do [ $(( $(date +%s) - t0 )) -gt ${REP_S:-200} ] && break; timeout 120 python3 .device/run9/cli_direct.py $OUT rep$i 2>&1 | tee -a $OUT/cli_repeat.log; done
       echo "wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/cli_repeat.log ;;
  fidelity) timeout ${FID_S:-560} python3 -m sandbox_workers.fidelity --examples ${FID_EX:-cuda_94_MSELoss,cuda_1_square_matmul,cuda_12_Gemm_Multiply_LeakyReLU,cuda_40_LayerNorm,cuda_88_MinGPTNewGelu,cuda_76_Gemm_Add_ReLU} --trials 100 --out $OUT/${FIDOUT:-fidelity.jsonl} 2> >(tee $OUT/${FIDLOG:-fidelity.log} >&2)
       echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/${FIDLOG:-fidelity.log} ;;
  profile) timeout ${PROF_S:-420} python3 .device/run9/profile.py $OUT/${PROFOUT:-profile.jsonl} ${PROF_EX:-cuda_19_relu,cuda_1_square_matmul,cuda_40_LayerNorm,cuda_12_Gemm_Multiply_LeakyReLU} 2>&1 | tail -c 60000 > $OUT/${PROFLOG:-profile.log}
       echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/${PROFLOG:-profile.log} ;;
  esac
done
