"""`kernelrl stress sandbox --workers 1,2`: the evaluation rate with 1, 2, ... evaluation workers this tool starts
itself, and the scaling efficiency (r_N / N) / (r_1 / 1).

Each step has its own topics and consumer groups (a fresh topic prefix under the configured one), so no backlog
of one step is served in the next. Its workers are `kernelrl compile-worker` / `eval-worker` subprocesses on the
resolved configuration (as `kernelrl up` starts them), each CPU evaluation worker pinned to its own cores
(`sandbox.cpu_cores`); the step waits until their consumer groups are stable, loads them at saturation with a
closed loop (stress.run_stress), stops them with SIGTERM (exit codes reported), and deletes its topics.

Every step gives each evaluation worker the same number of cores (the allowed cores over the largest count), so
the steps differ in the number of workers only; where the cores do not allow that cleanly the report's `note`
says how the timings are affected instead of hiding it.
"""
from __future__ import annotations

import copy
import logging
import os
import time
import uuid
from pathlib import Path

from cluster.config import jobs_for
from cluster.errors import KernelRLError

log = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # a fresh worker imports torch and starts its sandboxes: a minute on 2 loaded cores
STOP_GRACE_S = 60.0
IN_FLIGHT_PER_WORKER = 2  # the load has drained when the workers are stopped: they are between jobs


def parse_counts(spec: str) -> list[int]:
    """"1,2" -> [1, 2]; every count >= 1."""
    try:
        counts = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--workers: expected worker counts like 1,2; got {spec!r}") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"--workers: expected worker counts >= 1 like 1,2; got {spec!r}")
    return counts


def plan_cores(counts: list[int], allowed: list[int], per_worker: int = 0, threads: int = 0) -> dict:
    """The cores of each CPU evaluation worker at each step: ``per_worker`` in every step, disjoint while the allowed
    cores last, and the notes on what sharing them does to the timings. The default leaves one core to the rest
    (broker, compile worker, load generator), where there are enough: (allowed - 1) // largest count, at least 1."""
    from sandbox_workers import cpuset

    top = max(counts)
    per = per_worker or max(1, (len(allowed) - 1) // top)
    sets = {n: [[allowed[(i * per + k) % len(allowed)] for k in range(per)] for i in range(n)] for n in counts}
    notes = []
    if top * per > len(allowed):
        notes.append(f"{top} workers x {per} core(s) > {len(allowed)} allowed cores: workers share cores, so their "
                     "timings contend and the rate is bounded by the cores, not by the workers")
    elif top * per == len(allowed):
        notes.append(f"{top} workers x {per} core(s) take all {len(allowed)} allowed cores: the broker, the compile "
                     "worker, this load generator and the machine's other work run on the evaluation workers' cores, "
                     "which slows their jobs and adds noise to their timings (efficiency is a lower bound here)")
    if threads > per:
        notes.append(f"sandbox.cpu_threads={threads} > {per} core(s) per worker: every evaluation oversubscribes "
                     "its cores")
    return {"cores_per_worker": per, "allowed": cpuset.format_list(allowed), "notes": notes,
            "sets": {n: [cpuset.format_list(sorted(set(s))) for s in ss] for n, ss in sets.items()}}


def efficiency(counts: list[int], rates: list[float]) -> list[float | None]:
    """Per-worker rate of each step over the first step's per-worker rate (1.0 = linear scaling)."""
    base = rates[0] / counts[0] if rates and rates[0] > 0 else 0.0
    return [round(r / n / base, 4) if base else None for n, r in zip(counts, rates)]


def run_scaling(cfg, backend: str, counts: list[int], duration_s: float, *, tasks_dir: str | None = None,
                eval_fraction: float = 1.0, cache_hits: float = 0.0, timeout_s: float = 600.0, examples: str = "*",
                cores_per_worker: int = 0, compile_workers: int = 1) -> dict:
    """One step per worker count (in the order given): {"scaling": {...}, "steps": [each step's stress report]}."""
    from cluster.config import cache_path
    from sandbox_workers import cpuset

    run_id = f"scale{time.strftime('%H%M%S')}{uuid.uuid4().hex[:4]}"
    run_dir = cache_path(cfg, "stress", run_id)
    plan = None
    if backend == "cpu":
        allowed = cpuset.parse(cfg.sandbox.cpu_cores) if cfg.sandbox.cpu_cores else cpuset.available()
        plan = plan_cores(counts, allowed, cores_per_worker, cfg.sandbox.cpu_threads)
        for note in plan["notes"]:
            log.warning("stress scaling: %s", note)
    load = {"tasks_dir": tasks_dir, "eval_fraction": eval_fraction, "cache_hits": cache_hits,
            "timeout_s": timeout_s, "examples": examples}
    steps = []
    for k, n in enumerate(counts):
        log.info("stress scaling: step %d/%d: %d evaluation worker(s)%s, %.0f s of load (logs: %s)", k + 1,
                 len(counts), n, f" on cores {plan['sets'][n]}" if plan else "", duration_s, run_dir)
        step = _step(cfg, backend, n, f"{run_id}-w{n}", run_dir, plan, duration_s, load, compile_workers)
        log.info("stress scaling: step %d/%d done: %.2f evaluations/min with %d worker(s)", k + 1, len(counts),
                 step["evaluations_per_min"], n)
        steps.append(step)
    rates = [s["evaluations_per_min"] for s in steps]
    scaling = {"workers": counts, "evaluations_per_min": rates, "efficiency": efficiency(counts, rates),
               "cores": os.cpu_count(), "cores_per_worker": plan["cores_per_worker"] if plan else None,
               "cpu_sets": {str(n): s for n, s in plan["sets"].items()} if plan else None,
               "loadavg_1m": [s["loadavg"] for s in steps],
               "workers_exited_cleanly": all(s["workers_exit"]["clean"] for s in steps)}
    if plan and plan["notes"]:
        scaling["note"] = " ".join(plan["notes"])
    return {"backend": backend, "duration_s": duration_s, "run_dir": str(run_dir), "scaling": scaling,
            "steps": steps}


def _step(cfg, backend: str, n: int, prefix: str, run_dir: Path, plan: dict | None, duration_s: float, load: dict,
          compile_workers: int) -> dict:
    """One step: fresh topics, n evaluation workers (+ compile workers), ready, loaded, stopped, topics deleted."""
    from cluster.bus import topics_admin
    from cluster.bus.client import Bus
    from cluster.config import ENV_PREFIX, dump_toml
    from cluster.launch.supervisor import Supervisor, kernelrl_argv
    from sandbox_workers.stress import run_stress

    step_cfg = copy.deepcopy(cfg)
    step_cfg.bus.topic_prefix = f"{cfg.bus.topic_prefix}{prefix}."
    # one partition of the tool topics per worker: every assignor gives each worker exactly one, so the closed loop
    # keeps each worker's share queued (a random spread leaves some worker idle for 1/(in flight + 1) of the time)
    step_cfg.topics.tool_partitions = n
    bus = Bus(step_cfg, client_id=f"stress-{prefix}")
    bus.ensure_topics()
    config = run_dir / f"{prefix}.toml"
    config.write_text(dump_toml(step_cfg))
    # the written config is fully resolved: KRL__ variables must not be applied again on top (the step's prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    sup = Supervisor(run_dir / f"{prefix}-logs", kernelrl_argv(str(config)), base_env=env)
    sup.metrics_host = step_cfg.cluster.metrics_host
    loadavg = [round(os.getloadavg()[0], 2)]
    try:
        for spec in _roles(backend, n, plan, compile_workers):
            sup.add(spec)
        ready_s = _wait_ready(bus, sup, backend, n, compile_workers)
        log.info("stress scaling: %d worker(s) ready after %.0f s; warm-up, then the load", n, ready_s)
        # two in flight per worker: one running, one queued behind it (so no gap between jobs), and a drain of at
        # most two jobs per worker after the duration; a worker running sandbox.jobs_per_device jobs at once gets
        # one more than that in flight
        in_flight = max(IN_FLIGHT_PER_WORKER, jobs_for(step_cfg.sandbox, backend) + 1)
        report = run_stress(step_cfg, backend, duration_s, rate=1.0, closed_loop=in_flight,
                            warmup_partitions=tuple(range(n)), **load)
    finally:
        exits = _stop(sup)
        loadavg.append(round(os.getloadavg()[0], 2))
        try:
            topics_admin.delete_prefix(step_cfg, bus.bootstrap)
        except Exception as exc:  # noqa: BLE001 - leftover topics must not hide the step's result or error
            log.warning("deleting the topics of %s: %s", prefix, exc)
        bus.close()
    report.update({"workers": n, "topic_prefix": step_cfg.bus.topic_prefix, "tool_partitions": n,
                   "ready_s": round(ready_s, 1),
                   "cpu_sets": plan["sets"][n] if plan else None, "loadavg": loadavg, "workers_exit": exits})
    return report


def _roles(backend: str, n: int, plan: dict | None, compile_workers: int) -> list:
    from cluster.launch.supervisor import RoleSpec

    specs = [RoleSpec(f"compile-worker-{i}", ["compile-worker"], restart=False) for i in range(compile_workers)]
    for i in range(n):
        if backend == "cuda":
            specs.append(RoleSpec(f"eval-worker-{i}", ["eval-worker", "--device", str(i)], restart=False))
        else:  # the worker pins itself (and so its sandboxes) to these cores before anything else
            cores = ["--set", f"sandbox.cpu_cores={plan['sets'][n][i]}"]
            specs.append(RoleSpec(f"eval-worker-{i}", [*cores, "eval-worker", "--device", "cpu"], restart=False))
    return specs


def _wait_ready(bus, sup, backend: str, n: int, compile_workers: int, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Seconds until both consumer groups are stable with every worker a member (requests sent before a worker
    joins would queue behind the others'); a worker that dies meanwhile fails the step with its log's tail."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    from cluster.bus.clients import admin_kwargs
    from cluster.errors import is_retriable

    want = {bus.group(f"eval-workers-{backend}"): n, bus.group("compile-workers"): compile_workers}
    admin = KafkaAdminClient(**admin_kwargs(bus.cfg, f"{bus.client_id}-ready", bus.bootstrap))
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < timeout_s:
            _fail_if_dead(sup)
            try:
                groups = admin.describe_groups(list(want))
            except KafkaError as exc:  # no coordinator yet (a fresh broker creates __consumer_offsets first)
                if not is_retriable(exc):
                    raise
                groups = {}
            if all(_stable(groups, g, members) for g, members in want.items()):
                return time.monotonic() - t0
            time.sleep(1.0)
    finally:
        admin.close()
    raise KernelRLError(f"the workers' consumer groups were not stable after {timeout_s:.0f} s (logs: {sup.log_dir})")


def _stable(groups: dict, group: str, members: int) -> bool:
    g = groups.get(group) or {}
    return g.get("group_state") == "Stable" and len(g.get("members") or ()) == members


def _fail_if_dead(sup) -> None:
    for name, rp in sup.roles.items():
        if not rp.alive:
            tail = rp.log_path.read_text(errors="replace")[-2000:] if rp.log_path.is_file() else ""
            raise KernelRLError(f"{name} exited with {rp.proc.returncode} before serving; its log ends:\n{tail}")


def _stop(sup) -> dict:
    """SIGTERM every worker; their exit codes, and who outlived the grace and was killed."""
    sup.stop(grace_s=STOP_GRACE_S)
    codes = {name: rp.proc.returncode for name, rp in sup.roles.items() if rp.proc is not None}
    clean = all(c == 0 for c in codes.values()) and not sup.killed_at_stop
    if not clean:
        log.warning("stress scaling: workers did not all exit cleanly: %s, killed: %s", codes, sup.killed_at_stop)
    return {"codes": codes, "killed": list(sup.killed_at_stop), "clean": clean}
