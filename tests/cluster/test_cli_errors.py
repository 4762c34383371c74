"""A broker address that does not answer ends a command with one line that says so, not a traceback."""
from __future__ import annotations

import os
import subprocess

from tests.conftest import KERNELRL


def test_unreachable_broker_is_one_line_for_commands_and_workers():
    env = {**os.environ, "KRL__BUS__BOOTSTRAP_SERVERS": "127.0.0.1:1"}  # nothing listens there
    procs = {cmd: subprocess.Popen([*KERNELRL, *cmd.split()], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for cmd in ("topics describe", "compile-worker")}
    for cmd, p in procs.items():
        out, err = p.communicate(timeout=180)
        assert p.returncode == 1, (cmd, err[-2000:])
        assert "Traceback" not in err and "cannot reach Kafka at 127.0.0.1:1" in err, (cmd, err[-2000:])
