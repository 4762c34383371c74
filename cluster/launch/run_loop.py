"""The body of `kernelrl up` (and `kernelrl chaos`): bring the cluster up, watch it,
optionally inject faults, bring it down, and write the report."""
from __future__ import annotations

import copy
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path

from cluster.launch import report as report_mod
from cluster.config import ENV_PREFIX, Config, cache_path, dump_toml
from cluster.launch.dashboard import Dashboard
from cluster.launch.supervisor import RoleSpec, Supervisor, kernelrl_argv

log = logging.getLogger(__name__)

ACTOR_GROUP = "actors"
TINY_MAX_TURNS, TINY_MAX_NEW_TOKENS, TINY_BATCH = 4, 64, 4
REAL_MAX_NEW_TOKENS, REAL_MAX_CONTEXT, REAL_KV_CACHE_MB, REAL_LOGIT_CHUNK = 256, 4096, 512, 512
DEMO_SCRIPT = ('<tool_call>{"name": "compile", "arguments": {}}</tool_call>',
               '<tool_call>{"name": "verify", "arguments": {}}</tool_call>',
               '<tool_call>{"name": "finish", "arguments": {}}</tool_call>')


def _builtin_tasks() -> Path:
    return Path(__file__).resolve().parents[1] / "tasks" / "builtin"


def _ensure_broker(cfg: Config) -> bool:
    """Start the embedded broker unless a cluster is configured or it runs; True if we started it."""
    from cluster.broker import embedded as broker

    if cfg.bus.bootstrap_servers:
        return False
    if broker.status(cfg)["running"]:
        return False
    log.info("starting the embedded Kafka broker")
    broker.start(cfg, tie_to_parent=True)  # a killed `kernelrl up` leaves no JVM behind
    return True


def _child_config(cfg: Config, run_id: str) -> Config:
    from cluster.broker import embedded as broker

    child = copy.deepcopy(cfg)
    child.bus.bootstrap_servers = broker.bootstrap_servers(cfg)
    if cfg.cluster.isolate_runs:
        child.bus.topic_prefix = f"{cfg.bus.topic_prefix}{run_id}."
    from cluster.models.importer import is_tiny, resolve_model_path

    # Named built-ins ("smollm2", "tiny") become folders here, once, before any role starts.
    if is_tiny(child.actor.model_path):
        child.actor.model_path = ""  # the tiny model, with its episode caps below
    child.actor.model_path = resolve_model_path(cfg, child.actor.model_path)
    child.learner.model_path = resolve_model_path(cfg, child.learner.model_path)
    child.learner.critic_model_path = resolve_model_path(cfg, child.learner.critic_model_path)
    if child.actor.policy == "vllm" and not child.actor.model_path and not is_tiny(cfg.cluster.model):
        from cluster.errors import InputError
        from cluster.models.importer import BUILTINS

        if cfg.cluster.model.strip().lower() not in BUILTINS and not os.path.isdir(cfg.cluster.model):
            raise InputError(f"cluster.model: {cfg.cluster.model!r} is neither a built-in model "
                             f"({', '.join(sorted(BUILTINS))}, tiny) nor a model folder")
        child.actor.model_path = resolve_model_path(cfg, cfg.cluster.model)
        _real_model_caps(child)
    elif child.actor.policy == "vllm" and not child.actor.model_path:
        from cluster.models.tiny import build_tiny_model, default_tiny_model_dir

        child.actor.model_path = str(build_tiny_model(default_tiny_model_dir(cfg)))
        # The tiny random model writes no kernels: keep its episodes short so a laptop
        # run shows the whole loop (and its learner steps) within minutes.
        child.actor.max_turns = min(child.actor.max_turns, TINY_MAX_TURNS)
        child.actor.max_new_tokens = min(child.actor.max_new_tokens, TINY_MAX_NEW_TOKENS)
        child.learner.batch_trajectories = min(child.learner.batch_trajectories, TINY_BATCH)
        log.info("tiny model: episodes capped at %d turns x %d tokens, batches of %d", child.actor.max_turns,
                 child.actor.max_new_tokens, child.learner.batch_trajectories)
    if not child.learner.model_path:
        child.learner.model_path = child.actor.model_path
    if child.learner.stages:  # the schedule decides how long the learner runs
        from learner.stages import Schedule

        child.cluster.max_steps = Schedule.from_config(child.learner).total_steps
    return child


def _real_model_caps(child: Config) -> None:
    """`kernelrl up`'s default model (cluster.model) on a CPU machine: single-turn episodes (the recipe's
    warm-up form: one reply holding the whole solution) of at most REAL_MAX_NEW_TOKENS, small batches, and a
    KV cache that holds the context, so a 2-core laptop finishes the default run in minutes. A model the user
    names in actor.model_path runs with the configuration as given."""
    if child.sandbox.backend != "cpu":
        return
    a = child.actor
    a.episode_mode = "single_turn"
    a.max_new_tokens = min(a.max_new_tokens, REAL_MAX_NEW_TOKENS)
    a.max_context_tokens = min(a.max_context_tokens, REAL_MAX_CONTEXT)
    a.kv_cache_mb = max(a.kv_cache_mb, REAL_KV_CACHE_MB)
    lc = child.learner
    lc.batch_trajectories = min(lc.batch_trajectories, TINY_BATCH)
    # a 49k-token vocabulary: [positions, vocab] fp32 logits are 200 KB per position; one episode per
    # micro-batch and 512 positions per log-prob chunk bound the learner's peak
    lc.token_budget = min(lc.token_budget, a.max_context_tokens)
    lc.logit_chunk = min(lc.logit_chunk, REAL_LOGIT_CHUNK)
    log.info("model %s on CPU: single-turn episodes of <= %d tokens, batches of %d", a.model_path, a.max_new_tokens,
             lc.batch_trajectories)


def _roles(cfg: Config, gpus: list | None = None) -> list[RoleSpec]:
    return _plan(cfg, gpus)[0]


def _plan(cfg: Config, gpus: list | None = None) -> tuple[list[RoleSpec], dict | None]:
    """The role specs `up` starts, and (cuda backend) where each role's GPUs are: the placement's description
    for the report, None on the CPU backend. ``gpus``: NVML's list (tests inject a fake one)."""
    c = cfg.cluster
    placement = None
    if cfg.sandbox.backend == "cuda":
        from cluster.launch import placement as pl

        gpus = pl.nvml_gpus() if gpus is None else gpus
        vllm_actors = c.actors if cfg.actor.policy == "vllm" else 0
        placement = pl.place(gpus, c.learner_ranks, vllm_actors,
                             cfg.actor.tensor_parallel_size * cfg.actor.pipeline_parallel_size, c.eval_workers)
    specs = [RoleSpec(f"compile-worker-{i}", ["compile-worker"]) for i in range(c.compile_workers)]
    if placement is not None:
        specs += [RoleSpec(f"eval-worker-{i}", ["eval-worker", "--device", str(g.index)])  # pins by NVML UUID
                  for i, g in enumerate(placement.eval_workers)]
    else:
        n_eval = c.eval_workers or 1
        specs += [RoleSpec(f"eval-worker-{i}", [*cores, "eval-worker", "--device", "cpu"])
                  for i, cores in enumerate(_cpu_slices(cfg, n_eval))]
    # an actor finishes its running episodes for up to actor.shutdown_grace_s, then closes its engine
    actor_grace = cfg.actor.shutdown_grace_s + 30.0
    for i in range(c.actors):
        env = _gpu_env(placement.actors[i]) if placement is not None and placement.actors else {}
        specs.append(RoleSpec(f"actor-{i}", ["actor", "--id", f"actor-{i}"], env=env, grace_s=actor_grace,
                              stop_first=True))
    specs += [RoleSpec(f"actor-scripted-{i}", ["--set", "actor.policy=scripted", "actor", "--id", f"actor-scripted-{i}"],
                       grace_s=actor_grace, stop_first=True) for i in range(c.scripted_actors)]
    learner_grace = 300.0
    launcher = []
    if c.learner_ranks > 1:
        # one process per rank; torchrun hands each RANK/LOCAL_RANK/WORLD_SIZE/MASTER_*, forwards SIGTERM, and
        # waits --shutdown-timeout for the ranks to finish their step and checkpoint before it SIGKILLs them
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(c.learner_ranks),
                    "--shutdown-timeout", str(int(learner_grace - 30))]
    specs.append(RoleSpec("learner", ["learner", "--max-steps", str(c.max_steps)], main=True, grace_s=learner_grace,
                          env=_gpu_env(placement.learner) if placement is not None else {}, launcher=launcher))
    described = placement.describe() if placement is not None else None
    if described is not None:
        log.log(logging.WARNING if placement.shared else logging.INFO, "GPU placement (NVML indices): %s%s",
                described, " (roles share a GPU: evaluation timings contend with them)" if placement.shared else "")
    return specs, described


def _gpu_env(gpus: list) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES by UUID (NVML's order and CUDA's may differ; a UUID names one GPU either way)."""
    from cluster.launch.placement import visible_devices

    return {"CUDA_VISIBLE_DEVICES": visible_devices(gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def _cpu_slices(cfg: Config, n: int) -> list[list[str]]:
    """Per CPU evaluation worker, the --set that gives it its own cores (none for a single worker)."""
    from sandbox_workers import cpuset

    if n == 1 and not cfg.sandbox.cpu_cores:
        return [[]]
    cores = cpuset.parse(cfg.sandbox.cpu_cores) if cfg.sandbox.cpu_cores else cpuset.available()
    return [["--set", f"sandbox.cpu_cores={cpuset.format_list(part)}"] for part in cpuset.split(cores, n)]


def _gates(bus, cfg: Config, tasks: list) -> list[tuple[str, str, int]]:
    """(group, topic, lag limit) per backlog the feeder waits on: the actors' tasks, and (unless scripted actors
    run) the learner's trajectories, widened by the held-out tasks' share, whose episodes the learner reads but
    never trains on."""
    from schemas import topics

    in_flight = max(2, cfg.actor.concurrency * (cfg.cluster.actors + cfg.cluster.scripted_actors))
    ahead = cfg.learner.batch_trajectories * (cfg.learner.max_staleness + 1)
    gates = [(bus.group(ACTOR_GROUP), topics.TASKS, in_flight)]
    if not cfg.cluster.scripted_actors:
        # Scripted trajectories are never trained on (no log-probs), so with scripted actors
        # a trajectory backlog could fill up with them and starve the trainable ones.
        limit = max(ahead - in_flight, cfg.learner.batch_trajectories)
        held = sum(1 for t in tasks if t.metadata.get("heldout"))
        gates.append((bus.group("learner"), topics.TRAJECTORIES, -(-limit * len(tasks) // max(1, len(tasks) - held))))
    return gates


class _Stop:
    """SIGINT/SIGTERM set a flag the main loop reads; a second signal is not needed."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.reason = ""

    def __call__(self, signum, _frame) -> None:
        self.reason = signal.Signals(signum).name
        self.event.set()


def _lags(bus) -> dict:
    from cluster.bus.lag import group_lag
    from schemas import topics

    out = {}
    for name, group, topic in (("tasks", ACTOR_GROUP, topics.TASKS),
                               ("compile", "compile-workers", topics.TOOL_COMPILE),
                               ("evaluate", f"eval-workers-{bus.cfg.sandbox.backend}",
                                topics.evaluate_topic(bus.cfg.sandbox.backend)),
                               ("trajectories", "learner", topics.TRAJECTORIES)):
        try:
            out[name] = group_lag(bus, bus.group(group), [topic])[topic]
        except Exception as exc:  # noqa: BLE001 - a dashboard figure must never stop the run
            log.debug("lag of %s: %s", name, exc)
    return out


def run_cluster(cfg: Config, chaos_every_s: float = 0.0, dashboard: bool = True,
                config_path: str | None = None, overrides: list[str] | None = None,
                chaos_broker: bool = False, chaos_seed: int | None = None, chaos_repeat: bool = False) -> dict:
    """Run the loop and write its report; a failure ends the run with a report saying why, not a traceback."""
    from cluster.broker.watch import BrokerWatch

    run_id = time.strftime("%Y%m%d-%H%M%S")
    run_dir = cache_path(cfg, "runs", run_id)
    stop = _Stop()
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    run = {"sup": None, "feeder": None, "watch": None}
    owned_broker = False
    try:
        owned_broker = _ensure_broker(cfg)
        run["watch"] = BrokerWatch(cfg, owned_broker)
        chaos = _Chaos(chaos_every_s, chaos_seed, run["watch"] if chaos_broker else None, repeat=chaos_repeat)
        return _run(cfg, run_id, run_dir, stop, run, chaos, dashboard)
    except Exception as exc:  # every way the run can end gets a report saying why
        log.error("the run failed: %s: %s", type(exc).__name__, exc)
        log.debug("the run failed", exc_info=True)
        return report_mod.write(_failure_report(run_id, run_dir, stop, run, exc), cfg.cluster.report_path)
    finally:
        for key in ("feeder", "sup"):
            if run[key] is not None:
                run[key].stop()
        for s, h in old.items():
            signal.signal(s, h)
        if owned_broker:
            from cluster.broker import embedded as broker

            broker.stop(cfg)


def _run(cfg: Config, run_id: str, run_dir: Path, stop: _Stop, run: dict, chaos: "_Chaos", dashboard: bool) -> dict:
    from cluster.bus.client import Bus
    from cluster.launch.feeder import Feeder, load_task_files

    child = _child_config(cfg, run_id)
    specs, gpu_placement = _plan(child)  # before anything starts: a layout that does not fit is the run's error
    (run_dir / "config.toml").write_text(dump_toml(child))
    bus = Bus(child, client_id="kernelrl-up")
    bus.ensure_topics()
    tasks = load_task_files(child.cluster.task_dir or _builtin_tasks(), backend=child.sandbox.backend)
    if child.cluster.heldout_task_dir:
        from cluster.launch.feeder import load_heldout_tasks

        tasks += load_heldout_tasks(child.cluster.heldout_task_dir, tasks, backend=child.sandbox.backend)
    for t in tasks:  # read by scripted actors only: real tool traffic through the workers
        t.metadata["scripted_turns"] = list(DEMO_SCRIPT)
    feeder = run["feeder"] = Feeder(bus, tasks, _gates(bus, child, tasks)).start()
    # The written config is fully resolved (env and --set included): children must not
    # re-apply KRL__ overrides on top of it (the run's own topic prefix would be lost).
    env = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    sup = run["sup"] = Supervisor(run_dir / "logs", kernelrl_argv(str(run_dir / "config.toml")), base_env=env,
                                  subreaper=True)
    sup.keep_pids = run["watch"].pids  # the broker is ours, not an orphan
    sup.metrics_host = child.cluster.metrics_host
    for spec in specs:
        sup.add(spec)
    demos = _start_demonstrations(child, tasks)
    snaps = _watch(sup, bus, feeder, child, stop, chaos, run["watch"],
                   Dashboard(every_s=2.0 if dashboard else 10.0))
    feeder.stop()
    sup.stop()
    result = report_mod.durable_invariants(bus, bus.group(ACTOR_GROUP))
    result.update({
        "run_id": run_id, "run_dir": str(run_dir), "stopped_by": stop.reason or "learner finished",
        "weight_versions_applied_min": report_mod.applied_min(snaps),
        "role_throughput_per_s": report_mod.role_throughput(snaps),
        "restarts": {n: rp.starts - 1 for n, rp in sup.roles.items()},
        "chaos_kills": {n: rp.kills for n, rp in sup.roles.items() if rp.kills},
        "chaos_seed": chaos.seed,
        "killed_at_stop": list(sup.killed_at_stop),  # roles that outlived their SIGTERM grace
        "orphans_killed": list(sup.orphans_killed),  # processes a dead role left behind (a vLLM engine)
        "tasks_fed": feeder.published,
        "demonstrations": demos.result if demos is not None else None,
        "gpu_placement": gpu_placement,  # role -> NVML GPU indices (cuda backend), None on CPU
        **run["watch"].report(),
    })
    result["ok"] = (result["learner_steps"] >= child.cluster.max_steps and result["trajectories_lost"] == 0
                    and result["tool_calls_lost"] == 0 and result["trajectories_trained_twice"] == 0)
    return report_mod.write(result, cfg.cluster.report_path)


class _Demonstrations(threading.Thread):
    """Replays the tasks' known solutions as RFT demonstrations while the roles start (actors/demos.py)."""

    def __init__(self, cfg: Config, tasks: list, count: int) -> None:
        super().__init__(name="demonstrations", daemon=True)
        self.cfg, self.tasks, self.count, self.result = cfg, tasks, count, None

    def run(self) -> None:
        from actors.demos import publish_demonstrations

        try:
            self.result = publish_demonstrations(self.cfg, self.tasks, self.count,
                                                 self.cfg.actor.model_path or self.cfg.learner.model_path)
            log.info("demonstrations: %s", self.result)
        except Exception as exc:  # noqa: BLE001 - RFT then trains on fewer demonstrations; the report says why
            log.error("demonstrations failed: %s: %s", type(exc).__name__, exc)
            self.result = {"error": f"{type(exc).__name__}: {exc}"}


def _start_demonstrations(cfg: Config, tasks: list) -> _Demonstrations | None:
    """Demonstrations are replayed when the schedule has an RFT stage and some task has a solution."""
    from learner.stages import Schedule

    schedule = Schedule.from_config(cfg.learner)
    rft_steps = sum(p.steps for p in schedule.plans if p.stage == "rft") or \
        (cfg.cluster.max_steps if cfg.learner.stage == "rft" and not schedule.plans else 0)
    count = cfg.cluster.demonstrations or rft_steps * cfg.learner.batch_trajectories
    if not rft_steps or count <= 0 or not any((t.metadata or {}).get("demonstration") for t in tasks):
        return None
    demos = _Demonstrations(cfg, tasks, count)
    demos.start()
    return demos


def _failure_report(run_id: str, run_dir: Path, stop: _Stop, run: dict, exc: Exception) -> dict:
    sup, watch = run["sup"], run["watch"]
    rep = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "retriable": bool(getattr(exc, "retriable", False)),
           "run_id": run_id, "run_dir": str(run_dir), "stopped_by": stop.reason or "error",
           "learner_steps": 0, "episodes_finished": 0, "trajectories_trained": 0, "trajectories_lost": None,
           "tool_calls_lost": None}
    if sup is not None:
        rep["restarts"] = {n: rp.starts - 1 for n, rp in sup.roles.items()}
    if watch is not None:
        rep.update(watch.report())
    return rep


class _Chaos:
    """Random SIGKILLs from a logged seed: each role (and the broker with --broker) once at a random moment,
    or, with ``repeat`` (`kernelrl chaos --every S`), a victim every ~S seconds for the whole run."""

    def __init__(self, every_s: float, seed: int | None, broker_watch=None, repeat: bool = False) -> None:
        self.every_s, self.broker, self.repeat = every_s, broker_watch, repeat
        self.seed = seed if seed is not None else random.SystemRandom().randrange(2**31)
        self.rng = random.Random(self.seed)
        self.next = time.time() + every_s if every_s else float("inf")
        if every_s:
            log.warning("chaos: a SIGKILL every ~%.0f s%s, seed %d (--chaos-seed %d replays the choices)",
                        every_s, " (broker included)" if broker_watch else "", self.seed, self.seed)

    def tick(self, sup: Supervisor) -> None:
        if time.time() < self.next:
            return
        # Each role is killed once: on small machines a role killed again and again (the learner, say)
        # could never finish a step between kills.
        victims = [n for n, rp in sup.roles.items() if rp.alive and (self.repeat or rp.kills < 1)]
        if self.broker is not None and self.broker.owned and (self.repeat or self.broker.kills < 1) \
                and self.broker.alive():
            victims.append("<broker>")
        victim = self.rng.choice(sorted(victims) or [None])
        if victim == "<broker>":
            log.warning("chaos: SIGKILL the Kafka broker")
            self.broker.kill()
        elif victim:
            log.warning("chaos: SIGKILL %s", victim)
            sup.kill(victim)
        self.next = time.time() + self.every_s * self.rng.uniform(0.5, 1.5)


def _tail_goal(cfg: Config) -> str:
    n, secs = cfg.cluster.tail_episodes, cfg.cluster.tail_s
    return f"{n} of its own episodes (at most {secs:.0f} s)" if n else f"{secs:.0f} s more"


def _tail_reached(bus, cfg: Config, tail_end: float) -> bool:
    """cluster.tail_episodes: the final version has that many own episodes on the trajectories topic."""
    from cluster.launch.report import final_version_episodes

    version, n = final_version_episodes(bus)
    log.info("tail: version %d has %d of %d own episodes (%.0f s left)", version, n, cfg.cluster.tail_episodes,
             tail_end - time.time())
    return n >= cfg.cluster.tail_episodes


def _watch(sup: Supervisor, bus, feeder, cfg: Config, stop: _Stop, chaos: _Chaos, broker_watch,
           dash: Dashboard) -> dict:
    """Poll roles until the learner finishes, the duration passes or a signal arrives."""
    from schemas import topics

    started = time.time()
    snaps: dict[str, dict] = {}
    tail_end = 0.0  # cluster.tail_s: the actors go on sampling with the final version after the learner ends
    next_count = 0.0  # when cluster.tail_episodes is next counted
    while not stop.event.is_set():
        broker_watch.check()  # a dead embedded broker is restarted before anything else is asked of it
        feeder.check()  # a feeder stopped by an error no retry fixes ends the run with its reason
        finished = sup.poll() if not tail_end else []
        if "learner" in finished:
            if cfg.cluster.tail_s <= 0:
                break
            tail_end = time.time() + cfg.cluster.tail_s
            feeder.drop_gate(topics.TRAJECTORIES)  # no learner reads them now: its backlog must not stop the tail
            log.info("learner finished; the actors sample the final version for %s", _tail_goal(cfg))
        if tail_end and time.time() >= tail_end:
            break
        if tail_end and cfg.cluster.tail_episodes and time.time() >= next_count:
            next_count = time.time() + 5.0  # a read of the whole topic: not every second
            if _tail_reached(bus, cfg, tail_end):
                break
        if cfg.cluster.duration_s and time.time() - started > cfg.cluster.duration_s:
            stop.reason = f"duration {cfg.cluster.duration_s:.0f}s"
            break
        for name in sup.roles:
            snap = sup.scrape(name)
            if snap is not None or name not in snaps:
                snaps[name] = snap
        chaos.tick(sup)
        dash.update(snaps, {"tasks_fed": feeder.published, "lags": _lags(bus), "broker": broker_watch.status_line()})
        stop.event.wait(1.0)
    return snaps
