"""Install a seccomp-bpf filter in this process: no new processes, exec, ptrace, sockets or namespaces.

Self-contained (ctypes only, no project imports): it runs inside the sandboxed
candidate after start-up. ``install()`` sets PR_SET_NO_NEW_PRIVS and installs a
classic BPF program with SECCOMP_FILTER_FLAG_TSYNC, so threads that already run
(torch's and OpenMP's pools) get it too. Denied calls fail with EPERM (clone3 with
ENOSYS, so glibc falls back to clone, which is then checked): fork, vfork, clone
without CLONE_THREAD (threads keep working), execve/execveat (unless allow_exec),
ptrace, process_vm_readv/writev, sockets, mounts, namespaces, bpf, perf, keyrings,
userfaultfd, io_uring (its requests bypass seccomp), kernel modules, kexec,
iopl/ioperm, personality, file handles. A system call of another ABI (i386 via
int 0x80, x32) kills the process. Supported: x86_64 and aarch64.

Install it after CUDA is initialised: cuInit opens a listening AF_UNIX socket
(socket+bind+listen; seen on an H200 with driver 580), so a filter installed
first makes torch.cuda fail with "Error 304: OS call failed". Once initialised,
CUDA work (allocations, kernels, new threads) runs under the filter.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform

log = logging.getLogger(__name__)

# classic BPF opcodes
_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K

_RET_KILL_PROCESS = 0x80000000
_RET_ERRNO = 0x00050000
_RET_ALLOW = 0x7FFF0000

_OFF_NR, _OFF_ARCH, _OFF_ARG0 = 0, 4, 16  # struct seccomp_data; arg0's low 32 bits (little endian)
_CLONE_THREAD = 0x00010000
_X32_BIT = 0x40000000

_PR_SET_NO_NEW_PRIVS = 38
_SECCOMP_SET_MODE_FILTER = 1
_SECCOMP_FILTER_FLAG_TSYNC = 1

# name -> number per architecture; audit arch value, seccomp(2) number
_ARCHES = {
    "x86_64": {
        "audit": 0xC000003E, "seccomp": 317, "clone": 56, "clone3": 435, "execve": 59, "execveat": 322,
        "deny": {
            "fork": 57, "vfork": 58, "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311,
            "socket": 41, "socketpair": 53, "connect": 42, "bind": 49, "listen": 50, "accept": 43, "accept4": 288,
            "mount": 165, "umount2": 166, "unshare": 272, "setns": 308, "pivot_root": 155, "chroot": 161,
            "bpf": 321, "perf_event_open": 298, "keyctl": 250, "add_key": 248, "request_key": 249,
            "userfaultfd": 323, "kexec_load": 246, "kexec_file_load": 320, "init_module": 175,
            "finit_module": 313, "delete_module": 176, "iopl": 172, "ioperm": 173, "personality": 135,
            "open_by_handle_at": 304, "name_to_handle_at": 303, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431,
            "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        },
    },
    "aarch64": {  # the generic table: no fork/vfork/iopl/ioperm
        "audit": 0xC00000B7, "seccomp": 277, "clone": 220, "clone3": 435, "execve": 221, "execveat": 281,
        "deny": {
            "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "socket": 198, "socketpair": 199,
            "bind": 200, "listen": 201, "accept": 202, "connect": 203, "accept4": 242, "mount": 40,
            "umount2": 39, "unshare": 97, "setns": 268, "pivot_root": 41, "chroot": 51, "bpf": 280,
            "perf_event_open": 241, "keyctl": 219, "add_key": 217, "request_key": 218, "userfaultfd": 282,
            "kexec_load": 104, "kexec_file_load": 294, "init_module": 105, "finit_module": 273,
            "delete_module": 106, "personality": 92, "open_by_handle_at": 265, "name_to_handle_at": 264,
            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
            "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
            "mount_setattr": 442,
        },
    },
}


class SeccompError(RuntimeError):
    """The filter could not be installed (the message says which step failed)."""


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def program(allow_exec: bool = False, arch: str | None = None) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions for `arch` (default: this machine's)."""
    arch = arch or _arch()
    if arch not in _ARCHES:
        raise SeccompError(f"seccomp: unsupported architecture {arch!r} (supported: {', '.join(_ARCHES)})")
    a = _ARCHES[arch]
    eperm, enosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 1, 0, a["audit"]),  # another ABI (i386, arm32): kill
        (_RET_K, 0, 0, _RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if arch == "x86_64":
        prog += [(_JGE_K, 0, 1, _X32_BIT), (_RET_K, 0, 0, _RET_KILL_PROCESS)]  # x32 ABI: kill
    prog += [
        (_JEQ_K, 0, 4, a["clone"]),  # clone: a thread (CLONE_THREAD) is fine, a new process is not
        (_LD_W_ABS, 0, 0, _OFF_ARG0),
        (_JSET_K, 0, 1, _CLONE_THREAD),
        (_RET_K, 0, 0, _RET_ALLOW),
        (_RET_K, 0, 0, eperm),
        (_JEQ_K, 0, 1, a["clone3"]),  # its flags live in a struct seccomp cannot read: glibc falls back to clone
        (_RET_K, 0, 0, enosys),
    ]
    denied = sorted(set(a["deny"].values()) | (set() if allow_exec else {a["execve"], a["execveat"]}))
    for nr in denied:
        prog += [(_JEQ_K, 0, 1, nr), (_RET_K, 0, 0, eperm)]
    prog.append((_RET_K, 0, 0, _RET_ALLOW))
    return prog


def install(allow_exec: bool = False) -> None:
    """Install the filter on every thread of this process (irreversible). Raises SeccompError on failure."""
    arch = _arch()
    prog = program(allow_exec, arch)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SeccompError(f"seccomp: prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(err)}")
    filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
    fprog = _SockFprog(len(prog), ctypes.cast(filters, ctypes.POINTER(_SockFilter)))
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(_ARCHES[arch]["seccomp"]), ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                      ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(fprog))
    if rc != 0:
        if rc > 0:  # TSYNC: the id of a thread that could not be synchronised
            raise SeccompError(f"seccomp: thread {rc} could not take the filter (TSYNC)")
        err = ctypes.get_errno()
        raise SeccompError(f"seccomp: installing the filter failed: {os.strerror(err)} "
                           "(kernel without CONFIG_SECCOMP_FILTER?)")
    log.debug("seccomp filter installed (%d instructions, exec %s)", len(prog), "allowed" if allow_exec else "denied")


def installed() -> bool:
    """True when this process runs under a seccomp filter (/proc/self/status Seccomp: 2)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Seccomp:"):
                    return line.split()[1] == "2"
    except OSError:
        return False
    return False
