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


def test_bad_input_to_replay_and_weights_is_one_line_before_the_broker_is_asked(tmp_path):
    """Malformed options and missing folders exit 2 with a line naming the argument, at once: the broker
    address is one nothing listens on, so a command that asked it first would fail differently (rc 1)."""
    env = {**os.environ, "KRL__BUS__BOOTSTRAP_SERVERS": "127.0.0.1:1"}
    (tmp_path / "empty").mkdir()
    cases = {"replay --from-offset abc --to-dir OUT": "offset 'abc'",
             "replay --from-offset 0:-3 --to-dir OUT": "offset '0:-3'",
             "replay --since yesterday --to-dir OUT": "time 'yesterday'",
             "weights push --path /nonexistent": "--path '/nonexistent': a checkpoint folder is required",
             f"weights push --path {tmp_path / 'empty'}": "holds no *.safetensors file"}
    for cmd, words in cases.items():
        p = subprocess.run([*KERNELRL, *cmd.replace("OUT", str(tmp_path / "out")).split()], env=env,
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 2, (cmd, p.stderr[-2000:])
        assert "Traceback" not in p.stderr and words in p.stderr, (cmd, p.stderr[-2000:])
        assert "cannot reach Kafka" not in p.stderr, cmd
