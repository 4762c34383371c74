#!/usr/bin/env bash
# Issue 12 on the device, through Kafka: embedded broker, compile worker, `eval-worker --device 0`, closed-loop
# `stress sandbox --backend cuda --in-flight N --warmup` over the CUDA examples matching $EX (run13.sh's open loop
# counted the ramp up and the drain; the stress JSON's `timeline` reports the GPU's busy share at saturation, in
# and outside exclusive holds). carry [".gpukafka", ".device/bin"] (the bus
# bundle from cluster/scripts/gpu_bundle.sh; ninja and bubblewrap binaries from a `make setup` machine) and, to seed the baselines, ".device/cache.tgz".
# STEPS, run in order while time is left (LAST_START_S: no step starts after it; END_S: the running one is stopped):
#   warm       one evaluation of each example at once (cold baselines; not a throughput figure); $OUT/cache.tgz
#   count:J[:P[:N]] eval worker restarted with sandbox.jobs_per_device=J (sandbox.warm_pool=P), stress for $STRESS_S s
#              with N requests in flight per partition of the evaluate topic (8 partitions; default N = J/4 + 1),
#              or open loop at $RATE requests/s when RATE is set (run13.sh's load)
#   env:NAME=VALUE  exported for the eval workers started after it (e.g. env:KRL__SANDBOX__TIMING_BUDGET_S=1)
# Example: OUT=$OUT STEPS="warm count:4 count:8:4" EX="[14]*" STRESS_S=75 bash docs/gpu/run16/run16.sh
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
stress() {  # $1 tag, $2 duration, $3 rate (open loop) or in-flight:N (closed loop after a warm-up)
  local left=$(( ${END_S:-560} - $(el) )) load="--rate $3"
  case $3 in in-flight:*) load="--in-flight ${3#in-flight:} --warmup" ;; esac
  timeout $left $KRL stress sandbox --backend cuda --examples "${EX:-[1-4]*}" --duration $2 $load \
    --eval-fraction 1.0 --timeout ${REPLY_S:-200} --raw-timeline "$OUT/logs/timeline_$1.json" --json > "$OUT/stress_$1.json" 2>> "$OUT/logs/stress_$1.log"
  log "stress $1 rc=$? $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps({k: d.get(k) for k in ("sent","ok","failed","timeouts","rewards","evaluations_per_min","gpu_busy","timeline")}))' "$OUT/stress_$1.json" 2>&1 | head -c 3000)"
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
    count:*) IFS=: read -r _ j p n <<< "$step"; n=${n:-$(( j / 4 + 1 ))}
          # the warm-up, the stress and the drain take ~2x STRESS_S + 30 s (session 20's count:6 was cut off without its JSON)
          [ $(( $(el) + 2 * ${STRESS_S:-75} + 30 )) -gt "${END_S:-560}" ] && { log "no time left for $step"; break; }
          start_eval "$j" "$p" "s$(( ${k:-0} + 1 ))j$j"
          log "count: jobs_per_device=$j warm_pool=${p:-default}, ${STRESS_S:-75} s, $n in flight per partition"
          k=$(( ${k:-0} + 1 )); stress "s${k}j$j${p:+p$p}" ${STRESS_S:-75} ${RATE:-in-flight:$n} ;;
    env:*) kv=${step#env:}; export "$kv"; log "env $kv" ;;
    *) log "unknown step $step" ;;
  esac
done
kill -TERM $CW $EW; wait $CW; c=$?; wait $EW; log "SIGTERM: compile worker rc=$c, eval worker rc=$?"
$KRL broker stop >> "$OUT/run.log" 2>&1
tar -czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$OUT/logs"
log done
