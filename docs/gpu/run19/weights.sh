#!/usr/bin/env bash
# Issue 14 on the GPU host (16 cores): `kernelrl bench weights` for fs (and kafka) publish of >= 1 GB models, against
# memcpy of the same bytes measured in the same run. The 2-core CI box measured fs publish at 0.31x memcpy, bound by
# one blake3 pass (docs/weights-bench.md "fs publish without the disk on the hot path"); blake3 spreads over cores.
# carry [".gpukafka", ".whl/learner-gpu/blake3-1.0.11-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"]
# MODELS: the models to run, each random-<N>m[:transports] (default transports fs,kafka), RUNS per transport.
set -u
: "${OUT:?set OUT}"; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/krl-cache
T0=$(date +%s); log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
mkdir -p $KERNELRL_CACHE && tar -xJf .gpukafka/kafka-jre.tar.xz -C $KERNELRL_CACHE
export PATH="$KERNELRL_CACHE/jre/bin:$PATH"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .gpukafka/wheels/*.whl .whl/learner-gpu/blake3-*.whl
export PYTHONPATH=/tmp/site
KRL="python3 -m cluster.cli"
{ nproc; free -g | head -2; df -h /tmp | tail -1; python3 -c 'import torch, blake3; print(torch.__version__, blake3.__version__)'; } > "$OUT/env.txt" 2>&1
log "broker"; $KRL broker start --json > "$OUT/broker.json" 2>> "$OUT/run.log" || exit 1
for spec in ${MODELS:-random-300m}; do
  m=${spec%%:*}; t=fs,kafka; [ "$spec" != "$m" ] && t=${spec#*:}
  log "bench weights $m $t"
  timeout ${BENCH_S:-240} $KRL bench weights model=$m transports=$t runs=${RUNS:-3} swap=0 --json \
    > "$OUT/weights_$m.json" 2> "$OUT/weights_$m.err"
  log "rc=$? $(head -c 2500 "$OUT/weights_$m.json")"
done
$KRL broker stop >> "$OUT/run.log" 2>&1
log done
