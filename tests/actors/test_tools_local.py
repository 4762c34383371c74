"""Local tools: confinement to the workspace, deadline, no network, truncation, edits."""
from __future__ import annotations

import time

import pytest

from actors.tools_local import LocalTools


@pytest.fixture
def tools(tmp_path):
    (tmp_path / "model.py").write_text("class Model: pass\n")
    return LocalTools(tmp_path, protected={"model.py", "utils/"}, bash_timeout_s=2.0, max_output_chars=300)


def call(aloop, tools, name, **args):
    return aloop.run(tools.call(name, args))


def test_bash_runs_in_the_workspace_without_network(aloop, tools, tmp_path):
    r = call(aloop, tools, "bash", command="pwd; echo $HOME")
    assert r.ok and r.output.splitlines()[:2] == [str(tmp_path.resolve())] * 2
    probe = ("python3 -c \"import socket; s=socket.socket(); s.settimeout(2); print(s.connect_ex(('1.1.1.1', 53)))\";"
             " tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    net = call(aloop, tools, "bash", command=probe)
    lines = net.output.splitlines()
    # no route out, and the only network interface is loopback
    assert lines[0] != "0" and lines[1] == "lo" and lines[2].startswith("[exit"), net.output


def test_bash_deadline_kills_the_whole_process_group(aloop, tools, tmp_path):
    t0 = time.monotonic()
    r = call(aloop, tools, "bash", command="(sleep 30; touch late.txt) & sleep 30")
    assert not r.ok and "timed out after 2 s" in r.output
    assert time.monotonic() - t0 < 10
    time.sleep(0.5)
    assert not (tmp_path / "late.txt").exists()
    r = call(aloop, tools, "bash", command="exit 3")
    assert not r.ok and "[exit code 3]" in r.output


def test_bash_output_is_truncated(aloop, tools):
    r = call(aloop, tools, "bash", command="python3 -c \"print('x' * 5000)\"")
    assert "characters truncated" in r.output and len(r.output) < 500


def test_file_tools_refuse_escapes_and_protected_files(aloop, tools, tmp_path):
    assert "outside the workspace" in call(aloop, tools, "read", path="../../etc/passwd").output
    assert "outside the workspace" in call(aloop, tools, "write", path="/tmp/evil.txt", content="x").output
    (tmp_path / "link").symlink_to("/etc")
    assert "outside the workspace" in call(aloop, tools, "read", path="link/passwd").output
    assert "read-only" in call(aloop, tools, "write", path="model.py", content="x").output
    assert "read-only" in call(aloop, tools, "write", path="utils/x.py", content="x").output
    assert (tmp_path / "model.py").read_text() == "class Model: pass\n"
    assert "bad arguments" in call(aloop, tools, "write", path="a.py").output  # missing content


def test_write_edit_multi_edit_glob_grep_todo(aloop, tools, tmp_path):
    assert call(aloop, tools, "write", path="kernels/a.cpp", content="int a = 1;\nint b = 1;\n").ok
    r = call(aloop, tools, "edit", path="kernels/a.cpp", old_string="= 1", new_string="= 2")
    assert not r.ok and "occurs 2 times" in r.output
    assert call(aloop, tools, "edit", path="kernels/a.cpp", old_string="a = 1", new_string="a = 5").ok
    r = call(aloop, tools, "multi_edit", path="kernels/a.cpp",
             edits=[{"old_string": "b = 1", "new_string": "b = 6"}, {"old_string": "zzz", "new_string": "q"}])
    assert not r.ok and "no edit applied" in r.output
    assert (tmp_path / "kernels/a.cpp").read_text() == "int a = 5;\nint b = 1;\n"
    assert call(aloop, tools, "multi_edit", path="kernels/a.cpp", edits=[
        {"old_string": "b = 1", "new_string": "b = 6"}, {"old_string": "int", "new_string": "long",
                                                         "replace_all": True}]).ok
    assert (tmp_path / "kernels/a.cpp").read_text() == "long a = 5;\nlong b = 6;\n"
    assert call(aloop, tools, "glob", pattern="kernels/*.cpp").output == "kernels/a.cpp"
    assert call(aloop, tools, "grep", pattern=r"b = \d", path="kernels").output == "kernels/a.cpp:2:long b = 6;"
    assert "bad regex" in call(aloop, tools, "grep", pattern="(").output
    r = call(aloop, tools, "todo_write", todos=[{"content": "fuse", "status": "pending"}])
    assert r.ok and tools.todos == [{"content": "fuse", "status": "pending"}]
    r = call(aloop, tools, "read", path="kernels/a.cpp", offset=1, limit=1)
    assert r.output == "     2\tlong b = 6;"
