"""Verify + profile one solution against its task: the reward oracle's one entry point.

Flow: validate files -> static guards (a first speed bump) -> artifact by its content key (cache / an
older sender's inline bytes / the compile workers / build, with the native-code policy on the built
library) -> a judged session: the trusted judge
(sandbox_workers/judge.py, task code only) drives the candidate, sandboxed in another process,
on fresh secret inputs and checks every output -> baselines (eager, torch.compile) measured by
the same judge protocol on the task's own Model, cached per task, device and versions in a
folder no sandbox can see -> the candidate's time claims bounded by the judge's walls -> reward.

This process never runs task or candidate code. Every result says whose fault a failure was:
`fault` is "policy" (the candidate's), "infra" (task, judge, worker, sandbox) or "none".
"""
from __future__ import annotations

import copy
import fcntl
import hashlib
import json
import logging
import os
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from sandbox_workers import compiler, cpu_profile, cpuset, device_gate, device_memory, formats, guards, workspace
from cluster.config import freeze_judges, jobs_for
from sandbox_workers.reward import milestone_reward, speedup
from sandbox_workers.session import Session

log = logging.getLogger(__name__)
PROTOCOL_VERSION = "judge-7"  # judge-7: the remote places outputs with memcpy, remotes are CPU-profiled (baselines timed under the same sampling); judge-6: spiked inputs on every call
TIMING_CLAIM = "timing_claim_contradicted"
class Evaluator:
    def __init__(self, cfg, backend: str | None = None, device_key: str = "", fetch=None):
        """``fetch(files, backend)``: ask the compile workers for this workspace's artifact (a CompileResult; raises
        when they do not answer in time); None (no bus: ``kernelrl sandbox eval``, tests) builds locally instead."""
        self.cfg = cfg
        self.fetch = fetch
        self.sb = cfg.sandbox
        self.backend = backend or self.sb.backend
        self.device_key = device_key or _default_device_key(self.backend, self.sb)
        root = self.sb.baseline_cache_dir or os.path.join(cfg.broker.cache_dir, "baselines")
        self.ref_root = Path(root).expanduser()
        self.ref_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.ref_root, 0o700)  # trusted state: no sandbox user may read or write it
        self._lock = threading.Lock()
        self._ready: dict[str, list[Session]] = {}  # role -> started sessions waiting for their jobs, oldest first
        # jobs evaluated at once on this device (threads calling evaluate()); their timed phases stay exclusive
        # through the device's gate, which freezes the other jobs' sessions while one is timed (device_gate.py)
        self.jobs = max(1, jobs_for(self.sb, self.backend))
        cuda = self.backend == "cuda"
        self.gate = device_gate.for_device(self.device_key, freeze=self.jobs > 1, nvml=cuda,
                                           idle_wait_s=float(getattr(self.sb, "gate_idle_wait_s", 0.0)) if cuda else 0.0,
                                           freeze_judges=freeze_judges(self.sb, self.backend))
        self._tls = threading.local()  # the gate's records of the job on this thread
        # several jobs per device: admitted while their memory fits
        self.memory = device_memory.budget_for(self.sb, self.backend, self.jobs)
        self.profile = cpu_profile.enabled(self.sb, self.backend)  # the candidate's CPU time, sampled from outside

    # ------------------------------------------------------------------ public
    def evaluate(self, task_source: str, files: dict[str, str], mode: str = "both", artifact: bytes = b"",
                 artifact_key: str = "") -> dict:
        """One job; up to ``sandbox.jobs_per_device`` of them may run at once on threads of one Evaluator."""
        self._tls.gate = []
        try:
            res = self._admitted(task_source, files, mode, artifact, artifact_key)
        finally:
            holds, self._tls.gate = self._tls.gate, []
        gate_evidence(res, holds)
        return res

    def _admitted(self, task_source: str, files: dict[str, str], mode: str, artifact: bytes,
                  artifact_key: str) -> dict:
        """The job once the device has room for it (device_memory.py); run again alone if it ran out of memory
        next to other jobs (an infrastructure fault: the estimate was short, not the solution's fault)."""
        self._tls.held = 0
        if self.memory is None:
            return self._evaluate(task_source, files, mode, artifact, artifact_key)
        key = self.baseline_key(task_source)
        saved = self.ref_root / key / "memory.json"  # beside the task's baselines: kept across worker restarts
        if self.memory.need(key) is None:
            self.memory.learn(key, int((_read_json(saved) or {}).get("held_bytes") or 0))
        while True:
            with self.memory.hold(self.memory.need(key)) as rec:
                self._tls.held = 0
                res = self._evaluate(task_source, files, mode, artifact, artifact_key)
            rec["held_bytes"] = self._tls.held
            res.setdefault("evidence", {})["memory"] = rec
            oom = res.get("fault") == "infra" and "out of memory" in (res.get("error") or "")
            if not oom:
                before = self.memory.need(key)
                self.memory.learn(key, self._tls.held)
                if self.memory.need(key) != before:  # written when it changes, not after every job
                    saved.parent.mkdir(parents=True, exist_ok=True)
                    saved.write_text(json.dumps({"held_bytes": self._tls.held}))
                return res
            self.memory.forget(key)
            saved.unlink(missing_ok=True)
            if rec["alone"]:
                return res
            log.warning("evaluation ran out of device memory next to other jobs: again, alone")

    def _evaluate(self, task_source: str, files: dict[str, str], mode: str, artifact: bytes,
                  artifact_key: str) -> dict:
        t0 = time.monotonic()
        res = _empty_result()
        try:
            files = workspace.validate(files, self.backend)
        except workspace.WorkspaceError as exc:
            return _done(res, t0, error=str(exc), fault="policy")
        if self.sb.static_guards:
            found = formats.check_python(files)  # per format: load_inline / cuda_extension lines allowed
            if found:
                res["compiled"] = True
                res["evidence"]["violation_details"] = [v.__dict__ for v in found]
                return _done(res, t0, violations=guards.names(found), error="static guard violations",
                             fault="policy")
        phases = res["evidence"]["phases"] = {}
        t_phase = time.monotonic()
        lib, comp = self._artifact(files, artifact, artifact_key)
        res["evidence"]["compile"] = comp
        phases["artifact_s"] = round(time.monotonic() - t_phase, 6)
        if lib is None:
            res["violations"] = comp.get("violations", [])
            return _done(res, t0, error=comp.get("error") or "compilation failed",
                         fault="infra" if comp.get("infra") else "policy")
        res["compiled"] = True
        timing = mode != "verify"
        try:
            t_phase = time.monotonic()
            cand = self._candidate(task_source, files, lib, timing)
            phases["candidate_s"] = round(time.monotonic() - t_phase, 6)
            phases["candidate"] = cand.get("phases", {})
            base = None
            if timing and cand.get("ok") and cand.get("timing"):
                t_phase = time.monotonic()
                base = self.baselines(task_source)
                phases["baselines_s"] = round(time.monotonic() - t_phase, 6)
                phases["baselines"] = base.get("phases", {})
                if self._contradicted(cand, base):
                    # a second opinion before a claim is rejected: noise in one session (another process on the
                    # host, a GPU clock change) can push an honest round trip past the tolerance (an honest kernel
                    # at a 16 MB output was rejected in 2 of 11 runs when outputs were hashed on the timed path:
                    # docs/oracle-gpu.md, session 7). The candidate is evaluated again in a fresh session (and a
                    # bound that came from the baseline's session is re-measured first); the verdict is the second
                    # one's. Every accepted claim still passed the bound in its own session, and hidden work shows
                    # again in the second session.
                    if not ((cand.get("timing") or {}).get("trusted") or {}).get("probe"):
                        base = self.baselines(task_source, use_cache=False)  # the bound came from the baseline
                    if self._contradicted(cand, base):
                        cand = self._candidate(task_source, files, lib, timing)
                        cand["second_opinion"] = True
            pre = copy.deepcopy(res)
            self._assemble(res, cand, base, timing)
            if res["reward"] > 1 and base is not None and not base.get("confirmed"):
                # a speed tier rests on the baselines' medians, and a burst of load during their one measurement
                # inflates them all alike (no spread to see it by): before a tier is paid for the first time against
                # this cache entry, the baselines are timed once more, now, and the faster of each variant kept
                first = res["reward"]
                base = self.confirm_baselines(task_source, base)
                res = pre
                self._assemble(res, cand, base, timing)
                res["evidence"]["baselines_confirmed"] = {"reward_before": first, "reward": res["reward"]}
        except ReferenceFailure as exc:
            return _done(res, t0, error=f"infrastructure: {exc} (not the solution's fault)", fault="infra")
        out = _done(res, t0)
        log.info("evaluated (%s): reward %+.0f correct=%s violations=%s speedup eager %.3f compile %.3f in %.1f s",
                 self.backend, out["reward"], out["correct"], out["violations"], out["speedup_vs_eager"],
                 out["speedup_vs_compile"], out["duration_s"])
        return out

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown: the sandboxes die with this process anyway
            pass

    def close(self) -> None:
        """Stop the pre-started sessions (each job still gets fresh processes of its own)."""
        with self._lock:
            for pool in self._ready.values():
                for sess in pool:
                    sess.close()
            self._ready.clear()

    # ------------------------------------------------------------------ artifact
    def _artifact(self, files, artifact: bytes, artifact_key: str):
        """The built library for ``files``, by the content key this worker computes itself, from (in order): its
        own artifact cache (shared with the compile workers on one filesystem), the inline bytes of an older
        sender, the compile workers over the bus (``self.fetch``), else its own build. ``info["source"]`` says
        which: "cache" | "inline" | "compile_worker" | "local_build"."""
        try:
            key = compiler.cache_key(files, self.backend, self.cfg)
        except Exception as exc:  # noqa: BLE001 - bad flags or no toolchain: report as a compile failure
            return None, {"ok": False, "error": str(exc)}
        found = formats.check_cpp(files, self.backend)  # torch API in extensions: binpolicy decides
        if found:
            return None, {"ok": False, "error": "forbidden code in kernel sources", "violations": guards.names(found),
                          "log": "\n".join(f"{v.name}: {v.detail}" for v in found)}
        lib = compiler.lookup(self.cfg, key)
        if lib is not None:
            return lib, {"ok": True, "key": key, "cached": True, "source": "cache"}
        if artifact and artifact_key == key:
            # the compile worker's output carried by an older actor (trusted roles); keyed by the sources' content
            lib = compiler.store(self.cfg, key, artifact, {"log": "", "backend": self.backend, "source": "inline"})
            return lib, {"ok": True, "key": key, "cached": True, "source": "inline"}
        notes: dict = {}
        if self.fetch is not None:
            lib, info = self._fetch(files, key)
            if lib is not None or not info.get("ok", True):
                return lib, info  # the compile worker's artifact, or its verdict: the policy's compile failure
            notes = info  # no usable answer: why, kept with the local build's evidence
        if self.backend == "cpu" and self.jobs > 1:  # a build on the cores another job may be timed on
            with self.gate.holding(f"build-{threading.get_ident()}", device_gate.SHARED, "local_build"):
                out = compiler.compile_workspace(files, self.backend, self.cfg)
        else:
            out = compiler.compile_workspace(files, self.backend, self.cfg)
        info = {"ok": out.ok, "key": out.key, "cached": out.cached, "log": out.log, "error": out.error,
                "violations": out.violations, "duration_s": out.duration_s, "source": "local_build", **notes}
        return (out.library if out.ok else None), info

    def _fetch(self, files, key: str):
        """(library, info) from the compile workers. library None with info["ok"] False: their build failed (the
        policy's); with info["ok"] True: no usable answer (timeout, their infra fault, a key that is not ours)."""
        t0 = time.monotonic()
        try:
            res = self.fetch(files, self.backend)
        except Exception as exc:  # noqa: BLE001 - no answer in time or no bus: this worker builds it instead
            log.warning("compile workers gave no artifact for %s: %s: %s", key[:12], type(exc).__name__, exc)
            return None, {"ok": True, "fetch_error": f"{type(exc).__name__}: {exc}"[:2000]}
        waited = round(time.monotonic() - t0, 6)
        worker = getattr(res, "worker", "")
        if not res.ok:
            if getattr(res, "fault", "") == "infra":  # the compile worker's own failure: no verdict on the sources
                return None, {"ok": True, "fetch_error": f"compile worker {worker}: {(res.error or '')[:2000]}"}
            return None, {"ok": False, "key": key, "cached": False, "log": res.log, "error": res.error,
                          "violations": list(getattr(res, "violations", None) or []), "duration_s": res.duration_s,
                          "source": "compile_worker", "worker": worker, "fetch_s": waited}
        if res.artifact_key != key:
            log.warning("compile worker %s answered key %s for %s: refused", worker, res.artifact_key[:12], key[:12])
            return None, {"ok": True, "refused": f"compile worker {worker} answered artifact key "
                                                 f"{res.artifact_key!r}, not this worker's {key!r}"}
        data = res.artifact
        if not data and res.artifact_uri.startswith("file://"):  # too large to inline: same filesystem, read it
            try:
                data = Path(urllib.parse.unquote(urllib.parse.urlparse(res.artifact_uri).path)).read_bytes()
            except OSError:
                data = b""
        if not data:
            return None, {"ok": True, "fetch_error": f"compile worker {worker} sent no artifact bytes "
                                                     f"(uri {res.artifact_uri!r})"}
        lib = compiler.store(self.cfg, key, data, {"log": res.log, "backend": self.backend, "source": "compile_worker",
                                                   "worker": worker})
        return lib, {"ok": True, "key": key, "cached": True, "source": "compile_worker", "worker": worker,
                     "worker_cached": bool(res.cached), "fetch_s": waited}

    # ------------------------------------------------------------------ judged sessions
    def _spec(self, task_source: str, timing: bool, variants: list[dict]) -> dict:
        sb = self.sb
        spec = {"task_source": task_source, "backend": self.backend, "variants": variants,
                "deadline_s": sb.eval_timeout_s, "atol": sb.atol, "rtol": sb.rtol,
                "correctness_trials": sb.correctness_trials, "timed_check_fraction": sb.timed_check_fraction,
                "check_centred_inputs": sb.check_centred_inputs, "spiked_inputs": sb.spiked_inputs,
                "max_batch_bytes": sb.max_batch_bytes, "max_batch_bytes_device": sb.max_batch_bytes_device,
                "threads": cpuset.threads(sb.cpu_threads) if self.backend == "cpu" else 0,
                "runtime": self._runtime_kwargs(), "timing": self._timing_spec() if timing else None,
                "lead_cycles": max(0, sb.cuda_lead_us) * 2000 if self.backend == "cuda" else 0,
                "device_arena": self.backend == "cuda" and sb.cuda_device_arena,
                "remote_context_first": sb.remote_context_first}
        return spec

    def _take(self, role: str) -> Session:
        """A started session: the oldest pre-started one still alive, else a new one; then the pool is refilled."""
        with self._lock:
            pool = self._ready.setdefault(role, [])
            sess = None
            while pool and sess is None:
                sess = pool.pop(0)
                if not sess.alive():
                    sess.close()
                    sess = None
            if sess is None:
                sess = self._new_session(role)
            if role == "candidate" and self.sb.warm_sessions and (self.backend == "cuda" or len(cpuset.available()) >= 8):
                # on a small CPU host the next pairs' start-up would slow the job being timed; on a CPU host the
                # pairs share the timed job's cores, so one per job in flight there (the GPU times on the device);
                # with several jobs per device the pool serves them all (sessions are used at that many times the rate)
                size = max(1, self.sb.warm_pool) * self.jobs if self.backend == "cuda" else self.jobs
                while len(pool) < size:
                    pool.append(self._new_session(role))
            return sess

    def _new_session(self, role: str) -> Session:
        sess = Session(self.cfg, self.backend, role, inductor_cache=self._inductor_cache(), profile=self.profile)
        sess.gate = self.gate  # its judge holds the device's gate; its processes are frozen while another job is timed
        return sess.start()

    def _session(self, role: str, spec: dict, library: Path | None = None):
        t0 = time.monotonic()
        sess = self._take(role)
        take_s = time.monotonic() - t0
        try:
            if library is not None:
                lib_inside = sess.add_library(library)
                for v in spec["variants"]:
                    v["library"], spec["infra"] = lib_inside, sess.infra()
            t_run = time.monotonic()
            out = sess.run(spec, wall_s=float(spec["deadline_s"]) + 120)
            holds = [dict(r, role=role) for r in getattr(out, "gate", None) or []]
            if hasattr(self._tls, "gate"):
                self._tls.gate.extend(holds)
            if isinstance(out.judge, dict):
                out.judge["gate_noisy"] = any(r.get("idle") is False for r in holds)
                # the largest session of the job is what it needs of the device
                self._tls.held = max(getattr(self._tls, "held", 0), int(out.judge.get("device_bytes") or 0))
            if isinstance(out.judge, dict):  # the worker's side of the session is part of the job's phases too
                out.judge["phases"] = {"session_start_s": round(take_s, 6), **(out.judge.get("phases") or {}),
                                       "session_run_s": round(time.monotonic() - t_run, 6)}
            return out
        finally:
            sess.close()

    def _contradicted(self, cand: dict, base: dict) -> str:
        where = getattr(self.sb, "enforce_timing_claims", "cuda")
        if where == "none" or (where == "cuda" and self.backend != "cuda"):
            return ""
        cpu = self.backend == "cpu"
        return claim_contradicted(cand.get("timing") or {}, base.get("eager", {}),
                                  self.sb.timing_claim_slack_cpu if cpu else self.sb.timing_claim_slack,
                                  self.sb.timing_claim_abs_cpu_s if cpu else self.sb.timing_claim_abs_s,
                                  cap_probe=cpu)

    def _inductor_cache(self) -> Path:
        """torch.compile's cache for the baseline runs (trusted code): writable by the sandbox user, bound
        into baseline sandboxes only; the folder above it stays private to the worker (``sandbox.inductor_cache_dir``
        may name one that several workers share: their baselines' compiled code, nothing a candidate writes)."""
        custom = getattr(self.sb, "inductor_cache_dir", "")
        p = Path(custom).expanduser() if custom else self.ref_root / "inductor"
        p.mkdir(parents=True, exist_ok=True)
        if getattr(self.sb, "isolation", "none") != "none":
            from sandbox_workers import ossandbox

            ossandbox.prepare_dir(str(p))
        return p

    def _candidate(self, task_source: str, files, lib: Path, timing: bool) -> dict:
        variant = {"name": "candidate", "module": "model_new", "cls": "ModelNew",
                   "source": files[workspace.MODEL_NEW], "checked": True,
                   "ext": formats.plan(files, self.backend).module}  # a torch extension's module name, or ""
        spec = self._spec(task_source, timing, [variant])
        if timing and self.sb.reference_time_from_baselines:
            spec["t_ref"] = self.cached_t_ref(task_source)
        out = self._session("candidate", spec, library=lib)
        if self.profile and out.profile is None and out.profile_error == cpu_profile.NO_SAMPLES:
            # its events were attached and yet none of its CPU time came back (not seen since the sampler attaches
            # to the model's process itself, cpu_sampler.py): a fresh session, once, rather than no verdict
            log.warning("candidate session without a CPU profile (%s): evaluating it again", out.profile_error)
            out = self._session("candidate", spec, library=lib)
        judge = out.judge
        if judge is None:
            why = "the evaluation deadline" if out.timed_out else "the judge's own failure"
            raise ReferenceFailure(f"the judge produced no result ({why})\n{out.judge_log[-1500:]}".strip())
        if not judge.get("ok"):
            if judge.get("infra", True):
                raise ReferenceFailure(judge.get("error", "judge failed"))
            return {"ok": False, "error": _with_log(judge.get("error", ""), out), "violations": []}
        var = judge["variants"].get("candidate") or {}
        res = dict(var, versions=judge.get("versions", {}), clock=judge.get("clock", {}),
                   phases=judge.get("phases", {}), arena=judge.get("arena", "host"),
                   t_ref_source=judge.get("t_ref_source", ""), spiked_inputs=judge.get("spiked_inputs", ""))
        if not var.get("ok"):
            res["error"] = _with_log(var.get("error", "failed"), out)
            res["remote_signal"] = out.remote_signal
        elif self.profile:
            self._foreign_compute(res, out, judge.get("t_ref"))
        return res

    def _foreign_compute(self, res: dict, out, t_ref) -> None:
        """Where the candidate's CPU time went, sampled from outside its process: compute outside its own
        library is a violation (cpu_profile.py), whatever happened to the in-process guard."""
        if out.profile is None:  # fail closed: no verdict on the rule without the profile
            raise ReferenceFailure(f"the candidate's CPU profile: {out.profile_error}")
        res["cpu_profile"] = out.profile
        bad = cpu_profile.foreign_compute(out.profile, t_ref, self.sb.foreign_compute_floor_s,
                                          self.sb.foreign_compute_fraction)
        if bad:
            res.update(ok=False, error=bad, violations=[{"name": cpu_profile.TORCH_COMPUTE, "detail": bad}])

    def baseline_key(self, task_source: str) -> str:
        doc = {"task": hashlib.sha256(task_source.encode()).hexdigest(), "backend": self.backend,
               "device": self.device_key, "torch": compiler.torch_version(), "protocol": PROTOCOL_VERSION,
               "timing": self._timing_spec(), "runtime": self._runtime_kwargs(),
               "compile_baseline": self.sb.compile_baseline, "py": sys.version.split()[0],
               "device_arena": self.backend == "cuda" and self.sb.cuda_device_arena}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]

    def cached_t_ref(self, task_source: str) -> float | None:
        """The reference's time per call that a judge of this task's cached baselines measured (None: not cached
        yet). A candidate's judge then skips timing the reference: one exclusive section less per job, and its
        batch is that of the judge that last measured the baselines (an older, faster timing that ``keep_faster``
        kept may have used another batch). Only this trusted cache is read; no candidate can write it."""
        meta = _read_json(self.ref_root / self.baseline_key(task_source) / "baselines.json")
        t = (meta or {}).get("t_ref")
        return float(t) if isinstance(t, (int, float)) and t > 0 and not (meta or {}).get("gate_noisy") else None

    def baselines(self, task_source: str, use_cache: bool = True) -> dict:
        """Eager (and torch.compile) timings of the task by the judge protocol, cached; re-measured when noisy."""
        d = self.ref_root / self.baseline_key(task_source)
        d.mkdir(parents=True, exist_ok=True)
        with open(d / ".lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            meta = _read_json(d / "baselines.json") if use_cache else None
            if meta and meta.get("eager", {}).get("median_s") and not noisy(meta, self.sb.baseline_max_cv) \
                    and not meta.get("gate_noisy"):
                return dict(meta, cached=True)
            found, judge = self._measure_baselines(task_source)
            if noisy(found, self.sb.baseline_max_cv):
                # this evaluation's reward reads them now: a noisy one (a burst of load inflates medians, and a
                # forged claim then reaches a tier it should not: tests/sandbox/test_compressible.py) is timed once
                # more at once, the faster of each kept
                again, judge2 = self._measure_baselines(task_source)
                found, judge = keep_faster(found, again, self.sb.baseline_max_cv), judge2
            if meta:
                found = keep_faster(meta, found, self.sb.baseline_max_cv)
            _describe(found, judge)
            (d / "baselines.json").write_text(json.dumps(found))
            return dict(found, cached=False, phases=judge.get("phases", {}))

    def confirm_baselines(self, task_source: str, base: dict) -> dict:
        """``base`` timed once more and the faster of each variant kept, marked confirmed in the cache (a task's
        baselines are confirmed once: later speed tiers against them cost nothing more)."""
        d = self.ref_root / self.baseline_key(task_source)
        with open(d / ".lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            meta = _read_json(d / "baselines.json") or {}
            if meta.get("confirmed") and meta.get("eager", {}).get("median_s"):
                return dict(meta, cached=True)  # another job confirmed them meanwhile
            found, judge = self._measure_baselines(task_source)
            old = meta or base
            kept = keep_faster({k: v for k, v in old.items() if k in BASELINE_VARIANTS}, found,
                               self.sb.baseline_max_cv)
            if "t_ref" in old:
                kept["t_ref"] = old["t_ref"]  # replaced below by this measurement's own, where it has one
            _describe(kept, judge)
            kept["confirmed"] = True
            (d / "baselines.json").write_text(json.dumps(kept))
            return dict(kept, cached=False, phases=judge.get("phases", {}))

    def _measure_baselines(self, task_source: str) -> tuple[dict, dict]:
        """One baseline session: each variant's timing (or its error), and the judge's result."""
        variants = [{"name": "eager", "module": "krl_task", "cls": "Model", "source": task_source, "checked": False}]
        if self.sb.compile_baseline:
            variants.append(dict(variants[0], name="compile", compile=True))
        spec = self._spec(task_source, True, variants)
        spec["deadline_s"] = self.sb.reference_timeout_s  # torch.compile's first compile is slow
        out = self._session("baseline", spec)
        judge = out.judge or {}
        eager = (judge.get("variants") or {}).get("eager") or {}
        if not judge.get("ok") or not eager.get("ok") or not eager.get("timing"):
            why = judge.get("error") or eager.get("error") or out.judge_log[-1500:] or "no result"
            raise ReferenceFailure(f"the baseline run failed: {why}\n{out.remote_log[-1500:]}".strip())
        found = {}
        for name, v in judge["variants"].items():
            found[name] = dict(v["timing"], first_call_s=v.get("first_call_s", 0.0)) if v.get("ok") \
                and v.get("timing") else {"error": v.get("error", "failed")[:2000]}
        return found, judge

    def _timing_spec(self) -> dict:
        sb = self.sb
        return {"warmup": sb.warmup, "min_trials": sb.trials, "max_trials": max(sb.max_trials, sb.trials),
                "budget_s": sb.timing_budget_s, "rel_ci": sb.timing_rel_ci, "min_trial_s": sb.min_trial_s}

    def _runtime_kwargs(self) -> dict:
        if self.backend == "cpu":
            return {"flush_mb": self.sb.cpu_flush_mb, "threads": cpuset.threads(self.sb.cpu_threads)}
        return {"flush_mb": self.sb.cuda_flush_mb, "lead_us": 0}  # the remote queues its own lead spin

    # ------------------------------------------------------------------ result
    def _assemble(self, res: dict, cand: dict, base: dict | None, timing: bool) -> None:
        viol = cand.get("violations") or []
        res["violations"] = sorted({v.get("name", "?") for v in viol if isinstance(v, dict)})
        res["evidence"].update(violation_details=viol, checks=cand.get("checks", 0),
                               centred_check=cand.get("centred_check", ""),
                               spiked_inputs=cand.get("spiked_inputs", ""),
                               versions=cand.get("versions", {}), clock=cand.get("clock", {}),
                               device_key=self.device_key, isolation=getattr(self.sb, "isolation", "none"),
                               remote_signal=cand.get("remote_signal", ""), arena=cand.get("arena", "host"),
                               t_ref_source=cand.get("t_ref_source", ""), cpu_profile=cand.get("cpu_profile"))
        res["correct"] = bool(cand.get("ok")) and not res["violations"]
        res["error"] = "" if res["correct"] else cand.get("error", "")
        res["fault"] = "none" if res["correct"] else "policy"
        if not timing or not res["correct"]:
            res["reward"] = milestone_reward(res["compiled"], res["correct"], None, None, None)
            return
        stats = cand.get("timing") or {}
        eager, comp = base.get("eager", {}), base.get("compile", {})
        res["evidence"]["baseline_cached"] = base.get("cached", False)
        res["evidence"]["second_opinion"] = bool(cand.get("second_opinion"))
        bad = self._contradicted(cand, base)
        if bad:
            res.update(correct=False, error=bad, fault="policy", reward=-1.0)
            res["violations"] = sorted(set(res["violations"]) | {TIMING_CLAIM})
            res["evidence"]["violation_details"].append({"name": TIMING_CLAIM, "detail": bad})
            return
        t, te, tc = stats.get("median_s"), eager.get("median_s"), comp.get("median_s")
        if t:
            # a claim is never believed beyond what the judge's clock allows: on CPU its estimate itself, on
            # CUDA (tight clocks) the estimate less the bound's tolerance, so honest claims stand as measured
            cpu = self.backend == "cpu"
            slack = 0.0 if cpu else self.sb.timing_claim_slack
            abs_s = 0.0 if cpu else self.sb.timing_claim_abs_s
            est = judged_time(stats, eager, slack, abs_s)
            res["evidence"]["judged_time_s"] = est
            # CPU: the candidate's own library's CPU time per call, sampled from outside its process, spread over
            # every core: a claim below it is forged whatever the protocol's noise let the estimate say (Open 2)
            low = cpu_profile.compute_floor(cand.get("cpu_profile"), os.cpu_count() or 1) if cpu else 0.0
            if low:
                res["evidence"]["profiled_time_s"] = low
            if max(est, low) > t:
                res["evidence"]["claimed_time_s"] = t
                t = max(est, low)
        res["timings"] = {"candidate": stats, "eager": eager, "compile": comp}
        res["speedup_vs_eager"] = speedup(t, te)
        res["speedup_vs_compile"] = speedup(t, tc)
        res["reward"] = milestone_reward(res["compiled"], res["correct"], t, te, tc, self.sb.speedup_threshold)
        if t and self.backend == "cpu" and self.sb.cpu_charge_compressible:
            self._charge_compressible(res, stats, eager, t, te, tc)

    def _charge_compressible(self, res: dict, stats: dict, eager: dict, t: float, te, tc) -> None:
        """(CPU) Pay for the judged time plus the protocol's compressible part (cpu_charge_compressible): a speed
        tier only where the kernel beats the baseline by more than a forged claim could hide. The speed-ups
        reported are the paid time's too (fast_p and the agent's tool reply read them, so a forged claim buys
        neither); the evidence keeps the ones the claims measured."""
        c = compressible_per_call(stats)
        paid = max(t, judged_time(stats, eager) + c)
        res["evidence"].update(compressible_s=c, reward_time_s=paid, measured_speedup_vs_eager=res["speedup_vs_eager"],
                               measured_speedup_vs_compile=res["speedup_vs_compile"])
        res["speedup_vs_eager"], res["speedup_vs_compile"] = speedup(paid, te), speedup(paid, tc)
        reward = milestone_reward(res["compiled"], res["correct"], paid, te, tc, self.sb.speedup_threshold)
        if reward < res["reward"]:
            res["evidence"]["speed_unproven"] = (
                f"{t * 1e6:.1f} us a call as judged, {paid * 1e6:.1f} us with the {c * 1e6:.1f} us a candidate "
                f"could hide in the judge's copies: reward {reward:g}, not {res['reward']:g} (eager "
                f"{(te or 0) * 1e6:.1f} us{'' if not tc else f', compile {tc * 1e6:.1f} us'})")
            res["reward"] = reward


def compressible_per_call(cand: dict) -> float:
    """Seconds per call of the protocol's overhead that a candidate can take off its round trip on CPU: the
    judge's input copy (its work can overlap it, watching the inputs arrive) and one pass over the outputs (it
    can write them in place instead of the stand-in's copy; the judge's snapshot is that pass), as the probe
    timed them before the candidate's code was loaded. 0 without a probe."""
    probe = (cand.get("trusted") or {}).get("probe") or {}
    b = max(1, int(probe.get("batch") or 1))
    return (float(probe.get("copy_in_s", 0.0)) + float(probe.get("snapshot_s", 0.0))) / b


def gate_evidence(res: dict, holds: list[dict]) -> None:
    """The device gate's records of one job into its result: every hold (mode, phase, monotonic grant and
    release), the seconds waited for the gate, and whether a timed section began on a device not idle."""
    ev = res.setdefault("evidence", {})
    ev["gate"] = [{k: (round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in holds]
    if not holds:
        return
    if isinstance(ev.get("phases"), dict):
        ev["phases"]["gate_wait_s"] = round(sum(r.get("waited_s", 0.0) for r in holds), 6)
    if any(r.get("mode") == device_gate.EXCLUSIVE and r.get("idle") is False for r in holds):
        ev["timing_noisy"] = True


def claim_contradicted(cand: dict, base: dict, slack: float, abs_s: float, cap_probe: bool = False) -> str:
    """Why the judge's clock contradicts the candidate's time claims ("" if it doesn't).

    The remote can compute only between receiving the keys that unseal its inputs and the judge's
    snapshot of the outputs it placed: the "run" round trip, which the judge times. What the claim
    leaves of it is protocol overhead (pipe round trip, unsealing, placing and copying the outputs:
    the same for every model of the task), measured in the candidate's own session around a model
    that does no work before the candidate's code was loaded; work hidden from the claim (before the
    clock, after it, on another stream) shows up as more of it than that.

    With ``cap_probe`` (CPU) the probe is believed only as far as judged_time believes it: a probe slowed by a
    burst of load on a shared host allowed a 100x forged claim through here (CI, 2026-12-05), while the judged
    time, capped, still paid it as the slow kernel it was.
    """
    terms = _bound_terms(cand, base)
    if terms is None:
        return ""
    bc = max(1, cand.get("batch", 1))
    allowed = (_believed_overhead(terms) if cap_probe else terms["overhead"]) * (1 + slack) + abs_s
    if terms["gap"] > allowed:
        return (f"the judge timed {terms['run'] * 1e3:.3f} ms for a trial of {bc} calls claimed at "
                f"{cand.get('median_s', 0) * 1e6:.1f} us each: {terms['gap'] * 1e3:.3f} ms unclaimed, where "
                f"{terms['where']} left {terms['overhead'] * 1e3:.3f} ms (allowed {allowed * 1e3:.3f} ms): the time "
                "claims are contradicted")
    return ""


def _bound_terms(cand: dict, base: dict) -> dict | None:
    """The candidate's run round trip and unclaimed time per trial, the protocol overhead they are held to, and
    where it comes from. Preferred: the probe in the candidate's own session (same batch), minima against minima
    (interference only ever adds time). Else the reference's run in the baseline session, medians, scaled to the
    batch (noisier: another session). None when neither was measured."""
    tc, tb = cand.get("trusted") or {}, base.get("trusted") or {}
    if not tc:
        return None
    bc = max(1, cand.get("batch", 1))
    probe = tc.get("probe") or {}
    if probe.get("batch") == bc and "run_gap_min_s" in probe and "run_min_s" in tc:
        # the unclaimed time is taken against the claim the reward uses (the median), not each trial's own: a
        # candidate that forges its claims in all trials but one cannot pass the bound on that one trial's gap
        gap = tc["run_min_s"] - bc * cand.get("median_s", 0.0)
        return {"run": tc["run_min_s"], "gap": gap, "overhead": max(0.0, probe["run_gap_min_s"]),
                "reference_overhead": _reference_overhead(tb, base, bc),
                "where": f"the same protocol around a model doing nothing ({bc} calls, least of {probe.get('trials')})"}
    if tb:
        bb = max(1, base.get("batch", 1))
        return {"run": tc["run_s"], "gap": tc["run_gap_s"], "overhead": max(tb["run_gap_s"], tb["run_gap_s"] / bb * bc),
                "where": f"the reference's run of the same protocol ({bb} calls)"}
    return None


BASELINE_VARIANTS = ("eager", "compile")


def _describe(found: dict, judge: dict) -> None:
    """What a baseline cache entry keeps of the judge that measured it, besides the variants' timings."""
    found["versions"] = judge.get("versions", {})
    if isinstance(judge.get("t_ref"), (int, float)):  # candidate sessions size their batch by it
        found["t_ref"] = judge["t_ref"]
    # timed while the device was not idle (another job's queued kernels, device_gate.py): used now, measured again
    # on the next use (the faster of the two kept)
    found["gate_noisy"] = bool(judge.get("gate_noisy"))


def keep_faster(old: dict, new: dict, max_cv: float = 0.0) -> dict:
    """Per baseline variant, the measurement with the lower median (contention only inflates times); but a noisy
    old one (cv > max_cv > 0) never over a steady new one: kept, it would leave the cache noisy for good, and every
    later use would measure the baselines again (each evaluation then ~4x longer on a small CPU host)."""
    out = dict(new)
    for name, stats in old.items():
        if not isinstance(stats, dict):
            continue
        mine = out.get(name)
        if max_cv > 0 and spread(stats) > max_cv and mine and "median_s" in mine and spread(mine) <= max_cv:
            continue
        if "median_s" in stats and (not mine or "median_s" not in mine or stats["median_s"] < mine["median_s"]):
            out[name] = stats
    return out


def noisy(baselines: dict, max_cv: float) -> bool:
    """Any variant timed with a spread above max_cv (max_cv <= 0: never)."""
    return max_cv > 0 and any(spread(s) > max_cv for s in baselines.values()
                              if isinstance(s, dict) and "median_s" in s)


def spread(stats: dict) -> float:
    """A timing's robust spread (backends.base.robust_spread); its CV where it has none."""
    return float(stats.get("spread", stats.get("cv", 0.0)))


# How far the candidate session's probe may exceed the reference's overhead (another session's, same protocol and
# batch) before the judged time stops believing it: a probe slowed by interference overstates the overhead, and
# every second of overstatement is work a forged claim hides (held-out red team: a ~1 ms kernel with a 100x slow
# clock got reward 3 in CI while the probe ran beside a burst of load; docs/sandbox.md).
PROBE_OVER_REFERENCE_MAX = 2.0


def _reference_overhead(tb: dict, base: dict, bc: int) -> float | None:
    """The least unclaimed time of the reference's own trials (trusted code, trusted claims), scaled to bc calls."""
    gap = tb.get("run_gap_min_s", tb.get("run_gap_s"))
    if not isinstance(gap, (int, float)) or gap < 0:
        return None
    return gap / max(1, base.get("batch", 1)) * bc


def judged_time(cand: dict, base: dict, slack: float = 0.0, abs_s: float = 0.0) -> float:
    """Seconds per call by the judge's clock: the "run" round trip less the protocol's overhead (_bound_terms,
    plus a tolerance), 0.0 when either was not measured.

    Interference only ever adds time, to the probe as to anything, so the overhead used here is never more than
    PROBE_OVER_REFERENCE_MAX times the reference's (two independent measurements of the same protocol): an
    inflated probe can only make the judged time larger than the truth, never let a forged claim stand."""
    terms = _bound_terms(cand, base)
    if terms is None:
        return 0.0
    overhead = _believed_overhead(terms)
    return max(0.0, (terms["run"] - overhead * (1 + slack) - abs_s) / max(1, cand.get("batch", 1)))


def _believed_overhead(terms: dict) -> float:
    """The protocol overhead of _bound_terms, the probe's never above PROBE_OVER_REFERENCE_MAX x the reference's."""
    ref = terms.get("reference_overhead")
    return terms["overhead"] if ref is None else min(terms["overhead"], PROBE_OVER_REFERENCE_MAX * ref)


class ReferenceFailure(Exception):
    """The task, the judge or the sandbox failed: an infrastructure fault, never the policy's."""

    retriable = True


def _empty_result() -> dict:
    return {"compiled": False, "correct": False, "reward": -1.0, "speedup_vs_eager": 0.0, "speedup_vs_compile": 0.0,
            "violations": [], "error": "", "timings": {}, "evidence": {}, "duration_s": 0.0, "fault": "none"}


def _done(res: dict, t0: float, **kw) -> dict:
    res.update(kw)
    if res.get("violations") or not res["correct"]:
        res["correct"] = False if res.get("violations") else res["correct"]
    if not res["compiled"] or not res["correct"]:
        res["reward"] = -1.0
        if res.get("fault") == "none":
            res["fault"] = "policy"
    res["duration_s"] = time.monotonic() - t0
    return res


def _read_json(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _default_device_key(backend: str, sb) -> str:
    if backend == "cpu":
        from sandbox_workers.backends.cpu import cpu_model
        return f"cpu:{cpu_model()}:threads={cpuset.threads(sb.cpu_threads)}"
    name = os.environ.get("KRL_GPU_NAME", "cuda")
    return f"cuda:{name}:locked={sb.lock_clocks}"


def _with_log(error: str, out) -> str:
    """The remote's error, with how its process ended and the tail of what it printed."""
    parts = [error]
    if out.remote_signal:
        parts.append(f"(the model's process was killed by {out.remote_signal})")
    tail = out.remote_log.strip()
    if tail:
        parts.append("output of the model's process (tail):\n" + tail[-1500:])
    return "\n".join(parts)
