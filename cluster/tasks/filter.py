"""The execution filter: decide whether one task file is a usable training task.

``check_task(source, cfg)`` runs every rule in the current process and must be called
inside a sandbox child (``cluster.tasks.filter_runner`` spawns one; a sandbox
evaluation worker can call it the same way). It needs only torch. Rules, in order
(the first failure names the verdict):

  load            the file defines Model / get_inputs / get_init_inputs and they work
  eager           the forward runs and returns floating tensors
  finite          no NaN or Inf in the output
  deterministic   same inputs under different RNG seeds give the same output (no stochastic ops)
  mutates_inputs  the forward leaves its inputs unchanged
  constant        the output is not (within tolerance) one constant
  identity        no output is (within tolerance) one of the inputs unchanged: a program that returns its input
                  must fail (KernelBench's 19_ReLU draws torch.rand, never negative, so `return x` passed the oracle)
  input_insensitive  two input sets from different seeds give distinguishable outputs
  runtime_window  eager median runtime inside [min_ms, max_ms]
  compile         torch.compile(model) runs
  compile_mismatch  the compiled output matches eager within tolerance
"""
from __future__ import annotations

import statistics
import time
import traceback
from dataclasses import asdict, dataclass, field, fields

RULES = ("load", "eager", "finite", "deterministic", "mutates_inputs", "constant", "identity", "input_insensitive",
         "runtime_window", "compile", "compile_mismatch")
# Eager runtime windows (ms): CUDA Agent's 1-100 ms on GPU; a few ms on a 2-core CPU.
DEFAULT_WINDOWS = {"cuda": (1.0, 100.0), "cpu": (0.1, 10.0)}
_RUNTIMES: dict = {}  # one sandbox timing runtime (with its flush buffer) per backend and process


@dataclass
class FilterConfig:
    backend: str = "cpu"
    min_ms: float = -1.0  # < 0: the backend's default window
    max_ms: float = -1.0
    atol: float = 1e-2
    rtol: float = 1e-2
    compile_backend: str = "inductor"
    check_compile: bool = True
    warmup: int = 2
    trials: int = 7
    input_seeds: tuple[int, int] = (42, 43)
    threads: int = 1  # torch CPU threads in the child (0 = torch's default); one thread keeps timings
    #                   stable on a busy 2-core machine, where OpenMP spin-waits inflate runtimes 100x
    flush_mb: int = -1  # cache-flush buffer before each timed trial (-1: 8 MiB on CPU, 256 MiB on GPU)

    def window(self) -> tuple[float, float]:
        lo, hi = DEFAULT_WINDOWS[self.backend]
        return (self.min_ms if self.min_ms >= 0 else lo, self.max_ms if self.max_ms >= 0 else hi)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "FilterConfig":
        """Rebuild a config sent over a pipe or the bus; unknown fields or an unknown backend raise ValueError."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise ValueError(f"filter config: unknown field(s) {unknown}")
        out = dict(raw)
        if "input_seeds" in out:
            out["input_seeds"] = tuple(int(x) for x in out["input_seeds"])
        cfg = cls(**out)
        if cfg.backend not in DEFAULT_WINDOWS:
            raise ValueError(f"filter config: backend={cfg.backend!r} is not one of {sorted(DEFAULT_WINDOWS)}")
        return cfg


@dataclass
class Verdict:
    ok: bool
    rule: str = ""  # the first rule that failed ("" when ok)
    reason: str = ""
    eager_ms: float = 0.0
    compile_ms: float = 0.0
    output_shape: list[int] = field(default_factory=list)
    duration_s: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


class Reject(Exception):
    def __init__(self, rule: str, reason: str):
        super().__init__(f"{rule}: {reason}")
        self.rule, self.reason = rule, reason


def load_task_module(source: str, name: str = "task_under_test"):
    """Execute a task file's source as a fresh module and return its namespace."""
    import types

    module = types.ModuleType(name)
    module.__file__ = f"<{name}>"
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - runs in a sandbox child
    for attr in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, attr):
            raise Reject("load", f"the file defines no {attr}")
    return module


def _outputs(y) -> list:
    import torch

    items = list(y) if isinstance(y, (tuple, list)) else [y]
    if not items or not all(isinstance(t, torch.Tensor) for t in items):
        raise Reject("eager", f"forward returned {type(y).__name__}, not a tensor or tuple of tensors")
    if not all(t.is_floating_point() for t in items):
        raise Reject("eager", "forward returned a non-floating tensor")
    return [t.detach() for t in items]


def _inputs(module, seed: int, device):
    import torch

    torch.manual_seed(seed)
    inputs = module.get_inputs()
    if not isinstance(inputs, (list, tuple)):
        raise Reject("load", "get_inputs() did not return a list")
    return [t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs]


def _close(a: list, b: list, atol: float, rtol: float) -> bool:
    import torch

    return len(a) == len(b) and all(x.shape == y.shape and torch.allclose(x, y, atol=atol, rtol=rtol)
                                    for x, y in zip(a, b))


def _run(model, inputs, rng_seed: int):
    import torch

    torch.manual_seed(rng_seed)
    with torch.no_grad():
        return _outputs(model(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]))


def time_eager_ms(model, inputs, cfg: FilterConfig) -> float:
    """Median eager runtime in ms, with the sandbox's timing protocol (cache flush, batching) when installed."""
    import torch

    try:
        from sandbox_workers.backends import get_runtime
    except ImportError:  # the tasks package also runs where the sandbox is not installed
        get_runtime = None
    backend, warmup, trials = cfg.backend, cfg.warmup, cfg.trials
    with torch.no_grad():
        if get_runtime is not None:
            flush = cfg.flush_mb if cfg.flush_mb >= 0 else (8 if backend == "cpu" else 256)
            kwargs = {"flush_mb": flush, "threads": cfg.threads} if backend == "cpu" else {"flush_mb": flush}
            key = (backend, tuple(sorted(kwargs.items())))
            runtime = _RUNTIMES.get(key) or _RUNTIMES.setdefault(key, get_runtime(backend, **kwargs))
            stats = runtime.time_callable(lambda: model(*inputs), warmup=warmup, min_trials=trials,
                                          max_trials=4 * trials, budget_s=1.0, rel_ci=0.02, min_trial_s=2e-4)
            return stats["median_s"] * 1e3
        return _simple_time_ms(model, inputs, backend, warmup, trials)


def _simple_time_ms(model, inputs, backend: str, warmup: int, trials: int) -> float:
    import torch

    for _ in range(warmup):
        model(*inputs)
    samples = []
    if backend == "cuda":
        torch.cuda.synchronize()
        for _ in range(trials):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(*inputs)
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end))
    else:
        for _ in range(trials):
            t0 = time.perf_counter()
            model(*inputs)
            samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def _check(source: str, cfg: FilterConfig, verdict: Verdict) -> None:
    import torch

    device = torch.device("cuda" if cfg.backend == "cuda" else "cpu")
    try:
        module = load_task_module(source)
        torch.manual_seed(cfg.input_seeds[0])
        model = module.Model(*module.get_init_inputs()).to(device)
        inputs_a = _inputs(module, cfg.input_seeds[0], device)
        inputs_b = _inputs(module, cfg.input_seeds[1], device)
    except Reject:
        raise
    except Exception as exc:  # noqa: BLE001 - the task's own code failed: that is the verdict
        raise Reject("load", _short(exc)) from None
    try:
        out_a = _run(model, inputs_a, 1)
    except Reject:
        raise
    except Exception as exc:  # noqa: BLE001
        raise Reject("eager", _short(exc)) from None
    verdict.output_shape = list(out_a[0].shape)
    if not all(torch.isfinite(t).all() for t in out_a):
        raise Reject("finite", "the output has NaN or Inf")
    if not _close(out_a, _run(model, inputs_a, 2), atol=1e-6, rtol=1e-5):
        raise Reject("deterministic", "the same inputs under a different RNG seed gave a different output")
    snapshot = [t.clone() for t in inputs_a if isinstance(t, torch.Tensor)]
    with torch.no_grad():
        model(*inputs_a)
    if not all(torch.equal(s, t) for s, t in zip(snapshot, [t for t in inputs_a if isinstance(t, torch.Tensor)])):
        raise Reject("mutates_inputs", "the forward changed its inputs in place")
    if all(torch.allclose(t, torch.full_like(t, t.float().mean().item()), atol=cfg.atol, rtol=cfg.rtol)
           for t in out_a):
        raise Reject("constant", "the output is a constant within tolerance")
    _check_not_identity(out_a, inputs_a, cfg)
    out_b = _run(model, inputs_b, 1)
    if _close(out_a, out_b, cfg.atol, cfg.rtol):
        raise Reject("input_insensitive", "outputs for different inputs are indistinguishable within tolerance")
    lo, hi = cfg.window()
    verdict.eager_ms = time_eager_ms(model, inputs_a, cfg)
    if not lo <= verdict.eager_ms <= hi:
        raise Reject("runtime_window", f"eager runtime {verdict.eager_ms:.3f} ms outside [{lo}, {hi}] ms")
    if cfg.check_compile:
        _check_compile(model, inputs_a, out_a, cfg, verdict)


def _check_not_identity(outputs: list, inputs: list, cfg: FilterConfig) -> None:
    """Reject a task on which returning an input unchanged is correct: the oracle checks outputs on the task's own
    input distribution only, so such a task pays a no-op program as a perfect kernel."""
    import torch

    for j, out in enumerate(outputs):
        for k, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.is_floating_point() and x.shape == out.shape \
                    and torch.allclose(out, x.to(out.dtype), atol=cfg.atol, rtol=cfg.rtol):
                raise Reject("identity", f"output {j} equals input {k} within tolerance: a program returning its "
                                         "input would pass (the inputs never exercise what the op changes)")


def _check_compile(model, inputs, expected, cfg: FilterConfig, verdict: Verdict) -> None:
    import torch

    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend=cfg.compile_backend)
        t0 = time.perf_counter()
        got = _run(compiled, inputs, 1)
        verdict.compile_ms = (time.perf_counter() - t0) * 1e3
    except Reject as exc:
        raise Reject("compile", exc.reason) from None
    except Exception as exc:  # noqa: BLE001
        raise Reject("compile", _short(exc)) from None
    if not _close(expected, got, cfg.atol, cfg.rtol):
        raise Reject("compile_mismatch", "torch.compile output differs from eager beyond tolerance")


def _short(exc: BaseException, limit: int = 400) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= limit else text[:limit] + "..."


def check_task(source: str, cfg: FilterConfig | None = None) -> Verdict:
    """Run every rule on one task source; never raises for a bad task (the verdict says why)."""
    import torch

    cfg = cfg or FilterConfig()
    if cfg.threads and cfg.backend == "cpu":
        torch.set_num_threads(cfg.threads)
    verdict = Verdict(ok=False)
    t0 = time.perf_counter()
    try:
        _check(source, cfg, verdict)
        verdict.ok = True
    except Reject as exc:
        verdict.rule, verdict.reason = exc.rule, exc.reason
    except Exception as exc:  # noqa: BLE001 - report any harness failure as the verdict, with its trace
        verdict.rule, verdict.reason = "load", _short(exc) + "\n" + traceback.format_exc(limit=3)
    verdict.duration_s = time.perf_counter() - t0
    return verdict
