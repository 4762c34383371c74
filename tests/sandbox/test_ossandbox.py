"""The OS sandbox (bubblewrap + seccomp) with real processes: what a sandboxed command can see and do."""
from __future__ import annotations

import asyncio
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from sandbox_workers import ossandbox
from sandbox_workers.candidate import seccomp
from sandbox_workers.isolation import Limits, run_sandboxed

REPO = Path(__file__).resolve().parents[2]
SECCOMP_PY = Path(seccomp.__file__).resolve()
ENV = {"PATH": f"{sys.prefix}/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "OMP_NUM_THREADS": "2"}

try:
    ossandbox.mode("bwrap")
    _WHY = ""
except ossandbox.IsolationUnavailable as exc:
    _WHY = str(exc)
pytestmark = pytest.mark.skipif(bool(_WHY), reason=f"bubblewrap cannot run here: {_WHY}")


def run_in(profile, code: str, limits: Limits | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    cmd = ossandbox.wrap([sys.executable, "-c", code], profile, limits or Limits(wall_s=60), ENV)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)


def candidate(ws: Path | None = None, **kw) -> ossandbox.Profile:
    rw = [(str(ws), str(ws))] if ws else []
    if ws:
        ossandbox.prepare_dir(ws)
    return ossandbox.Profile("candidate", rw_binds=rw, chdir=str(ws) if ws else "/", **kw)


def expected_uid() -> int:
    return pwd.getpwnam(ossandbox.SANDBOX_USER).pw_uid if os.geteuid() == 0 else os.getuid()


def host_pids_with(marker: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{d}/cmdline").read_bytes():
                    pids.append(int(d))
            except OSError:
                pass
    return pids


def wait_for(pred, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_candidate_sees_only_its_binds_and_runs_as_the_sandbox_user(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    code = f"""
import os
for p in ["/etc/shadow", "/etc/gshadow", "/root/.cache", {os.path.expanduser('~/.cache')!r}, {str(REPO / 'README.md')!r},
          {str(REPO / 'sandbox_workers')!r}, {str(tmp_path / 'outside.txt')!r}]:
    print("VISIBLE" if os.path.exists(p) else "hidden", p)
print("uid", os.getuid(), os.geteuid(), os.getgroups())
print("repo", sorted(os.listdir({str(REPO)!r})) if os.path.isdir({str(REPO)!r}) else "-")
open("made.txt", "w").write("hi")
print("cwd", os.getcwd())
"""
    (tmp_path / "outside.txt").write_text("secret")
    r = run_in(candidate(ws), code)
    assert r.returncode == 0, r.stderr
    assert "VISIBLE" not in r.stdout, r.stdout
    uid = expected_uid()
    assert f"uid {uid} {uid} []" in r.stdout
    if os.geteuid() == 0:
        assert uid != 0
    # the repository shows at most the bound venv, never its files
    repo_line = next(ln for ln in r.stdout.splitlines() if ln.startswith("repo"))
    assert "README.md" not in repo_line and "sandbox_workers" not in repo_line
    assert f"cwd {ws}" in r.stdout
    assert (ws / "made.txt").read_text() == "hi" and (ws / "made.txt").stat().st_uid == uid


def test_no_network_even_to_a_host_listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    srv.settimeout(0.5)
    port = srv.getsockname()[1]
    code = f"""
import socket
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3); print("CONNECTED")
except OSError as e:
    print("NONET", e.errno)
print(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").read().splitlines()[2:]))
"""
    try:
        r = run_in(candidate(), code)
        assert "NONET" in r.stdout and "['lo']" in r.stdout, r.stdout + r.stderr
        with pytest.raises(socket.timeout):
            srv.accept()
    finally:
        srv.close()


def test_nothing_outlives_the_job_setsid_double_fork(tmp_path):
    marker = f"{time.time() % 1000:.6f}{uuid.uuid4().int % 10**6}"
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "300", "{marker[:4]}" + "{marker[4:]}"])  # only the sleeper's argv has it
    os._exit(0)
time.sleep(3)
"""
    p = subprocess.Popen(ossandbox.wrap([sys.executable, "-c", code], candidate(), Limits(wall_s=60), ENV),
                         start_new_session=True)
    try:
        assert wait_for(lambda: host_pids_with(marker)), "the sleeper never started"
        assert p.wait(timeout=60) == 0
        assert wait_for(lambda: not host_pids_with(marker), 10), "a detached sleeper survived the job"
    finally:
        p.kill()


def test_sigkill_of_the_outer_bwrap_kills_everything_inside():
    marker = f"{uuid.uuid4().int % 10**9}.5"
    code = f"""
import os, time
if os.fork() == 0:
    os.setsid()
    os.execvp("sleep", ["sleep", "{marker[:4]}" + "{marker[4:]}"])
time.sleep(300)
"""
    p = ossandbox.spawn([sys.executable, "-c", code], candidate(), Limits(wall_s=60), ENV)
    try:
        assert wait_for(lambda: host_pids_with(marker))
        os.kill(p.pid, signal.SIGKILL)  # only the outer bwrap, not its process group
        p.wait(timeout=10)
        assert wait_for(lambda: not host_pids_with(marker), 10), "processes survived the killed sandbox"
    finally:
        p.kill()
        from sandbox_workers import isolation
        isolation.untrack(p)


def test_private_capped_tmp(tmp_path):
    name = f"krl-private-{uuid.uuid4().hex}"
    code = f"""
import os
open("/tmp/{name}", "w").write("x")
print("wrote", os.path.exists("/tmp/{name}"))
try:
    with open("/tmp/big", "wb") as f:
        for _ in range(32):
            f.write(b"\\0" * (1 << 20))
            f.flush()
    print("NOCAP")
except OSError as e:
    print("CAPPED", e.errno)
"""
    r = run_in(candidate(tmp_mb=8), code)
    assert "wrote True" in r.stdout and "CAPPED 28" in r.stdout, r.stdout + r.stderr  # ENOSPC
    assert not os.path.exists(f"/tmp/{name}")


def test_rlimit_data_holds():
    code = """
import resource
print("limit", resource.getrlimit(resource.RLIMIT_DATA)[0] >> 20)
small = bytearray(64 << 20)
try:
    big = bytearray(1 << 30); print("ALLOCATED")
except MemoryError:
    print("MEMORYERROR")
"""
    r = run_in(candidate(), code, Limits(wall_s=60, data_mb=256))
    assert "limit 256" in r.stdout and "MEMORYERROR" in r.stdout, r.stdout + r.stderr


def test_compilers_and_numpy_absent_in_candidate_present_in_build(tmp_path):
    (tmp_path / "a.c").write_text("int main(void) { return 7; }\n")
    code = """
import subprocess
for tool in ("gcc", "g++", "cc", "c++", "as", "ld", "ninja"):
    try:
        r = subprocess.run([tool, "--version"], capture_output=True)
        print(tool, "RUNS" if r.returncode == 0 else f"fails {r.returncode}")
    except OSError as e:
        print(tool, "fails", e.errno)
try:
    import numpy
    print("numpy", numpy.__version__)
except ImportError as e:
    print("numpy MISSING", type(e).__name__)
try:
    r = subprocess.run(["gcc", "a.c", "-o", "a.out"], capture_output=True)
    print("compiled", r.returncode == 0 and subprocess.run(["./a.out"]).returncode == 7)
except OSError:
    print("compiled False")
"""
    r = run_in(candidate(tmp_path), code)
    assert "RUNS" not in r.stdout and "numpy MISSING ModuleNotFoundError" in r.stdout, r.stdout + r.stderr
    assert "compiled False" in r.stdout
    build = ossandbox.Profile("build", rw_binds=[(str(tmp_path), str(tmp_path))], chdir=str(tmp_path), toolchain=True)
    r = run_in(build, code)
    for tool in ("gcc", "g++", "as", "ld", "ninja"):
        assert f"{tool} RUNS" in r.stdout, r.stdout + r.stderr
    assert "numpy 2" in r.stdout or "numpy 1" in r.stdout
    assert "compiled True" in r.stdout, r.stdout + r.stderr


def test_pass_fds_pipe_between_two_sandboxes():
    r_fd, w_fd = os.pipe()
    msg = uuid.uuid4().hex
    writer = ossandbox.spawn([sys.executable, "-c", f"import os; os.write({w_fd}, b'{msg}'); os.close({w_fd})"],
                             candidate(), Limits(wall_s=30), ENV, pass_fds=(w_fd,))
    reader = ossandbox.spawn([sys.executable, "-c", f"import os; print(os.read({r_fd}, 100).decode())"],
                             candidate(), Limits(wall_s=30), ENV, pass_fds=(r_fd,), stdout=subprocess.PIPE)
    os.close(r_fd)
    os.close(w_fd)
    out, _ = reader.communicate(timeout=60)
    assert writer.wait(timeout=60) == 0 and reader.returncode == 0
    assert out.decode().strip() == msg


SECCOMP_CODE = """
import os, socket, subprocess, sys, threading
sys.path.insert(0, "/opt/krl")
import torch
import seccomp
torch.set_num_threads(2)
x = torch.randn(256, 256)
ref = (x @ x).sum().item()                      # an OpenMP pool exists before the filter
seccomp.install()
print("installed", seccomp.installed())
def probe(name, fn):
    try:
        fn(); print(name, "ALLOWED")
    except OSError as e:
        print(name, "denied", e.errno)
probe("fork", os.fork)
probe("subprocess", lambda: subprocess.run(["true"]))
probe("socket", socket.socket)
probe("socketpair", socket.socketpair)
probe("execv", lambda: os.execv("/bin/true", ["true"]))
box = []
t = threading.Thread(target=lambda: box.append(threading.get_ident())); t.start(); t.join()
print("thread", len(box))
torch.set_num_threads(2)
y = torch.randn(512, 512)
print("matmul", abs((x @ x).sum().item() - ref) < 1e-3 * max(1, abs(ref)), torch.get_num_threads())
tasks = os.listdir("/proc/self/task")
print("tasks", len(tasks), all("Seccomp:\\t2" in open(f"/proc/self/task/{t}/status").read() for t in tasks))
"""


def test_seccomp_denies_processes_exec_and_sockets_but_not_threads():
    prof = candidate(ro_binds=[(str(SECCOMP_PY), "/opt/krl/seccomp.py")])
    r = run_in(prof, SECCOMP_CODE, Limits(wall_s=120, data_mb=8192))
    out = r.stdout
    assert r.returncode == 0, out + r.stderr
    assert "installed True" in out
    for name in ("fork", "subprocess", "socket", "socketpair", "execv"):
        assert f"{name} denied 1" in out, out  # EPERM
    assert "thread 1" in out and "matmul True 2" in out, out
    line = next(ln for ln in out.splitlines() if ln.startswith("tasks"))
    assert line.endswith("True") and int(line.split()[1]) >= 2, line  # every thread, pre-existing ones too


def test_seccomp_allow_exec_and_unknown_arch():
    code = ("import os, sys; sys.path.insert(0, '/opt/krl'); import seccomp; seccomp.install(allow_exec=True); "
            "os.execv('/bin/echo', ['echo', 'EXECED'])")
    r = run_in(candidate(ro_binds=[(str(SECCOMP_PY), "/opt/krl/seccomp.py")]), code)
    assert "EXECED" in r.stdout, r.stderr
    with pytest.raises(seccomp.SeccompError, match="unsupported architecture"):
        seccomp.program(arch="riscv64")
    assert len(seccomp.program(arch="aarch64")) > 20 and not seccomp.installed()


def test_agent_shell_sees_only_its_workspace(tmp_path):
    from actors.tools_local import LocalTools

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "model.py").write_text("class Model: pass\n")
    tools = LocalTools(ws, bash_timeout_s=30.0, max_output_chars=4000)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    cmd = (f"cat /etc/shadow; cat {REPO}/README.md; ls /root/.cache; ls {tmp_path}; id -u; "
           f"python3 -c \"import socket; print('NET', socket.socket().connect_ex(('127.0.0.1', {port})))\"; "
           "echo hi > /tmp/t && cat /tmp/t; echo x > made.txt; cat model.py")
    try:
        r = asyncio.run(tools.call("bash", {"command": cmd}))
    finally:
        srv.close()
    out = r.output
    assert "root:" not in out and "kernelrl" not in out, out
    assert "No such file" in out
    assert f"{expected_uid()}\n" in out
    assert "NET 0" not in out and "NET " in out, out
    assert "hi\n" in out and "class Model" in out and (ws / "made.txt").read_text() == "x\n"


def test_run_sandboxed_with_a_profile_is_isolated_and_killed_on_deadline(tmp_path):
    prof = ossandbox.Profile("build", toolchain=True)
    ossandbox.prepare_dir(tmp_path)
    prof.rw_binds.append((str(tmp_path), str(tmp_path)))
    r = run_sandboxed(["sh", "-c", "id -u; pwd; cat /etc/shadow"], cwd=str(tmp_path), limits=Limits(wall_s=30),
                      env={"PATH": "/usr/bin:/bin"}, profile=prof)
    assert r.network_isolated and r.stdout.split() == [str(expected_uid()), str(tmp_path)], r
    t0 = time.monotonic()
    r = run_sandboxed(["sleep", "30"], cwd=str(tmp_path), limits=Limits(wall_s=1), env={}, profile=prof)
    assert r.timed_out and time.monotonic() - t0 < 10
    r = run_sandboxed(["sh", "-c", "kill -SEGV $$"], cwd=str(tmp_path), limits=Limits(wall_s=10), env={},
                      profile=prof)
    assert r.signal == "SIGSEGV", r


def test_mode_fails_closed_without_bwrap(monkeypatch):
    from cluster.config import ConfigError, Config, load

    assert ossandbox.mode("none") == "none"
    cfg = Config()
    cfg.sandbox.isolation = "none"
    assert ossandbox.require(cfg) == "none"
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ossandbox.IsolationUnavailable) as ei:
        ossandbox.mode("bwrap")
    msg = str(ei.value)
    assert "apt-get install -y bubblewrap" in msg and 'sandbox.isolation = "none"' in msg
    with pytest.raises(ossandbox.IsolationUnavailable):
        ossandbox.require(Config())
    with pytest.raises(ConfigError, match="sandbox.isolation"):
        load(None, ["sandbox.isolation=chroot"])
