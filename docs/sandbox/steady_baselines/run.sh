#!/usr/bin/env bash
# Three one-shot evaluations of the CPU ReLU example in a row, each tree with a fresh cache of its own:
# the first times the baselines, the later ones should reuse them (evidence.baseline_cached) unless the
# stored timing is "noisy". Usage: run.sh TREE LABEL OUTDIR (TREE: a checkout; the venv is /work/main's).
set -u
TREE=$1; LABEL=$2; mkdir -p "$3"; OUT=$(cd "$3" && pwd)
export KERNELRL_CACHE=/tmp/krl-steady-$LABEL; rm -rf "$KERNELRL_CACHE"
cd "$TREE"
for i in 1 2 3; do
  /usr/bin/time -f "%e" -o "$OUT/$LABEL-$i.wall" nice -n 10 /work/main/.venv/bin/python -c \
    "import sys; from cluster.cli import main; sys.exit(main(sys.argv[1:]))" sandbox eval --json \
    --task /work/main/skills/examples/cpu_19_relu/model.py --solution /work/main/skills/examples/cpu_19_relu \
    > "$OUT/$LABEL-$i.json" 2> "$OUT/$LABEL-$i.stderr"
  /work/main/.venv/bin/python - "$OUT/$LABEL-$i.json" "$(cat "$OUT/$LABEL-$i.wall")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["timings"]
print(f"wall {sys.argv[2]} s  reward {r['reward']}  baseline_cached {r['evidence'].get('baseline_cached')}  "
      + "  ".join(f"{k}: median {v['median_s']*1e3:.2f} ms cv {v['cv']:.2f} spread {v.get('spread', float('nan')):.2f}"
                  for k, v in t.items() if isinstance(v, dict) and 'median_s' in v))
PY
done
