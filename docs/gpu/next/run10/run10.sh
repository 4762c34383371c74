#!/bin/bash
# session 10 device phases (issue 12: several evaluation jobs per GPU, timing exclusive): results under $OUT
#   OUT=$OUT bash .device/run10/run10.sh profile        (carry .device/run10)
# budgets (s): PROF_S (whole profile phase, default 500) >= WARM_S (cold pass, 170) + RUN_S per run (80, x2)
#   + PREWARM_S (12, x2) + RECHECK_S (baselines re-measured under load, 40) + jobs in flight; GATE_S (the CPU gate tests on the device's cores, 240)
export PATH=$PWD/.device/run10/bin:$PATH PYTHONUNBUFFERED=1
set -o pipefail
: "${OUT:?set OUT}"
mkdir -p $OUT
PY=${PY:-python3}
for phase in "$@"; do
  t0=$(date +%s)
  case $phase in
  env) { date -u; nvidia-smi; nvcc --version | tail -2; bwrap --version; ninja --version
         $PY -c "import torch,sys;print(sys.version, torch.__version__, torch.version.cuda)"; nproc; free -g; } > $OUT/env.txt 2>&1 ;;
  profile) timeout ${PROF_S:-500} $PY .device/run10/profile.py $OUT ${PROF_EX:-cuda_1_square_matmul,cuda_40_LayerNorm,cuda_12_Gemm_Multiply_LeakyReLU,cuda_88_MinGPTNewGelu} 2>&1 | tail -c 200000 > $OUT/run10_profile.log
       echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/run10_profile.log
       tail -c 6000 $OUT/run10_profile.log ;;
  gate) timeout ${GATE_S:-240} $PY -m pytest tests/sandbox/test_concurrent_eval.py -v --tb=short -rA -s -p no:cacheprovider 2>&1 | tail -c 60000 > $OUT/gate_tests.log
       echo "rc=$? wall=$(( $(date +%s) - t0 ))s" | tee -a $OUT/gate_tests.log ;;
  esac
done
