#!/usr/bin/env bash
# The CPU profile of every CPU example's honest solution at its own shape (sessions 18 and 19, docs/sandbox.md "Who computed:
# the CPU profile"): reward, violations and evidence.cpu_profile per example. Run from the repository root.
set -u
for ex in skills/examples/cpu_*; do
  n=$(basename $ex)
  PYTHONPATH=. ${PY:-python} -m cluster.cli sandbox eval --backend cpu --mode both --json --task $ex/model.py \
      --solution $ex 2>/dev/null | ${PY:-python} -c "
import json, sys
d = json.load(sys.stdin); p = d['evidence'].get('cpu_profile') or {}
print('$n', 'reward', d['reward'], 'violations', d['violations'], 'calls', p.get('calls'),
      'own_ms_per_call %.3f' % (1e3 * p.get('own_s', 0) / max(1, p.get('calls') or 1)),
      'foreign_ms_per_call %.3f' % (1e3 * p.get('foreign_per_call_s', 0)),
      'eager_ms %.3f' % (1e3 * ((d.get('timings') or {}).get('eager') or {}).get('median_s', 0)),
      json.dumps({k.rsplit('/', 1)[-1]: v for k, v in (p.get('foreign_in') or {}).items()}))"
done
