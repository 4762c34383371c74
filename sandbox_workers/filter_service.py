"""The evaluation worker's side of the task execution filter: ``FilterRequest`` -> ``FilterResult``.

`kernelrl tasks synthesize|verify --via bus` sends each candidate task's source with
the filter config and a timeout (schemas.messages.FilterRequest) on the evaluate topic
of the filter's backend; the worker checks it in a sandboxed child (kept across
requests, so torch is imported once) on its own device and answers with the verdict.

``EvaluateRequest(mode="filter")``, the way senders asked before FilterRequest existed,
is still answered as it was (``correct`` is the pass, ``violations`` names the failed
rule, ``evidence["filter"]`` holds the whole verdict) so requests in flight across an
upgrade are not lost; nothing in this repository sends it any more.
"""
from __future__ import annotations

import logging

from sandbox_workers import isolation

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 120.0


class InvalidFilterRequest(ValueError):
    """The request's filter config or timeout cannot be used: answered as rule "invalid_request"."""


class FilterService:
    def __init__(self, backend: str, worker: str):
        self.backend, self.worker = backend, worker
        self._session = None

    def __call__(self, req):
        """A FilterRequest's FilterResult (fault none / policy / infra, see schemas.messages.FilterResult)."""
        from schemas.messages import FAULT_INFRA, FAULT_NONE, FAULT_POLICY, FilterResult

        def refused(rule: str, reason: str) -> FilterResult:
            return FilterResult(request_id=req.header.request_id, ok=False, rule=rule, reason=reason[:8000],
                                worker=self.worker, fault=FAULT_INFRA)

        wanted = (req.filter or {}).get("backend")
        if wanted and wanted != self.backend:
            return refused("worker_error", f"filter request for backend {wanted!r} reached a {self.backend} worker")
        try:
            verdict = self.check(req.source, req.filter, req.timeout_s, req.header.request_id)
        except InvalidFilterRequest as exc:
            return refused("invalid_request", f"filter request: {exc}")
        return FilterResult(request_id=req.header.request_id, ok=verdict.ok, rule=verdict.rule,
                            reason=verdict.reason[:8000], eager_ms=verdict.eager_ms, compile_ms=verdict.compile_ms,
                            duration_s=verdict.duration_s, verdict=verdict.to_dict(), worker=self.worker,
                            fault=FAULT_NONE if verdict.ok else FAULT_POLICY)

    def legacy(self, req):
        """An ``EvaluateRequest(mode="filter")`` from an older sender, answered as before (an EvaluateResult)."""
        from schemas.messages import FAULT_NONE, FAULT_POLICY, EvaluateResult

        def result(**kw):
            return EvaluateResult(request_id=req.header.request_id, episode_id=req.episode_id, task_id=req.task_id,
                                  compiled=False, worker=self.worker, **kw)

        try:
            verdict = self.check(req.model_py, req.options.get("filter"),
                                 req.options.get("timeout_s", DEFAULT_TIMEOUT_S), req.task_id)
        except InvalidFilterRequest as exc:
            return result(correct=False, reward=0.0, violations=["invalid_request"], error=f"filter request: {exc}",
                          fault=FAULT_POLICY)
        return result(correct=verdict.ok, reward=0.0, violations=[] if verdict.ok else [verdict.rule],
                      error=verdict.reason[:8000], duration_s=verdict.duration_s,
                      timings={"eager_ms": verdict.eager_ms, "compile_ms": verdict.compile_ms},
                      evidence={"filter": verdict.to_dict()}, fault=FAULT_NONE if verdict.ok else FAULT_POLICY)

    def check(self, source: str, filter_cfg, timeout_s, what: str = ""):
        """The Verdict on ``source``; raises InvalidFilterRequest for an unusable config or timeout."""
        from cluster.tasks.filter import FilterConfig

        try:
            fcfg = FilterConfig.from_dict({**dict(filter_cfg or {}), "backend": self.backend})
            timeout_s = float(timeout_s)
        except (TypeError, ValueError) as exc:
            raise InvalidFilterRequest(str(exc)) from None
        if not timeout_s > 0:
            raise InvalidFilterRequest(f"timeout_s={timeout_s!r} is not a positive number of seconds")
        verdict = self._check(source, fcfg, timeout_s)
        if isolation.ABORTED.is_set():
            raise isolation.Abandoned()
        log.info("filter %s: %s %s", what, "ok" if verdict.ok else "REJECT " + verdict.rule, verdict.reason[:120])
        return verdict

    def _check(self, source: str, fcfg, timeout_s: float):
        from cluster.tasks.filter_runner import FilterSession

        if self._session is None:
            self._session = FilterSession(fcfg, on_spawn=isolation.register_pgid, on_exit=isolation.unregister_pgid)
        return self._session.check(source, timeout_s, fcfg)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
