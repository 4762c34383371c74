"""`kernelrl sandbox eval` on the shipped CPU example: compiles, verifies, times, prints JSON."""
from __future__ import annotations

import json
import subprocess
import time

from tests.conftest import KERNELRL
from tests.sandbox.conftest import fast_sandbox
from tests.sandbox.helpers import ROOT

EXAMPLE = ROOT / "skills" / "examples" / "cpu_19_relu"


def _cli(sandbox_cache: str, *args: str) -> subprocess.CompletedProcess:
    sets = [a for k, v in fast_sandbox(sandbox_cache).items() for a in ("--set", f"sandbox.{k}={v}")]
    return subprocess.run([*KERNELRL, *sets, "sandbox", "eval", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=600)


def test_cli_on_shipped_cpu_example(sandbox_cache):
    r = _cli(sandbox_cache, "--task", str(EXAMPLE / "model.py"), "--solution", str(EXAMPLE), "--backend", "cpu",
             "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    for key in ("compiled", "correct", "reward", "speedup_vs_eager", "speedup_vs_compile", "violations", "error",
                "timings"):
        assert key in out
    assert out["compiled"] and out["correct"] and out["reward"] >= 1 and out["violations"] == [], out
    for variant in ("candidate", "eager", "compile"):
        t = out["timings"][variant]
        assert t["median_s"] > 0 and t["n"] >= 5 and t["stdev_s"] >= 0 and t["mean_s"] > 0
    assert out["speedup_vs_eager"] > 0 and out["speedup_vs_compile"] > 0


def test_cli_on_wrong_solution(sandbox_cache, tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "model_new.py").write_text((EXAMPLE / "model_new.py").read_text())
    (tmp_path / "kernels" / "relu.cpp").write_text((EXAMPLE / "kernels" / "relu.cpp").read_text()
                                                   .replace("v > 0.0f ? v : 0.0f", "v - 1.0f"))
    r = _cli(sandbox_cache, "--task", str(EXAMPLE / "model.py"), "--solution", str(tmp_path), "--mode", "verify",
             "--json")
    out = json.loads(r.stdout)
    assert r.returncode == 1 and out["compiled"] and not out["correct"] and out["reward"] == -1
    assert "mismatch" in out["error"]


def test_cli_input_errors_are_one_line_not_tracebacks(sandbox_cache, tmp_path):
    bad = tmp_path / "model.py"
    bad.write_text("class Model(nn.Module:\n    pass\n")
    cases = {("--task", str(bad), "--solution", str(EXAMPLE)): "not valid Python (line 1",
             ("--task", str(tmp_path / "none.py"), "--solution", str(EXAMPLE)): "no such file",
             ("--task", str(EXAMPLE / "model.py"), "--solution", str(tmp_path / "nope")): "no such folder"}
    for args, words in cases.items():
        r = _cli(sandbox_cache, *args, "--backend", "cpu")
        assert r.returncode == 2 and words in r.stderr and "Traceback" not in r.stderr, (args, r.stderr[-2000:])


def test_up_with_a_missing_or_broken_task_folder_is_one_line(tmp_path):
    r = subprocess.run([*KERNELRL, "up", "--tasks", str(tmp_path / "nope")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "--tasks" in r.stderr and "no such folder" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "1_Ok.py").write_text((EXAMPLE / "model.py").read_text())
    (tmp_path / "tasks" / "2_Broken.py").write_text("class Model(nn.Module:\n    pass\n\ndef get_inputs():\n    pass\n")
    t0 = time.monotonic()
    r = subprocess.run([*KERNELRL, "up", "--tasks", str(tmp_path / "tasks")], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 2 and "2_Broken.py" in r.stderr and "not valid Python (line 1" in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr and time.monotonic() - t0 < 60  # refused before any broker or role starts
