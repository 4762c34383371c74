"""Load generator for the sandbox topics: compile/evaluate requests (open loop at a rate, or a saturating closed
loop), latency, lag and throughput report.

Requests come from (task, solution) pairs: the shipped examples of the backend, plus
(with a task corpus such as ../shared/kernelbench) every task file at shrunken shapes
paired with the template solution, which exercises the reference path and fails
verification quickly. Compile requests get a unique comment unless `cache_hits` asks
for repeats, so they really build.
"""
from __future__ import annotations

import ast
import json
import logging
import random
import re
import statistics
import threading
import time
import uuid
from pathlib import Path

from sandbox_workers import stress_timeline, workspace
from sandbox_workers.stress_load import Progress, closed_loop as run_closed, open_loop, partition_keys, \
    topic_partitions, warm_up

log = logging.getLogger(__name__)
SKILLS = Path(__file__).resolve().parent.parent / "skills"


def shrink_task(source: str, cap: int = 64) -> str:
    """Cap every module-level integer constant at `cap` (shapes), leaving the rest of the file alone."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.splitlines()
    known: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            value = _const_value(node.value, known)
            name = node.targets[0].id
            if isinstance(value, int) and not isinstance(value, bool) and value > cap and node.lineno == node.end_lineno:
                lines[node.lineno - 1] = f"{name} = {cap}"
                value = cap
            if value is not None:
                known[name] = value
    return "\n".join(lines) + "\n"


def _const_value(node: ast.AST, known: dict):
    """Value of a constant expression (numbers, known names, + - * // / **), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.Name):
        return known.get(node.id)
    if isinstance(node, ast.BinOp):
        a, b = _const_value(node.left, known), _const_value(node.right, known)
        if a is None or b is None:
            return None
        ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
               ast.FloorDiv: lambda: a // b if b else None, ast.Div: lambda: a / b if b else None}
        fn = ops.get(type(node.op))
        return fn() if fn else None
    return None


def load_pairs(backend: str, tasks_dir: str | None, limit: int = 200,
               examples: str = "*") -> list[tuple[str, str, dict]]:
    """[(task_id, model_py, files)] for the requests (`examples`: a glob over example names)."""
    pairs = []
    for d in sorted((SKILLS / "examples").glob(f"{backend}_{examples}")):
        if (d / "model.py").is_file():
            pairs.append((d.name, (d / "model.py").read_text(), workspace.read_dir(d)))
    if tasks_dir:
        template = workspace.read_dir(SKILLS / "templates" / backend)
        for p in sorted(Path(tasks_dir).rglob("*.py"))[:limit]:
            text = p.read_text(errors="replace")
            if "class Model" in text and "def get_inputs" in text:
                pairs.append((p.stem, shrink_task(text), template))
    if not pairs:
        raise ValueError(f"no tasks: no skills/examples/{backend}_* and nothing usable in {tasks_dir!r}")
    return pairs


def _salted(files: dict, salt: str) -> dict:
    out = dict(files)
    for k in out:
        if k.startswith("kernels/") and re.search(r"\.(cpp|cu|cc)$", k):
            out[k] = out[k] + f"\n// stress {salt}\n"
            break
    return out


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def run_stress(cfg, backend: str, duration_s: float, rate: float, tasks_dir: str | None = None,
               eval_fraction: float = 0.5, cache_hits: float = 0.0, concurrency: int = 64,
               timeout_s: float = 600.0, examples: str = "*", closed_loop: int = 0,
               warmup_partitions: tuple[int, ...] = (), warmup_every_partition: bool = False,
               raw_timeline: str = "") -> dict:
    """Open loop at ``rate`` requests/s; or, with ``closed_loop`` > 0, that many requests kept in flight on every
    partition of the evaluate topic (a saturating load that never builds a backlog). ``warmup_partitions``: one
    evaluation sent to each, all answered before the clock starts (and not counted); ``warmup_every_partition``:
    to each partition of the evaluate topic. ``raw_timeline``: a file to write the gate holds, the requests'
    send/answer times and the NVML samples to (JSON), for a closer look than the report's `timeline`."""
    from cluster.bus.client import Bus, RequestClient
    from cluster.config import jobs_for
    from schemas import topics
    from schemas.messages import CompileRequest, EvaluateRequest, RequestHeader

    pairs = load_pairs(backend, tasks_dir, examples=examples)
    bus = Bus(cfg, client_id=f"stress-{uuid.uuid4().hex[:6]}")
    client = RequestClient(bus, name=bus.client_id)
    rng = random.Random(0)
    lock = threading.Lock()
    rec = {"compile": [], "evaluate": []}
    phases: dict[str, list[float]] = {}  # evaluation phase -> seconds, from each reply's evidence
    busy: dict[str, float] = {}
    # baselines_measured: evaluations that timed the task's baselines (no cached ones, or cached ones too noisy)
    # t_ref_source: where each candidate's reference time came from (measured in its session, or its baselines)
    counts = {"sent": 0, "ok": 0, "failed": 0, "timeouts": 0, "rewards": {}, "baselines_measured": 0,
              "t_ref_source": {}}
    gpu = _GpuSampler() if backend == "cuda" else None
    trial: dict[str, list[float]] = {}  # where a timed trial's wall went, per evaluation (timed_trial)
    holds: list[dict] = []  # every evaluation's device-gate holds (evidence.gate), for the timeline
    events: list[tuple[float, int]] = []  # (time, +1) an evaluation sent, (time, -1) answered or lost
    lag_max = {"compile": 0, "evaluate": 0}

    def one(kind: str, i: int, key: str | None = None, record: bool = True) -> bool:
        """One request and its reply; True when answered. ``record=False`` (the warm-up) leaves no trace."""
        tid, model_py, files = pairs[i % len(pairs)]
        with lock:  # the generator is shared by the sender threads
            salt = f"{i}" if rng.random() >= cache_hits else "0"
        t0 = time.monotonic()
        if kind == "evaluate" and record:
            with lock:
                events.append((t0, 1))
        try:
            if kind == "compile":
                msg = CompileRequest(header=RequestHeader(), episode_id=f"stress-{i}", files=_salted(files, salt),
                                     backend=backend)
                reply = client.request(topics.TOOL_COMPILE, msg, timeout_s=timeout_s, retries=0, key=key)
                ok = reply.ok
            else:
                msg = EvaluateRequest(header=RequestHeader(), episode_id=f"stress-{i}", task_id=tid, model_py=model_py,
                                      files=files, mode="both", backend=backend)
                reply = client.request(topics.evaluate_topic(backend), msg, timeout_s=timeout_s, retries=0, key=key)
                ok = reply.compiled
        except Exception as exc:  # noqa: BLE001 - a lost request is a data point, not a crash of the tool
            if record:
                with lock:
                    if kind == "evaluate":
                        events.append((time.monotonic(), -1))
                    counts["timeouts" if "imeout" in type(exc).__name__ else "failed"] += 1
            else:
                log.warning("warm-up request %d failed: %s: %s", i, type(exc).__name__, exc)
            return False
        lat = time.monotonic() - t0
        if not record:
            return True
        with lock:
            rec[kind].append(lat)
            counts["ok" if ok else "failed"] += 1
            busy[reply.worker] = busy.get(reply.worker, 0.0) + float(reply.duration_s)
            if kind == "evaluate":
                events.append((t0 + lat, -1))
                job = len(events)  # names this reply's holds (the timeline's gaps by active jobs)
                holds.extend(dict(h, job=job) for h in (reply.evidence or {}).get("gate") or [] if isinstance(h, dict))
                cand = (reply.timings or {}).get("candidate") or {}
                for name, sec in timed_trial(cand).items():
                    trial.setdefault(name, []).append(sec)
                counts["rewards"][str(reply.reward)] = counts["rewards"].get(str(reply.reward), 0) + 1
                phases.setdefault("queue_s", []).append(max(0.0, lat - float(reply.duration_s)))
                counts["baselines_measured"] += (reply.evidence or {}).get("baseline_cached") is False
                src = str((reply.evidence or {}).get("t_ref_source", "none"))
                counts["t_ref_source"][src] = counts["t_ref_source"].get(src, 0) + 1
                for name, sec in flat_phases((reply.evidence or {}).get("phases") or {}).items():
                    phases.setdefault(name, []).append(sec)
        return True

    want_keys = closed_loop or warmup_partitions or warmup_every_partition
    keys = partition_keys(topic_partitions(bus, topics.evaluate_topic(backend))) if want_keys else []
    if warmup_every_partition:
        warmup_partitions = tuple(range(len(keys)))
    warm = warm_up(one, [keys[p % len(keys)] for p in warmup_partitions])
    progress = Progress(duration_s, rec, counts)
    t_start = time.monotonic()
    stop_lag = threading.Event()
    lag_thread = threading.Thread(target=_sample_lag, args=(bus, backend, lag_max, stop_lag), daemon=True)
    lag_thread.start()
    if closed_loop:
        run_closed(one, keys, closed_loop, duration_s, eval_fraction, rng, counts, lock, progress)
    else:
        open_loop(one, rate, duration_s, eval_fraction, rng, counts, concurrency, progress)
    wall = time.monotonic() - t_start
    stop_lag.set()
    lag_thread.join(timeout=10)
    client.close()
    end_lag = _lag(bus, backend)
    bus.close()
    done = len(rec["compile"]) + len(rec["evaluate"])
    slots = jobs_for(cfg.sandbox, backend)  # the worker's job slots: saturation is every one of them asked for
    out = {"backend": backend, "duration_s": duration_s, "wall_s": wall, "tasks": len(pairs),
           "jobs_per_device": slots,
           **({"mode": "closed", "in_flight": closed_loop * len(keys)} if closed_loop else {"mode": "open", "rate": rate}),
           "warmup": warm,
           **{k: v for k, v in counts.items()}, "throughput_per_s": done / wall if wall else 0.0,
           "lag_max": lag_max, "lag_end": end_lag,
           "worker_busy_fraction": {w: min(1.0, b / wall) for w, b in busy.items()}}
    for kind, xs in rec.items():
        out[kind] = {"n": len(xs), "p50_s": _pct(xs, 0.5), "p90_s": _pct(xs, 0.9), "p99_s": _pct(xs, 0.99),
                     "mean_s": statistics.fmean(xs) if xs else 0.0}
    out["evaluate_phases"] = {name: {"n": len(xs), "p50_s": _pct(xs, 0.5), "p99_s": _pct(xs, 0.99)}
                              for name, xs in sorted(phases.items())}
    out["timed_trial"] = {name: {"n": len(xs), "p50_s": _pct(xs, 0.5), "p99_s": _pct(xs, 0.99)}
                          for name, xs in sorted(trial.items())}
    out["evaluations_per_min"] = len(rec["evaluate"]) / wall * 60 if wall else 0.0
    if gpu is not None:
        out["gpu_busy"] = gpu.stop()
    if raw_timeline:
        Path(raw_timeline).write_text(json.dumps({"holds": holds, "events": events,
                                                  "samples": gpu.samples if gpu is not None else []}))
    out["timeline"] = stress_timeline.report(gpu.samples if gpu is not None else [], holds, events, slots)
    return out


def timed_trial(cand: dict) -> dict[str, float]:
    """One evaluation's median timed trial, split: the judge's preparation (fresh inputs, expected outputs, sealing),
    staging, the cache flush, the run round trip (of which the candidate's claimed calls), the snapshot and the
    comparison; the trials and calls per trial (from the candidate's timing summary)."""
    tr = cand.get("trusted") or {}
    if not tr or not isinstance(cand.get("median_s"), (int, float)):
        return {}
    out = {k: float(tr[k]) for k in ("prep_s", "stage_s", "flush_s", "run_s", "snapshot_s", "check_s")
           if isinstance(tr.get(k), (int, float))}
    out["claimed_calls_s"] = float(cand["median_s"]) * int(cand.get("batch") or 1)
    out["trials"] = float(cand.get("n") or 0)
    out["batch"] = float(cand.get("batch") or 1)
    return out


def flat_phases(phases: dict, prefix: str = "") -> dict[str, float]:
    """{"candidate": {"probe_s": 1}, "artifact_s": 2} -> {"candidate.probe_s": 1, "artifact_s": 2}."""
    out: dict[str, float] = {}
    for k, v in phases.items():
        if isinstance(v, dict):
            out.update(flat_phases(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)):
            out[prefix + k] = float(v)
    return out


def _lag(bus, backend: str) -> dict:
    from schemas import topics

    try:
        c = bus.lag("compile-workers", [topics.TOOL_COMPILE])[topics.TOOL_COMPILE]
        e = bus.lag(f"eval-workers-{backend}", [topics.evaluate_topic(backend)])[topics.evaluate_topic(backend)]
        return {"compile": c, "evaluate": e}
    except Exception as exc:  # noqa: BLE001 - lag is best-effort evidence
        return {"error": str(exc)}


def _sample_lag(bus, backend: str, lag_max: dict, stop: threading.Event) -> None:
    while not stop.wait(2.0):
        cur = _lag(bus, backend)
        for k in ("compile", "evaluate"):
            if isinstance(cur.get(k), int):
                lag_max[k] = max(lag_max[k], cur[k])


class _GpuSampler:
    """GPU utilisation from NVML every 0.2 s (all visible GPUs), while the stress runs: the mean utilisation (the
    share of each sample period with a kernel running, NVML's definition) and the share of samples not idle."""

    def __init__(self):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            hs = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            while not self._stop.wait(0.2):
                util = statistics.fmean(pynvml.nvmlDeviceGetUtilizationRates(h).gpu for h in hs)
                self.samples.append((time.monotonic(), util))
        except Exception as exc:  # noqa: BLE001 - no NVML: report nothing
            log.warning("GPU sampling unavailable: %s", exc)

    def stop(self) -> dict:
        self._stop.set()
        self._t.join(timeout=5)
        xs = [u for _, u in self.samples]
        return {"mean_util_pct": statistics.fmean(xs) if xs else None, "n": len(xs), "interval_s": 0.2,
                "busy_fraction": statistics.fmean(x / 100.0 for x in xs) if xs else None,
                "nonidle_fraction": sum(x > 0 for x in xs) / len(xs) if xs else None}
