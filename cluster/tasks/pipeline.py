"""The synthesis pipeline: compose candidates -> decontaminate -> execution filter -> task folder.

GPU-sized tasks made on a machine without a GPU are checked through their CPU-sized
twin (same operators and options, smaller sizes): every rule runs on the twin, and the
GPU runtime window is judged on a roofline estimate (recorded as such in the metadata;
``runtime_verified`` is false until a GPU filter run measures it).
"""
from __future__ import annotations

import logging
import random
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from cluster.tasks.dataset import TaskEntry, content_id, next_number, write_index, write_task
from cluster.tasks.filter import DEFAULT_WINDOWS, FilterConfig, Verdict

log = logging.getLogger(__name__)
GENERATOR_VERSION = "2"
# CUDA-Agent-Ops-6K's operator-count mix (REFERENCE.md section 1).
CUDA_AGENT_MIX = {1: 0.034, 2: 0.838, 3: 0.076, 4: 0.028, 5: 0.012}


def parse_mix(text: str) -> dict[int, float]:
    """'1:0.1,2:0.6,3:0.3' -> {1: 0.1, 2: 0.6, 3: 0.3} (weights need not sum to 1)."""
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        k, _, v = part.partition(":")
        try:
            n, w = int(k), float(v)
        except ValueError:
            raise ValueError(f"--mix: expected N:WEIGHT pairs like '2:0.8', got {part!r}") from None
        if not 1 <= n <= 5 or w < 0:
            raise ValueError(f"--mix: operator counts are 1..5 with weights >= 0, got {part!r}")
        out[n] = w
    if not out or sum(out.values()) <= 0:
        raise ValueError(f"--mix: no positive weight in {text!r}")
    return out


@dataclass
class SynthConfig:
    n: int
    backend: str = "cpu"
    out: Path = Path("tasks-synth")
    seed: int = 0
    mix: dict[int, float] = field(default_factory=lambda: dict(CUDA_AGENT_MIX))
    workers: int = 1
    filter: FilterConfig | None = None
    eval_dir: str | None = None  # decontamination set; None = the default KernelBench path; "" = off
    threshold: float = 0.9
    max_candidates: int = 0  # 0 = 25 * n
    verify: str = "auto"  # auto | direct | twin
    task_timeout_s: float = 180.0
    unique_names: bool = True
    llm: object = None  # cluster.tasks.llm.LLMComposer
    llm_share: float = 0.0
    checker: Callable[[list[str], FilterConfig], list[Verdict]] | None = None  # None: local sandboxed children

    def check(self, sources: list[str], fcfg: FilterConfig) -> list[Verdict]:
        if self.checker is not None:
            return self.checker(sources, fcfg)
        from cluster.tasks.filter_runner import filter_sources
        return filter_sources(sources, fcfg, workers=self.workers, timeout_s=self.task_timeout_s)


@dataclass
class SynthReport:
    accepted: list[TaskEntry] = field(default_factory=list)
    candidates: int = 0
    rejected: Counter = field(default_factory=Counter)
    duration_s: float = 0.0

    def summary(self) -> dict:
        levels = Counter(e.level for e in self.accepted)
        ops = Counter(e.metadata.get("n_ops", 0) for e in self.accepted)
        return {"accepted": len(self.accepted), "candidates": self.candidates, "rejected": dict(self.rejected),
                "by_level": dict(sorted(levels.items())), "by_n_ops": dict(sorted(ops.items())),
                "duration_s": round(self.duration_s, 1)}


@dataclass
class _Candidate:
    source: str
    name: str
    n_ops: int
    meta: dict
    check_source: str  # what the filter runs (the source itself, or its CPU twin)


def _verify_mode(sc: SynthConfig) -> str:
    if sc.verify != "auto":
        return sc.verify
    if sc.backend == "cpu" or sc.checker is not None:  # a bus checker measures on the workers' devices
        return "direct"
    try:
        import torch
        return "direct" if torch.cuda.is_available() else "twin"
    except ImportError:
        return "twin"


def _programmatic(sc: SynthConfig, k: int, n_ops: int, mode: str) -> _Candidate | None:
    from cluster.tasks.compose import compose, estimate_flops_bytes, estimate_gpu_ms
    from cluster.tasks.render import render

    cseed = sc.seed * 1_000_003 + k
    comp = compose(n_ops, sc.backend, cseed)
    if comp is None:
        return None
    source = render(comp)
    meta = {"generator": f"compose/{GENERATOR_VERSION}", "seed": cseed, "n_ops": n_ops,
            "ops": [op.describe() for op in comp.ops], "input_shapes": [list(s) for s in comp.input_shapes],
            "output_shape": list(comp.shapes[-1])}
    check = source
    if sc.backend == "cuda":
        flops, nbytes = estimate_flops_bytes(comp)
        meta.update(flops=flops, bytes=nbytes, est_gpu_ms=round(estimate_gpu_ms(comp), 4))
    if mode == "twin":
        twin = compose(n_ops, "cpu", cseed)
        if twin is None or twin.name != comp.name:
            return None
        check = render(twin)
        lo, hi = (sc.filter.window() if sc.filter else DEFAULT_WINDOWS["cuda"])
        if not lo <= meta["est_gpu_ms"] <= hi:
            meta["reject"] = ("runtime_window", f"estimated GPU runtime {meta['est_gpu_ms']} ms outside [{lo}, {hi}]")
        meta.update(verified_on="cpu-twin", twin_seed=cseed, runtime_verified=False)
    else:
        meta.update(verified_on=sc.backend, runtime_verified=True)
    return _Candidate(source, comp.name, n_ops, meta, check)


def _candidates(sc: SynthConfig, start: int, count: int, mode: str, rng: random.Random) -> list[_Candidate]:
    sizes, weights = zip(*sorted(sc.mix.items()))
    out = []
    for k in range(start, start + count):
        n_ops = rng.choices(sizes, weights)[0]
        if sc.llm is not None and rng.random() < sc.llm_share:
            cand = _from_llm(sc, n_ops, mode)
        else:
            cand = _programmatic(sc, k, n_ops, mode)
        if cand is not None:
            out.append(cand)
    return out


def _from_llm(sc: SynthConfig, n_ops: int, mode: str) -> _Candidate | None:
    if mode == "twin":
        return None  # LLM tasks have no twin: they are kept only where the filter can measure them
    try:
        source, name, ops = sc.llm.propose(n_ops, sc.backend)
    except Exception as exc:  # noqa: BLE001 - a bad LLM answer costs one candidate, not the run
        log.info("LLM composition failed: %s", exc)
        return None
    meta = {"generator": "llm", "n_ops": n_ops, "ops": ops, "verified_on": sc.backend, "runtime_verified": True}
    return _Candidate(source, name, n_ops, meta, source)


def synthesize(sc: SynthConfig) -> SynthReport:
    from cluster.tasks.decontam import Decontaminator, default_eval_dir

    t0 = time.monotonic()
    mode = _verify_mode(sc)
    fcfg = sc.filter or FilterConfig(backend=sc.backend)
    check_cfg = replace(fcfg, backend="cpu") if mode == "twin" else fcfg
    if mode == "twin":  # the twin proves semantics; the GPU window was judged on the estimate
        check_cfg = replace(check_cfg, min_ms=0.0, max_ms=10_000.0)
    decon = None
    if sc.eval_dir != "":
        decon = Decontaminator.from_dir(sc.eval_dir or default_eval_dir(), sc.threshold)
    report = SynthReport()
    rng = random.Random(f"mix{sc.seed}")
    seen_src, seen_names = set(), set()
    k, budget = 0, sc.max_candidates or 25 * sc.n
    sc.out.mkdir(parents=True, exist_ok=True)
    while len(report.accepted) < sc.n and report.candidates < budget:
        want = min(budget - report.candidates, max(2 * sc.workers, 2 * (sc.n - len(report.accepted))))
        batch = _candidates(sc, k, want, mode, rng)
        k += want
        report.candidates += want
        ready = []
        for c in batch:
            key = c.name if sc.unique_names else c.source
            if c.source in seen_src or key in seen_names:
                report.rejected["duplicate"] += 1
                continue
            seen_src.add(c.source)
            if "reject" in c.meta:
                report.rejected[c.meta["reject"][0]] += 1
                continue
            if decon is not None:
                dirty, match = decon.is_contaminated(c.source)
                c.meta.update(decontam={"max_similarity": round(match.score, 4), "closest": match.name,
                                        "threshold": sc.threshold})
                if dirty:
                    report.rejected["contaminated"] += 1
                    continue
            ready.append(c)
        verdicts = sc.check([c.check_source for c in ready], check_cfg)
        for c, v in zip(ready, verdicts):
            if not v.ok:
                report.rejected[v.rule] += 1
                log.info("rejected %s: %s (%s)", c.name, v.rule, v.reason[:160])
                continue
            if len(report.accepted) >= sc.n or (sc.unique_names and c.name in seen_names):
                continue
            seen_names.add(c.name)
            c.meta["filter"] = {"eager_ms": round(v.eager_ms, 4), "compiled": check_cfg.check_compile,
                                "compile_backend": check_cfg.compile_backend, "backend": check_cfg.backend}
            report.accepted.append(_write(sc, c))
    write_index(sc.out, report.accepted, meta={"generator_version": GENERATOR_VERSION})
    report.duration_s = time.monotonic() - t0
    return report


def _write(sc: SynthConfig, c: _Candidate) -> TaskEntry:
    level = 1 if c.n_ops == 1 else 2
    entry = TaskEntry(task_id=content_id(c.source, f"synth-{sc.backend}"), name=c.name, file="",
                      backend=sc.backend, level=level, source="synth", metadata=c.meta, model_py=c.source)
    return write_task(sc.out, entry, next_number(sc.out / sc.backend / f"level{level}"))
