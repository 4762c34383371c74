"""KernelBench metrics over per-task evaluation results, per level tables, JSON and a PNG plot.

Definitions (KernelBench): fast_p = share of ALL tasks that are correct AND whose
speed-up over the baseline is strictly greater than p (fast_0 = the pass rate);
geometric-mean speed-up over the correct tasks. Two baselines: eager PyTorch and
torch.compile. A task without a solution counts as not correct. Speed-ups above
10x are counted as suspicious (REFERENCE.md section 2).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

P_VALUES = (0.0, 0.8, 1.0, 1.5, 2.0)
SUSPICIOUS = 10.0


@dataclass
class TaskResult:
    task_id: str
    name: str = ""
    level: int = 0
    backend: str = "cpu"
    has_solution: bool = True
    compiled: bool = False
    correct: bool = False
    speedup_vs_eager: float = 0.0
    speedup_vs_compile: float = 0.0
    reward: float = -1.0
    error: str = ""
    violations: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)
    duration_s: float = 0.0

    @classmethod
    def from_eval(cls, task_id: str, name: str, level: int, backend: str, r: dict[str, Any]) -> "TaskResult":
        timings = {}
        for k, t in (r.get("timings") or {}).items():
            if isinstance(t, dict) and t.get("median_s"):
                timings[k] = round(t["median_s"] * 1e3, 6)
        return cls(task_id=task_id, name=name, level=level, backend=backend, has_solution=True,
                   compiled=bool(r.get("compiled")), correct=bool(r.get("correct")),
                   speedup_vs_eager=float(r.get("speedup_vs_eager") or 0.0),
                   speedup_vs_compile=float(r.get("speedup_vs_compile") or 0.0), reward=float(r.get("reward", -1.0)),
                   error=str(r.get("error") or "")[:2000], violations=list(r.get("violations") or []),
                   timings_ms=timings, duration_s=float(r.get("duration_s") or 0.0))

    def to_dict(self) -> dict:
        return asdict(self)


def fast_p(results: list[TaskResult], p: float, baseline: str) -> float:
    if not results:
        return 0.0
    key = f"speedup_vs_{baseline}"
    return sum(1 for r in results if r.correct and getattr(r, key) > p) / len(results)


def geomean_speedup(results: list[TaskResult], baseline: str) -> float:
    vals = [getattr(r, f"speedup_vs_{baseline}") for r in results if r.correct]
    vals = [v for v in vals if v > 0]
    if not vals:
        return 0.0
    return math.exp(sum(math.log(v) for v in vals) / len(vals))


def summarize(results: list[TaskResult]) -> dict:
    n = len(results)
    out = {
        "n": n,
        "with_solution": sum(r.has_solution for r in results),
        "compiled": sum(r.compiled for r in results),
        "correct": sum(r.correct for r in results),
        "pass_rate": (sum(r.correct for r in results) / n) if n else 0.0,
        "fast_1_vs_eager": fast_p(results, 1.0, "eager"),
        "fast_1_vs_compile": fast_p(results, 1.0, "compile"),
        "geomean_speedup_vs_eager": geomean_speedup(results, "eager"),
        "geomean_speedup_vs_compile": geomean_speedup(results, "compile"),
        "fast_p": {b: {f"{p:g}": fast_p(results, p, b) for p in P_VALUES} for b in ("eager", "compile")},
        "suspicious": sum(1 for r in results if r.correct and max(r.speedup_vs_eager, r.speedup_vs_compile)
                          > SUSPICIOUS),
    }
    return out


def report(results: list[TaskResult], meta: dict | None = None) -> dict:
    levels = sorted({r.level for r in results})
    return {"meta": meta or {}, "overall": summarize(results),
            "levels": {str(lv): summarize([r for r in results if r.level == lv]) for lv in levels},
            "tasks": [r.to_dict() for r in results]}


def table(rep: dict) -> str:
    """A fixed-width per-level table of the report's headline numbers."""
    head = f"{'level':>6} {'n':>4} {'pass':>7} {'fast1_eager':>12} {'fast1_compile':>14} {'geo_eager':>10} " \
           f"{'geo_compile':>12}"
    rows = [head, "-" * len(head)]
    for name, s in [*rep["levels"].items(), ("all", rep["overall"])]:
        rows.append(f"{name:>6} {s['n']:>4} {s['pass_rate']:>7.1%} {s['fast_1_vs_eager']:>12.1%} "
                    f"{s['fast_1_vs_compile']:>14.1%} {s['geomean_speedup_vs_eager']:>9.3f}x "
                    f"{s['geomean_speedup_vs_compile']:>11.3f}x")
    return "\n".join(rows)


def plot(rep: dict, path: str, title: str = "kernelrl eval") -> str:
    """Two panels: per-level pass rate and fast_1 bars; fast_p curves over p for both baselines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = [TaskResult(**t) for t in rep["tasks"]]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [*rep["levels"].keys(), "all"]
    stats = [*rep["levels"].values(), rep["overall"]]
    width = 0.26
    for i, (key, label) in enumerate((("pass_rate", "pass rate"), ("fast_1_vs_eager", "fast_1 vs eager"),
                                      ("fast_1_vs_compile", "fast_1 vs torch.compile"))):
        xs = [j + (i - 1) * width for j in range(len(names))]
        bars = ax1.bar(xs, [s[key] for s in stats], width, label=label)
        ax1.bar_label(bars, labels=[f"{s[key]:.0%}" for s in stats], fontsize=7, padding=1)
    ax1.set_xticks(range(len(names)), [f"L{n}" if n != "all" else "all" for n in names])
    ax1.set_ylim(0, 1.05)
    ax1.set_ylabel("share of tasks")
    ax1.legend(fontsize=8)
    ax1.set_title("per level")
    ps = [i / 20 for i in range(0, 61)]
    for base in ("eager", "compile"):
        ax2.plot(ps, [fast_p(tasks, p, base) for p in ps], label=f"vs {'torch.compile' if base == 'compile' else base}")
    ax2.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax2.set_xlabel("speed-up threshold p")
    ax2.set_ylabel("fast_p")
    ax2.set_ylim(0, 1.05)
    ax2.legend(fontsize=8)
    ax2.set_title("fast_p")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
