"""Verify + profile one solution against its task: the reward oracle's one entry point.

Flow: validate files -> static guards -> artifact (cache / inline / build) ->
reference data and baselines (cached per task, device and versions; built by a
sandboxed reference child under a file lock) -> a fresh sandboxed candidate
child -> reward. Speed-ups above the suspicious threshold are re-verified on
inputs from fresh seeds. Everything returned is plain data (EvaluateResult fields).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from cluster.config import PROJECT_ROOT
from sandbox_workers import compiler, guards, workspace
from sandbox_workers.isolation import Limits, run_sandboxed, sandbox_env
from sandbox_workers.reward import milestone_reward, speedup

log = logging.getLogger(__name__)
RUNNER_VERSION = "2"


class Evaluator:
    def __init__(self, cfg, backend: str | None = None, device_key: str = ""):
        self.cfg = cfg
        self.sb = cfg.sandbox
        self.backend = backend or self.sb.backend
        self.device_key = device_key or _default_device_key(self.backend, self.sb)
        root = self.sb.baseline_cache_dir or os.path.join(cfg.broker.cache_dir, "baselines")
        self.ref_root = Path(root).expanduser()
        self.ref_root.mkdir(parents=True, exist_ok=True)
        self._zyg = None
        self._zlock = threading.Lock()

    # ------------------------------------------------------------------ public
    def evaluate(self, task_source: str, files: dict[str, str], mode: str = "both", artifact: bytes = b"",
                 artifact_key: str = "") -> dict:
        t0 = time.monotonic()
        res = _empty_result()
        try:
            files = workspace.validate(files, self.backend)
        except workspace.WorkspaceError as exc:
            return _done(res, t0, error=str(exc))
        if self.sb.static_guards:
            found = guards.check_python(files[workspace.MODEL_NEW])
            if found:
                res["compiled"] = True
                res["evidence"]["violation_details"] = [v.__dict__ for v in found]
                return _done(res, t0, violations=guards.names(found), error="static guard violations")
        lib, comp = self._artifact(files, artifact, artifact_key)
        res["evidence"]["compile"] = comp
        if lib is None:
            res["violations"] = comp.get("violations", [])
            return _done(res, t0, error=comp.get("error") or "compilation failed")
        res["compiled"] = True
        timing = mode != "verify"
        try:
            # expected outputs first; the baselines (torch.compile's first compile is slow) only
            # once a candidate is correct and needs timing: most early candidates are not
            data_path, ref = self.reference(task_source, timing=False)
            cand = self._run_candidate(task_source, files, lib, data_path, timing)
            if timing and cand.get("correct") and not cand.get("violations") and not ref.get("baselines"):
                data_path, ref = self.reference(task_source, timing=True)
        except ReferenceFailure as exc:
            return _done(res, t0, error=f"reference run failed (task problem, not the solution): {exc}")
        self._assemble(res, ref, cand, timing)
        if res["correct"] and max(res["speedup_vs_eager"], res["speedup_vs_compile"]) > self.sb.suspicious_speedup:
            self._reverify(res, task_source, files, lib)
        out = _done(res, t0)
        log.info("evaluated (%s): reward %+.0f correct=%s violations=%s speedup eager %.3f compile %.3f in %.1f s",
                 self.backend, out["reward"], out["correct"], out["violations"], out["speedup_vs_eager"],
                 out["speedup_vs_compile"], out["duration_s"])
        return out

    # ------------------------------------------------------------------ artifact
    def _artifact(self, files, artifact: bytes, artifact_key: str):
        try:
            key = compiler.cache_key(files, self.backend, self.cfg)
        except Exception as exc:  # noqa: BLE001 - bad flags or no toolchain: report as a compile failure
            return None, {"ok": False, "error": str(exc)}
        found = guards.check_cpp(files, self.backend)
        if found:
            return None, {"ok": False, "error": "forbidden code in kernel sources", "violations": guards.names(found),
                          "log": "\n".join(f"{v.name}: {v.detail}" for v in found)}
        lib = compiler.lookup(self.cfg, key)
        if lib is None and artifact and artifact_key == key:
            lib = compiler.store(self.cfg, key, artifact, {"log": "", "backend": self.backend, "source": "inline"})
        if lib is not None:
            return lib, {"ok": True, "key": key, "cached": True}
        out = compiler.compile_workspace(files, self.backend, self.cfg)
        info = {"ok": out.ok, "key": out.key, "cached": out.cached, "log": out.log, "error": out.error,
                "violations": out.violations, "duration_s": out.duration_s}
        return (out.library if out.ok else None), info

    # ------------------------------------------------------------------ reference + baselines
    def reference_key(self, task_source: str, seeds: list[int]) -> str:
        doc = {"task": hashlib.sha256(task_source.encode()).hexdigest(), "seeds": seeds, "backend": self.backend,
               "device": self.device_key, "torch": compiler.torch_version(), "runner": RUNNER_VERSION,
               "timing": self._timing_spec(), "runtime": self._runtime_kwargs(),
               "compile_baseline": self.sb.compile_baseline, "py": sys.version.split()[0],
               "outputs": [self.sb.max_full_output_elems, self.sb.output_sample_elems]}
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]

    def trial_seeds(self, base: int | None = None) -> list[int]:
        base = self.sb.seed if base is None else base
        return [base + 1000 * i for i in range(max(self.sb.correctness_trials, 2))]

    def reference(self, task_source: str, timing: bool = True, seeds: list[int] | None = None,
                  use_cache: bool = True) -> tuple[Path, dict]:
        seeds = seeds or self.trial_seeds()
        key = self.reference_key(task_source, seeds)
        d = self.ref_root / key
        d.mkdir(parents=True, exist_ok=True)
        with open(d / ".lock", "w") as lockf:
            fcntl.flock(lockf, fcntl.LOCK_EX)
            meta = _read_json(d / "ref.json") if use_cache else None
            if meta and (meta.get("baselines") or not timing) and (d / "data.pt").is_file() \
                    and not (timing and noisy(meta.get("baselines") or {}, self.sb.baseline_max_cv)):
                meta["cached"] = True
                return d / "data.pt", meta
            have_data = bool(meta) and (d / "data.pt").is_file()
            spec = {"mode": "reference", "task_source": task_source, "seed": self.sb.seed, "trial_seeds": seeds,
                    "data_path": str(d / "data.pt"), "save_data": not have_data, "backend": self.backend,
                    "runtime": self._runtime_kwargs(),
                    "timing": self._timing_spec() if timing else None,
                    "compile_baseline": self.sb.compile_baseline, "max_full_elems": self.sb.max_full_output_elems,
                    "sample_elems": self.sb.output_sample_elems}
            out = self._child(spec, wall_s=self.sb.reference_timeout_s)
            if not out.get("ok"):
                raise ReferenceFailure(out.get("error", "unknown error"))
            out["cached"] = False
            if timing:
                if meta and meta.get("baselines"):
                    out["baselines"] = keep_faster(meta["baselines"], out.get("baselines") or {})
                out["baselines_noisy"] = noisy(out.get("baselines") or {}, self.sb.baseline_max_cv)
            (d / "ref.json").write_text(json.dumps(out))
            return d / "data.pt", out

    # ------------------------------------------------------------------ candidate
    def _run_candidate(self, task_source: str, files, lib: Path, data_path: Path, timing: bool) -> dict:
        deny = [str(PROJECT_ROOT / "sandbox_workers"), str(PROJECT_ROOT / "cluster"), str(self.ref_root),
                str(PROJECT_ROOT / "tests"), "/proc"]
        spec = {"mode": "candidate", "model_new_source": files[workspace.MODEL_NEW], "library": str(lib),
                "task_source": task_source,
                "data_path": str(data_path), "backend": self.backend, "runtime": self._runtime_kwargs(),
                "timing": self._timing_spec() if timing else None, "atol": self.sb.atol, "rtol": self.sb.rtol,
                "deny_paths": deny}
        return self._child(spec, wall_s=self.sb.eval_timeout_s)

    def _child(self, spec: dict, wall_s: float) -> dict:
        """Run the runner module in a fresh sandboxed process; a crash or hang becomes an error result."""
        with tempfile.TemporaryDirectory(prefix="krl-eval-") as tmp:
            spec = dict(spec, result_path=os.path.join(tmp, "result.json"))
            work = os.path.join(tmp, "work")
            os.mkdir(work)
            limits = Limits(wall_s=wall_s, cpu_s=self.sb.cpu_time_limit_s,
                            memory_mb=self.sb.eval_memory_limit_mb if self.backend == "cpu" else 0,
                            file_size_mb=self.sb.file_size_limit_mb)
            if self.sb.zygote:
                with self._zlock:
                    out = self._zygote().run(spec, work, limits, self.sb.max_output_chars)
            else:
                out = run_sandboxed([sys.executable, "-m", "sandbox_workers.runner"], cwd=work, limits=limits,
                                    env=self._child_env(work), stdin=json.dumps(spec).encode(),
                                    max_output_chars=self.sb.max_output_chars)
            result = _read_json(Path(spec["result_path"]))
        if result is None:
            if out.timed_out:
                why = f"evaluation exceeded the {wall_s:.0f} s deadline (killed)"
            elif out.signal:
                why = f"evaluation process died with {out.signal}"
            else:
                why = f"evaluation process exited with code {out.returncode}"
            tail = (out.stderr or out.stdout)[-1500:]
            return {"ok": False, "crashed": True, "error": f"{why}\n{tail}".strip(), "wall_s": out.wall_s,
                    "network_isolated": out.network_isolated}
        result.setdefault("network_isolated", out.network_isolated)
        return result

    def _zygote(self):
        if self._zyg is None:
            from sandbox_workers.zygote import ZygoteClient

            zdir = tempfile.mkdtemp(prefix="krl-zygote-")
            self._zyg = ZygoteClient(self._child_env(zdir), zdir)
        return self._zyg

    def close(self) -> None:
        if self._zyg is not None:
            self._zyg.close()
            self._zyg = None

    def _child_env(self, work: str) -> dict:
        extra = {"PYTHONPATH": str(PROJECT_ROOT), "TORCHINDUCTOR_CACHE_DIR": str(self.ref_root / "inductor"),
                 "KRL_IN_SANDBOX": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}  # fork-safe is_available()
        if self.backend == "cpu" and self.sb.cpu_threads > 0:
            extra["OMP_NUM_THREADS"] = str(self.sb.cpu_threads)
        env = sandbox_env(extra, home=work)
        env.pop("TORCH_COMPILE_DISABLE", None)  # the compile baseline needs inductor
        return env

    def _timing_spec(self) -> dict:
        sb = self.sb
        return {"warmup": sb.warmup, "min_trials": sb.trials, "max_trials": max(sb.max_trials, sb.trials),
                "budget_s": sb.timing_budget_s, "rel_ci": sb.timing_rel_ci, "min_trial_s": sb.min_trial_s}

    def _runtime_kwargs(self) -> dict:
        if self.backend == "cpu":
            return {"flush_mb": self.sb.cpu_flush_mb, "threads": self.sb.cpu_threads}
        return {"flush_mb": self.sb.cuda_flush_mb, "lead_us": self.sb.cuda_lead_us}

    # ------------------------------------------------------------------ result
    def _assemble(self, res: dict, ref: dict, cand: dict, timing: bool) -> None:
        res["violations"] = sorted({v["name"] for v in cand.get("violations", [])})
        res["evidence"].update(violation_details=cand.get("violations", []), trials=cand.get("trials", []),
                               versions=ref.get("versions", {}), clock=ref.get("clock", {}),
                               baseline_cached=ref.get("cached", False),
                               network_isolated=cand.get("network_isolated", False), device_key=self.device_key)
        res["correct"] = bool(cand.get("correct")) and not res["violations"]
        res["error"] = cand.get("error", "") if not res["correct"] else ""
        if cand.get("crashed"):
            res["evidence"]["crashed"] = True
        if not timing:
            res["reward"] = milestone_reward(res["compiled"], res["correct"], None, None, None)
            return
        base = ref.get("baselines", {})
        t = (cand.get("timing") or {}).get("median_s")
        te = base.get("eager", {}).get("median_s")
        tc = base.get("compile", {}).get("median_s")
        res["timings"] = {"candidate": cand.get("timing") or {}, "eager": base.get("eager", {}),
                          "compile": base.get("compile", {})}
        res["speedup_vs_eager"] = speedup(t, te)
        res["speedup_vs_compile"] = speedup(t, tc)
        res["reward"] = milestone_reward(res["compiled"], res["correct"], t, te, tc, self.sb.speedup_threshold)

    def _reverify(self, res: dict, task_source: str, files, lib: Path) -> None:
        seeds = self.trial_seeds(base=int.from_bytes(os.urandom(3), "little") + 7)
        try:
            data_path, _ = self.reference(task_source, timing=False, seeds=seeds, use_cache=False)
        except ReferenceFailure as exc:
            res["evidence"]["reverify"] = {"error": str(exc)}
            return
        cand = self._run_candidate(task_source, files, lib, data_path, timing=False)
        viol = sorted({v["name"] for v in cand.get("violations", [])})
        res["evidence"]["reverify"] = {"seeds": seeds, "correct": bool(cand.get("correct")), "violations": viol}
        if not cand.get("correct") or viol:
            res["correct"] = False
            res["violations"] = sorted(set(res["violations"]) | set(viol))
            res["error"] = f"re-verification on fresh inputs failed: {cand.get('error', '')}"
            res["reward"] = -1.0
        try:
            import shutil
            shutil.rmtree(data_path.parent, ignore_errors=True)
        except OSError:
            pass


def keep_faster(old: dict, new: dict) -> dict:
    """Per baseline variant, the measurement with the lower median (contention only inflates times)."""
    out = dict(new)
    for name, stats in old.items():
        mine = out.get(name)
        if "median_s" in stats and (not mine or "median_s" not in mine or stats["median_s"] < mine["median_s"]):
            out[name] = stats
    return out


def noisy(baselines: dict, max_cv: float) -> bool:
    """Any variant timed with a coefficient of variation above max_cv (max_cv <= 0: never)."""
    return max_cv > 0 and any(s.get("cv", 0.0) > max_cv for s in baselines.values() if "median_s" in s)


class ReferenceFailure(Exception):
    retriable = False


def _empty_result() -> dict:
    return {"compiled": False, "correct": False, "reward": -1.0, "speedup_vs_eager": 0.0, "speedup_vs_compile": 0.0,
            "violations": [], "error": "", "timings": {}, "evidence": {}, "duration_s": 0.0}


def _done(res: dict, t0: float, **kw) -> dict:
    res.update(kw)
    if res.get("violations") or not res["correct"]:
        res["correct"] = False if res.get("violations") else res["correct"]
    if not res["compiled"] or not res["correct"]:
        res["reward"] = -1.0
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
        return f"cpu:{cpu_model()}:threads={sb.cpu_threads or os.cpu_count()}"
    name = os.environ.get("KRL_GPU_NAME", "cuda")
    return f"cuda:{name}:locked={sb.lock_clocks}"
