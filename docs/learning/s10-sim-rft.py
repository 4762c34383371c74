# RFT alone on the relu demonstration, for AdamW schedules: env SCHED="140@3e-3" (passes@lr,...), BETA2.
# Runs the head of s10-sim.py beside it (model, prompt and demonstration).
import os
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "s10-sim.py")).read().split("opt = torch.optim")[0])
import itertools
sched = [(int(a), float(b)) for a, b in (x.split("@") for x in os.environ["SCHED"].split(","))]
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, betas=(0.9, float(os.environ.get("BETA2", 0.999))))
e = 0
for n, lr in sched:
    for g in opt.param_groups: g["lr"] = lr
    for _ in range(n):
        model.train()
        lp = torch.log_softmax(model(ids).logits[0, P-1:-1].float(), -1)
        loss = -lp.gather(1, ids[0, P:, None]).mean()
        opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
        e += 1
        if e % 20 == 0 or e == sum(a for a, _ in sched):
            tl = seq_nll(); print(f"{os.environ['SCHED']} ep {e} lr {lr} seqnll {tl.sum():.3f} P(exact) {math.exp(-tl.sum()):.3f}", flush=True)
