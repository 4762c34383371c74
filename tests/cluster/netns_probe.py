"""One client-side step of the multi-node test, run inside a node's namespace; prints one JSON line.

``python -m tests.cluster.netns_probe metadata``: the brokers the cluster announces (host, port).
``... compile``: one compile request (the ReLU example) to the compile workers; their reply.
``... scrape URL``: a Prometheus text endpoint parsed by prometheus_client's parser: {sample name: value}.
``... receive MODEL VERSION DEST``: the announced weight version received and verified into DEST.
The configuration comes from the environment (KRL__...), as for any role.
"""
from __future__ import annotations

import hashlib
import json
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELU_DIR = ROOT / "skills" / "examples" / "cpu_19_relu"


def metadata(cfg) -> dict:
    from kafka import KafkaAdminClient

    from cluster.bus.clients import admin_kwargs

    admin = KafkaAdminClient(**admin_kwargs(cfg, "netns-probe"))
    try:
        brokers = admin.describe_cluster()["brokers"]
    finally:
        admin.close()
    return {"brokers": [{"host": b["host"], "port": b["port"]} for b in brokers]}


def compile_relu(cfg) -> dict:
    from cluster.bus.client import Bus
    from cluster.bus.rpc import RequestClient
    from schemas import topics
    from schemas.messages import CompileRequest, RequestHeader

    files = {"model_new.py": (RELU_DIR / "model_new.py").read_text(),
             "kernels/relu.cpp": (RELU_DIR / "kernels" / "relu.cpp").read_text()}
    with Bus(cfg, client_id="netns-probe") as bus, RequestClient(bus, "netns-probe") as client:
        req = CompileRequest(header=RequestHeader(), episode_id="netns", files=files, backend="cpu")
        res = client.request(topics.TOOL_COMPILE, req, timeout_s=240, retries=0)
    return {"ok": res.ok, "error": res.error, "cached": res.cached, "worker": res.worker,
            "artifact_key": res.artifact_key}


def scrape(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {s.name + json.dumps(s.labels, sort_keys=True) * bool(s.labels): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def receive(cfg, model: str, version: int, dest: str) -> dict:
    from cluster.weights import transport as wt
    from cluster.bus.client import Bus
    from cluster.cmd_weights import announcements

    with Bus(cfg, client_id="netns-probe") as bus:
        ann = next(a for a in announcements(bus, model) if a.version == version)
        folder = wt.receive(bus, ann, dest, timeout_s=60)
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in wt.version_files(folder)}
    return {"transport": ann.transport, "uri": ann.uri, "folder": str(folder), "files": files}


def main(argv: list[str]) -> None:
    from cluster.config import load

    cmd, rest = argv[0], argv[1:]
    if cmd == "scrape":
        out = scrape(rest[0])
    else:
        cfg = load()
        out = {"metadata": lambda: metadata(cfg), "compile": lambda: compile_relu(cfg),
               "receive": lambda: receive(cfg, rest[0], int(rest[1]), rest[2])}[cmd]()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
