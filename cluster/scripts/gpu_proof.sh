#!/usr/bin/env bash
# GPU proof of the reward oracle and the learner in one device session (docs/oracle-gpu.md,
# docs/learner-gpu.md). Run from the repo root on the GPU machine:
#   bash cluster/scripts/gpu_proof.sh [phase ...]   phases: env pytest bench learner cv evals tasks kbeval bus
#   (default: the first six). tasks: the built-in GPU-sized tasks through the execution filter on the GPU
#   (index.json with measured runtimes -> $OUT); kbeval: `kernelrl eval` of skills/examples over KernelBench
#   level 1 at $KB (a copy of ../shared/kernelbench carried to the device) -> $OUT/kbeval/; bus: the embedded
#   broker, a compile worker and `eval-worker --device 0` on the GPU, `stress sandbox --backend cuda` and
#   `eval --via bus` against them (needs $BUNDLE, default .gpukafka, from cluster/scripts/gpu_bundle.sh).
# Environment: OUT (results folder), BUDGET_S (seconds for the whole script), ONLY (examples for `evals`),
# CV_EXAMPLE / CV_REPEATS (for `cv`), PYTEST_K (a -k filter for `pytest`), TASK_WORKERS, KB, BUNDLE, BUS_DEVICE,
# STRESS_S, STRESS_RATE, STRESS_EXAMPLES (for `bus`). Results: $OUT/{env.txt,pytest.log,bench_compile.json,learner.json,
# learner.log,evals.jsonl,cv.jsonl,proof.log}.
set -u
OUT=${OUT:-$PWD/gpu-proof-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export KERNELRL_CACHE=${KERNELRL_CACHE:-/tmp/krl-cache}
PY=${PY:-python3}
T0=$(date +%s)
BUDGET=${BUDGET_S:-560}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/proof.log"; }
phases=${*:-env pytest bench learner cv evals}
cap() { local want=$1; local l; l=$(left); echo $(( l - 15 < want ? l - 15 : want )); }
has() { [[ " $phases " == *" $1 "* ]]; }

if has env; then
  log "env"
  { nvidia-smi; nvidia-smi -q -d CLOCK,PERFORMANCE | head -80; nvcc --version; g++ --version | head -1
    which unshare prlimit ninja make; id -u
    $PY -c "import torch, sys; print(sys.version); print('torch', torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"
    $PY -c "import pynvml, ninja; print('pynvml ok')"
    unshare -n true && echo "unshare -n ok"
  } > "$OUT/env.txt" 2>&1
fi

BENCH_PID=""
if has bench; then  # CPU-bound (nvcc, g++ of torch/extension.h): overlaps the GPU tests
  log "bench compile (background)"
  ( timeout 420 $PY -m cluster.cli bench compile cuda --json > "$OUT/bench_compile.json" 2>> "$OUT/proof.log" ) &
  BENCH_PID=$!
fi

if has pytest; then
  log "pytest -m gpu"
  t=$(( $(left) > 320 ? 300 : $(left) - 20 ))
  if command -v make > /dev/null; then
    timeout $t make test-gpu PYTEST_ARGS="-q --durations=25 -p no:cacheprovider ${PYTEST_K:+-k $PYTEST_K}" \
      > "$OUT/pytest.log" 2>&1
  else
    timeout $t $PY -m pytest -m gpu tests/sandbox -q --durations=25 -p no:cacheprovider > "$OUT/pytest.log" 2>&1
  fi
  log "pytest rc=$? $(tail -1 "$OUT/pytest.log")"
fi

if has learner; then
  log "learner bench"
  ( set -o pipefail
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/learner-gpu/*.whl &&
    PYTHONPATH=/tmp/site timeout $(( $(left) > 260 ? 240 : $(left) - 20 )) $PY -m learner.bench \
      --set learner.dtype=bf16 --set learner.zero_stage=1 --set learner.logit_chunk=512 \
      --set learner.token_budget=16384 model=random-0.5b batch=8 seq=2048 steps=5 transport=fs \
      --out "$OUT/learner.json" ) > "$OUT/learner.log" 2>&1
  log "learner rc=$? $(tail -c 600 "$OUT/learner.json" 2>/dev/null)"
fi

if has cv; then
  log "timing CV"
  timeout $(( $(left) - 5 )) $PY -m sandbox_workers.gpu_proof cv --out "$OUT" --example "${CV_EXAMPLE:-cuda_19_relu}" \
    --repeats "${CV_REPEATS:-5}" 2>> "$OUT/proof.log" | tee -a "$OUT/proof.log"
fi

if has evals; then
  log "sandbox evals"
  $PY -m sandbox_workers.gpu_proof evals --out "$OUT" --cache /tmp/krl-proof-cache --deadline-s $(( $(left) - 15 )) \
    ${ONLY:+--only "$ONLY"} 2>> "$OUT/proof.log" | tee -a "$OUT/proof.log"
fi

if has tasks; then
  log "tasks verify --backend cuda (built-in set)"
  timeout $(cap 330) $PY -m cluster.cli tasks verify --backend cuda --workers "${TASK_WORKERS:-3}" --write \
    > "$OUT/tasks_verify.txt" 2>&1
  log "tasks verify rc=$? $(tail -1 "$OUT/tasks_verify.txt")"
  cp cluster/tasks/builtin/index.json "$OUT/index.json"
fi

if has kbeval; then
  log "eval skills/examples over KernelBench level 1 (${KB:-.kb})"
  timeout $(cap 300) $PY -m cluster.cli eval --tasks "${KB:-.kb}" --level 1 --only-solved --shrink-inputs 67108864 \
    --solutions skills/examples --backend cuda --out "$OUT/kbeval" --json > "$OUT/kbeval.log" 2>&1
  log "kbeval rc=$? $(tail -c 400 "$OUT/kbeval.log")"
fi

if has bus; then
  log "bus: embedded Kafka, compile worker, eval-worker --device ${BUS_DEVICE:-0}"
  B=${BUNDLE:-.gpukafka}
  if [ -f "$B/kafka-jre.tar.xz" ]; then  # the GPU image has no Java and no kafka-python
    mkdir -p "$KERNELRL_CACHE" && tar -xJf "$B/kafka-jre.tar.xz" -C "$KERNELRL_CACHE"
    export PATH="$KERNELRL_CACHE/jre/bin:$PATH"
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/wheels/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  fi
  KRL="$PY -m cluster.cli"
  DEV=${BUS_DEVICE:-0}; BK=cuda; [ "$DEV" = cpu ] && BK=cpu  # BUS_DEVICE=cpu: a dry run of this phase anywhere
  if $KRL broker start --json > "$OUT/broker.json" 2>> "$OUT/proof.log"; then
    $KRL topics create >> "$OUT/proof.log" 2>&1
    $KRL -v compile-worker > "$OUT/compile_worker.log" 2>&1 & CW=$!
    $KRL -v eval-worker --device "$DEV" > "$OUT/eval_worker.log" 2>&1 & EW=$!
    timeout $(cap 200) $KRL stress sandbox --backend $BK --tasks "${KB:-.kb}/level1" --examples "${STRESS_EXAMPLES:-12_Gemm*}" \
      --duration "${STRESS_S:-40}" --rate "${STRESS_RATE:-1}" --eval-fraction 0.3 --timeout 180 --json > "$OUT/stress.json" 2>> "$OUT/proof.log"
    log "stress rc=$? $(cat "$OUT/stress.json")"
    timeout $(cap 300) $KRL eval --via bus --tasks "${KB:-.kb}" --level 1 --only-solved --shrink-inputs 67108864 \
      --solutions skills/examples --backend $BK --out "$OUT/kbeval_bus" --json > "$OUT/kbeval_bus.log" 2>&1
    log "eval --via bus rc=$? $(tail -c 600 "$OUT/kbeval_bus.log")"
    kill -TERM $CW $EW; wait $CW; c=$?; wait $EW; log "SIGTERM: compile worker rc=$c, eval worker rc=$?"
  fi
  $KRL broker stop >> "$OUT/proof.log" 2>&1
fi

if [ -n "$BENCH_PID" ]; then
  wait "$BENCH_PID"
  log "bench compile: $(cat "$OUT/bench_compile.json" 2>/dev/null)"
fi
log "done"
