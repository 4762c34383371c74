# Scratch replica of the learning test's RFT and PPO("floor") in plain torch (docs/learning.md "PPO that sharpens"):
# .venv/bin/python docs/learning/s10-sim.py TINY_MODEL_DIR with env SEED, BETA2, RFT_EPOCHS, PPO_LR, EPOCHS, STEPS, N.
"""Offline: SFT the tiny model on the relu demo, then measure P(exact demo) and sampled pass proxy; then
PPO-floor-like sharpening on own samples (reward = reply equals demo after whitespace strip)."""
import os, sys, time, json, math
sys.path.insert(0, "/work/main")
import torch
from pathlib import Path
from transformers import AutoTokenizer, AutoModelForCausalLM
from cluster.launch.feeder import load_task_files
from actors.agent import task_prompt
from actors.chat import ChatRenderer
from actors.workspace import single_turn_skill_text
from actors.demos import single_turn_answer
from actors.extract import extract_files
torch.manual_seed(int(os.environ.get("SEED", 0)))
torch.set_num_threads(2)
MODEL = sys.argv[1]
tok = AutoTokenizer.from_pretrained(MODEL)
model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32)
task = load_task_files("/work/main/tests/learning/tasks")[0]
sol = Path("/work/main/tests/learning/tasks/relu.solution")
files = {str(p.relative_to(sol)): p.read_text() for p in sorted(sol.rglob("*")) if p.is_file()}
r = ChatRenderer(tok)
prompt = r.prompt_ids(single_turn_skill_text("cpu"), task_prompt(task, True))
reply = tok(single_turn_answer(files), add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
print("prompt", len(prompt), "reply", len(reply))
ids = torch.tensor([prompt + reply])
P = len(prompt)
want = {k: v.strip() for k, v in files.items()}

def seq_nll():
    with torch.no_grad():
        lp = torch.log_softmax(model(ids).logits[0, P-1:-1].float(), -1)
        tl = -lp.gather(1, ids[0, P:, None])[:, 0]
    return tl

def sample(n):
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]*n), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                             max_new_tokens=264, pad_token_id=tok.pad_token_id or 0)
    res = []
    for row in out[:, P:]:
        toks = row.tolist()
        text = tok.decode(toks, skip_special_tokens=True)
        got = {k: v.strip() for k, v in extract_files(text).items()}
        res.append((toks, got == want))
    return res

B2 = float(os.environ.get("BETA2", 0.999))
opt = torch.optim.AdamW(model.parameters(), lr=float(os.environ.get("RFT_LR", 3e-3)), weight_decay=0.0, betas=(0.9, B2))
E = int(os.environ.get("RFT_EPOCHS", 100))
t0 = time.time()
for e in range(E):
    model.train()
    lp = torch.log_softmax(model(ids).logits[0, P-1:-1].float(), -1)
    loss = -lp.gather(1, ids[0, P:, None]).mean()
    opt.zero_grad(); loss.backward(); torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
    if (e+1) % 20 == 0:
        tl = seq_nll()
        top = torch.topk(tl, 5)
        print(f"rft {e+1} loss {loss.item():.4f} seqnll {tl.sum():.3f} P(exact) {math.exp(-tl.sum()):.3f} worst {[(int(i), round(float(v),3)) for v,i in zip(top.values, top.indices)]} {time.time()-t0:.0f}s", flush=True)
N = int(os.environ.get("N", 16))
s = sample(N); print("after RFT sampled pass", sum(p for _, p in s)/N, flush=True)
for g in opt.param_groups: g["lr"] = float(os.environ.get("PPO_LR", 1e-3))
if os.environ.get("RESET"):
    opt = torch.optim.AdamW(model.parameters(), lr=float(os.environ.get("PPO_LR", 1e-3)), weight_decay=0.0, betas=(0.9, B2))
CLIP = 0.2
for step in range(int(os.environ.get("STEPS", 8))):
    batch = sample(int(os.environ.get("B", 8)))
    passing = [t for t, p in batch if p]
    with torch.no_grad():
        old = [torch.log_softmax(model(torch.tensor([prompt + t])).logits[0, P-1:-1].float(), -1).gather(1, torch.tensor([prompt + t])[0, P:, None]) for t in passing]
    # floor advantage: only passing samples, weight 2, normaliser = all tokens
    ntok = sum(len(t) for t, _ in batch)
    for t, o in zip(passing, old):
        if t[:len(reply)] != reply:
            print("   passing non-exact: len", len(t), "min logp", round(float(o.min()), 2), "n tokens logp<-2:", int((o < -2).sum()), repr(tok.decode(t)[-80:]), flush=True)
    for ep in range(int(os.environ.get("EPOCHS", 4))):
        model.train(); opt.zero_grad()
        loss_tot = 0.0
        for t, o in zip(passing, old):
            x = torch.tensor([prompt + t])
            lp = torch.log_softmax(model(x).logits[0, P-1:-1].float(), -1).gather(1, x[0, P:, None])
            ratio = torch.exp(lp - o)
            loss = -(2.0 * torch.minimum(ratio, torch.clamp(ratio, max=1 + CLIP))).sum() / ntok
            loss.backward(); loss_tot += loss.item()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0); opt.step()
        if os.environ.get("VERBOSE"):
            print(f"     epoch {ep} gradnorm {float(gn):.4f} seqnll {float(seq_nll().sum()):.3f}", flush=True)
    tl = seq_nll()
    print(f"ppo {step+1} batch pass {len(passing)}/{len(batch)} seqnll {tl.sum():.3f} P(exact) {math.exp(-tl.sum()):.3f} {time.time()-t0:.0f}s", flush=True)
s = sample(N); print("final sampled pass", sum(p for _, p in s)/N)
