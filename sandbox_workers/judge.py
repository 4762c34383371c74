"""The trusted judge: draws secret inputs, runs the reference, drives the remote model, checks and times it.

`python -m sandbox_workers.judge --rfd R --wfd W --arena PATH` reads a JSON spec on stdin and
writes its result (JSON) to the spec's `result_path`. It runs the task's own code and never
imports or runs candidate code: the candidate lives in another sandboxed process
(sandbox_workers/candidate/serve.py) and only ever sees inputs and weights written into the
shared arena. Per trial:

  fresh inputs from a secret seed (one set per call) -> expected outputs by the reference
  -> stage (where they will be) -> the judge flushes the caches -> (CPU: the judge writes
  them into the arena) run (the remote claims
  a time per call and writes its outputs) -> the judge snapshots the outputs -> every checked
  output compared here, on every element.

On the CPU backend the inputs reach the shared arena only after the judge's clock for the call has
started (`layout_plain`: the judge copies them in, the remote runs the model on views of them), so the
remote has no protocol work on its inputs that a candidate could do faster than the probe's stand-in;
on CUDA they travel sealed (XORed with a pad whose key comes only with "run"). The remote writes its
outputs into the arena before it replies to "run"; the judge copies them out the moment the reply
arrives, and that copy ends the round trip its clock measures: whatever the remote computes, it
computes inside it. Before any model code is loaded, the judge times the same protocol around a
trusted stand-in model that does no work (`echo`) in the same process: the protocol's own overhead
in this session. The evaluator bounds the remote's time claims by the round trip less that overhead,
so a claim its own measurement contradicts is rejected. Timed calls and checked calls are the same
calls.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import socket
import statistics
import sys
import time
import traceback

import torch

from sandbox_workers import device_gate
from sandbox_workers.candidate import devarena, wire

log = logging.getLogger(__name__)
_TOL = {torch.float16: 1e-2, torch.bfloat16: 2e-2}


class RemoteFailed(Exception):
    """The remote model failed a step: its error is the agent's observation (a policy fault)."""

    def __init__(self, error: str, violations: list | None = None):
        super().__init__(error)
        self.error, self.violations = error, violations or []


class Judge:
    def __init__(self, spec: dict, ch: wire.Channel, arena: wire.Arena, sock: socket.socket | None = None,
                 ahead: tuple[dict, ...] = ()):
        """``ahead``: messages sent to the remote before this side makes its runtime (its CUDA context), so the
        remote works on them meanwhile (`send_ahead`)."""
        from sandbox_workers.backends import get_runtime

        self.spec, self.ch, self.arena = spec, ch, arena
        self.ahead: list[dict] = []  # messages sent with send_ahead whose replies are not read yet, oldest first
        self.ahead_replies: dict[str, dict] = {}
        for msg in ahead:
            self.send_ahead(msg)
        self.deadline = time.monotonic() + float(spec["deadline_s"])
        self.runtime = get_runtime(spec["backend"], **spec.get("runtime", {}))
        self.device = self.runtime.device
        self.rng = random.Random(int.from_bytes(os.urandom(16), "little"))
        self.clock = time.perf_counter
        self.inputs_on_device = self.device != "cpu"
        self.t_ref: float | None = None  # seconds per reference call, timed before any model is loaded
        self.probe: dict | None = None  # the protocol's own overhead in this session (probe_overhead)
        self.sock = sock  # socketpair to the remote: the device arena's descriptor travels on it
        self.darena: devarena.DeviceArena | None = None  # outputs stay on the GPU (setup_device_arena)
        self._layout: tuple[list[tuple[list, str]], int] | None = None  # outputs_layout()
        self.out_lo = 0  # the device arena: inputs in [0, out_lo), outputs in [out_lo, size)
        self.cap_bytes = 0  # bytes one batched trial may take (0: the host arena's max_batch_bytes)
        self.windows: list[list[int]] = []  # [monotonic ns at "stage", at the "run" reply, calls] per trial (measure)
        # the worker's device gate (device_gate.py): shared around untimed device work, exclusive around timing
        self.gate = device_gate.client_from_env()
        self.spike_plan: list | None = None  # plan_spikes(): per input, (scale, sign) or None; None: no spikes

    # ------------------------------------------------------------------ setup
    def left(self) -> float:
        return self.deadline - time.monotonic()

    def ask(self, msg: dict) -> dict:
        self.take_ahead()
        self.ch.send(msg)
        return self._reply(msg)

    def send_ahead(self, msg: dict) -> None:
        """Send ``msg`` now and take its reply later (`take_ahead`, or the next `ask`): the remote works on it
        while this side does something else."""
        self.ch.send(msg)
        self.ahead.append(msg)

    def take_ahead(self) -> None:
        """The replies of every message sent ahead, in order (kept in ``ahead_replies`` by op, with the seconds
        this side waited for each)."""
        while self.ahead:
            msg, t0 = self.ahead.pop(0), time.monotonic()
            reply = self._reply(msg)
            self.ahead_replies[msg["op"]] = dict(reply, waited_s=round(time.monotonic() - t0, 6))

    def _reply(self, msg: dict) -> dict:
        try:
            reply = self.ch.recv(timeout=self.left())
        except wire.PeerTimeout as exc:
            raise RemoteFailed(f"the model did not answer {msg['op']!r} before the evaluation deadline "
                               f"({self.spec['deadline_s']:.0f} s)") from exc
        except wire.PeerGone as exc:
            raise RemoteFailed(f"the model's process died during {msg['op']!r}") from exc
        except wire.ProtocolError as exc:
            raise RemoteFailed(f"malformed reply to {msg['op']!r}: {exc}") from exc
        if reply.get("ok") is not True:
            viol = reply.get("violations")
            raise RemoteFailed(str(reply.get("error", "failed"))[:4000], viol if isinstance(viol, list) else [])
        return reply

    def build_reference(self, task, place: bool = True) -> None:
        """The task's model, built on the CPU (host work only: no device gate needed, device_gate.py) and, with
        ``place``, moved to the device (``place_reference``: under the gate)."""
        from sandbox_workers.runner_common import seed_all

        seed = self.rng.getrandbits(62)
        seed_all(seed)
        self.init_inputs = list(task.get_init_inputs())
        seed_all(seed)
        self.model = task.Model(*self.init_inputs).eval()
        self.get_inputs = task.get_inputs
        if place:
            self.place_reference()

    def place_reference(self) -> None:
        self.model = self.model.to(self.device)

    def fresh_inputs(self) -> list:
        from sandbox_workers.runner_common import seed_all

        seed_all(self.rng.getrandbits(62))
        if self.inputs_on_device:  # generated on the GPU: no host-side randn over the tensor
            try:
                with torch.device(self.device):
                    vals = list(self.get_inputs())
                return self._spiked([v.to(self.device) if isinstance(v, torch.Tensor) else v for v in vals])
            except Exception:  # noqa: BLE001 - a task whose get_inputs needs the CPU: fall back for good
                self.inputs_on_device = False
        return self._spiked([v.to(self.device) if isinstance(v, torch.Tensor) else v for v in self.get_inputs()])

    def _spiked(self, vals: list) -> list:
        if self.spike_plan is None:
            return vals
        return spiked(vals, self.spike_plan, self.rng.getrandbits(62))

    def plan_spikes(self) -> str:
        """Decide, once per session, whether every call's inputs carry spikes (see `spiked`): only where the reference
        stays finite on them wherever it is finite on the task's own inputs. Says what was decided and why."""
        if not self.spec.get("spiked_inputs", True):
            return "off (sandbox.spiked_inputs)"
        vals = self.fresh_inputs()
        plan = spike_plan(vals)
        if not any(plan):
            return "off: no non-integer floating input of 2 or more elements"
        # one set of inputs and one of outputs alive at a time beside the next (the judge's peak memory decides
        # which jobs share a device: device_memory.py)
        try:
            plain = self.reference(vals)
            finite = [o.is_floating_point() and bool(torch.isfinite(o).all()) for o in plain]
            del plain
            vals = spiked(vals, plan, self.rng.getrandbits(62))
            spikes = self.reference(vals)
        except (RuntimeError, ValueError) as exc:  # e.g. a loss that refuses values outside [0, 1]
            return f"off: the reference refuses spiked inputs ({str(exc)[:200]})"
        del vals
        if not all(bool(torch.isfinite(b).all()) for ok, b in zip(finite, spikes) if ok):
            return "off: the reference is not finite on spiked inputs"
        self.spike_plan = plan
        return "on"

    def reference(self, inputs: list) -> list:
        with torch.no_grad():
            out = self.model(*inputs)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        return [o.detach() for o in out]

    def load(self, module: str, cls: str, source: str, library: str = "", compile_: bool = False,
             ext: str = "") -> None:
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        need = wire.nbytes_of(list(state.values())) + wire.nbytes_of(self.init_inputs) + wire.ALIGN
        self.arena.ensure(need)
        init, pos = self.arena.put(self.init_inputs, 0)
        sdescs, _ = self.arena.put(list(state.values()), pos)
        self.ask({"op": "load", "module": module, "cls": cls, "source": source, "library": library, "ext": ext,
                  "infra": self.spec.get("infra", ""), "init": init, "state": dict(zip(state, sdescs)),
                  "device": self.device, "compile": compile_, "threads": self.spec.get("threads", 0),
                  "lead_cycles": self.spec.get("lead_cycles", 0)})

    # ------------------------------------------------------------------ one trial
    def centred_inputs(self) -> tuple[tuple[list, list] | None, str]:
        """One call's inputs for the centred check (see `centred`) with the reference's outputs for them, or None
        and why there is none."""
        vals, changed = centred(self.fresh_inputs())
        if not changed:
            return None, "skipped: no sign-definite floating input"
        try:
            exp = self.reference(vals)
        except (RuntimeError, ValueError) as exc:  # e.g. a loss that refuses values outside [0, 1]
            return None, f"skipped: the reference refuses centred inputs ({str(exc)[:200]})"
        if not all(bool(torch.isfinite(e).all()) for e in exp if e.is_floating_point()):
            return None, "skipped: the reference is not finite on centred inputs"
        return (vals, exp), "checked"

    def trial(self, b: int, check: list[bool], out_bytes: int, guard: bool = True,
              given: tuple[list, list] | None = None) -> dict:
        """One trial of b calls; ``given``: one call's (inputs, expected outputs), already computed here."""
        t_prep = time.monotonic()
        if given is not None:
            sets, expected = [given[0]], [given[1]]
        else:
            sets = [self.fresh_inputs() for _ in range(b)]
            expected = [self.reference(s) if c else None for s, c in zip(sets, check)]
        keys = [self.rng.getrandbits(62) for _ in sets]
        plain = None  # CPU: the input bytes, written into the shared arena only after the clock starts
        if self.darena is not None:  # inputs and outputs in GPU memory both processes map: no host copies
            descs = self.put_device(sets, keys)
            self.runtime.sync()  # the remote (another process) reads them next
            where = {"device": True, "lo": self.out_lo, "hi": self.darena.size}
        elif self.device == "cpu":  # nothing sealed: the plaintext is written into the arena once the clock runs
            descs, lo, plain = self.layout_plain(sets, b * out_bytes)
            keys = []
            where = {"lo": lo, "hi": lo + b * out_bytes}
        else:
            descs, lo = self.put_host(sets, keys, b * out_bytes)
            where = {"lo": lo, "hi": lo + b * out_bytes}
        del sets
        prep_s = time.monotonic() - t_prep  # inputs, expected outputs, sealing: the judge's own work, not timed
        clock = self.clock
        w0 = time.monotonic_ns()  # from "stage" on: work that overlaps the judge's input copy is in the window too
        t0 = clock()
        self.ask({"op": "stage", "sets": descs, "device": self.darena is not None, "plain": bool(plain is not None)})
        t1 = clock()
        self.runtime.flush()
        self.runtime.sync()
        t2 = clock()
        t_copy = 0.0
        if plain is not None:  # the call's inputs exist outside this process only from here on (layout_plain)
            tc = clock()
            self.arena.raw(0, plain.numel()).copy_(plain)
            t_copy = clock() - tc
            del plain
        ran = self.ask({"op": "run", "keys": keys, "guard": guard, **where})
        t_reply = clock()
        self.windows.append([w0, time.monotonic_ns(), b])  # the worker's CPU profile of the remote reads these
        got = self.snapshot(ran.get("outs"), b, where["lo"], where["hi"])
        t3 = clock()
        claim = ran.get("claim_s")
        if not isinstance(claim, (int, float)) or not math.isfinite(claim) or claim < 0:
            raise RemoteFailed(f"malformed time claim {claim!r}")
        results = []
        t_check = time.monotonic()
        for i, (o, e) in enumerate(zip(got, expected)):
            if e is None:
                continue
            ok, detail = compare([t.to(self.device) for t in o], e, self.spec["atol"], self.spec["rtol"])
            results.append({"call": i, "ok": ok, "detail": detail})
        del expected
        faults = ran.get("minflt")  # the remote's report: only steers the warm-up and is shown, never trusted
        return {"b": b, "claim_s": float(claim), "stage_s": t1 - t0, "flush_s": t2 - t1, "run_s": t3 - t2,
                "snapshot_s": t3 - t_reply, "copy_in_s": t_copy, "checks": results,
                "prep_s": prep_s, "check_s": time.monotonic() - t_check,
                "minflt": faults if isinstance(faults, int) and faults >= 0 else -1}

    def put_host(self, sets: list[list], keys: list[int], out_total: int) -> tuple[list, int]:
        """Sealed copies of the input sets into the host arena; their descriptors and where the outputs go."""
        in_bytes = sum(wire.nbytes_of(s) for s in sets)
        lo = wire.align(in_bytes + wire.ALIGN)
        self.arena.ensure(lo + out_total)
        descs, pos = [], 0
        for s, key in zip(sets, keys):
            sealed = [v.clone() if isinstance(v, torch.Tensor) else v for v in s]
            wire.seal(sealed, key)
            d, pos = self.arena.put(sealed, pos, lo)
            descs.append(d)
            del sealed
        return descs, lo

    def layout_plain(self, sets: list[list], out_total: int) -> tuple[list, int, torch.Tensor]:
        """CPU: the input sets laid out as the host arena will hold them, in a buffer private to this process; their
        descriptors, where the outputs go, and the buffer. `trial` copies the buffer into the arena (one memcpy)
        only after its clock for the call has started, and the remote runs the model on views of the arena: no
        unsealing on the remote's side, so no protocol work there that a candidate could do faster (or fuse with
        its kernel) than the stand-in model of the probe did. Until that copy the arena holds the previous call's
        inputs (fresh secret seeds every call: they tell nothing about this one)."""
        in_bytes = sum(wire.nbytes_of(s) for s in sets)
        lo = wire.align(in_bytes + wire.ALIGN)
        self.arena.ensure(lo + out_total)
        buf = torch.zeros(in_bytes, dtype=torch.uint8)  # zeros, not empty: the alignment gaps reach the remote too
        descs, pos = [], 0
        for s in sets:
            d, pos = wire.put_values(lambda off, n: buf[off:off + n], s, pos, in_bytes)
            descs.append(d)
        return descs, lo, buf[:pos]

    def put_device(self, sets: list[list], keys: list[int]) -> list[list]:
        """The input sets copied into the device arena's input region and sealed there, in place."""
        descs, pos = [], 0
        for s, key in zip(sets, keys):
            d, views = [], []
            for v in s:
                if not isinstance(v, torch.Tensor):
                    d.append({"t": "value", "v": wire.plain(v)})
                    continue
                (desc,), pos = wire.place(self.darena.region, [v], _align_dev(pos), self.out_lo)
                d.append(desc)
                views.append(self._device_view(desc, 0, self.out_lo))
            _seal_tensors_of(s, views, key)
            descs.append(d)
        return descs

    def snapshot(self, outs, b: int, lo: int, hi: int) -> list[list]:
        """The outputs copied out of the shared arena into this process, right as the run reply arrives: the
        copy ends the round trip the judge times, so whatever the remote does to them later (a thread still
        writing, work after its reply) counts as run time or is not seen at all. No commitment is needed, and
        nothing is hashed on the timed path."""
        if not isinstance(outs, list) or len(outs) != b or not all(isinstance(o, list) for o in outs):
            raise RemoteFailed("malformed run reply: one list of outputs per call expected")
        try:
            if self.darena is None:
                return [[self.arena.get(d, lo, hi).clone() for d in o] for o in outs]
            got = [[self._device_copy(d, lo, hi) for d in o] for o in outs]
            self.runtime.sync()  # the copies end the round trip
            return got
        except wire.ProtocolError as exc:
            raise RemoteFailed(f"malformed output descriptor: {exc}") from exc

    def _device_copy(self, desc, lo: int, hi: int):
        return self._device_view(desc, lo, hi).clone()

    def _device_view(self, desc, lo: int, hi: int):
        off, nbytes, shape, dtype = wire.tensor_desc(desc, lo, hi)
        return self.darena.region(off, nbytes).view(dtype).reshape(shape)

    def setup_device_arena(self, timing: dict | None) -> None:
        """CUDA: device memory shared with the remote for the outputs, sized for the largest trial; the host
        arena stays the fallback (no driver support, or the remote could not map it)."""
        if self.device == "cpu" or self.sock is None or not self.spec.get("device_arena"):
            return
        _, out_bytes = self.outputs_layout()
        self.cap_bytes = int(self.spec.get("max_batch_bytes_device", 4 << 30))
        b = self.batch_size(timing["min_trial_s"], out_bytes) if timing else 1
        in_set = device_nbytes(self.fresh_inputs())
        try:
            arena = devarena.DeviceArena.create(b * (in_set + out_bytes), torch.cuda.current_device())
            devarena.send(self.sock, arena)
            self.ask({"op": "darena"})
            self.sock.close()
        except (devarena.DeviceArenaError, OSError, RemoteFailed) as exc:
            log.warning("device arena unavailable, inputs and outputs go through host memory: %s", exc)
            self.cap_bytes = 0
            return
        self.darena, self.out_lo = arena, b * in_set

    def batch_size(self, min_trial_s: float, out_bytes: int) -> int:
        """Calls per trial, from the judge's own timing of the reference (never from a claim): a power of two
        so that the candidate's and the baselines' sessions of one task agree. `t_ref` is measured by `run`
        before any model code is loaded: once candidate code runs, it could keep the GPU (or the CPU) busy
        while the reference is timed, inflate t_ref and so shrink the batch until hidden work fits in the
        claim bound's tolerance (one call per trial leaves the judged-time floor nothing to see)."""
        if self.t_ref is None:
            self.t_ref = self.time_reference()
        if self.t_ref >= min_trial_s:
            return 1
        per_set = max(1, device_nbytes(self.fresh_inputs()) + out_bytes)
        cap = max(1, (self.cap_bytes or int(self.spec.get("max_batch_bytes", 256 << 20))) // per_set)
        return max(1, min(1024, _pow2_floor(min_trial_s / max(self.t_ref, 1e-7)), _pow2_floor(cap)))

    def time_reference(self, calls: int = 5) -> float:
        """Median seconds of one reference call (caches flushed first), measured here."""
        inputs = self.fresh_inputs()
        times = []
        with torch.no_grad():
            self.model(*inputs)
            for _ in range(calls):
                self.runtime.flush()
                self.runtime.sync()
                t0 = self.clock()
                self.model(*inputs)
                self.runtime.sync()
                times.append(self.clock() - t0)
        return statistics.median(times)

    def outputs_layout(self) -> tuple[list[tuple[list, str]], int]:
        """The (shape, dtype name) of each reference output on one fresh input set and the arena bytes one call's
        outputs take: computed once per session (the device arena, the probe and every variant use them)."""
        if self._layout is None:
            first = self.reference(self.fresh_inputs())
            metas = [(list(o.shape), str(o.dtype).removeprefix("torch.")) for o in first]
            self._layout = (metas, wire.nbytes_of(first) + wire.ALIGN * (len(first) + 1))
        return self._layout

    def probe_overhead(self, timing: dict, trials: int = 7) -> None:
        """Time the protocol around a stand-in model that does no work, in this session and before any model code
        is loaded (so nothing here is the candidate's): what the run round trip costs besides the model's calls
        (unsealing, placing the outputs, the snapshot, the pipe). The candidate's round trips are bounded by it.
        Measured in the same process minutes apart, it is not subject to the session-to-session noise of a
        baseline measured elsewhere, and a candidate cannot inflate it (it is taken before its code exists)."""
        metas, out_bytes = self.outputs_layout()
        if not all(dtype in wire.DTYPES for _, dtype in metas):
            return  # outputs the echo cannot stand in for: the bound falls back to the baseline's overhead
        # the same thread count as the model's runs: torch's default (every core, OpenMP spinning) made the echo
        # up to 5x slower than a 1-thread candidate's whole trial on a loaded 2-core host, and that inflated
        # overhead hid the work behind a forged CPU clock (docs/sandbox.md)
        self.ask({"op": "echo", "device": self.device, "lead_cycles": self.spec.get("lead_cycles", 0),
                  "threads": self.spec.get("threads", 0),
                  "outs": [{"shape": shape, "dtype": dtype} for shape, dtype in metas]})
        b = self.batch_size(timing["min_trial_s"], out_bytes)
        runs = [self.trial(b, [False] * b, out_bytes, guard=False) for _ in range(trials + 1)][1:]  # 1 warm-up
        gaps = [t["run_s"] - b * t["claim_s"] for t in runs]
        self.probe = {"run_gap_s": statistics.median(gaps), "run_gap_min_s": min(gaps),
                      "snapshot_s": statistics.median(t["snapshot_s"] for t in runs),
                      "copy_in_s": statistics.median(t["copy_in_s"] for t in runs), "batch": b, "trials": trials}

    # ------------------------------------------------------------------ a whole variant
    def measure(self, checked: bool, timing: dict | None, phases: Phases | None = None, name: str = "") -> dict:
        """Correctness trials, then (timing) warm-up and measured trials until the median is tight."""
        phases = phases or Phases()
        n_correct = max(1, int(self.spec.get("correctness_trials", 5))) if checked else 0
        frac = float(self.spec.get("timed_check_fraction", 1.0)) if checked else 0.0
        _, out_bytes = self.outputs_layout()
        checks, trials = [], []
        self.windows = []

        def run_trial(b: int, must_check: bool, guard: bool = True, given: tuple[list, list] | None = None) -> dict:
            mask = [must_check or (checked and self.rng.random() < frac) for _ in range(b)]
            t = self.trial(b, mask, out_bytes, guard, given)
            checks.extend(t["checks"])
            bad = next((c for c in t["checks"] if not c["ok"]), None)
            if bad is not None:
                kind = "timed" if timing and len(checks) > n_correct else "check"
                raise RemoteFailed(f"output mismatch on a {kind} call: {bad['detail']}",
                                   [{"name": "timed_output_mismatch", "detail": bad["detail"]}]
                                   if kind == "timed" else [])
            return t

        for _ in range(n_correct):
            run_trial(1, True)
        out = {}
        if checked and self.spec.get("check_centred_inputs", True):
            given, out["centred_check"] = self.centred_inputs()
            if given is not None:
                try:
                    run_trial(1, True, given=given)
                except RemoteFailed as exc:
                    raise RemoteFailed("on the centred check's inputs (the task's sign-definite inputs shifted to "
                                       f"mean zero; the reference is finite there): {exc.error}", exc.violations) from exc
        phases.mark(f"{name}.verify_s")
        out.update(checks=len(checks), timing=None, run_windows=self.windows)
        if not timing:
            return out
        t_first = time.monotonic()
        b = self.batch_size(timing["min_trial_s"], out_bytes)
        n_warm = max(1, int(timing["warmup"]))
        for _ in range(n_warm):  # guarded, one call each: the guard sees the warm-up too
            run_trial(1, False)
        if self.device == "cpu":
            # CPU (plain inputs): with nothing copied or unsealed on the remote's side at "stage", the model's first
            # calls page-fault their freshly allocated outputs (4096 minor faults, +4-5 ms, per 16 MiB) and the
            # first unguarded calls fault again after the guarded ones. Faulting timed trials made the baselines
            # noisy, and a noisy cached baseline is timed again on every evaluation (4-5x longer evaluations on a
            # 2-core host). So unguarded trials at the timed batch follow, until two agree and the remote reports
            # no faults (at most 12, and no more once they took the timing budget: the batch is sized by the
            # reference, so a candidate 100x slower than it spends ~1 s per trial); glibc keeps the freed outputs
            # (session.MALLOC_ENV)
            t_settle = time.monotonic()
            warm = [run_trial(b, False, guard=False)]
            while len(warm) < 12 and not _settled(warm) and time.monotonic() - t_settle < timing["budget_s"]:
                warm.append(run_trial(b, False, guard=False))
            out["warmup_trials"] = n_warm + len(warm)
        out["first_call_s"] = time.monotonic() - t_first
        phases.mark(f"{name}.warmup_s")
        self.gate.acquire(device_gate.EXCLUSIVE, f"{name}.timing", self)  # alone on the device from here
        out["batch_from_reference_s"] = self.t_ref
        t_start = time.monotonic()
        while len(trials) < timing["max_trials"]:
            trials.append(run_trial(b, False, guard=False))
            claims = [t["claim_s"] for t in trials]
            if len(trials) >= timing["min_trials"] and (time.monotonic() - t_start > timing["budget_s"]
                                                        or rel_sem_median(claims) <= timing["rel_ci"]):
                break
            if self.left() < 0.1 * float(self.spec["deadline_s"]):
                break  # keep what was measured rather than lose it all to the deadline
        phases.mark(f"{name}.timing_s")
        self.gate.release()
        out["checks"] = len(checks)
        out["timing"] = summarize_trials(trials)
        if self.device == "cpu":
            out["timing"]["warmup_minflt"] = [t["minflt"] for t in warm]  # the remote's word (diagnostic only)
        if self.probe and self.probe["batch"] == b:
            out["timing"]["trusted"]["probe"] = self.probe
        return out


class Phases:
    """Wall seconds of each step of the job, in order (the throughput benchmark reads them)."""

    def __init__(self):
        self.done: dict[str, float] = {}
        self._t = time.monotonic()

    def mark(self, name: str) -> None:
        now = time.monotonic()
        self.done[name] = round(self.done.get(name, 0.0) + now - self._t, 6)
        self._t = now


DEVICE_ALIGN = 512  # inputs in the device arena start where torch's allocator would put them (fidelity)


def _align_dev(n: int) -> int:
    return (n + DEVICE_ALIGN - 1) // DEVICE_ALIGN * DEVICE_ALIGN


def device_nbytes(values: list) -> int:
    """Bytes an input set takes in the device arena (every tensor on a DEVICE_ALIGN boundary)."""
    return sum(_align_dev(v.numel() * v.element_size()) for v in values if isinstance(v, torch.Tensor))


def _seal_tensors_of(values: list, views: list, key: int) -> None:
    """Seal the arena copies of a set's tensors with the pads the remote unseals them with: a pad's index is the
    value's index in the whole set (plain values included), as `wire.seal` numbers it on the remote's side."""
    it = iter(views)
    wire.seal([next(it) if isinstance(v, torch.Tensor) else v for v in values], key)


def centred(values: list) -> tuple[list, bool]:
    """The call's inputs with every sign-definite floating tensor (all >= 0 or all <= 0, as torch.rand draws them)
    shifted to mean zero, and whether any was. The task's inputs often exercise one branch of the op only (ReLU on
    rand: never negative), so a kernel that drops the other branch is exact on every call the task draws. Integer-
    valued tensors (labels, masks, +-1 targets) keep their values: shifting them would change what they mean."""
    out, changed = [], False
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1:
            lo, hi = float(v.min()), float(v.max())
            if (lo >= 0 or hi <= 0) and lo < hi and not torch.equal(v, v.round()):
                v = (v - v.float().mean().to(v.dtype)).contiguous()
                changed = True
        out.append(v)
    return out, changed


SPIKE_EVERY = 512  # one spiked element per this many, at least one per tensor
SPIKE_SIZE = 32.0  # a spike adds this many times the tensor's mean magnitude


def spike_plan(values: list) -> list:
    """Per input: (scale, sign) for a floating tensor of >= 2 elements that is not integer-valued (labels, masks,
    +-1 targets keep their meaning), else None. sign: +1 / -1 for a sign-definite tensor (spikes keep its sign, and so
    the op's domain), 0 for spikes of either sign."""
    plan = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1 and not torch.equal(v, v.round()):
            lo, hi = float(v.min()), float(v.max())
            plan.append((float(v.float().abs().mean()) or 1.0, 1 if lo >= 0 else -1 if hi <= 0 else 0))
        else:
            plan.append(None)
    return plan


def spiked(values: list, plan: list, seed: int) -> list:
    """The call's inputs with one element in every SPIKE_EVERY (at secret positions, fresh per call) pushed SPIKE_SIZE
    mean magnitudes away. On every call, checked or timed alike, so a candidate cannot tell the calls apart: a kernel
    that reduces a sample of its input (the MSE of every 64th element, within atol on i.i.d. inputs) misses most
    spikes and is wrong, and finding them means reading every element, which is the honest kernel's work."""
    out = []
    for v, p in zip(values, plan):
        if p is not None and isinstance(v, torch.Tensor):
            v = v.clone(memory_format=torch.contiguous_format)
            flat = v.view(-1)
            g = torch.Generator(device=flat.device)
            g.manual_seed(seed)
            seed = (seed * 6364136223846793005 + 1442695040888963407) & ((1 << 62) - 1)
            k = max(1, flat.numel() // SPIKE_EVERY)
            where = torch.randint(flat.numel(), (k,), generator=g, device=flat.device)
            size = p[0] * SPIKE_SIZE
            if p[1]:
                bump = torch.full((k,), size * p[1], device=flat.device)
            else:
                bump = (torch.randint(2, (k,), generator=g, device=flat.device) * 2 - 1).float() * size
            flat.index_add_(0, where, bump.to(flat.dtype))
        out.append(v)
    return out


def _pow2_floor(x: float) -> int:
    return 1 << max(0, int(math.floor(math.log2(max(x, 1.0)))))


def summarize_trials(trials: list[dict]) -> dict:
    """Claimed per-call times, plus the judge's own walls: what the evaluator bounds the claims with."""
    from sandbox_workers.backends.base import summarize

    claims = [t["claim_s"] for t in trials]
    b = trials[0]["b"]
    stats = summarize(claims, b)
    med = statistics.median
    stats["trusted"] = {
        "gap_s": med(t["stage_s"] + t["run_s"] - t["b"] * t["claim_s"] for t in trials),
        "run_gap_s": med(t["run_s"] - t["b"] * t["claim_s"] for t in trials),
        # minima: interference (other processes, the OS) only ever adds time, so the least of several trials is
        # the steadiest estimate on a shared host; the probe's minimum is compared with these
        "run_gap_min_s": min(t["run_s"] - t["b"] * t["claim_s"] for t in trials),
        "run_min_s": min(t["run_s"] for t in trials),
        "stage_s": med(t["stage_s"] for t in trials), "snapshot_s": med(t["snapshot_s"] for t in trials),
        "copy_in_s": med(t["copy_in_s"] for t in trials),
        "run_s": med(t["run_s"] for t in trials), "flush_s": med(t["flush_s"] for t in trials),
        "wall_per_call_s": med((t["stage_s"] + t["run_s"]) / t["b"] for t in trials),
        # the judge's own work around each timed trial (fresh inputs, expected outputs, the comparison): where the
        # device's exclusive time goes besides the candidate's calls (the stress tool's `timed_trial`)
        "prep_s": med(t.get("prep_s", 0.0) for t in trials), "check_s": med(t.get("check_s", 0.0) for t in trials),
    }
    stats["reported_minflt"] = [t.get("minflt", -1) for t in trials]  # the remote's word (diagnostic only)
    return stats


FAULTS_SETTLED = 64  # minor faults per warm-up trial still taken as steady (a 16 MiB output that faults takes 4096)


def _settled(warm: list[dict], tol: float = 0.25) -> bool:
    """Warm-up at steady state: the last two trials' claims within ``tol`` of each other and of the fastest so far,
    and the remote reported no page faults in the last one (a fault-free trial is the steady state the timed
    trials should see; a remote that always reports faults only lengthens its own warm-up, up to its cap)."""
    claims = [t["claim_s"] for t in warm]
    if len(claims) < 2 or warm[-1].get("minflt", 0) > FAULTS_SETTLED:
        return False
    a, b = claims[-2], claims[-1]
    best = min(claims)
    return max(a, b) <= (1 + tol) * min(a, b) and max(a, b) <= (1 + tol) * best


def rel_sem_median(samples: list[float]) -> float:
    med = statistics.median(samples)
    if med <= 0 or len(samples) < 2:
        return math.inf
    return 1.2533 * statistics.stdev(samples) / math.sqrt(len(samples)) / med


# Outputs whose typical size is below atol: the elementwise tolerance alone accepts anything small, zeros
# included (a softmax over 4096+ columns is ~1e-4 per element against atol 1e-2: held-out red team, docs/sandbox.md).
# There the whole output must also match in relative L2 norm. Below SMALL_FLOOR the reference is rounding noise
# (e.g. a mean of centred values): nothing relative can be asked of it.
SMALL_REL_L2 = 0.1
SMALL_FLOOR = 1e-6


def _small_output_error(o: torch.Tensor, e: torch.Tensor, atol: float) -> str:
    """Why an output whose reference is small against atol is still wrong ("" if it is right or not small)."""
    if not (e.is_floating_point() and o.is_floating_point()) or e.numel() == 0 or o.shape != e.shape:
        return ""
    norm = float(torch.linalg.vector_norm(e, dtype=torch.float32))
    if not math.isfinite(norm):  # NaN/Inf in the reference (their count is checked elsewhere): the finite part
        norm = float(torch.linalg.vector_norm(torch.nan_to_num(e, nan=0.0, posinf=0.0, neginf=0.0), dtype=torch.float32))
    ref_rms = norm / math.sqrt(e.numel())
    if not (SMALL_FLOOR < ref_rms < atol):
        return ""
    diff = torch.nan_to_num(o.float() - e.float(), nan=0.0, posinf=0.0, neginf=0.0)
    rel = float(torch.linalg.vector_norm(diff)) / (ref_rms * math.sqrt(e.numel()))
    if rel > SMALL_REL_L2:
        return (f"relative L2 error {rel:.3g} > {SMALL_REL_L2}: the reference's values are small (rms {ref_rms:.3g}) "
                f"against atol {atol}, so the output must also match as a whole")
    return ""


# Elementwise checks run over slices of this many elements: torch.allclose on whole tensors makes several
# temporaries of the output's size (a 6.4 GB KernelBench ReLU output: ~19 GB more at the judge's peak), and the
# worker admits jobs to a device by the memory their judges held (device_memory.py). Same verdict, element by element.
COMPARE_SLICE = 1 << 24


def _slices(t: torch.Tensor):
    flat = t.reshape(-1)
    return (flat[i:i + COMPARE_SLICE] for i in range(0, flat.numel(), COMPARE_SLICE))


def _nonfinite(t: torch.Tensor) -> int:
    return sum(int((~torch.isfinite(s)).sum()) for s in _slices(t))


def _allclose(o: torch.Tensor, e: torch.Tensor, atol: float, rtol: float) -> bool:
    return all(torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True) for a, b in zip(_slices(o), _slices(e)))


def compare(outs: list, expected: list, atol: float, rtol: float) -> tuple[bool, str]:
    """Every element of every output against the reference's, with the dtype's tolerance."""
    if len(outs) != len(expected):
        return False, f"expected {len(expected)} outputs, got {len(outs)}"
    for j, (o, e) in enumerate(zip(outs, expected)):
        if list(o.shape) != list(e.shape):
            return False, f"output {j}: shape {tuple(o.shape)} != expected {tuple(e.shape)}"
        if o.dtype != e.dtype:
            return False, f"output {j}: dtype {o.dtype} != expected {e.dtype}"
        if o.is_floating_point():
            bad, ref_bad = _nonfinite(o), _nonfinite(e)
            if bad > ref_bad:
                return False, f"output {j}: {bad} NaN/Inf values (reference: {ref_bad})"
        tol_a, tol_r = max(atol, _TOL.get(e.dtype, 0.0)), max(rtol, _TOL.get(e.dtype, 0.0))
        small = _small_output_error(o, e, tol_a)
        if small:
            return False, f"output {j}: {small}"
        if not _allclose(o, e, tol_a, tol_r):
            if e.is_floating_point():
                diff = (o.double() - e.double()).abs()
                diff[~torch.isfinite(diff)] = 0
                n_bad = int((~torch.isclose(o, e, atol=tol_a, rtol=tol_r, equal_nan=True)).sum())
                return False, (f"output {j}: {n_bad} of {e.numel()} elements differ, max abs diff "
                               f"{float(diff.max()):.4g} (atol {tol_a}, rtol {tol_r})")
            return False, f"output {j}: {int((o != e).sum())} elements differ"
    return True, "ok"


def run(spec: dict, ch: wire.Channel, arena: wire.Arena, sock: socket.socket | None = None) -> dict:
    """The whole job; failures of the task or of this side are infrastructure faults. Every result carries the
    memory this session held (`device_bytes`, the worker's admission of jobs to the device: device_memory.py)."""
    made: list[Judge] = []
    result = _run(spec, ch, arena, sock, made)
    result["device_bytes"] = held_bytes(made[0] if made else None, arena)
    return result


def held_bytes(judge: Judge | None, arena: wire.Arena) -> int:
    """The most memory this session held on its device: CUDA, torch's peak reservation here plus the device
    arena (the model's process maps it); CPU, this process's peak resident set plus the shared arena file."""
    if torch.cuda.is_initialized():
        darena = judge.darena if judge is not None else None
        return int(torch.cuda.max_memory_reserved()) + (int(darena.size) if darena is not None else 0)
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 + int(arena.size or 0)


def _run(spec: dict, ch: wire.Channel, arena: wire.Arena, sock: socket.socket | None, made: list) -> dict:
    from sandbox_workers.runner_common import load_task, versions

    phases = Phases()
    try:
        hello = ch.recv(timeout=float(spec.get("startup_timeout_s", 120)))
    except wire.ProtocolError as exc:
        return {"ok": False, "infra": False, "error": f"the model's process did not start: {exc}"}
    # the remote makes its CUDA context while this side makes its own and builds the reference: host work for
    # both, done before the device gate is asked for (docs/oracle-gpu.md, session 24)
    ahead = ({"op": "cuda"},) if spec.get("backend") == "cuda" and spec.get("remote_context_first", True) else ()
    try:
        judge = Judge(spec, ch, arena, sock, ahead=ahead)
    except wire.ProtocolError as exc:
        return {"ok": False, "infra": True, "error": f"the model's process went away after it started: {exc}"}
    made.append(judge)
    result = {"ok": True, "remote_pid": hello.get("pid"), "versions": versions(judge.runtime),
              "clock": judge.runtime.clock_info(), "variants": {}, "phases": phases.done}
    phases.mark("judge_start_s")  # the remote's hello, this side's CUDA context, versions and clocks
    try:
        task = load_task(spec["task_source"])
        # host only, before the gate is asked for: while another job is timed, a judge left running (CUDA,
        # device_gate.py) gets this far
        judge.build_reference(task, place=False)
        phases.mark("reference_host_s")
        judge.gate.acquire(device_gate.SHARED, "reference", judge)
        judge.place_reference()
        result["spiked_inputs"] = judge.plan_spikes()
        phases.mark("reference_s")
        cached = spec.get("t_ref")
        if spec.get("timing") and isinstance(cached, (int, float)) and math.isfinite(cached) and cached > 0:
            # the reference's time as a judge of this task's baselines measured it (the worker's trusted cache):
            # nothing to time here, and the candidate times in the batch of the judge that last measured the baselines
            judge.t_ref, result["t_ref_source"] = float(cached), "baselines"
        elif spec.get("timing"):  # the reference's time sizes the batch, then the probe: timed, so alone
            judge.take_ahead()  # nothing of this session's may run beside its own timing
            judge.gate.acquire(device_gate.EXCLUSIVE, "time_reference+probe", judge)
            judge.t_ref = judge.time_reference()  # before the remote loads any model (see batch_size)
            result["t_ref_source"] = "measured"
            phases.mark("time_reference_s")
        result["t_ref"] = judge.t_ref
    except Exception as exc:  # noqa: BLE001 - the task itself is broken: not the candidate's fault
        return {"ok": False, "infra": True, "error": "reference failed: " + _err(exc)}
    try:
        judge.setup_device_arena(spec.get("timing"))
        judge.take_ahead()  # where no device arena was mapped (its "darena" question takes it otherwise)
        if "cuda" in judge.ahead_replies:  # what the remote's context took, and how much of it this side waited
            phases.done["remote_context"] = {"made_s": judge.ahead_replies["cuda"].get("s", 0.0),
                                             "waited_s": judge.ahead_replies["cuda"]["waited_s"]}
        result["arena"] = "device" if judge.darena is not None else "host"
        phases.mark("device_arena_s")
    except Exception as exc:  # noqa: BLE001 - no model code has run yet: not the candidate's fault
        return {"ok": False, "infra": True, "error": "the device arena failed: " + _err(exc)}
    if spec.get("timing"):
        try:
            judge.gate.acquire(device_gate.EXCLUSIVE, "probe", judge)  # held already when t_ref was timed here
            judge.probe_overhead(spec["timing"])
            phases.mark("probe_s")
        except Exception as exc:  # noqa: BLE001 - no model code has run yet: not the candidate's fault
            return {"ok": False, "infra": True, "error": "the protocol probe failed: " + _err(exc)}
    for v in spec["variants"]:
        t0 = time.monotonic()
        try:
            judge.gate.acquire(device_gate.SHARED, f"{v['name']}.load+verify", judge)
            judge.load(v["module"], v["cls"], v["source"], v.get("library", ""), v.get("compile", False),
                       v.get("ext", ""))
            phases.mark(f"{v['name']}.load_s")
            out = judge.measure(v["checked"], spec.get("timing"), phases, v["name"])
            out["ok"] = True
        except RemoteFailed as exc:
            out = {"ok": False, "error": exc.error, "violations": exc.violations}
            if v["checked"]:
                result["variants"][v["name"]] = out
                break
        except Exception as exc:  # noqa: BLE001 - the reference or the judge failed: infrastructure
            return {"ok": False, "infra": True, "error": f"judge failed in variant {v['name']}: " + _err(exc)}
        out["wall_s"] = time.monotonic() - t0
        result["variants"][v["name"]] = out
    try:
        ch.send({"op": "exit"})
    except wire.ProtocolError:
        pass
    return result


def _err(exc: BaseException, limit: int = 2500) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= limit else "...\n" + text[-limit:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rfd", type=int, required=True)
    ap.add_argument("--wfd", type=int, required=True)
    ap.add_argument("--arena", required=True)
    ap.add_argument("--sock", type=int, default=-1, help="socketpair end for the device arena's descriptor")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="judge %(levelname)s %(message)s")
    spec = json.loads(sys.stdin.read())
    arena = wire.Arena(args.arena)
    try:
        sock = socket.socket(fileno=args.sock) if args.sock >= 0 else None
        result = run(spec, wire.Channel(args.rfd, args.wfd), arena, sock)
        device_gate.client_from_env().release()  # a no-op unless the gate is still held (the exit below ends it too)
    except BaseException as exc:  # noqa: BLE001 - report whatever ended the judge
        result = {"ok": False, "infra": True, "error": "judge crashed: " + _err(exc)}
    tmp = spec["result_path"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, spec["result_path"])
    # the worker waits for this process to end: skip the interpreter's and torch's teardown (seconds with a CUDA
    # context and GBs of device memory); the kernel and the driver reclaim everything at exit anyway
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
