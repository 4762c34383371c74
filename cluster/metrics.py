"""Per-process metrics with a health endpoint: Prometheus text and JSON over HTTP.

Every role calls ``metrics.serve(port, host)`` (or ``serve_from_env()``, which reads
``KERNELRL_METRICS_PORT``; the host is config's ``cluster.metrics_host``) and bumps counters,
gauges and latency summaries. ``/healthz`` answers 200 while the role's health check passes,
``/metrics`` is Prometheus text (format 0.0.4), ``/metrics.json`` is what `kernelrl up` scrapes
for its dashboard and report.

Series are keyed by name; labels (``observe("tool_latency_s", s, tool="compile")``) are folded
into the JSON key as dotted suffixes (``tool_latency_s.compile``) and rendered as Prometheus
labels (``kernelrl_tool_latency_s{tool="compile"}``).
"""
from __future__ import annotations

import http.server
import json
import logging
import math
import os
import re
import socket
import threading
import time
from typing import Callable

log = logging.getLogger(__name__)

_WINDOW = 2048  # latency samples kept per summary (a sliding window is enough for p50/p99)
PREFIX = "kernelrl_"
DEFAULT_HOST = "127.0.0.1"  # cluster.metrics_host's default: `kernelrl up` scrapes over loopback
_QUANTILES = (("p50", "0.5"), ("p90", "0.9"), ("p99", "0.99"))
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_RESERVED_LABELS = {"quantile", "le"}
_NOT_IN_NAME = re.compile(r"[^a-zA-Z0-9_:]")
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1"}

Labels = tuple[tuple[str, str], ...]


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


def metric_name(family: str) -> str:
    """The Prometheus name of a registry family: prefixed, every character outside [a-zA-Z0-9_:] an '_'."""
    return PREFIX + _NOT_IN_NAME.sub("_", family)


def _label_name(name: str, label: str) -> str:
    if not _LABEL_NAME.match(label) or label.startswith("__") or label in _RESERVED_LABELS:
        raise ValueError(f"metric {name!r}: label name {label!r} is not a Prometheus label name "
                         f"([a-zA-Z_][a-zA-Z0-9_]*, not '__'-prefixed, not {sorted(_RESERVED_LABELS)})")
    return label


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt_labels(labels: Labels) -> str:
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}" if labels else ""


def _fmt_value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class Registry:
    """Thread-safe counters, gauges and summaries keyed by name (labels folded into the key)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.summaries: dict[str, _Summary] = {}
        self.hist: dict[str, dict[str, int]] = {}
        self.info: dict[str, str] = {}
        self.series: dict[str, tuple[str, Labels]] = {}  # JSON key -> (family, labels)
        self.health: Callable[[], bool] = lambda: True
        self.started = time.time()

    def _key(self, name: str, labels: dict) -> str:
        """The JSON key of a series (``name`` or ``name.v1.v2``); remembers its family and labels."""
        if not labels:
            return name
        pairs = tuple((_label_name(name, k), str(v)) for k, v in labels.items())
        key = ".".join([name, *(v for _, v in pairs)])
        self.series[key] = (name, pairs)
        return key

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        with self._lock:
            key = self._key(name, labels)
            self.counters[key] = self.counters.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self.gauges[self._key(name, labels)] = float(value)

    def add(self, name: str, delta: float, **labels: str) -> None:
        """Move a gauge up or down (e.g. episodes in flight): a counter only goes up."""
        with self._lock:
            key = self._key(name, labels)
            self.gauges[key] = self.gauges.get(key, 0.0) + delta

    def observe(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self.summaries.setdefault(self._key(name, labels), _Summary()).observe(float(value))

    def bucket(self, name: str, key: str | float) -> None:
        """Count one observation in a categorical histogram (e.g. reward values); label ``value``."""
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

    def family(self, key: str) -> tuple[str, Labels]:
        """(family, labels) of a JSON key; a dotted key without declared labels gets label ``key``."""
        with self._lock:
            if key in self.series:
                return self.series[key]
        name, dot, rest = key.partition(".")
        return (name, (("key", rest),)) if dot else (key, ())

    def prometheus(self) -> str:
        return render_prometheus(self.snapshot(), self.family)


def _grouped(values: dict, family: Callable[[str], tuple[str, Labels]], suffix: str = "") -> dict:
    """Prometheus name -> [(labels, value)], names sorted, series in key order."""
    out: dict[str, list] = {}
    for key, v in sorted(values.items()):
        fam, labels = family(key)
        name = metric_name(fam)
        if suffix and not name.endswith(suffix):
            name += suffix
        out.setdefault(name, []).append((labels, v))
    return dict(sorted(out.items()))


def render_prometheus(snap: dict, family: Callable[[str], tuple[str, Labels]]) -> str:
    """A registry snapshot as Prometheus text format 0.0.4 (one # TYPE line per family)."""
    lines = []
    info = tuple((_NOT_IN_NAME.sub("_", k), str(v)) for k, v in sorted(snap["info"].items()))
    lines += [f"# TYPE {PREFIX}info gauge", f"{PREFIX}info{_fmt_labels(info)} 1.0"]
    lines += [f"# TYPE {PREFIX}uptime_s gauge", f"{PREFIX}uptime_s {_fmt_value(snap['uptime_s'])}"]
    for name, series in _grouped(snap["counters"], family, "_total").items():
        lines.append(f"# TYPE {name} counter")
        lines += [f"{name}{_fmt_labels(labels)} {_fmt_value(v)}" for labels, v in series]
    for name, series in _grouped(snap["gauges"], family).items():
        lines.append(f"# TYPE {name} gauge")
        lines += [f"{name}{_fmt_labels(labels)} {_fmt_value(v)}" for labels, v in series]
    for name, series in _grouped(snap["summaries"], family).items():
        lines.append(f"# TYPE {name} summary")
        for labels, s in series:
            lines += [f"{name}{_fmt_labels(labels + (('quantile', q),))} {_fmt_value(s[p])}" for p, q in _QUANTILES]
            lines += [f"{name}_count{_fmt_labels(labels)} {_fmt_value(s['count'])}",
                      f"{name}_sum{_fmt_labels(labels)} {_fmt_value(s['sum'])}"]
    for fam, h in sorted(snap["histograms"].items()):
        name = metric_name(fam)
        lines.append(f"# TYPE {name} gauge")
        lines += [f"{name}{_fmt_labels((('value', k),))} {_fmt_value(c)}" for k, c in sorted(h.items())]
    return "\n".join(lines) + "\n"


REGISTRY = Registry()
inc, set_gauge, add_gauge, observe, bucket = REGISTRY.inc, REGISTRY.set, REGISTRY.add, REGISTRY.observe, REGISTRY.bucket


class _Handler(http.server.BaseHTTPRequestHandler):
    registry: Registry = REGISTRY

    def do_GET(self) -> None:  # http.server's naming
        if self.path.startswith("/healthz"):
            ok = self.registry.health()
            self._send(200 if ok else 503, "ok\n" if ok else "unhealthy\n", "text/plain")
        elif self.path.startswith("/metrics.json"):
            self._send(200, json.dumps(self.registry.snapshot()), "application/json")
        elif self.path.startswith("/metrics"):
            self._send(200, self.registry.prometheus(), "text/plain; version=0.0.4; charset=utf-8")
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


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def serve(port: int, host: str = DEFAULT_HOST, registry: Registry = REGISTRY) -> http.server.ThreadingHTTPServer:
    """Serve /healthz, /metrics and /metrics.json on ``host`` (``0.0.0.0``: every interface) on a daemon
    thread; port 0 picks one."""
    handler = type("Handler", (_Handler,), {"registry": registry})
    server_cls = _Server6 if ":" in host else _Server
    try:
        server = server_cls((host, port), handler)
    except OSError as exc:
        raise OSError(exc.errno, f"cluster.metrics_host/port {host}:{port}: cannot listen there: "
                                 f"{exc.strerror}") from exc
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    log.info("metrics on http://%s:%d/metrics", url_host(host), server.server_address[1])
    return server


def url_host(host: str) -> str:
    """Where a local scraper reaches an endpoint bound to ``host`` (a wildcard: loopback), URL-ready."""
    h = _WILDCARDS.get(host, host)
    return f"[{h}]" if ":" in h else h


def serve_from_env(role: str, host: str = DEFAULT_HOST, **info: str) -> http.server.ThreadingHTTPServer | None:
    """Start the endpoint on ``host`` (pass ``cfg.cluster.metrics_host``) when KERNELRL_METRICS_PORT is set
    (as `kernelrl up` and the deployment manifests do)."""
    REGISTRY.info.update({"role": role, "pid": str(os.getpid()), **info})
    port = os.environ.get("KERNELRL_METRICS_PORT")
    if port is None:
        return None
    if not port.strip().isdigit() or int(port) > 65535:
        raise ValueError(f"KERNELRL_METRICS_PORT: must be a port number 0..65535, got {port!r}")
    return serve(int(port), host)


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
