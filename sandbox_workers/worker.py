"""Bus handlers of the compile and evaluation workers (CompileRequest -> CompileResult, EvaluateRequest -> result).

The handlers never raise for the agent's mistakes: those become results the
agent reads. ``Abandoned`` (a BaseException) escapes `serve` when SIGTERM
arrived mid-job, so that job's offset is not committed and it is redelivered.
"""
from __future__ import annotations

import logging
import os
import socket
import threading

from sandbox_workers import isolation
from sandbox_workers.filter_service import FilterService

log = logging.getLogger(__name__)


class Abandoned(BaseException):
    """The worker is stopping: the current request is dropped uncommitted (redelivered later)."""


def worker_name(kind: str) -> str:
    return f"{kind}@{socket.gethostname()}:{os.getpid()}"


def install_sigterm(stop: threading.Event) -> None:
    """SIGTERM/SIGINT: stop between messages, and abandon (kill) any child now running."""
    import signal

    def on_signal(signum, _frame):
        log.info("signal %d: stopping; abandoning the current job", signum)
        stop.set()
        isolation.abort_all()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


class CompileHandler:
    def __init__(self, cfg):
        self.cfg = cfg
        self.name = worker_name("compile")

    def __call__(self, req):
        from sandbox_workers import compiler
        from schemas.messages import CompileResult

        backend = req.backend or self.cfg.sandbox.backend
        cfg = self.cfg
        if req.cuda_arch and backend == "cuda":
            import copy
            cfg = copy.deepcopy(self.cfg)
            cfg.sandbox.cuda_arch = req.cuda_arch
        out = compiler.compile_workspace(req.files, backend, cfg, req.extra_flags)
        if isolation.ABORTED.is_set():
            raise Abandoned()
        res = CompileResult(request_id=req.header.request_id, episode_id=req.episode_id, ok=out.ok,
                            artifact_key=out.key if out.ok else "", cached=out.cached, log=out.log,
                            error=out.error + (f" ({', '.join(out.violations)})" if out.violations else ""),
                            duration_s=out.duration_s, worker=self.name)
        if out.ok and out.library is not None:
            res.artifact_uri = out.library.resolve().as_uri()
            size = out.library.stat().st_size
            if size <= self.cfg.sandbox.inline_artifact_bytes:
                res.artifact = out.library.read_bytes()
        return res


class EvalHandler:
    def __init__(self, cfg, backend: str, device_key: str = ""):
        from sandbox_workers.evaluator import Evaluator

        self.cfg = cfg
        self.backend = backend
        self.evaluator = Evaluator(cfg, backend, device_key=device_key)
        self.name = worker_name(f"eval-{backend}")
        self.filter = FilterService(backend, self.name)

    def __call__(self, req):
        from schemas.messages import EvaluateResult

        if req.backend and req.backend != self.backend:
            return EvaluateResult(request_id=req.header.request_id, episode_id=req.episode_id, task_id=req.task_id,
                                  compiled=False, correct=False, reward=-1.0, worker=self.name,
                                  error=f"request for backend {req.backend!r} reached a {self.backend} worker")
        if req.mode == "filter":
            return self.filter(req)
        r = self.evaluator.evaluate(req.model_py, req.files, req.mode, req.artifact, req.artifact_key)
        if isolation.ABORTED.is_set():
            raise Abandoned()
        return EvaluateResult(request_id=req.header.request_id, episode_id=req.episode_id, task_id=req.task_id,
                              compiled=r["compiled"], correct=r["correct"], reward=float(r["reward"]),
                              speedup_vs_eager=float(r["speedup_vs_eager"]),
                              speedup_vs_compile=float(r["speedup_vs_compile"]), violations=list(r["violations"]),
                              error=(r["error"] or "")[:8000], timings=r["timings"], evidence=r["evidence"],
                              duration_s=r["duration_s"], worker=self.name)

    def close(self) -> None:
        self.filter.close()
        self.evaluator.close()
