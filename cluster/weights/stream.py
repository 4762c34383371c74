"""Transport "nccl": the learner streams a version's bytes straight to the actors over a torch.distributed
collective (NCCL between GPUs, gloo where a side has no GPU), inside one cluster.

One-to-many: actors learn of a version from one announcement, so they ask for it at nearly the same moment.
The server waits ``gather_s`` after the first request, then serves every actor that asked for the same version
with one broadcast over one group (learner = rank 0, actors = ranks 1..k): the bytes leave the learner once,
whatever the number of actors. A group is formed per transfer, not once for the run, because actors join and
leave at any time and a fixed world cannot; it is rendezvoused on a TCPStore the learner hosts
(``nccl://host:port/<model>/<version>`` in the announcement; the store listens on that host alone,
``learner.weight_stream_host``, loopback by default). An actor that asks later is served by the next group, from
the learner's local copy of the newest ``keep`` versions (written like the ``fs`` transport: temp folder, fsync,
rename, manifest). Before a group is formed each asker must accept an offer within ``accept_s``, so one that
left after asking (a deserter) is dropped without costing the others; one killed mid-broadcast fails its group
once (the collective times out after ``timeout_s``), the others ask again, and the server serves on. The
actor hashes what it receives and checks it against the announcement exactly like the kafka path: a
half-sent or corrupt version is never materialised.

Each group picks its backend: NCCL only when every member has a GPU and all of them are different GPUs
(NCCL refuses two ranks on one GPU, as on a one-GPU box running learner and actor), gloo otherwise.

Store keys per ticket n (a counter the actor increments): ``t<n>/peer`` = the actor's GPU UUID or "",
``t<n>/want`` = "<model>:<version>" (actor), ``t<n>/offer`` (learner), ``t<n>/accept`` (actor),
``t<n>/header`` = JSON {"backend", "files": [[name, size]...], "chunk", "group", "rank", "world"} or {"error"}
(learner), ``t<n>/done`` (actor, after the last byte); the group's own keys under ``<group>/pg/``.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import re
import socket
import threading
import time
from pathlib import Path

from cluster.weights import digest
from cluster.weights import fs as wfs
from cluster.errors import KernelRLError, RetriableError, SetupError
from schemas.messages import WeightAnnouncement

log = logging.getLogger(__name__)

_URI = re.compile(r"^nccl://(?P<host>[^:/]+|\[[^\]]+\]):(?P<port>\d+)/(?P<model>[^/]+)/(?P<version>\d+)$")


class WeightsGone(KernelRLError):
    """The learner no longer holds the announced version (a newer one replaced it): wait for the next."""


class WeightsUnreachable(RetriableError):
    """The learner's weight server did not answer (restarting, or the network is down)."""


def resolve_backend(want: str) -> str:
    """The server's preference: auto -> nccl when this process sees a GPU, else gloo; an explicit nccl without
    a GPU is a setup error. Each transfer may still fall back to gloo (``pick_backend``)."""
    import torch

    has_gpu = torch.cuda.is_available()
    if want == "auto":
        return "nccl" if has_gpu else "gloo"
    if want == "nccl" and not has_gpu:
        raise SetupError("learner.weight_stream_backend 'nccl' needs a GPU in this process: use 'gloo' or 'auto'")
    return want


def gpu_uuid() -> str:
    """This process's current GPU (its UUID), or "" without one."""
    import torch

    if not torch.cuda.is_available():
        return ""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return str(getattr(props, "uuid", "") or "")  # unknown: treated as no GPU, so gloo (safe)


def pick_backend(configured: str, mine: str, peers: list[str]) -> str:
    """The backend of one group: NCCL needs a GPU on every member, each a different one."""
    gpus = [mine, *peers]
    return "nccl" if configured == "nccl" and all(gpus) and len(set(gpus)) == len(gpus) else "gloo"


def _group(store, prefix: str, rank: int, world: int, backend: str, timeout_s: float, local_host: str):
    """A process group of its own (the default group, DeepSpeed's or vLLM's, is untouched).
    ``local_host``: this side's address toward the others (gloo's sockets bind it)."""
    import os

    import torch
    import torch.distributed as dist

    ps = dist.PrefixStore(prefix, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(ps, rank, world, opts), torch.device("cuda", torch.cuda.current_device())
    if os.environ.get("GLOO_SOCKET_IFNAME"):  # the operator's choice of interface wins
        return dist.ProcessGroupGloo(ps, rank, world, timeout), torch.device("cpu")
    # gloo's default device resolves the machine's host name, often to a loopback address (127.0.1.1 in
    # /etc/hosts) that the peer on another machine cannot reach: bind the address that reaches the peer
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_host)]
    return dist.ProcessGroupGloo(ps, rank, world, opts), torch.device("cpu")


def _local_address(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        return s.getsockname()[0]


def _broadcast(pg, tensor) -> None:
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    pg.broadcast([tensor], opts).wait()


def _close_group(pg) -> None:
    try:
        pg.shutdown()
    except (AttributeError, RuntimeError) as exc:  # older torch has no shutdown; a broken group may refuse
        log.debug("process group shutdown: %s", exc)


def _listen(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host``:``port`` only (port 0: a free one)."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        return socket.create_server(addr, family=family, backlog=128)
    except OSError as exc:
        raise SetupError(f"learner.weight_stream_host/port {host}:{port}: cannot listen ({exc}); "
                         "set the learner's own address and a free port") from exc


class WeightStreamServer:
    """The learner's side: holds recent versions and streams each to everyone asking for it, one group at a time."""

    def __init__(self, root: str | Path, host: str = "127.0.0.1", port: int = 0, backend: str = "auto",
                 keep: int = 2, chunk_bytes: int = 64 << 20, timeout_s: float = 120.0, gather_s: float = 0.5,
                 accept_s: float = 5.0) -> None:
        import torch.distributed as dist

        self.root, self.host, self.keep = Path(root), host, max(1, keep)
        self.backend = resolve_backend(backend)
        self.gpu = gpu_uuid() if self.backend == "nccl" else ""
        self.chunk_bytes, self.timeout_s = chunk_bytes, timeout_s
        self.gather_s, self.accept_s = gather_s, min(accept_s, timeout_s)
        listener = _listen(host, port)
        try:
            # TCPStore binds every interface when it opens its own socket: hand it one bound to ``host`` alone
            self.store = dist.TCPStore(host, listener.getsockname()[1], None, True,
                                       datetime.timedelta(seconds=timeout_s), wait_for_workers=False,
                                       master_listen_fd=listener.fileno())
        except RuntimeError as exc:
            listener.close()
            raise SetupError(f"learner.weight_stream_port {port}: cannot listen ({exc})") from exc
        listener.detach()  # the store owns (and closes) the socket now
        self.port = int(self.store.port)
        self.served = 0
        self.failed = 0
        self.by_backend = {"nccl": 0, "gloo": 0}  # finished transfers (receivers served) per backend
        self.groups: list[int] = []  # receivers per finished broadcast, in order
        self._last = time.monotonic()  # newest add or finished transfer: close() drains from here
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="weight-stream", daemon=True)
        self._thread.start()
        log.info("weight stream server on %s:%d (%s), versions in %s", host, self.port, self.backend, self.root)

    def uri(self, model_name: str, version: int) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # an IPv6 literal
        return f"nccl://{host}:{self.port}/{model_name}/{version}"

    def announcement(self, ann: WeightAnnouncement) -> WeightAnnouncement:
        """The stream announcement of a version already held (an ``fs``-layout announcement of it)."""
        self._last = time.monotonic()  # announced (again): actors will ask for it shortly
        return dataclasses.replace(ann, transport="nccl", uri=self.uri(ann.model_name, ann.version))

    def add(self, model_name: str, version: int, folder: str | Path, step: int = 0,
            take: bool = False) -> WeightAnnouncement:
        """Take a copy of ``folder`` as version ``version`` and drop old versions. ``take`` (the caller gives the
        folder up): linked where it can be, and synced to disk after this returns (wfs.publish_fs)."""
        ann = wfs.publish_fs(self.root, model_name, version, folder, step=step, take=take, sync=not take)
        self._prune(model_name)
        self._last = time.monotonic()
        return self.announcement(ann)

    def _prune(self, model_name: str) -> None:
        wfs.prune_versions(self.root, model_name, self.keep)

    def close(self, drain_s: float = 0.0) -> None:
        """Stop serving, first serving on until nobody asked for ``drain_s`` seconds: actors learn of the
        newest version from its announcement a moment after it was added, and a learner that ends right
        after publishing must not take that version with it."""
        while self._thread.is_alive() and time.monotonic() - self._last < drain_s:
            time.sleep(0.1)
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 5)
        if not self._thread.is_alive():
            self.store = None  # stop listening: late receivers get WeightsUnreachable at once

    # ---- serving ------------------------------------------------------------------------------
    def _serve(self) -> None:
        nxt = 1
        while not self._stop.is_set():
            try:
                issued = self._gather(nxt)
            except RuntimeError as exc:
                log.error("weight stream store failed (%s); serving stops", exc)
                return
            if issued < nxt:
                self._stop.wait(0.05)
                continue
            self._last = time.monotonic()
            for want, tickets in self._batches(range(nxt, issued + 1)).items():
                try:
                    self._serve_batch(want, tickets)
                except (RuntimeError, OSError, ValueError, KernelRLError) as exc:  # bad peers, not the server
                    self.failed += len(tickets)
                    log.warning("weight stream transfers %s failed: %s", tickets, exc)
                self._last = time.monotonic()
            nxt = issued + 1

    def _gather(self, nxt: int) -> int:
        """The newest ticket, once ``gather_s`` passed since ticket ``nxt`` was seen: the others that read the
        same announcement ask within that moment, and one broadcast serves them all."""
        issued = self.store.add("tickets", 0)
        if issued >= nxt and self.gather_s > 0:
            self._stop.wait(self.gather_s)
            issued = self.store.add("tickets", 0)
        return issued

    def _batches(self, tickets) -> dict[str, list[int]]:
        """Tickets by the version they want ("<model>:<version>"), in ticket order; a malformed want fails alone."""
        out: dict[str, list[int]] = {}
        for n in tickets:
            try:
                self.store.wait([f"t{n}/want"], datetime.timedelta(seconds=10))  # set right after the ticket
                want = self.store.get(f"t{n}/want").decode()
            except RuntimeError as exc:
                self.failed += 1
                log.warning("weight stream transfer %d: no request (%s)", n, exc)
                continue
            model_name, _, version = want.rpartition(":")
            if not version.isdigit() or not model_name or "/" in model_name or model_name.startswith("."):
                self.failed += 1
                self._refuse(n, f"bad request {want!r}")
                continue
            out.setdefault(want, []).append(n)
        return out

    def _serve_batch(self, want: str, tickets: list[int]) -> None:
        model_name, _, version = want.rpartition(":")
        folder = wfs.version_dir(self.root, model_name, int(version))
        try:
            # opened up front: pruning may delete the folder mid-transfer, open files stay readable
            handles = [open(p, "rb") for p in wfs.version_files(folder)] if (folder / wfs.MANIFEST).is_file() else []  # noqa: SIM115 - closed after the transfer
        except FileNotFoundError:
            handles = []
        if not handles:
            for n in tickets:
                self._refuse(n, f"version {version} of {model_name!r} is no longer held (the newest {self.keep} are)")
            self.served += len(tickets)
            return
        try:
            members = self._accepted(tickets)
            if members:
                self._stream(members, handles)
                log.info("weights %s streamed to %d receiver(s) in one broadcast (transfers %s)", want, len(members),
                         members)
        finally:
            for f in handles:
                f.close()

    def _accepted(self, tickets: list[int]) -> list[int]:
        """The tickets whose receivers accept the offer within ``accept_s``; the rest are told they were dropped
        (a receiver that asked and left must not hold a whole group up to its timeout)."""
        for n in tickets:
            self.store.set(f"t{n}/offer", "1")
        waiting, members = set(tickets), []
        deadline = time.monotonic() + self.accept_s
        while waiting and time.monotonic() < deadline:
            for n in sorted(waiting):
                if self.store.check([f"t{n}/accept"]):
                    waiting.discard(n)
                    members.append(n)
            if waiting:
                time.sleep(0.01)
        for n in sorted(waiting):
            self.failed += 1
            self.store.set(f"t{n}/header", json.dumps({"error": f"no answer to the offer within {self.accept_s} s"}))
        return sorted(members)

    def _refuse(self, n: int, why: str) -> None:
        """Answer ticket ``n`` with an error (the header first: the receiver reads it as soon as the offer is there)."""
        self.store.set(f"t{n}/header", json.dumps({"error": why}))
        self.store.set(f"t{n}/offer", "1")

    def _stream(self, members: list[int], handles: list) -> None:
        import os

        files = [[Path(f.name).name, os.fstat(f.fileno()).st_size] for f in handles]
        peers = [self.store.get(f"t{n}/peer").decode() for n in members]
        backend = pick_backend(self.backend, self.gpu, peers)
        if backend != self.backend:
            log.info("transfers %s: gloo, a receiver %s", members,
                     "has no GPU" if not all(peers) else "shares a GPU with this server or another receiver")
        gid = f"g{members[0]}"
        for rank, n in enumerate(members, start=1):
            self.store.set(f"t{n}/header", json.dumps({"backend": backend, "files": files, "chunk": self.chunk_bytes,
                                                       "group": gid, "rank": rank, "world": len(members) + 1}))
        pg, device = _group(self.store, f"{gid}/pg/", 0, len(members) + 1, backend, self.timeout_s, self.host)
        try:
            for f, (_, size) in zip(handles, files):
                self._send_file(pg, device, f, size)
            self.store.wait([f"t{n}/done" for n in members], datetime.timedelta(seconds=self.timeout_s))
        finally:
            _close_group(pg)
        self.by_backend[backend] += len(members)
        self.served += len(members)
        self.groups.append(len(members))

    def _send_file(self, pg, device, f, size: int) -> None:
        import torch

        left = size
        while left > 0:
            k = min(self.chunk_bytes, left)
            buf = torch.frombuffer(bytearray(f.read(k)), dtype=torch.uint8)
            if buf.numel() != k:
                raise KernelRLError(f"{f.name} shrank while being streamed")
            _broadcast(pg, buf.to(device))
            left -= k


def served_root(cfg) -> str:
    """Where a learner (or ``weights push``) keeps the versions it streams."""
    from cluster.config import run_cache_path

    return cfg.learner.weight_fs_dir or str(run_cache_path(cfg, "weights-served"))


def server_from_config(cfg) -> WeightStreamServer:
    """The learner's server as configured (``close`` it with ``cfg.learner.weight_stream_drain_s``)."""
    lc = cfg.learner
    return WeightStreamServer(served_root(cfg), lc.weight_stream_host, lc.weight_stream_port,
                              lc.weight_stream_backend, lc.weight_stream_keep, lc.chunk_bytes,
                              gather_s=lc.weight_stream_gather_s)


# ---- receiving ----------------------------------------------------------------------------
def receive_stream(ann: WeightAnnouncement, tmp: Path, timeout_s: float) -> dict[str, str]:
    """Receive the announced version's files into ``tmp``; returns file name -> hash of what arrived (by the
    announcement's algorithm)."""
    import torch
    import torch.distributed as dist

    m = _URI.match(ann.uri)
    if not m:
        raise KernelRLError(f"weights v{ann.version}: bad nccl uri {ann.uri!r}")
    alg = wfs.announced_digest(ann)
    host = m["host"].strip("[]")
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = dist.TCPStore(host, int(m["port"]), None, False, timeout)
    except RuntimeError as exc:
        raise WeightsUnreachable(f"weights v{ann.version}: learner's weight server {host}:{m['port']} "
                                 f"unreachable ({exc})") from exc
    n = store.add("tickets", 1)
    store.set(f"t{n}/peer", gpu_uuid())  # before want: the server reads it once want is there
    store.set(f"t{n}/want", f"{ann.model_name}:{ann.version}")
    try:
        store.wait([f"t{n}/offer"], timeout)
        store.set(f"t{n}/accept", "1")
        store.wait([f"t{n}/header"], timeout)
    except RuntimeError as exc:  # busy with other transfers past our deadline, or gone
        raise WeightsUnreachable(f"weights v{ann.version}: the weight server did not answer ({exc})") from exc
    header = json.loads(store.get(f"t{n}/header"))
    if "error" in header:
        raise WeightsGone(f"weights v{ann.version}: {header['error']}")
    backend = header["backend"]
    if backend == "nccl" and not torch.cuda.is_available():  # the server only picks it when we said we have one
        raise KernelRLError(f"weights v{ann.version}: the weight server chose NCCL for a receiver without a GPU")
    pg, device = _group(store, f"{header['group']}/pg/", int(header["rank"]), int(header["world"]), backend,
                        timeout_s, _local_address(host, int(m["port"])))
    hashes: dict[str, str] = {}
    try:
        for name, size in header["files"]:
            if "/" in name or name.startswith(".") or name in hashes:
                raise KernelRLError(f"weights v{ann.version}: unexpected file {name!r}")
            h = digest.hasher(alg)
            with open(tmp / name, "wb") as f:
                left = int(size)
                while left > 0:
                    k = min(int(header["chunk"]), left)
                    buf = torch.empty(k, dtype=torch.uint8, device=device)
                    _broadcast(pg, buf)
                    data = buf.cpu().numpy().tobytes()
                    h.update(data)
                    f.write(data)
                    left -= k
            hashes[name] = h.hexdigest()
        store.set(f"t{n}/done", "1")
    finally:
        _close_group(pg)
    return hashes
