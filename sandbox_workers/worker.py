"""Bus handlers of the compile and evaluation workers (CompileRequest -> CompileResult, EvaluateRequest -> result).

The handlers never raise for the agent's mistakes: those become results the
agent reads. ``Abandoned`` (a BaseException) escapes `serve` when SIGTERM
arrived mid-job, so that job's offset is not committed and it is redelivered.

Every result says whose failure it is (``fault``, schemas.messages): "none",
"policy" (the candidate's compile error, violation, wrong output, its own crash or
timeout) or "infra" (a handler exception, a reference/baseline failure, a missing
toolchain, a request routed to the wrong backend). An infra result carries reward
0.0 and no verdict on the candidate; the actor retries it. A RetriableError still
escapes to `serve`, which retries it in place.
"""
from __future__ import annotations

import logging
import os
import shutil
import socket
import threading

from cluster.errors import RetriableError
from sandbox_workers import isolation
from sandbox_workers.isolation import Abandoned  # re-exported: the role commands catch it here
from sandbox_workers.filter_service import FilterService

log = logging.getLogger(__name__)


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
        from schemas.messages import FAULT_INFRA, CompileResult

        def infra(error: str) -> CompileResult:
            return CompileResult(request_id=req.header.request_id, episode_id=req.episode_id, ok=False,
                                 error=error[:4000], worker=self.name, fault=FAULT_INFRA)

        return as_infra_fault(lambda: self._compile(req), req, infra, "compile")

    def _compile(self, req):
        from sandbox_workers import compiler
        from schemas.messages import FAULT_INFRA, FAULT_NONE, FAULT_POLICY, CompileResult

        backend = req.backend or self.cfg.sandbox.backend
        cfg = self.cfg
        if req.cuda_arch and backend == "cuda":
            import copy
            cfg = copy.deepcopy(self.cfg)
            cfg.sandbox.cuda_arch = req.cuda_arch
        out = compiler.compile_workspace(req.files, backend, cfg, req.extra_flags)
        if isolation.ABORTED.is_set():
            raise Abandoned()
        error = out.error + (f" ({', '.join(out.violations)})" if out.violations else "")
        fault = FAULT_NONE if out.ok else FAULT_POLICY
        missing = "" if out.ok else missing_toolchain(backend)
        if missing:
            fault, error = FAULT_INFRA, f"{error} (the worker's toolchain is incomplete: {missing})"
        res = CompileResult(request_id=req.header.request_id, episode_id=req.episode_id, ok=out.ok,
                            artifact_key=out.key if out.ok else "", cached=out.cached, log=out.log,
                            error=error, duration_s=out.duration_s, worker=self.name, fault=fault,
                            violations=list(out.violations))
        if out.ok and out.library is not None:
            res.artifact_uri = out.library.resolve().as_uri()
            size = out.library.stat().st_size
            if getattr(req, "inline_artifact", True) and size <= self.cfg.sandbox.inline_artifact_bytes:
                res.artifact = out.library.read_bytes()
        return res


def missing_toolchain(backend: str) -> str:
    """What of the build toolchain this machine lacks ('' = complete): a failed build is then no verdict."""
    from sandbox_workers.backends import get_builder

    try:
        tid = get_builder(backend).toolchain_id()
    except Exception as exc:  # noqa: BLE001 - an unknown backend or a broken probe is the worker's problem
        return f"{type(exc).__name__}: {exc}"
    missing = [part.split(":")[0].strip() for part in tid.split("|") if part.strip().endswith(":missing")]
    if shutil.which("ninja") is None:
        missing.append("ninja")
    return ", ".join(missing)


def _head_and_tail(text: str | None, tail: int = 600) -> str:
    """A fault for the log: its first line and its last `tail` characters (a traceback's exception is at the end)."""
    text = text or ""
    if len(text) <= tail + 200:
        return text
    return text.splitlines()[0][:200] + " ... " + text[-tail:]


def eval_fault(r: dict) -> str:
    """The fault of an evaluator result dict: its own "fault", with infrastructure signs taking precedence."""
    from schemas.messages import FAULT_INFRA, FAULT_NONE, FAULT_POLICY, FAULTS, REFERENCE_FAILED_PREFIX

    evidence = r.get("evidence") or {}
    fault = r.get("fault") or ""
    if fault == FAULT_INFRA or evidence.get("infra") or (r.get("error") or "").startswith(REFERENCE_FAILED_PREFIX):
        return FAULT_INFRA
    if fault in FAULTS:
        return fault
    return FAULT_NONE if r.get("compiled") and r.get("correct") and not r.get("violations") else FAULT_POLICY


class EvalHandler:
    def __init__(self, cfg, backend: str, device_key: str = "", client=None, fetch_timeout_s: float | None = None):
        """``client``: a cluster.bus.rpc.RequestClient to ask the compile workers for artifacts by content key
        (Evaluator._artifact); None: this worker builds what its artifact cache lacks."""
        from sandbox_workers.evaluator import Evaluator

        self.cfg = cfg
        self.backend = backend
        self.name = worker_name(f"eval-{backend}")
        fetch = None if client is None else compile_fetcher(client, cfg, self.name, fetch_timeout_s)
        self.evaluator = Evaluator(cfg, backend, device_key=device_key, fetch=fetch)
        self.filter = FilterService(backend, self.name)
        # serve(concurrency=jobs): up to sandbox.jobs_per_device evaluations at once on this device (their timing
        # kept exclusive by the evaluator's device gate); the task filter's one session serves one check at a time
        self.jobs = self.evaluator.jobs
        self._filter_lock = threading.Lock()

    def __call__(self, req):
        from schemas.messages import FAULT_INFRA, EvaluateResult, FilterRequest

        if isinstance(req, FilterRequest):  # the task filter shares the evaluate topic: dispatched by kind
            return self._filter(req)

        def infra(error: str) -> EvaluateResult:
            return EvaluateResult(request_id=req.header.request_id, episode_id=req.episode_id, task_id=req.task_id,
                                  compiled=False, correct=False, reward=0.0, worker=self.name, error=error[:8000],
                                  fault=FAULT_INFRA, evidence={"infra": True})

        if req.backend and req.backend != self.backend:
            return infra(f"request for backend {req.backend!r} reached a {self.backend} worker")
        return as_infra_fault(lambda: self._evaluate(req, infra), req, infra, "evaluation")

    def _evaluate(self, req, infra):
        from schemas.messages import FAULT_INFRA, EvaluateResult

        if req.mode == "filter":  # an older sender's filter request (FilterRequest replaced it)
            with self._filter_lock, self._filter_gate():
                return self.filter.legacy(req)
        r = self.evaluator.evaluate(req.model_py, req.files, req.mode, req.artifact, req.artifact_key)
        if isolation.ABORTED.is_set():
            raise Abandoned()
        fault = eval_fault(r)
        if fault == FAULT_INFRA:
            log.warning("evaluation of %s: infrastructure fault: %s", req.header.request_id, _head_and_tail(r["error"]))
            res = infra(r["error"] or "evaluation failed (infrastructure)")
            res.evidence = {**(r.get("evidence") or {}), "infra": True}
            res.duration_s = r["duration_s"]
            return res
        return EvaluateResult(request_id=req.header.request_id, episode_id=req.episode_id, task_id=req.task_id,
                              compiled=r["compiled"], correct=r["correct"], reward=float(r["reward"]),
                              speedup_vs_eager=float(r["speedup_vs_eager"]),
                              speedup_vs_compile=float(r["speedup_vs_compile"]), violations=list(r["violations"]),
                              error=(r["error"] or "")[:8000], timings=r["timings"], evidence=r["evidence"],
                              duration_s=r["duration_s"], worker=self.name, fault=fault)

    def _filter(self, req):
        from schemas.messages import FAULT_INFRA, FilterResult

        def infra(error: str) -> FilterResult:
            return FilterResult(request_id=req.header.request_id, ok=False, rule="worker_error", reason=error[:8000],
                                worker=self.name, fault=FAULT_INFRA)

        def check():
            with self._filter_lock, self._filter_gate():
                return self.filter(req)

        return as_infra_fault(check, req, infra, "filter")

    def _filter_gate(self):
        """The task filter runs task code on the device: never while another job is timed."""
        from sandbox_workers import device_gate

        return self.evaluator.gate.holding(f"filter-{self.name}", device_gate.SHARED, "filter")

    def close(self) -> None:
        self.filter.close()
        self.evaluator.close()


def compile_fetcher(client, cfg, sender: str, timeout_s: float | None = None):
    """fetch(files, backend) -> CompileResult: the same workspace sent to the compile workers (a cache hit is
    answered at once, else built), waiting at most ``timeout_s`` (default: a build's limit plus a margin) with no
    retry; RequestTimeout when they do not answer: the caller builds instead."""
    from schemas import topics as T
    from schemas.messages import CompileRequest, CompileResult, RequestHeader

    wait_s = float(timeout_s if timeout_s is not None else cfg.sandbox.compile_timeout_s + 30.0)

    def fetch(files: dict[str, str], backend: str):
        req = CompileRequest(header=RequestHeader(sender=sender), episode_id="", files=dict(files), backend=backend,
                             cuda_arch=cfg.sandbox.cuda_arch if backend == "cuda" else "")
        box: list = []

        def ask():
            try:
                box.append(client.request(T.TOOL_COMPILE, req, timeout_s=wait_s, retries=0))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting handler below
                box.append(exc)

        t = threading.Thread(target=ask, name="fetch-artifact", daemon=True)
        t.start()
        while t.is_alive():  # in slices: a SIGTERM abandons the job without waiting for the reply
            t.join(0.2)
            if isolation.ABORTED.is_set():
                raise Abandoned()
        reply = box[0]
        if isinstance(reply, BaseException):
            raise reply
        if not isinstance(reply, CompileResult):
            raise TypeError(f"compile worker answered with {type(reply).__name__}")
        return reply

    return fetch


def as_infra_fault(handle, req, infra, what: str):
    """Run a handler; its own exception is the worker's failure (an infra result), never the agent's."""
    try:
        return handle()
    except RetriableError:
        raise  # serve() retries it in place, then answers with its error reply
    except Exception as exc:  # the worker's failure, not the agent's: an infra result
        if isolation.ABORTED.is_set():
            raise Abandoned() from exc  # stopping: leave the job uncommitted
        log.warning("%s handler failed on %s: %s", what, req.header.request_id, exc, exc_info=True)
        return infra(f"{what} worker failed: {type(exc).__name__}: {exc}")
