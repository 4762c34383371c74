"""Two DeepSpeed ranks (two processes, gloo) see different micro-batches yet keep identical parameters."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("zero_stage", [2])  # ZeRO-3 passes too (25 s): not in the budget
def test_two_ranks_identical_parameters(ds_process, tiny_model, tmp_path, zero_stage):
    port = _port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "tests.learner.two_ranks_worker", str(r), "2", str(port),
                               str(tmp_path / f"rank{r}"), tiny_model, str(zero_stage)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in range(2)]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outs.append(out.decode(errors="replace"))
        assert p.returncode == 0, outs[-1][-3000:]
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # data parallel for real: disjoint micro-batches covering the batch
    e0, e1 = set(info[0]["local_episodes"]), set(info[1]["local_episodes"])
    assert e0 and e1 and not (e0 & e1) and e0 | e1 == {f"e{i}" for i in range(6)}
    # the reduced metrics agree on both ranks
    assert info[0]["metrics"][-1]["policy_loss"] == pytest.approx(info[1]["metrics"][-1]["policy_loss"])
    p0, p1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert p0.keys() == p1.keys()
    for k in p0:
        assert torch.equal(p0[k], p1[k]), f"{k} differs between ranks"
    from safetensors.torch import load_file

    init = load_file(str(Path(tiny_model) / "model.safetensors"))
    moved = [k for k in init if not torch.equal(init[k], p0["policy." + k])]
    assert moved, "training did not change the policy"
