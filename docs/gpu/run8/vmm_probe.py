"""Feasibility of a device-resident arena between the trusted side and a sandboxed candidate (issue 12).

Legacy CUDA IPC handles do not cross PID namespaces; this probes the VMM route instead: the trusted
side (this process, host namespaces) allocates device memory with cuMemCreate exportable as a POSIX
file descriptor, passes the fd over a socketpair (SCM_RIGHTS) to a candidate started by the real
OS sandbox (bubblewrap, its own PID namespace, the candidate profile with the GPU), which imports
and maps it, installs the real seccomp filter, and writes a pattern with torch; the trusted side
then copies the region device-to-device into its own memory and checks it, and times that copy.

usage: python3 vmm_probe.py OUT_JSON [MB]     (inside: python3 vmm_probe.py --child FD MB)
"""
import ctypes
import json
import os
import socket
import subprocess
import sys
import time

CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class Prop(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


def cu():
    lib = ctypes.CDLL("libcuda.so.1")
    return lib


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} failed: CUresult {rc}")


def prop(dev=0):
    p = Prop()
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    p.location = Location(CU_MEM_LOCATION_TYPE_DEVICE, dev)
    return p


def map_handle(lib, handle, size, dev=0):
    ptr = ctypes.c_uint64()
    check(lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_uint64(0),
                                  ctypes.c_uint64(0)), "cuMemAddressReserve")
    check(lib.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), handle, ctypes.c_uint64(0)), "cuMemMap")
    desc = AccessDesc(Location(CU_MEM_LOCATION_TYPE_DEVICE, dev), CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    check(lib.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(desc), ctypes.c_size_t(1)), "cuMemSetAccess")
    return ptr.value


def as_tensor(ptr, nbytes):
    """A uint8 CUDA tensor over mapped memory (torch's own storage-from-pointer; no numpy in the sandbox)."""
    import torch

    storage = torch._C._construct_storage_from_data_pointer(ptr, torch.device("cuda", 0), nbytes)
    return torch.empty(0, dtype=torch.uint8, device="cuda").set_(storage)


def child(sock_fd: int, mb: int) -> None:
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    s = socket.socket(fileno=sock_fd)
    msg, fds, _, _ = socket.recv_fds(s, 1024, 1)
    info = json.loads(msg)
    lib = cu()
    handle = ctypes.c_uint64()
    check(lib.cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fds[0]),
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "cuMemImportFromShareableHandle")
    ptr = map_handle(lib, handle, info["size"])
    view = as_tensor(ptr, mb << 20)
    seccomp_ok = ""
    try:
        sys.path.insert(0, "/krl")
        from sandbox_workers.candidate import seccomp

        seccomp.install(allow_exec=False)
        seccomp_ok = "installed"
    except Exception as exc:  # noqa: BLE001 - report, the probe goes on
        seccomp_ok = f"failed: {exc}"
    src = torch.arange(mb << 20, device="cuda", dtype=torch.int64).remainder(251).to(torch.uint8)
    view.copy_(src)
    torch.cuda.synchronize()
    s.send(json.dumps({"ok": True, "seccomp": seccomp_ok, "pid": os.getpid(),
                       "pidns": os.readlink("/proc/self/ns/pid")}).encode())
    s.recv(16)  # wait until the parent has read it


def parent(out: str, mb: int) -> dict:
    import torch

    sys.path.insert(0, os.getcwd())
    from sandbox_workers import ossandbox
    from sandbox_workers.isolation import Limits, sandbox_env

    torch.cuda.init()
    torch.empty(1, device="cuda")
    lib = cu()
    p = prop()
    gran = ctypes.c_size_t()
    check(lib.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(p), 0), "granularity")
    size = ((mb << 20) + gran.value - 1) // gran.value * gran.value
    handle = ctypes.c_uint64()
    check(lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(p), ctypes.c_uint64(0)),
          "cuMemCreate")
    fd = ctypes.c_int(-1)
    check(lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                           ctypes.c_uint64(0)), "cuMemExportToShareableHandle")
    ptr = map_handle(lib, handle, size)
    mine = as_tensor(ptr, mb << 20)
    mine.zero_()
    torch.cuda.synchronize()
    a, b = socket.socketpair()
    here = os.path.dirname(os.path.abspath(__file__))
    prof = ossandbox.Profile(name="candidate", gpu=True, chdir="/exp",
                             ro_binds=[(here, "/exp"), (os.path.join(os.getcwd(), "sandbox_workers"),
                                                        "/krl/sandbox_workers")])
    env = sandbox_env({"PYTHONUNBUFFERED": "1", "PYTORCH_NVML_BASED_CUDA_CHECK": "1"}, home="/tmp")
    log = open(os.path.join(os.path.dirname(out), "vmm_child.log"), "wb")  # noqa: SIM115 - the child writes it
    proc = ossandbox.spawn([sys.executable, "/exp/vmm_probe.py", "--child", str(b.fileno()), str(mb)], prof,
                           Limits(wall_s=0), env, pass_fds=(b.fileno(),), stdout=log, stderr=subprocess.STDOUT)
    b.close()
    t0 = time.monotonic()
    socket.send_fds(a, [json.dumps({"size": size}).encode()], [fd.value])
    a.settimeout(120)
    reply = json.loads(a.recv(4096))
    got_after = time.monotonic() - t0
    snap = torch.empty(mb << 20, dtype=torch.uint8, device="cuda")
    times = []
    for _ in range(20):
        torch.cuda.synchronize()
        t = time.perf_counter()
        snap.copy_(mine)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    want = torch.arange(mb << 20, device="cuda", dtype=torch.int64).remainder(251).to(torch.uint8)
    ok = bool(torch.equal(snap, want))
    a.send(b"bye")
    proc.wait(timeout=60)
    times.sort()
    res = {"mb": mb, "granularity": gran.value, "child": reply, "parent_pidns": os.readlink("/proc/self/ns/pid"),
           "data_ok": ok, "child_rc": proc.returncode, "handshake_s": round(got_after, 3),
           "d2d_snapshot_ms_min": round(times[0] * 1e3, 4), "d2d_snapshot_ms_med": round(times[len(times) // 2] * 1e3, 4),
           "d2d_gb_s": round((mb << 20) / times[len(times) // 2] / 1e9, 1)}
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    if sys.argv[1] == "--child":
        child(int(sys.argv[2]), int(sys.argv[3]))
    else:
        print(json.dumps(parent(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 64), indent=1))
