#!/bin/bash
# the held-out forged-clock attack (outputs written in place, claims at 1/100) on the CPU example's ReLU, with the
# compressible charge off and on, alternating: reward, speed-ups, the evidence of what was paid for
cd "$(dirname "$0")/../../.."
SOL=${SOL:-/tmp/arena_sol}  # written by: .venv/bin/python -m tests.sandbox.test_compressible $SOL
for i in 1 2 3; do for charge in false true; do
  KRL__SANDBOX__CPU_CHARGE_COMPRESSIBLE=$charge .venv/bin/kernelrl sandbox eval --backend cpu --mode both --json \
    --task skills/examples/cpu_19_relu/model.py --solution $SOL > docs/sandbox/compressible/ab-$charge-$i.json 2>/dev/null
  .venv/bin/python -c "
import json; r = json.load(open('docs/sandbox/compressible/ab-$charge-$i.json')); e = r['evidence']; c = r['timings']['candidate']
print('run $i charge=$charge reward', r['reward'], 'x_eager %.2f' % r['speedup_vs_eager'], 'claim_us %.1f' % (c['median_s']*1e6),
      'judged_us %.1f' % (e.get('judged_time_s', 0)*1e6), 'compressible_us', e.get('compressible_s') and round(e['compressible_s']*1e6, 1),
      'reward_time_us', e.get('reward_time_s') and round(e['reward_time_s']*1e6, 1), 'eager_us %.1f' % (r['timings']['eager']['median_s']*1e6))"
done; done
