# Long hand-over gaps (> 0.2 s between exclusive holds) of a stress run's raw timeline: was an exclusive request
# pending (the gap is a drain of shared holders) or none (no job ready to be timed)? Usage: python3 gaps.py timeline.json
import json,sys
d=json.load(open(sys.argv[1]))
H=d['holds']
ex=sorted([h for h in H if h['mode']=='exclusive' and h.get('t1')],key=lambda h:h['t0'])
sh=[h for h in H if h['mode']=='shared' and h.get('t1')]
cats={'excl_pending':[], 'no_excl_pending':[]}
for a,b in zip(ex,ex[1:]):
    g0,g1=a['t1'],b['t0']
    if g1-g0<0.2: continue
    waiting=[h for h in ex if h['t_request']<=g0+0.02 and h['t0']>=g1-1e-6]
    key='excl_pending' if waiting else 'no_excl_pending'
    phases=sorted(set(h['phase'] for h in sh if h['t0']<g1 and h['t1']>g0))
    first_req=min((h['t_request'] for h in ex if h['t_request']>=g0-1e-6), default=g0)
    cats[key].append((round(g1-g0,3), round(first_req-g0,3), phases))
tot=sum(b['t0']-a['t1'] for a,b in zip(ex,ex[1:]))
print(sys.argv[1], 'all gaps', round(tot,2))
for k,v in cats.items():
    print(' ',k, len(v), 'sum', round(sum(x[0] for x in v),2))
    for x in v[:6]: print('     ',x)
