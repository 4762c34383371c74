"""The evaluation worker's side of the task execution filter: ``EvaluateRequest(mode="filter")``.

`kernelrl tasks synthesize|verify --via bus` sends each candidate task as
``model_py`` with the filter config in ``options``; the worker checks it in a
sandboxed child (kept across requests, so torch is imported once) on its own
device and answers with the verdict: ``correct`` is the pass, ``violations``
names the failed rule, ``evidence["filter"]`` holds the whole verdict.
"""
from __future__ import annotations

import logging

from sandbox_workers import isolation

log = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 120.0


class FilterService:
    def __init__(self, backend: str, worker: str):
        self.backend, self.worker = backend, worker
        self._session = None

    def __call__(self, req):
        from actors.tasks.filter import FilterConfig
        from schemas.messages import EvaluateResult

        def result(**kw):
            return EvaluateResult(request_id=req.header.request_id, episode_id=req.episode_id, task_id=req.task_id,
                                  compiled=False, worker=self.worker, **kw)

        try:
            fcfg = FilterConfig.from_dict({**dict(req.options.get("filter") or {}), "backend": self.backend})
            timeout_s = float(req.options.get("timeout_s", DEFAULT_TIMEOUT_S))
        except (TypeError, ValueError) as exc:
            return result(correct=False, reward=0.0, violations=["invalid_request"], error=f"filter request: {exc}")
        verdict = self._check(req.model_py, fcfg, timeout_s)
        if isolation.ABORTED.is_set():
            raise isolation.Abandoned()
        log.info("filter %s: %s %s", req.task_id, "ok" if verdict.ok else "REJECT " + verdict.rule, verdict.reason[:120])
        return result(correct=verdict.ok, reward=0.0, violations=[] if verdict.ok else [verdict.rule],
                      error=verdict.reason[:8000], duration_s=verdict.duration_s,
                      timings={"eager_ms": verdict.eager_ms, "compile_ms": verdict.compile_ms},
                      evidence={"filter": verdict.to_dict()})

    def _check(self, source: str, fcfg, timeout_s: float):
        from actors.tasks.filter_runner import FilterSession

        if self._session is None:
            self._session = FilterSession(fcfg, on_spawn=isolation.register_pgid, on_exit=isolation.unregister_pgid)
        return self._session.check(source, timeout_s, fcfg)

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
