#!/usr/bin/env bash
# Device calls of session 15 (2026-12-06), from the working tree the device tool copies:
#   env      the machine
#   learner  `python3 -m learner.bench` bf16 ZeRO-1 random-0.5b, PPO step vs plain PyTorch (AdamW on the bf16
#            weights, with a torch.profiler table of one step of each loop; then plain=mixed: AdamW on fp32
#            master copies, as DeepSpeed's bf16 mode keeps them) (issue 14: where the PPO step's time goes)
#   export   `python3 -m learner.bench export=0.5b,1.5b`: the bucket export into pinned host slots vs the
#            device-to-host copy rate (issue 14)
#   replay   the learner part of `kernelrl bench learning` (issue 13): `bench learner trajectories=DIR` on
#            trajectories a SmolLM2-135M run recorded on the CPU machine, SmolLM2's architecture in bf16
#   formats  `pytest -m gpu tests/sandbox/test_gpu_formats.py`
#   suite    `pytest -m gpu tests/sandbox` with the time left
# Carry: [".whl", ".device"] where .whl/learner-gpu holds the wheels of docs/learner-gpu.md, .device/bin holds
# ninja and bwrap from a `make setup` machine, .device/smol holds SmolLM2's config + tokenizer files and traj/.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
T0=$(date +%s); BUDGET=${BUDGET_S:-570}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
log() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$OUT/run.log"; }
install -m 755 .device/bin/ninja /usr/local/bin/ninja 2>/dev/null; export PATH=$PATH:$PWD/.device/bin
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/krl-cache
phases=${*:-env learner export replay formats suite}
has() { [[ " $phases " == *" $1 "* ]]; }
if [ ! -d /tmp/site/deepspeed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/learner-gpu/*.whl \
    > "$OUT/pip.log" 2>&1
fi
export PYTHONPATH=/tmp/site
BF="--set learner.dtype=bf16 --set learner.zero_stage=1"
if has env; then
  { nvidia-smi; nvcc --version | tail -2; python3 -c "import torch,sys;print(sys.version);print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())"; nproc; free -g | head -2; bwrap --version; git log -1 --format=%H 2>/dev/null; git status --short 2>/dev/null | head -30; } > "$OUT/env.txt" 2>&1
  log "env done"
fi
if has export; then
  log "export bench"
  timeout $(( $(left) > 200 ? ${EXPORT_S:-150} : $(left) - 20 )) python3 -m learner.bench $BF export=${EXPORT_SIZES:-0.5b,1.5b} \
      --out "$OUT/export.json" > "$OUT/export.log" 2>&1
  log "export rc=$? $(cat "$OUT/export.json" 2>/dev/null)"
fi
if has learner; then
  for plain in ${PLAINS:-bf16 mixed}; do
    log "learner bench bf16, plain loop $plain"
    prof=""; [ "$plain" = bf16 ] && prof="profile=$OUT/prof"
    timeout $(( $(left) > 200 ? ${LEARNER_S:-150} : $(left) - 20 )) python3 -m learner.bench $BF \
        --set learner.logit_chunk=512 --set learner.token_budget=16384 model=random-0.5b batch=8 seq=2048 steps=5 \
        publishes=0 plain=$plain $prof --out "$OUT/learner_$plain.json" > "$OUT/learner_$plain.log" 2>&1
    log "learner plain=$plain rc=$? $(cat "$OUT/learner_$plain.json" 2>/dev/null)"
  done
fi
if has replay; then
  log "replay (learner part of bench learning), SmolLM2 architecture bf16"
  python3 - > "$OUT/replay_model.log" 2>&1 <<'PY'
import shutil, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
src, dst = Path(".device/smol"), Path("/tmp/smol")
torch.manual_seed(0)
cfg = AutoConfig.from_pretrained(str(src))
with torch.device("cuda"):
    m = AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
m.save_pretrained(str(dst), safe_serialization=True)
for p in src.iterdir():
    if p.is_file() and p.name != "config.json":
        shutil.copyfile(p, dst / p.name)
print("params", sum(p.numel() for p in m.parameters()), "->", dst)
PY
  for tb in ${REPLAY_BUDGETS:-16384 1536}; do
    timeout $(( $(left) > 150 ? ${REPLAY_S:-120} : $(left) - 20 )) python3 -m learner.bench $BF \
        --set learner.rft_epochs=6 --set learner.ppo_epochs=1 --set learner.critic_lr=1e-4 \
        --set learner.token_budget=$tb --set learner.logit_chunk=512 \
        model=/tmp/smol trajectories=.device/smol/traj stages=${REPLAY_STAGES:-rft:2,ppo:4} batch=4 publishes=0 \
        --out "$OUT/replay_tb$tb.json" > "$OUT/replay_tb$tb.log" 2>&1
    log "replay token_budget=$tb rc=$? $(head -c 600 "$OUT/replay_tb$tb.json" 2>/dev/null)"
  done
fi
if has formats; then
  log "gpu formats tests"
  timeout $(( $(left) > 260 ? ${FORMATS_S:-240} : $(left) - 20 )) python3 -m pytest -m gpu tests/sandbox/test_gpu_formats.py -v -rA -s -p no:cacheprovider --durations=10 > "$OUT/formats.log" 2>&1
  log "formats rc=$? $(tail -1 "$OUT/formats.log")"
fi
if has suite; then
  log "gpu suite (tests/sandbox ${SUITE_K:+-k $SUITE_K}), $(left) s left"
  timeout $(( $(left) - 10 )) python3 -m pytest -m gpu tests/sandbox ${SUITE_K:+-k "$SUITE_K"} -q -rA -p no:cacheprovider --durations=15 > "$OUT/suite.log" 2>&1
  log "suite rc=$? $(tail -1 "$OUT/suite.log")"
fi
log "done"
