#!/usr/bin/env bash
# Device calls of session 16 (2026-12-06), from the working tree the device tool copies:
#   zero     issue 14's PPO step vs the plain loop with fp32 masters (plain=mixed), under DeepSpeed settings given by
#            `learner.zero_stage` and `learner.deepspeed_json` (VARIANTS: name|stage|json lines); the first variant
#            also against plain=bf16, and a profile of the variant named in PROFILE
#   other phases (env export learner replay formats suite) are docs/gpu/run14/run14.sh's, run after this one
# Carry: [".whl", ".device"] as docs/gpu/next/README.md says.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); BUDGET=${BUDGET_S:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/krl-cache
if [ ! -d /tmp/site/deepspeed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/learner-gpu/*.whl \
    > "$OUT/pip.log" 2>&1
fi
export PYTHONPATH=/tmp/site
phases=${*:-zero}
rest=""
for p in $phases; do [ "$p" = zero ] || rest="$rest $p"; done
DEFAULT_VARIANTS='stage1|1|
stage1-nocheck|1|{"bf16": {"check_grad_overflow": false}}
stage0|0|
stage0-immediate|0|{"bf16": {"immediate_grad_update": true}}
stage2|2|
stage1-bigbucket-nocheck|1|{"bf16": {"check_grad_overflow": false}, "zero_optimization": {"reduce_bucket_size": 1000000000, "allgather_bucket_size": 1000000000, "overlap_comm": false}}'
if [[ " $phases " == *" zero "* ]]; then
  first=1
  while IFS='|' read -r name stage json; do
    [ -n "$name" ] || continue
    plains="mixed"; [ $first = 1 ] && plains="mixed bf16"; first=0
    for plain in $plains; do
      [ "$(left)" -gt 60 ] || { log "no time left for $name"; break 2; }
      prof=""; [ "$name" = "${PROFILE:-}" ] && [ "$plain" = mixed ] && prof="profile=$OUT/prof_$name"
      log "zero variant $name (stage $stage, $json), plain=$plain"
      timeout $(( $(left) > 150 ? ${LEARNER_S:-110} : $(left) - 20 )) python3 -m learner.bench \
          --set learner.dtype=bf16 --set learner.zero_stage=$stage --set "learner.deepspeed_json=$json" \
          --set learner.logit_chunk=512 --set learner.token_budget=16384 model=random-0.5b batch=8 seq=2048 steps=5 \
          publishes=0 plain=$plain $prof --out "$OUT/zero_${name}_$plain.json" > "$OUT/zero_${name}_$plain.log" 2>&1
      log "zero $name plain=$plain rc=$? $(cat "$OUT/zero_${name}_$plain.json" 2>/dev/null)"
    done
  done <<< "${VARIANTS:-$DEFAULT_VARIANTS}"
fi
if [ -n "${rest// /}" ]; then
  OUT=$OUT BUDGET_S=$(left) bash docs/gpu/run14/run14.sh $rest
fi
log "done"
