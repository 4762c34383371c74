"""Per-process metrics with a health endpoint: Prometheus text and JSON over HTTP.

Every role calls ``metrics.serve(port)`` (or ``serve_from_env()``, which reads
``KERNELRL_METRICS_PORT``) and bumps counters, gauges and latency summaries.
``/healthz`` answers 200 while the role's health check passes, ``/metrics`` is
Prometheus text, ``/metrics.json`` is what `kernelrl up` scrapes for its
dashboard and report.
"""
from __future__ import annotations

import http.server
import json
import logging
import os
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

_WINDOW = 2048  # latency samples kept per summary (a sliding window is enough for p50/p99)


class _Summary:
    def __init__(self) -> None:
        self.samples: list[float] = []
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.samples.append(value)
        if len(self.samples) > _WINDOW:
            del self.samples[: len(self.samples) - _WINDOW]

    def snapshot(self) -> dict:
        s = sorted(self.samples)

        def q(p: float) -> float:
            return s[min(len(s) - 1, int(p * len(s)))] if s else 0.0

        return {"count": self.count, "sum": self.total, "p50": q(0.5), "p90": q(0.9), "p99": q(0.99)}


class Registry:
    """Thread-safe counters, gauges and summaries keyed by name (labels folded into the name)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.summaries: dict[str, _Summary] = {}
        self.hist: dict[str, dict[str, int]] = {}
        self.info: dict[str, str] = {}
        self.health: Callable[[], bool] = lambda: True
        self.started = time.time()

    def inc(self, name: str, value: float = 1.0) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0.0) + value

    def set(self, name: str, value: float) -> None:
        with self._lock:
            self.gauges[name] = float(value)

    def observe(self, name: str, value: float) -> None:
        with self._lock:
            self.summaries.setdefault(name, _Summary()).observe(float(value))

    def bucket(self, name: str, key: str | float) -> None:
        """Count one observation in a categorical histogram (e.g. reward values)."""
        with self._lock:
            h = self.hist.setdefault(name, {})
            h[str(key)] = h.get(str(key), 0) + 1

    def snapshot(self) -> dict:
        with self._lock:
            return {
                "info": dict(self.info),
                "uptime_s": time.time() - self.started,
                "counters": dict(self.counters),
                "gauges": dict(self.gauges),
                "summaries": {k: v.snapshot() for k, v in self.summaries.items()},
                "histograms": {k: dict(v) for k, v in self.hist.items()},
            }

    def prometheus(self) -> str:
        snap = self.snapshot()
        lines = []
        for name, v in sorted(snap["counters"].items()):
            lines += [f"# TYPE kernelrl_{name} counter", f"kernelrl_{name} {v}"]
        for name, v in sorted(snap["gauges"].items()):
            lines += [f"# TYPE kernelrl_{name} gauge", f"kernelrl_{name} {v}"]
        for name, s in sorted(snap["summaries"].items()):
            lines.append(f"# TYPE kernelrl_{name} summary")
            for q in ("p50", "p90", "p99"):
                lines.append(f'kernelrl_{name}{{quantile="0.{q[1:]}"}} {s[q]}')
            lines += [f"kernelrl_{name}_count {s['count']}", f"kernelrl_{name}_sum {s['sum']}"]
        for name, h in sorted(snap["histograms"].items()):
            lines.append(f"# TYPE kernelrl_{name} gauge")
            lines += [f'kernelrl_{name}{{value="{k}"}} {c}' for k, c in sorted(h.items())]
        return "\n".join(lines) + "\n"


REGISTRY = Registry()
inc, set_gauge, observe, bucket = REGISTRY.inc, REGISTRY.set, REGISTRY.observe, REGISTRY.bucket


class _Handler(http.server.BaseHTTPRequestHandler):
    registry: Registry = REGISTRY

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        if self.path.startswith("/healthz"):
            ok = self.registry.health()
            self._send(200 if ok else 503, "ok\n" if ok else "unhealthy\n", "text/plain")
        elif self.path.startswith("/metrics.json"):
            self._send(200, json.dumps(self.registry.snapshot()), "application/json")
        elif self.path.startswith("/metrics"):
            self._send(200, self.registry.prometheus(), "text/plain; version=0.0.4")
        else:
            self._send(404, "not found\n", "text/plain")

    def _send(self, code: int, body: str, ctype: str) -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the scraper gave up (a busy role answers late); the next scrape will do

    def log_message(self, fmt: str, *args) -> None:  # keep scrapes out of role logs
        pass


def serve(port: int, host: str = "127.0.0.1", registry: Registry = REGISTRY) -> http.server.ThreadingHTTPServer:
    """Serve /healthz, /metrics and /metrics.json on a daemon thread; port 0 picks one."""
    handler = type("Handler", (_Handler,), {"registry": registry})
    server = http.server.ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", host, server.server_address[1])
    return server


def serve_from_env(role: str, **info: str) -> http.server.ThreadingHTTPServer | None:
    """Start the endpoint when KERNELRL_METRICS_PORT is set (as `kernelrl up` does)."""
    REGISTRY.info.update({"role": role, "pid": str(os.getpid()), **info})
    port = os.environ.get("KERNELRL_METRICS_PORT")
    if port is None:
        return None
    return serve(int(port))


class Metered:
    """Wraps a worker's request handler: counts jobs, failures, time per job and busy time."""

    def __init__(self, handler: Callable, registry: Registry = REGISTRY):
        self._handler, self._registry = handler, registry

    def __getattr__(self, name: str):
        return getattr(self._handler, name)

    def __call__(self, msg):
        t0 = time.monotonic()
        self._registry.set("busy", 1)
        try:
            out = self._handler(msg)
        except BaseException:
            self._registry.inc("jobs_failed")
            raise
        finally:
            dt = time.monotonic() - t0
            self._registry.set("busy", 0)
            self._registry.inc("busy_s", dt)
            self._registry.observe("job_s", dt)
        self._registry.inc("jobs_done")
        return out
