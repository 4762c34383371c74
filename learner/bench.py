"""`kernelrl bench learner`: PPO step throughput vs a plain PyTorch loop, and weight publishing vs memcpy.

Both training loops run in the same process on the same model and the same
batch, interleaved step by step so machine noise hits both alike:
``ppo_tok_s`` is the learner's Trainer (DeepSpeed engines, packing, GAE,
decoupled PPO + clipped value loss), ``plain_tok_s`` the same work written as a
bare PyTorch loop (AdamW, no DeepSpeed). ``publish_gb_s`` is export (HF
safetensors) + transport (+ announcement) of the policy, ``memcpy_gb_s`` an
in-memory copy of the same number of bytes.

Extra arguments after `bench learner`, as words: model=tiny|random-0.5b|PATH,
batch=8, seq=512, steps=5, warmup=1, publishes=3, transport=auto|kafka|fs|nccl (nccl: export plus
one receiver's fetch), profile=DIR (torch.profiler tables of one step of each loop), plain=bf16|mixed (the plain
loop's AdamW on the bf16 weights, or on fp32 master copies as DeepSpeed's bf16 mode keeps them). With
trajectories=DIR stages=rft:2,ppo:4 it instead runs the learner's stage schedule on recorded trajectories
(learner/bench_replay.py: the learner part of `bench learning`); with export=0.5b,1.5b it benches the bucket
export against the device-to-host copy rate (learner/bench_export.py); publishes=0 skips the publish part.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from learner.bench_export import QWEN05B

log = logging.getLogger(__name__)


def _options(rest: list[str]):
    p = argparse.ArgumentParser(prog="kernelrl bench learner --")
    p.add_argument("--model", default="tiny", help="tiny | random-0.5b | an HF folder")
    p.add_argument("--batch", type=int, default=8, help="trajectories per step")
    p.add_argument("--seq", type=int, default=512, help="tokens per trajectory")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--publishes", type=int, default=3)
    p.add_argument("--transport", default="auto", choices=["auto", "kafka", "fs", "nccl"])
    p.add_argument("--trajectories", default="", help="a `kernelrl replay --to-dir` folder: train on it instead")
    p.add_argument("--stages", default="rft:2,ppo:4", help="with trajectories=: the stage schedule")
    p.add_argument("--export", default="", help="tiny,0.5b,1.5b: bench the bucket export instead (bench_export)")
    p.add_argument("--profile", default="", help="a folder: torch.profiler tables of one PPO and one plain step")
    p.add_argument("--plain", default="bf16", choices=["bf16", "mixed"],
                   help="the plain loop's optimizer: AdamW on the bf16 weights, or on fp32 master copies (mixed), "
                        "as DeepSpeed's bf16 mode keeps them")
    flat: list[str] = []
    for tok in rest:  # `kernelrl bench learner steps=3 model=random-0.5b` (the bench CLI passes bare words)
        if "=" in tok and not tok.startswith("-"):
            k, v = tok.split("=", 1)
            flat += [f"--{k}", v]
        else:
            flat.append(tok)
    return p.parse_args(flat)


def _random_model(dst: Path, tiny: str) -> str:
    """A randomly initialised Qwen2 of ~0.5B parameters (Qwen2.5-0.5B shapes) with the tiny tokenizer files."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**QWEN05B, max_position_embeddings=32768, torch_dtype="bfloat16"))
    model.to(torch.bfloat16).save_pretrained(str(dst), safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (Path(tiny) / name).exists():
            shutil.copyfile(Path(tiny) / name, dst / name)
    return str(dst)


def _samples(batch: int, seq: int, vocab: int):
    from learner.data import Sample

    rng = np.random.default_rng(0)
    out = []
    for i in range(batch):
        ids = rng.integers(10, vocab - 1, seq)
        mask = np.zeros(seq, np.uint8)
        mask[seq // 8:] = 1
        lp = np.where(mask > 0, rng.normal(-6.0, 0.3, seq), 0).astype(np.float32)
        out.append(Sample(f"b{i}", ids, lp, mask, reward=float((-1) ** i), min_version=0))
    return out


class PlainLoop:
    """The same PPO step as the Trainer's, in bare PyTorch: same models, same batch, AdamW, no DeepSpeed."""

    def __init__(self, cfg, model_path: str, device, mixed: bool = False) -> None:
        import torch

        from learner.models import load_critic, load_policy
        from learner.objective import PPOParams

        dtype = torch.bfloat16 if cfg.learner.dtype == "bf16" else torch.float32
        self.cfg, self.device = cfg, device
        self.policy = load_policy(model_path, dtype).to(device)
        self.critic = load_critic(model_path, dtype).to(device)
        # mixed: AdamW steps fp32 master copies; the bf16 weights are copied from them after each step
        self.mixed = mixed and dtype != torch.float32
        self.masters = {}
        opts = []
        for model, lr in ((self.policy, cfg.learner.actor_lr), (self.critic, cfg.learner.critic_lr)):
            params = list(model.parameters())
            if self.mixed:
                self.masters[id(model)] = [p.detach().float().clone().requires_grad_(True) for p in params]
                params = self.masters[id(model)]
            opts.append(torch.optim.AdamW(params, lr=lr, betas=(0.9, cfg.learner.adam_beta2), weight_decay=0.0))
        self.opt_p, self.opt_c = opts
        lc = cfg.learner
        self.params = PPOParams(clip_low=lc.clip_low, clip_high=lc.clip_high, mode=lc.off_policy)

    def step(self, samples) -> int:
        import torch

        from learner.data import collate, pack
        from learner.models import token_logprobs
        from learner.objective import gae, ppo_policy_loss, value_loss

        lc = self.cfg.learner
        batches = [collate(g).to(self.device) for g in pack(samples, lc.token_budget)]
        norm = sum(float(b.loss_mask.sum()) for b in batches)
        prep = []
        with torch.no_grad():
            for mb in batches:
                prox = token_logprobs(self.policy, mb.input_ids, mb.attention_mask, chunk=lc.logit_chunk,
                                      select=mb.loss_mask)[0].float()
                values = self.critic(mb.input_ids, mb.attention_mask).float() * mb.loss_mask
                adv, ret = torch.zeros_like(values), torch.zeros_like(values)
                for i in range(values.shape[0]):
                    a, r = gae(float(mb.reward[i]), values[i].cpu(), mb.loss_mask[i].cpu(), lc.gamma, lc.lam)
                    adv[i], ret[i] = a.to(values.device), r.to(values.device)
                prep.append((prox, values, adv, ret))
        for mb, (prox, old_v, adv, ret) in zip(batches, prep):
            logp, _ = token_logprobs(self.policy, mb.input_ids, mb.attention_mask, want_entropy=True,
                                     chunk=lc.logit_chunk, select=mb.loss_mask)
            ppo_policy_loss(logp, prox, mb.logp_mu, adv, mb.loss_mask, self.params, norm)[0].backward()
            value_loss(self.critic(mb.input_ids, mb.attention_mask).float(), old_v, ret, mb.loss_mask,
                       lc.value_clip, norm)[0].backward()
        for model, opt in ((self.policy, self.opt_p), (self.critic, self.opt_c)):
            if self.mixed:
                params, masters = list(model.parameters()), self.masters[id(model)]
                for p, m in zip(params, masters):
                    m.grad = p.grad.float() if p.grad is not None else None
                    p.grad = None
                torch.nn.utils.clip_grad_norm_(masters, lc.grad_clip)
                opt.step()
                opt.zero_grad(set_to_none=True)
                with torch.no_grad():
                    torch._foreach_copy_(params, masters)
                continue
            torch.nn.utils.clip_grad_norm_(model.parameters(), lc.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return sum(b.tokens for b in batches)


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _bench_training(cfg, model_path: str, o) -> dict:
    from learner import engine as eng
    from learner.trainer import Trainer

    trainer = Trainer(cfg, model_path)
    plain = PlainLoop(cfg, model_path, eng.device(), mixed=o.plain == "mixed")
    samples = _samples(o.batch, o.seq, int(trainer.policy_module().config.vocab_size))
    t_ppo = t_plain = 0.0
    tok_ppo = tok_plain = 0
    for i in range(o.warmup + o.steps):
        _sync()
        t0 = time.perf_counter()
        m = trainer.step(samples)
        _sync()
        t1 = time.perf_counter()
        n_plain = plain.step(samples)
        _sync()
        t2 = time.perf_counter()
        if i >= o.warmup:
            t_ppo += t1 - t0
            t_plain += t2 - t1
            tok_ppo += int(m["tokens"])
            tok_plain += n_plain
    if o.profile:
        _profile(o.profile, trainer, plain, samples)
    mixed = plain.mixed
    del plain
    return {"plain_optimizer": "fp32 masters" if mixed else cfg.learner.dtype,
            "ppo_tok_s": tok_ppo / t_ppo, "plain_tok_s": tok_plain / t_plain,
            "ppo_step_s": t_ppo / o.steps, "plain_step_s": t_plain / o.steps, "trainer": trainer}


def _profile(folder: str, trainer, plain, samples) -> None:
    """One step of each loop under torch.profiler: per-op tables (device time, host time) in ``folder``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    dev_key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    for name, fn in (("ppo", lambda: trainer.step(samples)), ("plain", lambda: plain.step(samples))):
        _sync()
        t = time.perf_counter()
        with profile(activities=acts, record_shapes=False) as prof:
            fn()
            _sync()
        secs = time.perf_counter() - t
        ka = prof.key_averages()
        text = [f"{name} step under the profiler: {secs:.4f} s", "", f"by {dev_key}:",
                ka.table(sort_by=dev_key, row_limit=45), "", "by cpu_time_total:",
                ka.table(sort_by="cpu_time_total", row_limit=45)]
        (out / f"{name}.txt").write_text("\n".join(text) + "\n")
        log.warning("profile of one %s step (%.3f s) in %s", name, secs, out / f"{name}.txt")


def memcpy_gb_s(nbytes: int, reps: int = 3) -> float:
    """GB/s of one in-memory copy of `nbytes` (best of `reps`): what every transport is compared with."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def _timed_receive(ann, dest: Path) -> float:
    from cluster.weights import transport as wt

    t = time.perf_counter()
    wt.receive(None, ann, dest, timeout_s=600)
    secs = time.perf_counter() - t
    shutil.rmtree(dest)
    return secs


def _kafka_ready(cfg) -> tuple[bool, bool]:
    """(usable, started_here): a configured or running broker, else try to start the embedded one."""
    from cluster.broker import embedded as broker

    if cfg.bus.bootstrap_servers or broker.status(cfg)["running"]:
        return True, False
    try:
        broker.start(cfg)
        return True, True
    except Exception as exc:  # noqa: BLE001 - no Java / jars on this host: the bench falls back to fs
        log.warning("no Kafka broker for the publish bench (%s): using the fs transport", exc)
        return False, False


def _bench_publish(cfg, trainer, model_path: str, o, tmp: Path) -> dict:
    from learner.publish import Publisher

    transport, started, bus, prod = o.transport, False, None, None
    if transport in ("auto", "kafka"):
        ok, started = _kafka_ready(cfg)
        transport = "kafka" if ok else "fs"
    cfg.learner.weight_transport = transport
    cfg.learner.weight_fs_dir = str(tmp / "weights")
    cfg.learner.weight_stream_drain_s = 0.0  # the one receiver has fetched every version already
    try:
        if transport == "kafka":
            from cluster.bus import topics_admin
            from cluster.bus.client import Bus

            cfg.bus.topic_prefix = f"{cfg.bus.topic_prefix}bench-learner-{int(time.time())}."
            topics_admin.create_all(cfg)
            bus = Bus(cfg, client_id="bench-learner")
            prod = bus.producer()
        pub = Publisher(cfg, prod)
        times, nbytes = [], 0
        for v in range(1, o.publishes + 1):
            ann, secs = pub.publish(trainer.policy_module(), v, v, model_path)
            if transport == "nccl":  # the stream moves bytes only when asked: time one receiver's fetch too
                secs += _timed_receive(ann, tmp / "recv")
            times.append(secs)
            nbytes = ann.total_bytes
        pub.close()
    finally:
        if prod is not None:
            prod.close()
        if bus is not None:
            from cluster.bus import topics_admin

            topics_admin.delete_prefix(cfg)
            bus.close()
        if started:
            from cluster.broker import embedded as broker

            broker.stop(cfg)
    best = min(times)
    return {"publish_transport": transport, "publish_bytes": nbytes, "publish_s": best,
            "publish_gb_s": nbytes / best / 1e9, "memcpy_gb_s": memcpy_gb_s(nbytes)}


def run_bench(args, cfg) -> dict:
    from learner import engine as eng

    o = _options(list(getattr(args, "rest", []) or []))
    eng.setup_env(cfg)
    eng.init_distributed()
    from cluster.models.tiny import build_tiny_model, default_tiny_model_dir

    cfg.learner.stage = "ppo"
    cfg.learner.token_budget = max(cfg.learner.token_budget, o.seq)
    tiny = build_tiny_model(default_tiny_model_dir(cfg))
    if o.export:
        from learner import bench_export

        return _rounded(bench_export.run(cfg, [s.strip() for s in o.export.split(",") if s.strip()], tiny))
    with tempfile.TemporaryDirectory(prefix="krl-bench-learner-") as tmpd:
        tmp = Path(tmpd)
        if o.model == "tiny":
            model_path = tiny
        elif o.model == "random-0.5b":
            model_path = _random_model(tmp / "random-0.5b", tiny)
        else:
            from cluster.models.importer import resolve_model_path

            model_path = resolve_model_path(cfg, o.model)  # a folder, or a built-in such as "smollm2"
        if o.trajectories:
            from learner import bench_replay

            train = bench_replay.run(cfg, model_path, o.trajectories, o.stages, o.batch)
        else:
            train = _bench_training(cfg, model_path, o)
        trainer = train.pop("trainer")
        n_params = sum(p.numel() for p in trainer.policy_module().parameters())
        pub = _bench_publish(cfg, trainer, model_path, o, tmp) if o.publishes > 0 else {}
    out = {"model": o.model, "params": n_params, "device": "cuda" if eng.on_gpu() else "cpu",
           "dtype": cfg.learner.dtype, "zero_stage": cfg.learner.zero_stage,
           "deepspeed_json": cfg.learner.deepspeed_json, "batch": o.batch, "seq": o.seq,
           "steps": o.steps, **train, **pub}
    if "plain_tok_s" in out:
        out["ppo_vs_plain"] = out["ppo_tok_s"] / out["plain_tok_s"]
    if pub:
        out["publish_vs_memcpy"] = out["publish_gb_s"] / out["memcpy_gb_s"]
    return _rounded(out)


def _rounded(v):
    if isinstance(v, float):
        return round(v, 4)
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_rounded(x) for x in v]
    return v


def main(argv: list[str] | None = None) -> int:
    """`python -m learner.bench [--set section.field=value ...] [--out file.json] [word=value ...]`."""
    import json
    import sys

    from cluster.config import load

    argv = list(sys.argv[1:] if argv is None else argv)
    sets, rest, out = [], [], ""
    while argv:
        tok = argv.pop(0)
        if tok == "--set" and argv:
            sets.append(argv.pop(0))
        elif tok == "--out" and argv:
            out = argv.pop(0)
        else:
            rest.append(tok)
    logging.basicConfig(level=logging.WARNING)
    text = json.dumps(run_bench(argparse.Namespace(rest=rest), load(None, sets)))
    print(text)
    if out:
        Path(out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
