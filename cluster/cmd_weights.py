"""`kernelrl weights push --path DIR`: send a checkpoint folder (Hugging Face layout)
as the next policy version and announce it; every running actor swaps it in.
`kernelrl weights list` shows the announced versions. With ``--transport nccl`` the command itself
serves the version (as the learner would) for ``--serve-s`` seconds or until Ctrl-C. ``--layout buckets``
(kafka) sends the folder's tensors as in-memory buckets that actors load without a disk round trip."""
from __future__ import annotations

import json
from pathlib import Path


def add_arguments(p) -> None:
    p.add_argument("action", choices=["push", "list"])
    p.add_argument("--path", help="folder with config.json + *.safetensors (push)")
    p.add_argument("--version", type=int, help="version to announce (default: newest announced + 1)")
    p.add_argument("--transport", choices=["kafka", "fs", "nccl"], help="default: learner.weight_transport")
    p.add_argument("--serve-s", type=float, default=600.0,
                   help="nccl: how long to keep serving the version to actors (default 600)")
    p.add_argument("--model-name", help="default: learner.model_name")
    p.add_argument("--layout", choices=["files", "buckets"], help="default: learner.weight_layout (buckets: kafka)")


def announcements(bus, model_name: str) -> list:
    from cluster.bus.scan import read_topic
    from schemas import WeightAnnouncement, topics

    return [r.msg for r in read_topic(bus, topics.WEIGHTS)
            if isinstance(r.msg, WeightAnnouncement) and r.msg.model_name == model_name]


def run(args, cfg) -> int:
    from cluster.weights import transport as wt
    from cluster.bus.client import Bus
    from cluster.config import run_cache_path
    from cluster.errors import InputError, KernelRLError

    model = args.model_name or cfg.learner.model_name
    transport = args.transport or cfg.learner.weight_transport
    layout = args.layout or cfg.learner.weight_layout
    if args.action == "push":  # before the broker is asked anything
        _check_folder(args.path)
        if layout == "buckets" and transport != "kafka":
            raise InputError(f"--layout buckets needs --transport kafka, not {transport!r}")
    with Bus(cfg, client_id="kernelrl-weights") as bus:
        bus.ensure_topics()
        seen = announcements(bus, model)
        if args.action == "list":
            for a in seen:
                print(json.dumps({"version": a.version, "transport": a.transport, "layout": a.layout,
                                  "uri": a.uri, "bytes": a.total_bytes, "digest": a.digest, "sha256": a.sha256,
                                  "step": a.step}))
            return 0
        newest = max((a.version for a in seen), default=0)
        version = args.version if args.version is not None else newest + 1
        if version <= newest:
            raise KernelRLError(f"--version {version}: versions are monotonic and {newest} is already announced")
        producer, stream = bus.producer(), None
        try:
            if layout == "buckets":
                from cluster.weights import buckets as wb

                ann = wb.publish_kafka_buckets(producer, model, version, wb.pack(
                    wb.folder_tensors(args.path), cfg.learner.weight_bucket_bytes), cfg.learner.chunk_bytes)
            elif transport == "kafka":
                ann = wt.publish_kafka(producer, model, version, args.path, cfg.learner.chunk_bytes)
            elif transport == "nccl":
                from cluster.weights.stream import server_from_config

                stream = server_from_config(cfg)
                ann = stream.add(model, version, args.path)
            else:
                root = cfg.learner.weight_fs_dir or str(run_cache_path(cfg, "weights"))
                ann = wt.publish_fs(root, model, version, args.path)
            wt.announce(producer, ann)
        finally:
            producer.close()
    print(json.dumps({"model_name": model, "version": version, "transport": transport, "layout": layout,
                      "uri": ann.uri, "bytes": ann.total_bytes, "digest": ann.digest, "sha256": ann.sha256}),
          flush=True)
    if stream is not None:
        _serve_for(stream, args.serve_s)
    return 0


def _serve_for(stream, seconds: float) -> None:
    """Keep the server up so actors can fetch; SIGTERM or Ctrl-C end it early."""
    import signal
    import sys
    import threading

    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    print(f"serving for {seconds:.0f}s (Ctrl-C to stop)", file=sys.stderr, flush=True)
    try:
        done.wait(seconds)
    except KeyboardInterrupt:
        pass
    stream.close()
    print(f"served {stream.served} transfers ({stream.failed} failed)", file=sys.stderr)


def _check_folder(path: str | None) -> None:
    from cluster.errors import InputError

    if not path or not Path(path).is_dir():
        raise InputError(f"--path {path!r}: a checkpoint folder is required")
    if not list(Path(path).glob("*.safetensors")):
        raise InputError(f"--path {path!r} holds no *.safetensors file")
