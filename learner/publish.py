"""Export the policy as a Hugging Face folder and send it as a new version through the configured transport.

Every rank calls ``export_policy`` (ZeRO-3 gathers parameters collectively);
rank 0 writes the folder (safetensors + config + the base model's tokenizer
files) and publishes it with cluster.weights.transport: kafka announces once all bytes
are durable in the log; fs and nccl once the version's folder is complete, its fsync
following on a thread (a version found after a restart is verified first). With
``learner.weight_layout = "buckets"`` (kafka) nothing is written: rank 0 packs the gathered tensors into buckets (cluster.weights.buckets) and sends them from
memory; actors load them straight into their engines.
"""
from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

from cluster.weights import transport as wt
from cluster.errors import SetupError
from learner import engine as eng

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "generation_config.json")


def _state_dict(module, zero_stage: int) -> dict | None:
    rank, _ = eng.rank_world()
    if zero_stage == 3:
        import deepspeed

        params = list(module.parameters())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()} if rank == 0 else None
    return {k: v.detach().cpu() for k, v in module.state_dict().items()} if rank == 0 else None


def export_policy(module, zero_stage: int, out_dir: str | Path, base_path: str | None) -> Path | None:
    """Write the policy's HF folder into out_dir on rank 0 (None on other ranks)."""
    sd = _state_dict(module, zero_stage)
    rank, _ = eng.rank_world()
    if rank != 0:
        return None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    module.save_pretrained(str(out), state_dict=sd, safe_serialization=True)
    if base_path:
        for name in TOKENIZER_FILES:
            src = Path(base_path) / name
            if src.is_file() and not (out / name).exists():
                shutil.copyfile(src, out / name)
    return out


class Publisher:
    """Rank 0's side of weight publishing; other ranks only take part in the export."""

    def __init__(self, cfg, producer=None) -> None:
        self.cfg = cfg
        self.producer = producer
        lc = cfg.learner
        self.transport = lc.weight_transport
        self.buckets = lc.weight_layout == "buckets"
        if self.buckets and self.transport != "kafka":
            raise SetupError(f"learner.weight_layout 'buckets' needs weight_transport 'kafka', not {self.transport!r}")
        self.stream = None
        self.exporter = None
        if self.buckets:
            from learner.export_buckets import BucketExporter

            self.exporter = BucketExporter(lc.weight_bucket_bytes)
        self.delta = None  # learner.weight_compression: the encoder holding the last published buckets (deltas' base)
        if self.buckets and lc.weight_compression != "none":
            from cluster.weights.codec import encoder_for

            self.delta = encoder_for(lc.weight_compression)
        if self.transport == "fs":
            from cluster.config import run_cache_path

            self.fs_root = lc.weight_fs_dir or str(run_cache_path(cfg, "weights"))
        if self.transport == "nccl":
            from cluster.weights import stream as weights_stream

            self.fs_root = weights_stream.served_root(cfg)
            if eng.rank_world()[0] == 0:
                self.stream = weights_stream.server_from_config(cfg)
        if self.transport in ("fs", "nccl") and eng.rank_world()[0] == 0:
            from cluster.weights import fs as wfs

            # exports and half-written versions of a learner killed mid-publish (they would fill the disk)
            wfs.remove_leftovers(self.fs_root, lc.model_name)
        if self.transport == "kafka" and producer is None and eng.rank_world()[0] == 0:
            raise SetupError("weight_transport 'kafka' needs a bus producer")

    def publish(self, module, version: int, step: int, base_path: str | None):
        """Export + send + announce version; returns (announcement, seconds) on rank 0, (None, s) elsewhere."""
        lc = self.cfg.learner
        t0 = time.perf_counter()
        if self.buckets:
            rank = eng.rank_world()[0]
            views = self.exporter.buckets(module, lc.zero_stage, rank)  # every rank: ZeRO-3 gathers collectively
            if rank == 0:
                # the delta encoder keeps this version's buckets as the next one's base: they must outlive the slots
                ann = self.send_buckets((bytes(v) for v in views) if self.delta is not None else views, version, step)
            else:
                ann = None
                for _ in views:
                    pass
            eng.barrier()
            return ann, time.perf_counter() - t0
        ann = None
        if self.transport in ("fs", "nccl") and eng.rank_world()[0] == 0:
            ann = wt.existing_fs(self.fs_root, lc.model_name, version, step)
            if ann is not None and self.stream is not None:
                ann = self.stream.announcement(ann)
        if eng.broadcast_object(ann is not None):
            # already durable (a restart after publishing): announce it again, never rewrite a version
            if ann is not None and self.producer is not None:
                wt.announce(self.producer, ann)
            return ann, time.perf_counter() - t0
        # fs and nccl keep the version under fs_root: exported beside it (hidden from its readers), its files are
        # linked into the version's folder instead of copied, and synced to disk off this path (publish_fs)
        here = None
        if self.transport in ("fs", "nccl") and eng.rank_world()[0] == 0:
            here = Path(self.fs_root) / lc.model_name
            here.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f"{wt.EXPORT_PREFIX}v{version}-", dir=here) as tmp:
            folder = export_policy(module, lc.zero_stage, tmp, base_path)
            ann = None
            if folder is not None:
                ann = self.send(folder, version, step)
        eng.barrier()
        return ann, time.perf_counter() - t0

    def send(self, folder: Path, version: int, step: int):
        lc = self.cfg.learner
        if self.transport == "kafka":
            ann = wt.publish_kafka(self.producer, lc.model_name, version, folder, lc.chunk_bytes, step=step)
        elif self.transport == "nccl":
            ann = self.stream.add(lc.model_name, version, folder, step=step, take=True)
        else:
            ann = wt.publish_fs(self.fs_root, lc.model_name, version, folder, step=step, take=True, sync=False)
        if self.producer is not None:
            wt.announce(self.producer, ann)
        log.info("published %s v%d (%d bytes via %s)", lc.model_name, version, ann.total_bytes, self.transport)
        return ann

    def send_buckets(self, buckets, version: int, step: int):
        """Send safetensors buckets (bytes-like, one at a time) over Kafka from memory and announce them (rank 0)."""
        from cluster.weights import buckets as wb

        lc = self.cfg.learner
        ann = wb.publish_kafka_buckets(self.producer, lc.model_name, version, buckets, lc.chunk_bytes, step=step,
                                       delta=self.delta)
        wt.announce(self.producer, ann)
        log.info("published %s v%d (%d bytes in %d buckets via kafka, from memory)", lc.model_name, version,
                 ann.total_bytes, len(ann.buckets))
        return ann

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close(self.cfg.learner.weight_stream_drain_s)
        if not wt.wait_durable(60.0):
            log.warning("weights: the last versions were not on disk after 60 s (they are verified on a restart)")
