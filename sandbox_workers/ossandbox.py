"""Run one untrusted command in an OS sandbox (bubblewrap): own user, mounts, PIDs, no network; fail closed.

A sandboxed command (``wrap``/``spawn``) gets: a mount namespace whose root is an
empty tmpfs holding only ``system_ro_binds`` (/usr, /lib*, /bin, a few /etc files,
the Python installs of sys.prefix/sys.base_prefix, the CUDA home; read-only) and
the profile's binds; a private size-capped /tmp; a fresh /proc, a minimal /dev
(+ /dev/nvidia*, /dev/dri and /sys for ``gpu``); its own PID (bwrap's init is
PID 1: when the command ends or the outer bwrap dies, everything left inside dies,
setsid()/double-forked processes included), IPC, UTS and (unless ``network``)
network namespaces; rlimits set by prlimit inside: RLIMIT_DATA for ``memory_mb``/
``data_mb`` (unlike RLIMIT_AS it does not break CUDA), CPU, FSIZE, NOFILE, NPROC
(when set), CORE=0. The ``candidate`` profile (``toolchain=False``) sees no
compiler, assembler, linker, ninja, nvcc/ptxas/cicc (/dev/null bound over each)
and no numpy (``import numpy`` raises ModuleNotFoundError; torch works without).

Kill the *process group* of the outer bwrap (isolation.py does): bwrap 0.8 arms
its init's parent-death signal only after setup, so a SIGKILL to the outer pid
alone in its first ~20 ms leaves the sandbox running.

Who runs it: **as root** (the workers' case) bwrap runs privileged *without* a user
namespace and ``setpriv`` drops to the system user ``krlsandbox`` (made once by
``useradd --system``; no groups, no capabilities, empty bounding set, no new
privileges) right before exec; read-write binds must be writable by that user
(``prepare_dir`` chowns a host tree to it). **As any other user**: bwrap
``--unshare-user --disable-userns`` maps the current user; nothing to prepare.

``mode("bwrap")`` raises IsolationUnavailable with the fix when bwrap cannot run
here; ``mode("none")`` (``sandbox.isolation = "none"``) is for trusted code only.
"""
from __future__ import annotations

import atexit
import functools
import glob
import logging
import os
import pwd
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
import threading
from dataclasses import dataclass, field

from sandbox_workers import jobs
from sandbox_workers.toolchain import cuda_home

log = logging.getLogger(__name__)

SANDBOX_USER = "krlsandbox"
MODES = ("bwrap", "none")
FIX = ("fix: install bubblewrap (apt-get install -y bubblewrap), allow namespaces (as a non-root user: "
       "sysctl -w kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in a container: "
       "run it with namespaces allowed), or set sandbox.isolation = \"none\" for trusted code only")

# /etc files a sandboxed python/torch/g++ needs; never shadow/gshadow/sudoers or credentials.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf",
        "localtime", "timezone", "hosts", "host.conf", "os-release", "mime.types")
_ETC_NET = ("resolv.conf", "ssl", "ca-certificates", "ca-certificates.conf", "gai.conf", "services", "protocols")
# Hidden in the candidate profile (toolchain=False): compilers, assemblers, linkers, build tools.
_TOOLS = {"gcc", "g++", "cc", "c++", "cpp", "as", "ld", "ld.bfd", "ld.gold", "ld.lld", "lld", "ninja", "make",
          "nvcc", "cicc", "ptxas", "nvlink", "fatbinary", "clang", "clang++", "tcc", "cc1", "cc1plus", "collect2",
          "lto1", "lto-wrapper", "cudafe++", "nvdisasm", "cuobjdump"}
_STUB = 'raise ModuleNotFoundError("numpy is not available in the candidate sandbox", name="numpy")\n'
_TOOL_PREFIXES = ("gcc-", "g++-", "cpp-", "clang-", "clang++-")


class IsolationUnavailable(RuntimeError):
    """The OS sandbox cannot run here; the message says why and how to fix it."""

    retriable = False
    user_facing = True


@dataclass
class Profile:
    """What one sandboxed command may see and do."""

    name: str  # "candidate" | "judge" | "build" | "shell"
    ro_binds: list[tuple[str, str]] = field(default_factory=list)  # (host path, path inside)
    rw_binds: list[tuple[str, str]] = field(default_factory=list)
    chdir: str = "/"  # inside path
    tmp_mb: int = 256  # private /tmp (tmpfs, --size)
    network: bool = False
    gpu: bool = False  # bind /dev/nvidia* (+ /dev/dri if present), /sys and driver libs
    toolchain: bool = False  # compilers visible: True for "build"/"shell", False for "candidate"


# ----------------------------------------------------------------------------- availability
def _bwrap() -> str | None:
    return shutil.which("bwrap")


_USER_LOCK = threading.Lock()


def sandbox_ids() -> tuple[int, int] | None:
    """(uid, gid) the sandboxed command runs as when we are root (the user is created once); None otherwise."""
    if os.geteuid() != 0:
        return None
    with _USER_LOCK:
        try:
            pw = pwd.getpwnam(SANDBOX_USER)
        except KeyError:
            useradd = shutil.which("useradd") or "/usr/sbin/useradd"
            r = subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                                SANDBOX_USER], capture_output=True, text=True, timeout=60, check=False)
            try:  # exit 9: created meanwhile by another worker
                pw = pwd.getpwnam(SANDBOX_USER)
            except KeyError:
                raise IsolationUnavailable(f"cannot create the sandbox user {SANDBOX_USER!r}: "
                                           f"{(r.stderr or r.stdout).strip() or r.returncode}") from None
            log.info("created the sandbox user %s (uid %d)", SANDBOX_USER, pw.pw_uid)
    if pw.pw_uid == 0:
        raise IsolationUnavailable(f"the sandbox user {SANDBOX_USER!r} has uid 0")
    return pw.pw_uid, pw.pw_gid


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str) -> str:
    """'' when a trivial sandboxed command runs through `bwrap`, else why not."""
    try:
        ids = sandbox_ids()
        if ids is not None and not shutil.which("setpriv"):
            return "setpriv (util-linux) is missing"
        cmd = wrap(["true"], Profile("probe"), jobs.Limits(wall_s=30), {"PATH": "/usr/bin:/bin"})
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except IsolationUnavailable as exc:
        return str(exc)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"cannot run {bwrap}: {exc}"
    if r.returncode != 0:
        return f"{bwrap} failed (exit {r.returncode}): {(r.stderr or r.stdout).strip()[-400:]}"
    return ""


def mode(cfg_isolation: str) -> str:
    """'bwrap' or 'none'; raises IsolationUnavailable when bwrap is asked for (the default) but cannot run."""
    m = (cfg_isolation or "bwrap").strip().lower()
    if m not in MODES:
        raise IsolationUnavailable(f"sandbox.isolation: {cfg_isolation!r} is not one of {list(MODES)}")
    if m == "none":
        return m
    bwrap = _bwrap()
    if not bwrap:
        raise IsolationUnavailable(f"OS sandbox unavailable: bubblewrap (bwrap) is not installed; {FIX}")
    why = _probe(bwrap)
    if why:
        raise IsolationUnavailable(f"OS sandbox unavailable: {why}; {FIX}")
    return m


def require(cfg) -> str:
    """A worker's start-up check: the configured isolation works, else IsolationUnavailable (fail closed)."""
    m = mode(getattr(cfg.sandbox, "isolation", "bwrap"))
    if m == "none":
        log.warning("sandbox.isolation = none: untrusted code runs WITHOUT the OS sandbox (trusted code only)")
    return m


def prepare_dir(path) -> None:
    """Make a host directory tree writable by the sandbox user (chown to it when we are root; no-op otherwise)."""
    ids = sandbox_ids()
    if ids is None:
        return
    uid, gid = ids
    for root, dirs, files in os.walk(path):  # never follows symlinks; lchown never either
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                continue
            if (st.st_uid, st.st_gid) == (uid, gid):
                continue
            if st.st_nlink > 1 and not os.path.isdir(name):
                log.warning("prepare_dir: not chowning %s (hard-linked)", name)  # could be a link to a host file
                continue
            os.lchown(name, uid, gid)


# ----------------------------------------------------------------------------- what is visible
def _python_roots() -> list[str]:
    """The venv and the install it links to (e.g. /root/.pyenv/versions/X: that dir only), as named and real."""
    exe_root = os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))
    cands = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, exe_root]
    roots = [os.path.abspath(p) for p in cands] + [os.path.realpath(p) for p in cands]
    return [p for p in dict.fromkeys(roots) if p not in ("/usr", "/usr/local", "/")]


def _cuda_home() -> str | None:
    home = cuda_home()
    return str(home) if home is not None else None


@functools.lru_cache(maxsize=1)
def _base_binds() -> tuple[tuple[str, str], ...]:
    binds = [(p, p) for p in ("/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin") if os.path.lexists(p)]
    binds += [(f"/etc/{n}", f"/etc/{n}") for n in _ETC if os.path.exists(f"/etc/{n}")]
    binds += [(p, p) for p in _python_roots()]
    home = _cuda_home()
    for p in ([home, os.path.realpath(home)] if home else []) + ["/usr/local/nvidia"]:
        if os.path.isdir(p) and not _covered(p, [d for _, d in binds]):
            binds.append((p, p))
    return tuple(binds)


def _covered(path: str, dests) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in dests)


def _site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    for scheme_base in {sys.base_prefix, sys.prefix}:
        dirs.append(sysconfig.get_path("purelib", vars={"base": scheme_base, "platbase": scheme_base}))
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    dirs += ["/usr/lib/python3/dist-packages", f"/usr/local/lib/{ver}/dist-packages"]
    return [d for d in dict.fromkeys(os.path.realpath(d) for d in dirs) if os.path.isdir(d)]


def _tool_dirs() -> list[str]:
    dirs = ["/usr/bin", "/usr/local/bin", "/usr/sbin", os.path.join(sys.prefix, "bin"),
            os.path.join(sys.base_prefix, "bin")]
    dirs += glob.glob("/usr/lib/gcc/*/*") + glob.glob("/usr/libexec/gcc/*/*") + glob.glob("/usr/local/cuda*/bin")
    dirs += glob.glob("/usr/local/cuda*/nvvm/bin")
    for sp in _site_dirs():
        dirs += [os.path.join(sp, "triton", "backends", "nvidia", "bin"), os.path.join(sp, "ninja", "data", "bin")]
        dirs += glob.glob(os.path.join(sp, "nvidia", "*", "bin")) + glob.glob(os.path.join(sp, "nvidia", "*", "nvvm", "bin"))
    home = _cuda_home()
    if home:
        dirs += [os.path.join(home, "bin"), os.path.join(home, "nvvm", "bin")]
    return [d for d in dict.fromkeys(dirs) if os.path.isdir(d)]


def _is_tool(name: str) -> bool:
    if "-linux-gnu-" in name:  # x86_64-linux-gnu-gcc-12, aarch64-linux-gnu-ld.bfd, ...
        name = name.split("-linux-gnu-", 1)[1]
    return name in _TOOLS or name.startswith(_TOOL_PREFIXES)


def _stub_dir() -> str:
    """<tmp>/krl-sandbox-stub-<uid>: numpy/__init__.py raising ModuleNotFoundError, and empty/ (kept, shared).

    Checked on every use (a tmp cleaner may remove it; someone else may have made it): remade when missing,
    a private per-process one when the shared one is not ours.
    """
    stable = os.path.join(tempfile.gettempdir(), f"krl-sandbox-stub-{os.geteuid()}")
    if _stub_ok(stable):
        return stable
    d = tempfile.mkdtemp(prefix="krl-sandbox-stub-")
    for sub in ("numpy", "empty"):
        os.mkdir(os.path.join(d, sub), 0o755)
    with open(os.path.join(d, "numpy", "__init__.py"), "w") as f:
        f.write(_STUB)
    for p, m in ((d, 0o755), (f"{d}/numpy", 0o755), (f"{d}/empty", 0o755), (f"{d}/numpy/__init__.py", 0o644)):
        os.chmod(p, m)  # whatever the umask: the sandbox user reads it
    try:
        os.rename(d, stable)  # atomic; fails when another process made it first
    except OSError:
        pass
    if _stub_ok(stable):
        shutil.rmtree(d, ignore_errors=True)
        return stable
    atexit.register(shutil.rmtree, d, True)
    return d


def _stub_ok(d: str) -> bool:
    try:
        for p in (d, f"{d}/numpy", f"{d}/empty", f"{d}/numpy/__init__.py"):
            st = os.lstat(p)
            if st.st_uid != os.geteuid() or st.st_mode & 0o022 or not st.st_mode & 0o004 or os.path.islink(p):
                return False
        with open(f"{d}/numpy/__init__.py") as f:
            return f.read() == _STUB and not os.listdir(f"{d}/empty")
    except OSError:
        return False


@functools.lru_cache(maxsize=1)
def _hidden() -> tuple[tuple[str, str], ...]:
    """(what, path): ("tool", a compiler's real path) and ("numpy"|"empty", numpy's dirs), all visible ones."""
    visible = [d for _, d in _base_binds()]
    found: dict[str, str] = {}
    for d in _tool_dirs():
        for name in sorted(os.listdir(d)):
            real = os.path.realpath(os.path.join(d, name))
            if _is_tool(name) and os.path.isfile(real) and _covered(real, visible):
                found.setdefault(real, "tool")
    for sp in (sp for sp in _site_dirs() if _covered(sp, visible)):
        for sub, what in (("numpy", "numpy"), ("numpy.libs", "empty")):
            if os.path.isdir(os.path.join(sp, sub)):
                found[os.path.join(sp, sub)] = what
    return tuple((what, path) for path, what in found.items())


def _hide_binds() -> list[tuple[str, str]]:
    """(source, inside) binds that hide the toolchain (/dev/null over it) and numpy (a stub over it)."""
    stub = _stub_dir() if any(what != "tool" for what, _ in _hidden()) else ""
    return [("/dev/null" if what == "tool" else os.path.join(stub, what), path) for what, path in _hidden()]


def system_ro_binds(toolchain: bool) -> list[tuple[str, str]]:
    """What a sandboxed python/torch (and, with toolchain, g++/nvcc/ninja) needs, read-only.

    Without the toolchain the list ends with binds of /dev/null over every compiler and of a stub over numpy.
    """
    return list(_base_binds()) + ([] if toolchain else _hide_binds())


# ----------------------------------------------------------------------------- command line
def _limit_args(limits) -> list[str]:
    mb = 1 << 20
    data = getattr(limits, "data_mb", 0) or limits.memory_mb  # RLIMIT_DATA, never RLIMIT_AS (CUDA)
    values = [("data", data * mb), ("cpu", limits.cpu_s), ("fsize", limits.file_size_mb * mb),
              ("nofile", getattr(limits, "open_files", 0)),
              ("nproc", limits.max_procs)]  # per-user: as root, every process of the sandbox user counts
    return [shutil.which("prlimit") or "prlimit", "--core=0", *(f"--{k}={int(v)}" for k, v in values if v), "--"]


class _Mounts:
    """bwrap mount arguments; parent dirs made 0755 (bwrap's own are 0700, unreadable for the sandbox user)."""

    def __init__(self):
        self.args: list[str] = []
        self.mounted: list[str] = []
        self.made: set[str] = {"/", "/proc", "/dev"}

    def _parents(self, dest: str) -> None:
        parts = dest.strip("/").split("/")[:-1]
        for i in range(1, len(parts) + 1):
            p = "/" + "/".join(parts[:i])
            if p not in self.made and not _covered(p, self.mounted):
                self.args += ["--perms", "0755", "--dir", p]
            self.made.add(p)

    def add(self, kind: str, src: str, dest: str) -> None:
        dest = os.path.normpath(dest)
        if kind.startswith("--ro-bind") and src == dest and os.path.islink(src) and dest.count("/") == 1:
            self.args += ["--symlink", os.readlink(src), dest]  # merged-/usr links: /lib -> usr/lib
            self.made.add(dest)
            return
        self._parents(dest)
        self.args += [kind, src, dest]
        self.mounted.append(dest)

    def tmpfs(self, dest: str, size_mb: int) -> None:
        self._parents(dest)
        self.args += ["--perms", "1777", "--size", str(int(size_mb) << 20), "--tmpfs", dest]
        self.made.add(dest)  # writable: parents of later binds below it are made inside it


def wrap(argv: list[str], profile: Profile, limits, env: dict) -> list[str]:
    """The full command line that runs argv inside the sandbox described by profile and limits."""
    bwrap = _bwrap()
    if not bwrap:
        raise IsolationUnavailable(f"OS sandbox unavailable: bubblewrap (bwrap) is not installed; {FIX}")
    ids = sandbox_ids()
    cmd = [bwrap, "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid", "--unshare-uts",
           "--unshare-cgroup-try", "--hostname", "krl"]
    if ids is None:  # unprivileged: a user namespace maps us; no capabilities, no nested namespaces
        cmd += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    if not profile.network:
        cmd.append("--unshare-net")
    m = _Mounts()
    # the private /tmp and /dev first: a checkout or venv that lives under /tmp is bound on top of them
    m.args += ["--proc", "/proc", "--dev", "/dev"]
    m.tmpfs("/tmp", profile.tmp_mb)
    m.tmpfs("/dev/shm", min(profile.tmp_mb, 64))
    for src, dest in _base_binds():
        m.add("--ro-bind-try", src, dest)
    if profile.network:
        for n in _ETC_NET:
            if os.path.exists(f"/etc/{n}"):
                m.add("--ro-bind", f"/etc/{n}", f"/etc/{n}")
    if profile.gpu:
        for dev in sorted(glob.glob("/dev/nvidia*")) + (["/dev/dri"] if os.path.exists("/dev/dri") else []):
            m.add("--dev-bind", dev, dev)
        m.add("--ro-bind", "/sys", "/sys")
    else:
        for p in ("/sys/devices/system/cpu", "/sys/devices/system/node"):
            if os.path.isdir(p):
                m.add("--ro-bind", p, p)
    for src, dest in profile.rw_binds:
        m.add("--bind", src, dest)
    for src, dest in profile.ro_binds:  # after rw: may make part of a writable tree read-only
        m.add("--ro-bind", src, dest)
    if not profile.toolchain:
        for src, dest in _hide_binds():
            m.add("--ro-bind", src, dest)
    cmd += m.args
    env = dict(env)
    tmpdir = env.get("TMPDIR", "")
    if not tmpdir or not _covered(tmpdir, ["/tmp"] + [d for _, d in profile.rw_binds]):
        env["TMPDIR"] = "/tmp"
    cmd.append("--clearenv")
    for k, v in env.items():
        cmd += ["--setenv", str(k), str(v)]
    cmd += ["--chdir", profile.chdir, "--"]
    cmd += _limit_args(limits)
    if ids is not None:
        uid, gid = ids
        cmd += [shutil.which("setpriv") or "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--inh-caps=-all",
                "--bounding-set=-all", "--no-new-privs", "--"]
    return cmd + [str(a) for a in argv]


def spawn(argv, profile: Profile, limits, env: dict, *, pass_fds=(), stdin=None, stdout=None, stderr=None,
          cwd=None) -> subprocess.Popen:
    """Start argv sandboxed in a new session, registered so that jobs.abort_all() kills it.

    End it with os.killpg(proc.pid, SIGKILL) (everything inside dies); call jobs.untrack(proc) once
    it has been waited for. `pass_fds` stay open inside, at the same numbers.
    """
    cmd = wrap(argv, profile, limits, env)
    proc = subprocess.Popen(cmd, stdin=stdin, stdout=stdout, stderr=stderr, cwd=cwd or "/",
                            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}, pass_fds=tuple(pass_fds),
                            start_new_session=True)
    jobs.track(proc)
    return proc
