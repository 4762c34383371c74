"""The remote end: build one model, then run it on inputs the judge hands over, one trial at a time.

`python -m sandbox_workers.candidate.serve --role candidate|baseline --rfd R --wfd W --arena PATH`
runs inside the OS sandbox. As the candidate it locks itself down with seccomp (no processes,
no exec, no sockets) before any candidate code is loaded; as the baseline it runs the task's
own Model (eager, or torch.compile, which needs its compiler subprocesses).

Nothing this process reports is trusted by the judge: its time claims are bounded by the
judge's own clock, and every output it returns is compared by the judge. The in-process
compute guard below only tells an honest agent early that torch compute in ModelNew is not
allowed; it is not what keeps the reward honest.

Messages (judge -> here -> judge):
  load  {source, cls, init, state, library, device, compile, threads, lead_cycles} -> {ok, error}
  stage {sets: [[desc, ...], ...], device, plain} -> {ok}  (sealed inputs copied into this process's buffers;
                                             with `device`, views of the device arena's input region, no copy;
                                             with `plain` (CPU), views of the host arena's input region, where
                                             the judge writes the inputs unsealed only after its clock for the
                                             "run" started: nothing to unseal, no copy)
  cuda  {}                               -> {ok, s}  (CUDA, before any model code: make this process's CUDA
                                             context now, while the judge starts; seconds it took)
  darena {}                              -> {ok, size}  (CUDA, before any model code: map the device arena
                                             whose descriptor the judge sent over the socketpair)
  echo  {outs: [{shape, dtype}, ...], threads} -> {ok}   (before any model code: a trusted stand-in model that
                                             returns empty outputs of the task's shapes, so the judge can
                                             time the protocol's own overhead in this process)
  run   {keys: [int, ...], lo, hi, device} -> {ok, claim_s, outs: [[desc, ...], ...]}  (unseal unless `plain`
                                             was staged (no keys then), time the calls,
                                             write the outputs into the arena's [lo, hi), the device arena's
                                             when `device`; the judge flushed
                                             caches first and copies the outputs out as soon as this reply
                                             arrives, inside the round trip its clock measures)
  exit  {}
"""
from __future__ import annotations

import argparse
import os
import resource
import socket
import sys
import time
import traceback
import types

import torch

from sandbox_workers.candidate import devarena, policy, wire


class Remote:
    def __init__(self, role: str, ch: wire.Channel, arena: wire.Arena):
        self.role, self.ch, self.arena = role, ch, arena
        self.model = None
        self.device = "cpu"
        self.sets: list[list] = []
        self.plain = False  # the staged sets are views of the host arena, written in plain by the judge (CPU)
        self.lead_cycles = 0
        self.guard_rec = policy.Recorder()
        self.code_loaded = False
        self.sock: socket.socket | None = None  # the judge's socketpair end: the device arena's descriptor
        self.darena: devarena.DeviceArena | None = None
        self.locked = False
        self.seccomp = True

    def lock_down(self) -> None:
        """On the first job: start CUDA (only now: a pre-started process must not touch the GPU while another
        job is being timed), then seccomp before any model code; the driver needs its sockets at init."""
        if self.device == "cuda":
            torch.cuda.init()
            torch.empty(1, device="cuda")
        if self.role == "candidate" and self.seccomp:
            from sandbox_workers.candidate import seccomp

            seccomp.install(allow_exec=False)
        self.locked = True

    def warm_guard(self) -> None:
        """Enter the compute guard once before any job: its first use imports what torch's dispatch modes need
        (~4 s), which would otherwise land on the first checked call of every evaluation."""
        x = torch.zeros(4)
        with policy.ComputeGuard(policy.Recorder()):
            torch.empty_like(x).copy_(x)

    # ------------------------------------------------------------------ messages
    def serve(self) -> None:
        if self.role == "candidate":
            self.warm_guard()
        self.ch.send({"op": "ready", "pid": os.getpid()})
        while True:
            msg = self.ch.recv()
            op = msg.get("op")
            if op == "exit":
                return
            handler = {"load": self.load, "stage": self.stage, "run": self.run, "echo": self.echo,
                       "darena": self.map_device_arena, "cuda": self.start_cuda}.get(op)
            if handler is None:
                self.ch.send({"ok": False, "error": f"unknown op {op!r}"})
                continue
            try:
                reply = handler(msg)
            except policy.GuardTripped as exc:
                reply = {"ok": False, "error": f"guard: {exc}", "violations": self.guard_rec.found}
            except Exception as exc:  # noqa: BLE001 - the model's own failure is the agent's observation
                reply = {"ok": False, "error": _err(exc)}
            self.ch.send(reply)

    def load(self, msg: dict) -> dict:
        self.arena.remap()
        self.device = msg.get("device", "cpu")
        if not self.locked:
            self.lock_down()
        self.lead_cycles = int(msg.get("lead_cycles", 0))
        if msg.get("threads"):
            torch.set_num_threads(int(msg["threads"]))
        if msg.get("library") and msg.get("ext"):
            _bind_extension(msg["ext"], msg["library"])
        elif msg.get("library"):
            sys.path.insert(0, msg["infra"])
            import krl

            krl._bind(msg["library"], self.device)
        self.code_loaded = True
        mod = types.ModuleType(msg["module"])
        mod.__file__ = msg["module"] + ".py"
        sys.modules[msg["module"]] = mod
        exec(compile(msg["source"], mod.__file__, "exec"), mod.__dict__)  # noqa: S102 - sandboxed by design
        cls = getattr(mod, msg["cls"], None)
        if cls is None:
            return {"ok": False, "error": f"{mod.__file__} defines no {msg['cls']}"}
        init = [self.arena.get(d).clone() if d.get("t") == "tensor" else self.arena.get(d) for d in msg["init"]]
        model = cls(*init)
        if not isinstance(model, torch.nn.Module):
            return {"ok": False, "error": f"{msg['cls']} is not a torch.nn.Module"}
        state = {k: self.arena.get(d).clone() for k, d in msg["state"].items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            return {"ok": False, "error": f"{msg['cls']}'s parameters do not match Model's state_dict: missing "
                                          f"{list(missing)[:8]}, unexpected {list(unexpected)[:8]} (use the same "
                                          "submodule/parameter names)"}
        model = model.to(self.device).eval()
        self.model = torch.compile(model) if msg.get("compile") else model
        return {"ok": True}

    def stage(self, msg: dict) -> dict:
        self.plain = bool(msg.get("plain")) and not msg.get("device") and self.device == "cpu"
        if msg.get("device"):  # sealed inputs already in the device arena: the model runs on views of them
            if self.darena is None:
                return {"ok": False, "error": "stage: the inputs are in a device arena that was never mapped"}
            self.sets = [[self._device_view(d) for d in descs] for descs in msg["sets"]]
            return {"ok": True}
        self.arena.remap()
        if self.plain:  # CPU: the judge writes this call's inputs here after its clock starts; no copy, no key
            self.sets = [[self.arena.get(d) for d in descs] for descs in msg["sets"]]
            return {"ok": True}
        self.sets = []
        for descs in msg["sets"]:
            vals = []
            for d in descs:
                v = self.arena.get(d)
                vals.append(v.to(self.device, copy=True) if isinstance(v, torch.Tensor) else v)
            self.sets.append(vals)
        self._sync()
        return {"ok": True}

    def _device_view(self, desc):
        if isinstance(desc, dict) and desc.get("t") == "value":
            return desc.get("v")
        off, nbytes, shape, dtype = wire.tensor_desc(desc, 0, self.darena.size)
        return self.darena.region(off, nbytes).view(dtype).reshape(shape)

    def start_cuda(self, msg: dict) -> dict:
        """Make the CUDA context as the job starts, before the judge asks for the device gate: no kernel runs, and
        this process is frozen like any candidate while another job is timed, so it only uses the hand-over gaps
        (made inside the judge's first shared hold, it kept the device idle for ~0.3 s of every job there)."""
        if self.code_loaded:
            return {"ok": False, "error": "cuda: a model was loaded already"}
        t0 = time.monotonic()
        torch.cuda.init()
        torch.empty(1, device="cuda")
        return {"ok": True, "s": round(time.monotonic() - t0, 6)}

    def map_device_arena(self, msg: dict) -> dict:
        """Map the judge's device arena (before seccomp: the descriptor arrives over a socket)."""
        if self.locked or self.sock is None:
            return {"ok": False, "error": "darena: only before the first job starts, with a socket"}
        torch.cuda.init()
        torch.empty(1, device="cuda")
        self.darena = devarena.receive(self.sock)
        self.sock.close()  # nothing else travels on it: candidate code must not find a channel to the judge
        self.sock = None
        return {"ok": True, "size": self.darena.size}

    def echo(self, msg: dict) -> dict:
        """The protocol with no model work: only before any model code ran here, so its timing is honest."""
        if self.code_loaded:
            return {"ok": False, "error": "echo: a model was loaded already"}
        self.device = msg.get("device", "cpu")
        if not self.locked:
            self.lock_down()
        self.lead_cycles = int(msg.get("lead_cycles", 0))  # the same GPU spin before the calls as the model's runs
        if msg.get("threads"):  # the same CPU threads as the model's runs (load sets them the same way)
            torch.set_num_threads(int(msg["threads"]))
        specs = [(list(o["shape"]), wire.DTYPES[o["dtype"]]) for o in msg["outs"]]
        device = self.device
        self.model = lambda *inputs: [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in specs]
        return {"ok": True}

    def run(self, msg: dict) -> dict:
        model, sets = self.model, self.sets
        if model is None:
            return {"ok": False, "error": "no model loaded"}
        # the guard's Python dispatch costs ~10 us per tensor op: it checks the calls that verify correctness
        # and the warm-up, and stays out of the measured trials (it is advice, not the trust boundary)
        guard = self.role == "candidate" and self.code_loaded and bool(msg.get("guard", True))
        outs = []
        keys = msg.get("keys") or []
        if not self.plain:  # sealed inputs (CUDA): unsealed here, now that the keys came
            if len(keys) != len(sets):
                return {"ok": False, "error": "run: one key per staged set expected"}
            for vals, key in zip(sets, keys):
                wire.seal(vals, int(key))
            self._sync()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        with torch.no_grad():
            if self.device == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if self.lead_cycles:
                    torch.cuda._sleep(self.lead_cycles)  # the host enqueues the calls while the GPU spins
                start.record()
                for s in sets:
                    outs.append(self._call(model, s, guard))
                end.record()
                end.synchronize()
                claim = start.elapsed_time(end) / 1000.0
                torch.cuda.synchronize()
            else:
                t0 = time.perf_counter()
                for s in sets:
                    outs.append(self._call(model, s, guard))
                claim = time.perf_counter() - t0
        # page faults of this process during the calls: a diagnostic for the judge's warm-up, never trusted
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        if self.guard_rec.found:  # tripped, and the candidate swallowed the exception
            return {"ok": False, "error": "guard: " + self.guard_rec.found[0]["detail"],
                    "violations": self.guard_rec.found}
        placed = self._place(outs, int(msg["lo"]), int(msg["hi"]), bool(msg.get("device")))
        if isinstance(placed, str):
            return {"ok": False, "error": placed}
        self._sync()  # the judge's snapshot (another process) must find the copies done
        return {"ok": True, "claim_s": claim / max(1, len(sets)), "outs": placed, "minflt": faults}

    def _place(self, outs: list, lo: int, hi: int, device: bool = False):
        """Every call's outputs into the arena's output region (descriptors), or why they cannot go there."""
        if device and self.darena is None:
            return "run: the outputs go to a device arena that was never mapped"
        self.arena.remap()
        descs, pos = [], lo
        for call in outs:
            for j, o in enumerate(call):
                if type(o) is not torch.Tensor:
                    return f"output {j}: expected a plain torch.Tensor, got {type(o).__module__}.{type(o).__name__}"
            try:
                d, pos = wire.place(self.darena.region, call, pos, hi) if device else self.arena.put(call, pos, hi)
            except wire.ProtocolError as exc:
                return f"outputs do not fit the expected outputs' size: {exc}"
            descs.append(d)
        return descs

    def _call(self, model, inputs: list, guard: bool) -> list:
        if guard:
            with policy.ComputeGuard(self.guard_rec):
                out = model(*inputs)
        else:
            out = model(*inputs)
        return list(out) if isinstance(out, (tuple, list)) else [out]

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()


def _bind_extension(name: str, path: str) -> None:
    """A torch extension prebuilt by the compile worker (KernelBench load_inline, CUDA-Agent): imported under its
    module name; `torch.utils.cpp_extension.load_inline`/`load` return it instead of compiling (no compiler
    exists in this sandbox), and `import cuda_extension` finds it."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    ext = importlib.util.module_from_spec(spec)
    loader.exec_module(ext)
    sys.modules[name] = ext

    def prebuilt(name: str = "", *args, **kwargs):
        if name != ext.__name__:
            raise RuntimeError(f"load_inline(name={name!r}): this solution's extension was built as {ext.__name__!r}")
        return ext

    fake = types.ModuleType("torch.utils.cpp_extension")
    fake.load_inline = fake.load = prebuilt
    fake.CUDA_HOME = None
    sys.modules["torch.utils.cpp_extension"] = fake
    torch.utils.cpp_extension = fake


def _err(exc: BaseException, limit: int = 3000) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= limit else "...\n" + text[-limit:]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--role", choices=("candidate", "baseline"), required=True)
    ap.add_argument("--rfd", type=int, required=True)
    ap.add_argument("--wfd", type=int, required=True)
    ap.add_argument("--arena", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sock", type=int, default=-1, help="socketpair end for the device arena's descriptor")
    ap.add_argument("--no-seccomp", action="store_true", help="isolation=none only: trusted code")
    args = ap.parse_args(argv)
    remote = Remote(args.role, wire.Channel(args.rfd, args.wfd), wire.Arena(args.arena))
    remote.seccomp = not args.no_seccomp
    if args.sock >= 0:
        remote.sock = socket.socket(fileno=args.sock)
    try:
        remote.serve()
    except wire.PeerGone:
        pass
    # the worker waits for this process to end: no interpreter or CUDA teardown (the driver reclaims it at exit)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
