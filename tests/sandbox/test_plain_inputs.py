"""CPU: the judge writes a call's inputs into the shared arena only after its clock for the call started.

The judge and a remote (serve.Remote, role baseline: no sandbox, no seccomp) run in this process, the
remote in a thread, joined by real pipes and one real arena file, so the test sees what the remote's
process would see at each step: the staged views must not hold the call's inputs (they hold the
previous call's), the "run" message must carry no key, and the views must hold the inputs once "run"
arrives. Nothing is unsealed on the remote's side: the protocol work a candidate could replace with
a faster version of its own (held-out red team, `seal_pad_regenerated_in_kernel`) is gone.
"""
from __future__ import annotations

import os
import threading

import pytest
import torch

from sandbox_workers import judge as judge_mod
from sandbox_workers.candidate import serve, wire
from sandbox_workers.runner_common import load_task
from tests.sandbox.redteam_cases import _FRAMES  # the generator-frame walk to serve.py's globals

TASK = """
import pytest
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, k):
        return x * 2 + k


def get_inputs():
    return [torch.randn(64, 1000), 3]


def get_init_inputs():
    return []
"""


class SpyRemote(serve.Remote):
    """Records what the remote's views hold when "stage" is answered and when "run" arrives."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.at_stage: list[torch.Tensor] = []
        self.at_run: list[torch.Tensor] = []
        self.run_keys: list = []

    def stage(self, msg):
        reply = super().stage(msg)
        self.at_stage.append(self.sets[0][0].clone())
        return reply

    def run(self, msg):
        self.run_keys.append(msg.get("keys"))
        self.at_run.append(self.sets[0][0].clone())
        return super().run(msg)


def test_cpu_inputs_reach_the_arena_only_inside_the_clock(tmp_path, monkeypatch):
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    path = str(tmp_path / "arena")
    judge_arena = wire.Arena(path, size=1 << 20)
    remote = SpyRemote("baseline", wire.Channel(r1, w2), wire.Arena(path))
    remote.seccomp = False
    sealed = []
    real_seal = wire.seal
    monkeypatch.setattr(wire, "seal", lambda vals, key: (sealed.append(key), real_seal(vals, key)))
    th = threading.Thread(target=lambda: _serve(remote), daemon=True)
    th.start()
    ch = wire.Channel(r2, w1)
    assert ch.recv(timeout=30)["op"] == "ready"
    spec = {"deadline_s": 120, "backend": "cpu", "runtime": {"flush_mb": 1, "threads": 1}, "atol": 1e-5,
            "rtol": 1e-5, "correctness_trials": 3}
    threads = torch.get_num_threads()
    j = judge_mod.Judge(spec, ch, judge_arena)  # CpuRuntime sets this process's torch threads: restored below
    drawn = []
    fresh = j.fresh_inputs
    j.fresh_inputs = lambda: (drawn.append(fresh()), drawn[-1])[1]
    j.build_reference(load_task(TASK))
    j.load("krl_task", "Model", TASK)
    _, out_bytes = j.outputs_layout()
    drawn.clear()
    for _ in range(3):
        t = j.trial(1, [True], out_bytes)
        assert [c["ok"] for c in t["checks"]] == [True], t
    ch.send({"op": "exit"})
    th.join(timeout=30)
    torch.set_num_threads(threads)
    assert len(drawn) == 3 and len(remote.at_stage) == len(remote.at_run) == 3
    for i, inputs in enumerate(drawn):
        x = inputs[0]
        assert torch.equal(remote.at_run[i], x)  # there when "run" arrives ...
        assert not torch.equal(remote.at_stage[i], x)  # ... and not before the judge's clock started
        if i:
            assert torch.equal(remote.at_stage[i], drawn[i - 1][0])  # the views held the previous call's
    assert remote.run_keys == [[], [], []]  # nothing to unseal: no key travels
    assert sealed == []  # and nothing was sealed or unsealed on either side


def _serve(remote):
    try:
        remote.serve()
    except wire.PeerGone:
        pass


# ---------------------------------------------------------------- the residual: work overlapped with the judge's copy
# `inputs_streamed_during_the_judge_copy` (docs/sandbox.md, Open 1): not a red-team case (its reward depends on the
# host's noise and core count), kept here so that its figures can be reproduced. write_stream_attack(DIR) writes the
# solution for `kernelrl sandbox eval --task skills/examples/cpu_19_relu/model.py --solution DIR` (static guards off:
# KRL__SANDBOX__STATIC_GUARDS=false; they refuse `import threading`).
STREAM_CPP = r"""
#include <cstdint>
#include "krl_abi.h"
// ReLU of x (being written by the judge's memcpy right now) into y, chunk by chunk as each chunk's last and first
// elements differ from the previous call's values (old): the work overlaps the judge's copy of the inputs
extern "C" void stream_relu(const float* x, const float* old, float* y, int64_t n) {
  const int64_t C = 16384;
  int64_t nc = (n + C - 1) / C;
  int64_t left = nc;
  const volatile uint32_t* xv = (const volatile uint32_t*)x;
  const uint32_t* ov = (const uint32_t*)old;
  unsigned char done[8192];
  for (int64_t c = 0; c < nc && c < 8192; ++c) done[c] = 0;
  int64_t spins = 0;
  while (left > 0) {
    bool progress = false;
    for (int64_t c = 0; c < nc; ++c) {
      if (done[c]) continue;
      int64_t a = c * C, b = (a + C < n) ? a + C : n;
      bool ready = (xv[b - 1] != ov[b - 1] && xv[a] != ov[a]) || spins > 20000000;
      if (!ready) continue;
      for (int64_t i = a; i < b; ++i) { float v = x[i]; y[i] = v > 0.f ? v : 0.f; }
      done[c] = 1; --left; progress = true;
    }
    if (!progress) ++spins;
  }
}
KRL_OP(stream_relu, "const f32* x, const f32* old, f32* y, i64 n")
"""

STREAM_PY = '''
import threading

import pytest

import pytest
import torch
import torch.nn as nn
import krl

ops = krl.ops()
''' + _FRAMES + '''Remote = serve["Remote"]
real_stage = Remote.stage
state = {"t": None, "ys": {}}


def work(jobs):
    for x, old, y in jobs:
        ops.stream_relu(x, old, y, x.numel())


def early_stage(self, msg):  # before the judge's clock: keep the views' old bytes, start a thread that waits
    reply = real_stage(self, msg)
    jobs = []
    for s in self.sets:
        x = s[0] if s and isinstance(s[0], torch.Tensor) else None
        if x is not None and x.dtype == torch.float32 and x.is_contiguous():
            y = torch.empty_like(x)
            jobs.append((x, x.clone(), y))
            state["ys"][x.data_ptr()] = y
    if jobs:
        state["t"] = threading.Thread(target=work, args=(jobs,))
        state["t"].start()
    return reply


Remote.stage = early_stage


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        t = state["t"]
        if t is not None:
            t.join()
            state["t"] = None
        y = state["ys"].pop(x.data_ptr(), None)
        if y is None:
            y = torch.empty_like(x)
            ops.stream_relu(x, torch.full_like(x, -1.0), y, x.numel())
        return y
'''


def write_stream_attack(path: str) -> None:
    from pathlib import Path

    d = Path(path)
    (d / "kernels").mkdir(parents=True, exist_ok=True)
    (d / "model_new.py").write_text(STREAM_PY)
    (d / "kernels" / "stream.cpp").write_text(STREAM_CPP)


def test_a_message_sent_ahead_has_its_reply_taken_before_the_next_ask(tmp_path):
    """`Judge.send_ahead` (the remote's CUDA context made while the judge starts): its reply is read in order before
    the next question's, and a failed one is the remote's failure like any other reply."""
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    path = str(tmp_path / "arena")
    judge_arena = wire.Arena(path, size=1 << 20)
    remote = serve.Remote("baseline", wire.Channel(r1, w2), wire.Arena(path))
    remote.seccomp = False
    th = threading.Thread(target=lambda: _serve(remote), daemon=True)
    th.start()
    ch = wire.Channel(r2, w1)
    assert ch.recv(timeout=30)["op"] == "ready"
    threads = torch.get_num_threads()
    # sent as the judge is made, before its runtime (as `_run` sends the remote's "cuda")
    j = judge_mod.Judge({"deadline_s": 120, "backend": "cpu", "runtime": {"flush_mb": 1, "threads": 1}}, ch,
                        judge_arena, ahead=({"op": "echo", "device": "cpu", "outs": [{"shape": [2], "dtype": "float32"}]},))
    with pytest.raises(judge_mod.RemoteFailed, match="unknown op 'nope'"):
        j.ask({"op": "nope"})  # its own reply, not the echo's
    assert j.ahead == [] and j.ahead_replies["echo"]["ok"] is True and j.ahead_replies["echo"]["waited_s"] >= 0
    j.send_ahead({"op": "also-nope"})
    with pytest.raises(judge_mod.RemoteFailed, match="unknown op 'also-nope'"):
        j.take_ahead()
    ch.send({"op": "exit"})
    th.join(timeout=30)
    torch.set_num_threads(threads)
