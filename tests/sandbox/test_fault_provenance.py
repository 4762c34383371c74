"""Worker handlers say whose failure a result is: "none", "policy" (the candidate's) or "infra" (the worker's)."""
from __future__ import annotations

import pytest

from schemas.messages import (FAULT_INFRA, FAULT_NONE, FAULT_POLICY, CompileRequest, EvaluateRequest, RequestHeader,
                              fault_of)
from tests.sandbox.conftest import fast_cfg
from tests.sandbox.helpers import ROOT

EXAMPLE = ROOT / "skills" / "examples" / "cpu_19_relu"


def _solution() -> dict[str, str]:
    return {"model_new.py": (EXAMPLE / "model_new.py").read_text(),
            "kernels/relu.cpp": (EXAMPLE / "kernels" / "relu.cpp").read_text()}


def _creq(files) -> CompileRequest:
    return CompileRequest(header=RequestHeader(), episode_id="ep", files=files, backend="cpu")


def _ereq(**kw) -> EvaluateRequest:
    base = dict(header=RequestHeader(), episode_id="ep", task_id="t", model_py=(EXAMPLE / "model.py").read_text(),
                files=_solution(), mode="verify", backend="cpu")
    return EvaluateRequest(**{**base, **kw})


@pytest.fixture
def cfg(tmp_path):
    return fast_cfg(str(tmp_path))


def test_compile_handler_faults(cfg, monkeypatch):
    from sandbox_workers import compiler, worker

    handler = worker.CompileHandler(cfg)
    files = _solution()
    files["kernels/relu.cpp"] += "\n// provenance test\n"
    good = handler(_creq(files))
    assert good.ok and good.fault == FAULT_NONE and fault_of(good) == FAULT_NONE

    broken = dict(files, **{"kernels/relu.cpp": files["kernels/relu.cpp"].replace("int64_t n)", "int64_t n")})
    bad = handler(_creq(broken))
    assert not bad.ok and bad.fault == FAULT_POLICY and fault_of(bad) == FAULT_POLICY  # the agent's compile error

    # the same compile error on a worker without its toolchain is no verdict on the code
    real_which = worker.shutil.which
    monkeypatch.setattr(worker.shutil, "which", lambda name: None if name == "ninja" else real_which(name))
    broken["kernels/relu.cpp"] += "// again\n"
    lost = handler(_creq(broken))
    assert not lost.ok and lost.fault == FAULT_INFRA and "ninja" in lost.error
    monkeypatch.undo()

    def explode(*a, **kw):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(compiler, "compile_workspace", explode)
    crashed = handler(_creq(files))
    assert not crashed.ok and crashed.fault == FAULT_INFRA and "No space left" in crashed.error
    assert crashed.worker == handler.name


class _FakeEvaluator:
    def __init__(self, out):
        self.out = out

    def evaluate(self, *a, **kw):
        if isinstance(self.out, BaseException):
            raise self.out
        return dict(self.out)

    def close(self):
        pass


def _result(**kw) -> dict:
    base = {"compiled": True, "correct": False, "reward": -1.0, "speedup_vs_eager": 0.0, "speedup_vs_compile": 0.0,
            "violations": [], "error": "", "timings": {}, "evidence": {}, "duration_s": 0.5}
    return {**base, **kw}


@pytest.mark.parametrize("out, fault, reward", [
    (_result(correct=True, reward=2.0), FAULT_NONE, 2.0),
    (_result(error="mismatch at index 3"), FAULT_POLICY, -1.0),
    (_result(violations=["timing_hack"], error="violations"), FAULT_POLICY, -1.0),
    (_result(error="evaluation exceeded the 60 s deadline (killed)", evidence={"crashed": True}), FAULT_POLICY, -1.0),
    # today's evaluator: a failed reference run is said only in the error text
    (_result(error="reference run failed (task problem, not the solution): child died"), FAULT_INFRA, 0.0),
    (_result(error="baseline noisy", evidence={"infra": True}), FAULT_INFRA, 0.0),
    (_result(error="GPU unhealthy", fault="infra"), FAULT_INFRA, 0.0),
    (_result(correct=True, reward=1.0, fault="none"), FAULT_NONE, 1.0),
    (RuntimeError("CUDA error: unspecified launch failure in the worker"), FAULT_INFRA, 0.0),
])
def test_eval_handler_faults(cfg, out, fault, reward):
    from sandbox_workers import worker

    handler = worker.EvalHandler(cfg, "cpu")
    handler.evaluator = _FakeEvaluator(out)
    res = handler(_ereq())
    assert res.fault == fault and fault_of(res) == fault
    assert res.reward == reward  # an infrastructure fault is never the policy's -1
    if fault == FAULT_INFRA:
        assert res.evidence.get("infra") is True and not res.correct and res.worker == handler.name
    handler.close()


def test_eval_handler_misrouted_request_is_infra(cfg):
    from sandbox_workers import worker

    handler = worker.EvalHandler(cfg, "cpu")
    res = handler(_ereq(backend="cuda"))
    assert res.fault == FAULT_INFRA and res.reward == 0.0 and "cuda" in res.error
    handler.close()


def test_exception_while_stopping_abandons_instead_of_answering(cfg):
    from sandbox_workers import isolation, worker

    handler = worker.EvalHandler(cfg, "cpu")
    handler.evaluator = _FakeEvaluator(RuntimeError("child killed by the stop"))
    isolation.ABORTED.set()
    try:
        with pytest.raises(worker.Abandoned):
            handler(_ereq())
    finally:
        isolation.ABORTED.clear()
        handler.close()


def test_retriable_errors_still_reach_the_serve_loop(cfg):
    from cluster.errors import RetriableError
    from sandbox_workers import worker

    handler = worker.EvalHandler(cfg, "cpu")
    handler.evaluator = _FakeEvaluator(RetriableError("broker busy"))
    with pytest.raises(RetriableError):
        handler(_ereq())
    handler.close()
