#!/bin/bash
# the input-streaming attack (a thread started at `stage` computes the ReLU behind the judge's input copy;
# tests/sandbox/test_plain_inputs.py STREAM_PY/STREAM_CPP) on the CPU example's ReLU, the charge off and on.
# Solution folder: .venv/bin/python -c "from tests.sandbox.test_plain_inputs import write_stream_attack; write_stream_attack('/tmp/stream_sol')"
cd "$(dirname "$0")/../../.."
for charge in false true; do
  KRL__SANDBOX__STATIC_GUARDS=false KRL__SANDBOX__CPU_CHARGE_COMPRESSIBLE=$charge .venv/bin/kernelrl sandbox eval \
    --backend cpu --mode both --json --task skills/examples/cpu_19_relu/model.py --solution /tmp/stream_sol \
    > docs/sandbox/compressible/stream-$charge.json 2>/dev/null
  .venv/bin/python -c "
import json; r = json.load(open('docs/sandbox/compressible/stream-$charge.json')); e = r['evidence']; c = r['timings'].get('candidate', {})
print('charge=$charge reward', r['reward'], 'correct', r['correct'], 'x_eager %.2f' % r['speedup_vs_eager'], 'claim_us %.1f' % (c.get('median_s', 0)*1e6),
      'judged_us %.1f' % (e.get('judged_time_s', 0)*1e6), 'compressible_us', e.get('compressible_s') and round(e['compressible_s']*1e6, 1),
      'reward_time_us', e.get('reward_time_s') and round(e['reward_time_s']*1e6, 1), r['error'][:200])"
done
