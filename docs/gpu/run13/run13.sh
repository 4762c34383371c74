#!/usr/bin/env bash
# Issue 12 on the device, through Kafka: embedded broker, compile worker, `eval-worker --device 0`, open-loop
# `stress sandbox --backend cuda` over the CUDA examples matching $EX. carry [".gpukafka", ".device/bin"] (the bus
# bundle from cluster/scripts/gpu_bundle.sh; ninja and bubblewrap binaries from a `make setup` machine) and, to seed the baselines, ".device/cache.tgz".
# STEPS, run in order while time is left (LAST_START_S: no step starts after it; END_S: the running one is stopped):
#   warm       one evaluation of each example at once (cold baselines; not a throughput figure); $OUT/cache.tgz
#   count:J[:P] eval worker restarted with sandbox.jobs_per_device=J (sandbox.warm_pool=P), stress for $STRESS_S s
# Example: OUT=$OUT STEPS="warm count:8:2 count:4" EX="[1-4]*" STRESS_S=75 RATE=0.8 bash docs/gpu/run13/run13.sh
set -u
: "${OUT:?set OUT}"; mkdir -p "$OUT/logs"
install -m 755 .device/bin/ninja /usr/local/bin/ninja 2>/dev/null; export PATH=$PATH:$PWD/.device/bin
bwrap --version > "$OUT/bwrap.txt" 2>&1 || { echo "no bubblewrap: the workers would refuse to serve" >&2; exit 2; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/krl-cache
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/run.log"; }
mkdir -p $KERNELRL_CACHE && tar -xJf .gpukafka/kafka-jre.tar.xz -C $KERNELRL_CACHE
[ -f .device/cache.tgz ] && tar -xzf .device/cache.tgz -C $KERNELRL_CACHE && log "baselines seeded from .device/cache.tgz"
export PATH="$KERNELRL_CACHE/jre/bin:$PATH"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpukafka/wheels/*.whl
export PYTHONPATH=/tmp/site
KRL="python3 -m cluster.cli"
EW=
start_eval() {  # $1 jobs_per_device, $2 warm_pool (optional), $3 log tag
  [ -n "$EW" ] && { kill -TERM $EW; wait $EW; log "eval worker (jobs=$JOBS) SIGTERM rc=$?"; }
  JOBS=$1; export KRL__SANDBOX__JOBS_PER_DEVICE=$1
  if [ -n "${2:-}" ]; then export KRL__SANDBOX__WARM_POOL=$2; else unset KRL__SANDBOX__WARM_POOL; fi
  $KRL -v eval-worker --device 0 > "$OUT/logs/eval_worker_$3.log" 2>&1 & EW=$!
}
stress() {  # $1 tag, $2 duration, $3 rate
  local left=$(( ${END_S:-560} - $(el) ))
  timeout $left $KRL stress sandbox --backend cuda --examples "${EX:-[1-4]*}" --duration $2 --rate $3 \
    --eval-fraction 1.0 --timeout ${REPLY_S:-200} --json > "$OUT/stress_$1.json" 2>> "$OUT/logs/stress_$1.log"
  log "stress $1 rc=$? $(head -c 2500 "$OUT/stress_$1.json")"
}
log "broker"; $KRL broker start --json > "$OUT/broker.json" 2>> "$OUT/run.log" || exit 1
$KRL topics create >> "$OUT/run.log" 2>&1
$KRL -v compile-worker > "$OUT/logs/compile_worker.log" 2>&1 & CW=$!
for step in ${STEPS:-warm count:4}; do
  [ "$(el)" -gt "${LAST_START_S:-420}" ] && { log "no time left for $step"; break; }
  case $step in
    warm) start_eval 4 "" warm; n=$(ls -d skills/examples/cuda_${EX:-[1-4]*} | wc -l)
          log "warm: $n examples at once"; stress warm 1 $n
          tar -czf "$OUT/cache.tgz" -C $KERNELRL_CACHE baselines ;;
    count:*) IFS=: read -r _ j p <<< "$step"; start_eval "$j" "$p" "j$j"
          log "count: jobs_per_device=$j warm_pool=${p:-default}, ${STRESS_S:-75} s at ${RATE:-0.8}/s"
          stress "j$j" ${STRESS_S:-75} ${RATE:-0.8} ;;
    *) log "unknown step $step" ;;
  esac
done
kill -TERM $CW $EW; wait $CW; c=$?; wait $EW; log "SIGTERM: compile worker rc=$c, eval worker rc=$?"
$KRL broker stop >> "$OUT/run.log" 2>&1
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
log done
