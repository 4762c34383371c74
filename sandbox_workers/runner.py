"""The evaluation child: `python -m sandbox_workers.runner` reads a JSON spec on stdin.

Two modes, each in its own fresh process started by evaluator.py inside the sandbox:
- ``reference``: runs the task's Model on inputs from distinct seeds, saves weights,
  inputs and expected outputs for the candidate, and times eager and torch.compile;
- ``candidate``: loads that data (never the reference Model itself), binds the
  built kernels, imports model_new.py under the run-time guards, checks
  correctness, aliasing, mutation and caching, then times it with the same protocol.
The result is written as JSON to the spec's ``result_path``.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback


def _write(path: str, result: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def _err(exc: BaseException, limit: int = 2500) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text if len(text) <= limit else "...\n" + text[-limit:]


def main() -> int:
    return run_spec(json.loads(sys.stdin.read()))


def run_spec(spec: dict) -> int:
    """Run one spec and write its result file; the return value is the exit code."""
    result_path = spec["result_path"]
    t0 = time.monotonic()
    try:
        if spec["mode"] == "reference":
            from sandbox_workers.runner_reference import run_reference
            result = run_reference(spec)
        else:
            from sandbox_workers.runner_candidate import run_candidate
            result = run_candidate(spec)
    except BaseException as exc:  # noqa: BLE001 - report whatever ended the run, then exit non-zero
        result = {"ok": False, "error": _err(exc)}
        result["wall_s"] = time.monotonic() - t0
        _write(result_path, result)
        return 1
    result["wall_s"] = time.monotonic() - t0
    _write(result_path, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
