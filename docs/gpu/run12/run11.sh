#!/usr/bin/env bash
# Device call 1 of session 6: from a snapshot of main (helpers' edits in progress stay out):
# the new gpu format tests, the learner bench in bf16, then the whole gpu suite with the time left.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); BUDGET=${BUDGET_S:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
# bwrap from .device/run10/bin (the image has none); ninja where the sandboxed build can see it
install -m 755 .device/run10/bin/ninja /usr/local/bin/ninja 2>/dev/null; export PATH=$PATH:$PWD/.device/run10/bin
REPO=$PWD; S=/tmp/snap; rm -rf $S; mkdir -p $S; tar -xzf .device/run11/snap.tar.gz -C $S
cp -r .whl $S/ 2>/dev/null; cd $S
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/krl-cache
phases=${*:-env formats learner suite}
has() { [[ " $phases " == *" $1 "* ]]; }
if has env; then
  { nvidia-smi; nvcc --version | tail -2; python3 -c "import torch,sys;print(sys.version);print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; nproc; free -g | head -2; which bwrap unshare; } > "$OUT/env.txt" 2>&1
  log "env done"
fi
if has formats; then
  log "gpu formats tests"
  timeout $(( $(left) > 260 ? ${FORMATS_S:-240} : $(left) - 20 )) python3 -m pytest -m gpu tests/sandbox/test_gpu_formats.py -v -rA -s -p no:cacheprovider --durations=10 > "$OUT/c1_formats.log" 2>&1
  log "formats rc=$? $(tail -1 "$OUT/c1_formats.log")"
fi
if has learner; then
  log "learner bench bf16"
  ( set -o pipefail
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/learner-gpu/*.whl &&
    PYTHONPATH=/tmp/site timeout $(( $(left) > 200 ? ${LEARNER_S:-180} : $(left) - 20 )) python3 -m learner.bench \
      --set learner.dtype=bf16 --set learner.zero_stage=1 --set learner.logit_chunk=512 \
      --set learner.token_budget=16384 model=random-0.5b batch=8 seq=2048 steps=5 publishes=3 transport=fs \
      --out "$OUT/c1_learner.json" ) > "$OUT/c1_learner.log" 2>&1
  log "learner rc=$? $(cat "$OUT/c1_learner.json" 2>/dev/null)"
fi
if has suite; then
  log "gpu suite (tests/sandbox), $(left) s left"
  timeout $(( $(left) - 10 )) python3 -m pytest -m gpu tests/sandbox -q -rA -p no:cacheprovider --durations=15 > "$OUT/c1_suite.log" 2>&1
  log "suite rc=$? $(tail -1 "$OUT/c1_suite.log")"
fi
log "done"
