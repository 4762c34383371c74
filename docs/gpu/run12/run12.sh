#!/usr/bin/env bash
# Issue 12 through Kafka on the device: embedded broker, compile worker, eval-worker --device 0 with
# sandbox.jobs_per_device=$JOBS, an open-loop `stress sandbox --backend cuda` over the CUDA examples
# matching $EX (KernelBench shapes). carry [".gpukafka", ".device/run10", ".device/run12"]
set -u
: "${OUT:?set OUT}"; mkdir -p "$OUT"
install -m 755 .device/run10/bin/ninja /usr/local/bin/ninja 2>/dev/null; export PATH=$PATH:$PWD/.device/run10/bin
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/krl-cache KRL__SANDBOX__JOBS_PER_DEVICE=${JOBS:-4}
T0=$(date +%s); log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
mkdir -p $KERNELRL_CACHE && tar -xJf .gpukafka/kafka-jre.tar.xz -C $KERNELRL_CACHE
export PATH="$KERNELRL_CACHE/jre/bin:$PATH"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpukafka/wheels/*.whl
export PYTHONPATH=/tmp/site
KRL="python3 -m cluster.cli"
log "broker"; $KRL broker start --json > "$OUT/broker.json" 2>> "$OUT/run.log" || exit 1
$KRL topics create >> "$OUT/run.log" 2>&1
$KRL -v compile-worker > "$OUT/compile_worker.log" 2>&1 & CW=$!
$KRL -v eval-worker --device 0 > "$OUT/eval_worker.log" 2>&1 & EW=$!
log "stress: examples cuda_${EX:-[14]*}, ${STRESS_S:-240} s at ${RATE:-0.4}/s, jobs_per_device=$KRL__SANDBOX__JOBS_PER_DEVICE"
timeout ${STRESS_CAP:-480} $KRL stress sandbox --backend cuda --examples "${EX:-[14]*}" --duration ${STRESS_S:-240} \
  --rate ${RATE:-0.4} --eval-fraction 1.0 --timeout ${REPLY_S:-200} --json > "$OUT/stress.json" 2>> "$OUT/stress.log"
log "stress rc=$? $(head -c 3000 "$OUT/stress.json")"
kill -TERM $CW $EW; wait $CW; c=$?; wait $EW; log "SIGTERM: compile worker rc=$c, eval worker rc=$?"
$KRL broker stop >> "$OUT/run.log" 2>&1
log done
