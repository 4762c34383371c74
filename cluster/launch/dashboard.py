"""Live terminal dashboard for `kernelrl up`, built from the roles' scraped metrics."""
from __future__ import annotations

import sys
import time


def _sum(snaps: dict[str, dict], prefix: str, kind: str, name: str) -> float:
    return sum(s.get(kind, {}).get(name, 0.0) for role, s in snaps.items() if role.startswith(prefix) and s)


def _pct(snaps: dict[str, dict], prefix: str, name: str) -> tuple[float, float, int]:
    p50, p99, n = 0.0, 0.0, 0
    for role, s in snaps.items():
        if role.startswith(prefix) and s and name in s.get("summaries", {}):
            q = s["summaries"][name]
            p50, p99, n = max(p50, q["p50"]), max(p99, q["p99"]), n + q["count"]
    return p50, p99, n


def render(snaps: dict[str, dict], extra: dict, started: float) -> str:
    """One screenful of text: episodes, tool latency, lags, rewards, learner, weights."""
    lines = [f"kernelrl up  —  {time.time() - started:6.0f}s elapsed   (Ctrl-C stops everything cleanly)", ""]
    in_flight = _sum(snaps, "actor", "gauges", "episodes_in_flight")
    done = _sum(snaps, "actor", "counters", "episodes_finished")
    lines.append(f"episodes      in flight {in_flight:4.0f}   finished {done:5.0f}   "
                 f"tasks fed {extra.get('tasks_fed', 0)}")
    for tool in ("compile", "verify", "profile"):
        p50, p99, n = _pct(snaps, "actor", f"tool_latency_s.{tool}")
        if n:
            lines.append(f"tool {tool:8s} p50 {p50 * 1000:7.0f} ms  p99 {p99 * 1000:7.0f} ms  n {n}")
    if extra.get("broker"):
        lines.append(f"broker        {extra['broker']}")
    lags = extra.get("lags", {})
    if lags:
        lines.append("consumer lag  " + "  ".join(f"{k} {v}" for k, v in sorted(lags.items())))
    rewards: dict[str, int] = {}
    for role, s in snaps.items():
        if role.startswith("actor") and s:
            for k, c in s.get("histograms", {}).get("reward", {}).items():
                rewards[k] = rewards.get(k, 0) + c
    if rewards:
        lines.append("rewards       " + "  ".join(f"{k}: {c}" for k, c in sorted(rewards.items(), key=lambda kv: float(kv[0]))))
    learner = next((s for r, s in snaps.items() if r.startswith("learner") and s), None)
    if learner:
        g = learner.get("gauges", {})
        lines.append(f"learner       step {g.get('learner_step', 0):.0f}   loss {g.get('loss', float('nan')):.4f}   "
                     f"policy v{g.get('policy_version', 0):.0f}   trained {learner['counters'].get('trajectories_trained', 0):.0f}")
    versions = {r: s.get("gauges", {}).get("weight_version", 0) for r, s in snaps.items() if r.startswith("actor") and s}
    if versions:
        lines.append("weights       " + "  ".join(f"{r} v{v:.0f}" for r, v in sorted(versions.items())))
    lines.append("")
    lines.append("roles         " + "  ".join(f"{r}{'' if s else '(down)'}" for r, s in sorted(snaps.items())))
    return "\n".join(lines)


class Dashboard:
    """Redraws in place on a terminal; prints a line every `every_s` otherwise (CI logs)."""

    def __init__(self, stream=None, every_s: float = 10.0):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.every_s = every_s
        self.last = 0.0
        self.started = time.time()

    def update(self, snaps: dict[str, dict], extra: dict) -> None:
        now = time.time()
        if not self.tty and now - self.last < self.every_s:
            return
        self.last = now
        text = render(snaps, extra, self.started)
        if self.tty:
            self.stream.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            self.stream.write(text.replace("\n\n", "\n") + "\n---\n")
        self.stream.flush()
