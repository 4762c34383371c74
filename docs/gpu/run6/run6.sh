#!/bin/bash
# session 6 device phases: env, tests, fidelity (results under $OUT)
export PATH=$PWD/.gpu/bin:$PATH PYTHONUNBUFFERED=1
set -o pipefail
for phase in "$@"; do
  case $phase in
  env)
    { date -u; nvidia-smi; nvcc --version | tail -2; bwrap --version; python3 -c "import torch,sys;print(sys.version, torch.__version__, torch.version.cuda)";
      python3 -c "import xdist;print('xdist', xdist.__version__)"; df -h /dev/shm /tmp; nproc; free -g; } > $OUT/env.txt 2>&1 ;;
  tests)
    t0=$(date +%s)
    timeout ${TESTS_S:-560} python3 -m pytest -m gpu tests/sandbox ${XDIST:--n 4} -v -rA --durations=25 -p no:cacheprovider ${PYTEST_K:+-k "$PYTEST_K"} 2>&1 | tee $OUT/${TESTLOG:-pytest.log}
    echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/${TESTLOG:-pytest.log} ;;
  fidelity)
    t0=$(date +%s)
    timeout ${FID_S:-560} python3 -m sandbox_workers.fidelity --examples ${FID_EX:-cuda_94_MSELoss,cuda_1_square_matmul,cuda_12_Gemm_Multiply_LeakyReLU,cuda_40_LayerNorm,cuda_88_MinGPTNewGelu,cuda_76_Gemm_Add_ReLU} --trials 100 --out $OUT/${FIDOUT:-fidelity.jsonl} 2> >(tee $OUT/${FIDLOG:-fidelity.log} >&2)
    echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/${FIDLOG:-fidelity.log} ;;
  probe)
    t0=$(date +%s)
    timeout ${PROBE_S:-200} python3 .gpu/probe6.py $OUT/${PROBEOUT:-probe.jsonl} ${PROBE_CASES:-event_class_replaced,side_stream_python,elapsed_time_scaled,honest} ${PROBE_REPS:-2} 2>&1 | tee $OUT/${PROBELOG:-probe.log}
    echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/${PROBELOG:-probe.log} ;;
  big)
    t0=$(date +%s)
    timeout ${BIG_S:-150} python3 .gpu/probe_big.py $OUT/probe_big.jsonl ${BIG_DIMS:-4096} 2>&1 | tee $OUT/probe_big.log
    echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/probe_big.log ;;
  esac
done
