"""`kernelrl bench weights --json` on the real broker (no engine: swap=0): stdout is one JSON document with
every transport's stages and the same-run baselines; progress goes to stderr."""
from __future__ import annotations

import json
import subprocess

from tests.conftest import KERNELRL, cfg_env


def test_bench_weights_json_reports_every_transport_against_baselines(cfg):
    out = subprocess.run(KERNELRL + ["bench", "weights", "--json", "model=tiny", "runs=1", "swap=0",
                                     "bucket_mb=1", "chunk_mb=0.25"], env=cfg_env(cfg), capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["bytes"] == 2920960 and doc["swap"] is False and doc["bucket_bytes"] == 1 << 20
    assert doc["memcpy_gb_s"] > 0 and doc["kafka_raw"]["gb_s"] > 0
    t = doc["transports"]
    assert sorted(t) == ["fs", "kafka", "memory", "nccl"] and all(x["total_s"] > 0 and "swap_s" not in x for x in t.values())
    # each against its own baseline: raw Kafka for what crosses the broker, memcpy for the rest
    assert {n: x["baseline_gb_s"] for n, x in t.items()} == {"fs": doc["memcpy_gb_s"], "nccl": doc["memcpy_gb_s"],
                                                             "kafka": doc["kafka_raw"]["gb_s"],
                                                             "memory": doc["kafka_raw"]["gb_s"]}
    assert all(abs(x["ratio"] - x["gb_s"] / x["baseline_gb_s"]) < 1e-4 for x in t.values()), t
    # the nccl transport really streamed the version to a receiver: its stages, the bytes over gloo
    assert t["nccl"]["publish_s"] > 0 and t["nccl"]["receive_s"] > 0 and "export_s" in t["nccl"]
    assert "export_s" in t["kafka"] and "export_s" not in t["memory"]
    assert t["kafka"]["transfer_ratio_vs_kafka_raw"] > 0 and t["memory"]["transfer_ratio_vs_kafka_raw"] > 0
    assert doc["memory_speedup_vs_kafka"] > 0
    assert "[bench weights] memory run 1" in out.stderr and "[bench weights] nccl run 1" in out.stderr
