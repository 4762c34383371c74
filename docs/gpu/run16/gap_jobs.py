# Per job (holds grouped by reply, each job starts with its "reference" hold): exclusive seconds, and which job was
# the only one active in the long gaps. Usage: python3 gap_jobs.py timeline.json
import json,sys,statistics
d=json.load(open(sys.argv[1])); H=d['holds']
jobs=[];cur=[]
for h in H:
    if h['phase']=='reference' and cur: jobs.append(cur); cur=[]
    cur.append(h)
jobs.append(cur)
def excl(j): return sum(h['t1']-h['t0'] for h in j if h['mode']=='exclusive' and h.get('t1'))
spans=[(j[0]['t_request'], max(h['t1'] for h in j if h.get('t1')), j) for j in jobs]
ex_all=sorted(excl(j) for j in jobs)
print(sys.argv[1].split('/')[2], 'excl per job: sorted', [round(x,2) for x in ex_all])
ex=sorted([h for h in H if h['mode']=='exclusive' and h.get('t1')],key=lambda h:h['t0'])
solo=[]; tot=0; solo_t=0
for a,b in zip(ex,ex[1:]):
    g=b['t0']-a['t1']; tot+=g
    if g>0.2:
        m=(a['t1']+b['t0'])/2
        act=[j for s,e,j in spans if s<=m<=e]
        if len(act)==1: solo.append(round(excl(act[0]),2)); solo_t+=g
print('  long gaps with 1 job active: %d, %.1f s of %.1f s of gaps; that job\'s exclusive s:'%(len(solo),solo_t,tot), sorted(solo))
