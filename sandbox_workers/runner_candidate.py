"""Candidate child: bind the kernels, import ModelNew under guards, verify, then time it.

The reference Model is never loaded here: weights, inputs and expected outputs
come from the reference child's data file (read before any candidate code
runs, then denied to it), so the candidate can neither call the reference nor
find its leftover outputs in freed memory.
"""
from __future__ import annotations

import random
import sys
import threading
import types

import torch

from sandbox_workers import guards, runtime_guards as rg
from sandbox_workers.backends import get_runtime
from sandbox_workers.backends.base import INFRA_DIR
from sandbox_workers.runner_common import (flatten_outputs, input_digest, make_inputs, make_prepare,
                                           task_inputs_fn, timing_pool)

_TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


def run_candidate(spec: dict) -> dict:
    runtime = get_runtime(spec["backend"], **spec.get("runtime", {}))
    device = runtime.device
    data = torch.load(spec["data_path"], weights_only=True)
    get_inputs, _ = task_inputs_fn(spec.pop("task_source"))
    rec = rg.Recorder()
    rg.install_audit(rec, spec.get("deny_paths", []) + [spec["data_path"]], allow_dlopen=set())
    rg.install_thread_guard(rec)
    sys.path.insert(0, str(INFRA_DIR))
    import krl

    krl._bind(spec["library"], device)
    snapshot = rg.protected_objects(runtime)
    rng = random.Random(int.from_bytes(__import__("os").urandom(8), "little"))
    threads0 = threading.active_count()
    res = {"ok": True, "compiled": True, "correct": False, "trials": [], "violations": [], "error": ""}

    def finish(error: str = "") -> dict:
        rg.check_patched(rec, snapshot, runtime)
        if threading.active_count() > threads0:
            rec.add(guards.THREADS, f"{threading.active_count() - threads0} extra Python threads alive")
        res["violations"] = [{"name": v.name, "detail": v.detail} for v in rec.found]
        res["error"] = error or res["error"]
        if rec.found or error:
            res["correct"] = False
        return res

    # 1. import model_new.py and build ModelNew with the reference weights
    try:
        rec.active = True
        mod = types.ModuleType("model_new")
        mod.__file__ = "model_new.py"
        sys.modules["model_new"] = mod
        exec(compile(spec["model_new_source"], "model_new.py", "exec"), mod.__dict__)  # noqa: S102 - sandboxed
        cls = getattr(mod, "ModelNew", None)
        if cls is None:
            rec.active = False
            return finish("model_new.py defines no ModelNew")
        model = cls(*data["init_inputs"])
        rec.active = False
        _check_model(model, rec)
        missing, unexpected = model.load_state_dict(data["state_dict"], strict=False)
        if missing or unexpected:
            return finish(f"ModelNew's parameters do not match Model's state_dict: missing {list(missing)[:8]}, "
                          f"unexpected {list(unexpected)[:8]} (use the same submodule/parameter names)")
        model = model.to(device).eval()
    except rg.GuardTripped as exc:
        rec.active = False
        return finish(f"guard: {exc}")
    except Exception as exc:  # noqa: BLE001 - the candidate's own bug is the agent's observation
        rec.active = False
        return finish(f"building ModelNew failed: {type(exc).__name__}: {exc}")
    rg.check_patched(rec, snapshot, runtime)

    call = _guarded_caller(model, rec, runtime)
    # 2. correctness on every seed's inputs (regenerated from the seeds; a window of recent
    #    trials' inputs and outputs stays alive so buffers are distinct)
    trials = data["trials"]
    window: list[tuple[list, list]] = []
    for i, t in enumerate(trials):
        inputs = make_inputs(get_inputs, t["seed"], device)
        if input_digest(inputs) != t["input_digest"]:
            res["ok"] = False
            return finish(f"task inputs are not reproducible from seed {t['seed']} (task problem, not the solution)")
        before = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
        outs, err = call(inputs)
        if err:
            return finish(err)
        ok, detail = compare(outs, t["outputs"], spec["atol"], spec["rtol"])
        res["trials"].append({"seed": t["seed"], "ok": ok, "detail": detail})
        _check_io(inputs, before, outs, [o for _, o in window], rec)
        del before
        window = (window + [(inputs, outs)])[-2:]
        if not ok:
            return finish(f"output mismatch on trial {i} (seed {t['seed']}): {detail}")
    # 3. same buffers, new contents (the last two trials' buffers swap contents): a cache keyed
    #    by pointers returns stale outputs here
    if len(window) == 2:
        n = len(trials)
        for buf_i, src_t in ((1, n - 2), (0, n - 1)):
            src = make_inputs(get_inputs, trials[src_t]["seed"], device)
            for dst, x in zip(window[buf_i][0], src):
                if isinstance(dst, torch.Tensor):
                    dst.copy_(x)
            outs, err = call(window[buf_i][0])  # src stays alive: its freed block must not become the output
            del src
            if err:
                return finish(err)
            ok, detail = compare(outs, trials[src_t]["outputs"], spec["atol"], spec["rtol"])
            if not ok:
                rec.add(guards.OUTPUT_CACHING, f"stale output when inputs changed in place: {detail}")
                break
    del window
    if rec.found:
        return finish("guard violations")
    res["correct"] = True
    # 4. timing with the baselines' protocol; random timed calls are re-checked afterwards
    if spec.get("timing"):
        res["timing"] = _time(model, get_inputs, trials, runtime, spec, rec, rng)
    return finish()


def _guarded_caller(model, rec, runtime):
    def call(inputs):
        fp = rg.state_fingerprint(model)
        try:
            rec.active = True
            with torch.no_grad(), rg.ComputeGuard(rec):
                out = model(*inputs)
            runtime.sync()
        except rg.GuardTripped as exc:
            return None, f"guard: {exc}"
        except Exception as exc:  # noqa: BLE001 - a failing forward is the agent's observation
            return None, f"ModelNew.forward raised {type(exc).__name__}: {exc}"[:3000]
        finally:
            rec.active = False
        if rg.state_fingerprint(model) != fp:
            rec.add(guards.OUTPUT_CACHING, "ModelNew changed its own Python state during forward")
        return flatten_outputs(out), ""
    return call


def _check_model(model, rec) -> None:
    if not isinstance(model, torch.nn.Module):
        rec.add(guards.TENSOR_SUBCLASS, "ModelNew is not a torch.nn.Module")
    for k, v in vars(type(model)).items():
        if k in ("__call__", "__torch_function__", "__getattribute__"):
            rec.add(guards.INTROSPECTION, f"ModelNew overrides {k}")


def compare(outs, expected: list[dict], atol: float, rtol: float) -> tuple[bool, str]:
    """Outputs vs the reference's records (full tensors, or values at random positions for big ones)."""
    if len(outs) != len(expected):
        return False, f"expected {len(expected)} outputs, got {len(outs)}"
    for j, (o, e) in enumerate(zip(outs, expected)):
        if type(o) is not torch.Tensor:
            return False, f"output {j}: expected a plain torch.Tensor, got {type(o).__name__}"
        if list(o.shape) != list(e["shape"]):
            return False, f"output {j}: shape {tuple(o.shape)} != expected {tuple(e['shape'])}"
        if str(o.dtype) != e["dtype"]:
            return False, f"output {j}: dtype {o.dtype} != expected {e['dtype']}"
        if o.is_floating_point():
            bad = int((~torch.isfinite(o)).sum())
            if bad > e["nonfinite"]:
                return False, f"output {j}: {bad} NaN/Inf values (reference: {e['nonfinite']})"
        if "full" in e:
            oc, ref = o.detach().cpu(), e["full"]
        else:
            oc, ref = o.detach().reshape(-1)[e["idx"].to(o.device)].cpu(), e["vals"]
        tol_a, tol_r = max(atol, _TOL.get(ref.dtype, 0.0)), max(rtol, _TOL.get(ref.dtype, 0.0))
        if not torch.allclose(oc, ref, atol=tol_a, rtol=tol_r, equal_nan=True):
            where = "" if "full" in e else f" (at {ref.numel()} sampled positions)"
            if ref.is_floating_point():
                diff = (oc.double() - ref.double()).abs()
                diff[~torch.isfinite(diff)] = 0
                return False, f"output {j}: max abs diff {float(diff.max()):.4g}{where} (atol {tol_a}, rtol {tol_r})"
            return False, f"output {j}: {int((oc != ref).sum())} elements differ{where}"
    return True, "ok"


def _ranges(t: torch.Tensor):
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def _check_io(inputs, before, outs, previous, rec) -> None:
    for k, (x, b) in enumerate(zip(inputs, before)):
        if isinstance(x, torch.Tensor) and not torch.equal(x, b) and not (x.isnan() | b.isnan()).any():
            rec.add(guards.INPUT_MUTATION, f"input {k} was modified by ModelNew")
    for j, o in enumerate(outs):
        if type(o) is not torch.Tensor:
            rec.add(guards.TENSOR_SUBCLASS, f"output {j} is {type(o).__module__}.{type(o).__name__}")
            continue
        lo, hi = _ranges(o)
        for k, x in enumerate(inputs):
            if isinstance(x, torch.Tensor) and x.numel() and o.numel():
                xlo, xhi = _ranges(x)
                if lo < xhi and xlo < hi:
                    rec.add(guards.OUTPUT_ALIASES_INPUT, f"output {j} shares memory with input {k}")
        for prev in previous:
            for p in prev:
                if isinstance(p, torch.Tensor) and p.numel() and o.numel() and _ranges(p)[0] == lo:
                    rec.add(guards.OUTPUT_CACHING, f"output {j} reuses the buffer of an earlier call's output")


def _time(model, get_inputs, trials, runtime, spec, rec, rng) -> dict:
    pool = timing_pool(get_inputs, [t["seed"] for t in trials], runtime.device)
    live = [x.clone() if isinstance(x, torch.Tensor) else x for x in pool[0]]
    rotate = make_prepare(live, pool)
    state = {"idx": 0, "keep": False}
    kept: list[tuple[int, list]] = []

    def prepare():
        state["idx"] = rotate()
        state["keep"] = len(kept) < 4 and rng.random() < 0.15

    def fn():
        out = model(*live)
        if state["keep"]:
            kept.append((state["idx"], flatten_outputs(out)))
            state["keep"] = False

    fp = rg.state_fingerprint(model)
    rec.active = True
    try:
        with torch.no_grad():
            stats = runtime.time_callable(fn, prepare=prepare, **spec["timing"])
        runtime.sync()
    finally:
        rec.active = False
    if not kept:  # at least one timed-protocol call is always checked
        rec.active = True
        try:
            with torch.no_grad():
                prepare()
                state["keep"] = True
                fn()
                runtime.sync()
        finally:
            rec.active = False
    if rg.state_fingerprint(model) != fp:
        rec.add(guards.OUTPUT_CACHING, "ModelNew changed its own Python state while being timed")
    stats["spot_checks"] = len(kept)
    for idx, outs in kept:
        ok, detail = compare(outs, trials[idx]["outputs"], spec["atol"], spec["rtol"])
        if not ok:
            rec.add(guards.TIMED_OUTPUT_WRONG, f"a timed call returned a wrong result: {detail}")
    if getattr(runtime, "wall_over_event", None):
        ratios = sorted(runtime.wall_over_event)
        stats["wall_over_event_median"] = ratios[len(ratios) // 2]
        # Work hidden on another stream finishes after the timed stream's end event. Honest calls measured
        # 0.94-1.05 on the H200 (11 tasks, docs/oracle-gpu.md), the wall time being net of flush + lead.
        if stats["median_s"] * stats["batch"] > 1e-4 and stats["wall_over_event_median"] > 2.0:
            rec.add(guards.SIDE_STREAM, f"wall time is {stats['wall_over_event_median']:.1f}x the event time")
    return stats
