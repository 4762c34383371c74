"""The backend interface: build sources into a library; flush caches and time a callable.

A Builder turns ``kernels/`` plus the fixed infrastructure (skills/infra) into
one shared library ``libkrl_ops.so`` through a generated ninja file, run inside
the OS sandbox (ossandbox.py "build" profile: only the build directory writable,
toolchain read-only, no network; isolation.py alone with sandbox.isolation =
"none"). A Runtime lives in the evaluation child: it knows its device,
synchronises, flushes the cache before each trial and returns raw timing
statistics. Both are small so that a new device kind slots in.
"""
from __future__ import annotations

import functools
import math
import re
import shutil
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sandbox_workers import ossandbox
from sandbox_workers.isolation import Limits, run_sandboxed, sandbox_env

INFRA_DIR = Path(__file__).resolve().parents[2] / "skills" / "infra"
LIBRARY_NAME = "libkrl_ops.so"
INFRA_SOURCES = ("krl_registry.cpp",)

# Flags an agent may add (anything else is refused with a clear error).
_SAFE_FLAG = re.compile(r"^(-O[0-3s]|-ffast-math|-funroll-loops|-fno-math-errno|-march=[\w-]+|-mtune=[\w-]+|"
                        r"-m(avx\w*|fma|f16c|sse\w*|bmi2?)|-D[A-Za-z_]\w*(=[\w.]+)?|--use_fast_math|-lineinfo|"
                        r"-lcublas|-lcublasLt|-lcudnn|-maxrregcount=\d+|--extra-device-vectorization|"
                        r"-Xptxas=-v|-std=c\+\+(17|20))$")


class FlagError(ValueError):
    retriable = False


def check_flags(flags: list[str]) -> list[str]:
    bad = [f for f in flags if not _SAFE_FLAG.match(f)]
    if bad:
        raise FlagError(f"extra flags not allowed: {' '.join(bad)} (allowed: optimisation, -march/-m*, -D, "
                        "--use_fast_math, -lcublas/-lcudnn, -maxrregcount)")
    return list(flags)


@dataclass
class BuildOutput:
    ok: bool
    library: Path | None
    log: str
    error: str = ""
    duration_s: float = 0.0
    timed_out: bool = False
    network_isolated: bool = False


@functools.lru_cache(maxsize=8)
def tool_version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return f"{exe}:missing"
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return f"{exe}:" + (" | ".join(lines[:1] + lines[-1:]) if lines else "unknown")


class Builder:
    """Compile kernels/ + skills/infra into LIBRARY_NAME with ninja."""

    name = "base"

    def toolchain_id(self) -> str:
        raise NotImplementedError

    def ninja_file(self, sources: list[str], extra_flags: list[str], cfg) -> str:
        raise NotImplementedError

    def inspect(self, library: Path, libs: list[str] = ()) -> list:
        """Policy violations (guards.Violation) of the built library itself, `libs` the -l names linked."""
        return []

    def auto_libs(self, files: dict[str, str]) -> list[str]:
        """Link flags implied by the sources' includes (cuBLAS/cuDNN on CUDA); none on CPU."""
        return []

    def build(self, files: dict[str, str], sources: list[str], work: Path, cfg,
              extra_flags: list[str] = ()) -> BuildOutput:
        """Write sources + infra into `work`, run ninja sandboxed, return the library or the log."""
        (work / "kernels").mkdir(parents=True, exist_ok=True)
        (work / "infra").mkdir(exist_ok=True)
        for rel, text in files.items():
            if rel.startswith("kernels/"):
                (work / rel).write_text(text)
        for p in INFRA_DIR.iterdir():
            if p.suffix in (".h", ".cpp"):
                shutil.copy(p, work / "infra" / p.name)
        flags = check_flags(list(extra_flags))
        flags += [f for f in self.auto_libs(files) if f not in flags]
        (work / "build.ninja").write_text(self.ninja_file(sources, flags, cfg))
        return run_ninja(work, cfg, max(1, min(len(sources) + 1, cfg.sandbox.compile_jobs)),
                         rlimit_as=self.name == "cpu")


def run_ninja(work: Path, cfg, jobs: int, rlimit_as: bool = True, ro_binds=(), file_size_mb: int = 0,
              target: str = LIBRARY_NAME, wall_s: float = 0.0) -> BuildOutput:
    """Run `work`/build.ninja in the build sandbox (only `work` writable, `ro_binds` visible read-only)."""
    sb = cfg.sandbox
    iso = getattr(sb, "isolation", "bwrap")
    profile = None
    if ossandbox.mode(iso) == "bwrap":  # IsolationUnavailable when bwrap cannot run: fail closed
        ossandbox.prepare_dir(work)
        profile = ossandbox.Profile("build", rw_binds=[(str(work), str(work))], ro_binds=list(ro_binds),
                                    chdir=str(work), tmp_mb=max(1024, getattr(sb, "sandbox_tmp_mb", 0)),
                                    toolchain=True)
    limits = Limits(wall_s=wall_s or sb.compile_timeout_s, cpu_s=sb.cpu_time_limit_s,
                    memory_mb=sb.memory_limit_mb if rlimit_as else 0,
                    data_mb=sb.memory_limit_mb if profile is not None else 0,  # RLIMIT_DATA: CUDA-safe
                    file_size_mb=file_size_mb or sb.file_size_limit_mb)
    ninja = shutil.which("ninja") or "ninja"
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []  # builds yield to timing runs on shared CPUs
    res = run_sandboxed([*nice, ninja, "-j", str(jobs)], cwd=str(work), limits=limits,
                        env=sandbox_env(home=str(work)), max_output_chars=sb.max_output_chars,
                        profile=profile, isolation=iso)
    log = (res.stdout + res.stderr).strip()
    lib = work / target
    if res.timed_out:
        return BuildOutput(False, None, log, f"build exceeded the {sb.compile_timeout_s:.0f} s deadline",
                           res.wall_s, True, res.network_isolated)
    if res.returncode != 0 or not lib.is_file():
        return BuildOutput(False, None, _clean_log(log, work), "compilation failed", res.wall_s,
                           network_isolated=res.network_isolated)
    return BuildOutput(True, lib, _clean_log(log, work), "", res.wall_s, network_isolated=res.network_isolated)


def _clean_log(log: str, work: Path) -> str:
    """Drop ninja's progress lines and the temp-dir prefix so the agent sees its own paths."""
    keep = [ln for ln in log.splitlines() if not re.match(r"^\[\d+/\d+\] ", ln)]
    return "\n".join(keep).replace(str(work) + "/", "")


class Runtime:
    """Inside the evaluation child: device, synchronisation, cache flush and timing."""

    device = "cpu"

    def sync(self) -> None:
        pass

    def flush(self) -> None:
        raise NotImplementedError

    def device_name(self) -> str:
        raise NotImplementedError

    def clock_info(self) -> dict:
        return {}

    def time_batch(self, fn, batch: int) -> float:
        """Seconds for `batch` back-to-back calls, caches flushed before."""
        raise NotImplementedError

    def time_callable(self, fn, *, warmup: int, min_trials: int, max_trials: int, budget_s: float,
                      rel_ci: float, min_trial_s: float, prepare=None) -> dict:
        """Warm up, choose a batch size so one trial is long enough, then sample until the median is tight.

        `prepare()` runs before every trial, outside the timed region (input rotation).
        Returns per-call seconds: median, mean, stdev, min, cv, n (trials), batch (calls per trial).
        """
        prepare = prepare or (lambda: None)
        for _ in range(max(1, warmup)):
            prepare()
            fn()
        self.sync()
        prepare()
        one = self.time_batch(fn, 1)
        batch = 1 if one >= min_trial_s else min(1000, math.ceil(min_trial_s / max(one, 1e-7)))
        samples: list[float] = []
        t_start = time.monotonic()
        while len(samples) < max_trials:
            prepare()
            samples.append(self.time_batch(fn, batch) / batch)
            if len(samples) >= min_trials:
                if time.monotonic() - t_start > budget_s or _rel_sem_median(samples) <= rel_ci:
                    break
        return summarize(samples, batch)


def _rel_sem_median(samples: list[float]) -> float:
    med = statistics.median(samples)
    if med <= 0 or len(samples) < 2:
        return math.inf
    return 1.2533 * statistics.stdev(samples) / math.sqrt(len(samples)) / med


def summarize(samples: list[float], batch: int = 1) -> dict:
    return {
        "median_s": statistics.median(samples),
        "mean_s": statistics.fmean(samples),
        "stdev_s": statistics.stdev(samples) if len(samples) > 1 else 0.0,
        "min_s": min(samples),
        "n": len(samples),
        "batch": batch,
        "cv": (statistics.stdev(samples) / statistics.fmean(samples)) if len(samples) > 1 else 0.0,
        "spread": robust_spread(samples),
    }


def robust_spread(samples: list[float]) -> float:
    """1.4826 x the median absolute deviation over the median: the CV of a steady distribution, but blind to the
    few spikes a shared host adds (one 6 ms call among 31 at 1.7 ms takes the CV to 0.56, this to ~0.03). The
    reward reads medians, so only a spread of the bulk makes a measurement untrustworthy."""
    if len(samples) < 2:
        return 0.0
    med = statistics.median(samples)
    if med <= 0:
        return 0.0
    return 1.4826 * statistics.median(abs(x - med) for x in samples) / med
