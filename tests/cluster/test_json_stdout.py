"""`--json` prints JSON only on stdout: library prints, C-level writes to fd 1 and children's output go to
stderr while the command runs, and the command's document is the one thing on stdout."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import KERNELRL, cfg_env

NOISY = r"""
import os, subprocess, sys
from cluster.json_stdout import emit, json_only
with json_only(True):
    print("a library's print")
    os.write(1, b"a write to fd 1\n")
    subprocess.run(["echo", "a child's stdout"], check=True)
    emit({"ok": 1})
print("after: stdout is stdout again")
"""


def test_everything_but_the_document_goes_to_stderr():
    p = subprocess.run([sys.executable, "-c", NOISY], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout == '{"ok": 1}\nafter: stdout is stdout again\n', p.stdout
    for line in ("a library's print", "a write to fd 1", "a child's stdout"):
        assert line in p.stderr


@pytest.mark.parametrize("argv", [["config", "--json"], ["-v", "broker", "status", "--json"],
                                  ["-v", "topics", "describe", "--json"],
                                  ["-v", "bench", "bus", "--requests", "20", "--json"],
                                  ["-v", "bench", "learner", "--steps", "1", "--json"]],
                         ids=lambda a: " ".join(a))
def test_real_commands_print_one_json_document(cfg, argv):
    """`bench learner` is the command that printed DeepSpeed's op-build line before its JSON."""
    p = subprocess.run(KERNELRL + argv, env=cfg_env(cfg), capture_output=True, text=True, timeout=600)
    ok = (0, 3) if "status" in argv else (0,)  # status: 3 = this state dir runs no broker (the suite's is external)
    assert p.returncode in ok, p.stderr[-3000:]
    json.loads(p.stdout)  # the whole of stdout is one JSON document
