"""`kernelrl bench weights` with the delta transport (learner.weight_compression "xor-delta") on the real
broker, no engine: it reports the compression ratio and the same stages and rates as the in-memory run."""
from __future__ import annotations

import json
import subprocess

from tests.conftest import KERNELRL, cfg_env


def test_bench_weights_delta_reports_its_compression_ratio(cfg):
    out = subprocess.run(KERNELRL + ["bench", "weights", "--json", "model=tiny", "runs=1", "swap=0", "bucket_mb=1",
                                     "chunk_mb=0.25", "transports=memory,delta", "dtype=bf16"], env=cfg_env(cfg),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout)
    assert doc["dtype"] == "bf16" and doc["bytes"] == 2920960 // 2 and doc["lr"] == 1e-5
    t = doc["transports"]
    assert sorted(t) == ["delta", "memory"] and t["delta"]["compression_ratio"] > 2
    assert t["delta"]["gb_s"] > 0 and t["delta"]["transfer_ratio_vs_kafka_raw"] > 0
    assert doc["delta_speedup_vs_memory"] > 0 and "[bench weights] delta run 1" in out.stderr
