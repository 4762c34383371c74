"""Evaluator._artifact with a fetch from the compile workers (the bus stubbed): which source it takes, and when."""
from __future__ import annotations

import copy

from sandbox_workers import workspace
from tests.sandbox.helpers import relu_solution, relu_with_body


def _evaluator(sb_cfg, tmp_path, fetch):
    from sandbox_workers.evaluator import Evaluator

    other = copy.deepcopy(sb_cfg)  # another host: an empty artifact cache of its own
    other.sandbox.artifact_cache_dir = str(tmp_path / "eval-artifacts")
    return Evaluator(other, "cpu", fetch=fetch)


def _reply(**kw):
    from schemas.messages import CompileResult

    return CompileResult(request_id="r", episode_id="", worker="compile@test", **kw)


def test_fetched_artifact_is_kept_under_its_key_and_a_foreign_key_is_refused(sb_cfg, tmp_path):
    from sandbox_workers.compiler import compile_workspace

    files = workspace.validate(relu_solution(), "cpu")
    built = compile_workspace(files, "cpu", sb_cfg)
    asked = []

    def fetch(f, backend):
        asked.append(backend)
        return _reply(ok=True, artifact_key=built.key, artifact=built.library.read_bytes())

    ev = _evaluator(sb_cfg, tmp_path, fetch)
    lib, info = ev._artifact(files, b"", "")
    assert info["source"] == "compile_worker" and info["key"] == built.key and asked == ["cpu"]
    assert lib.read_bytes() == built.library.read_bytes()
    lib, info = ev._artifact(files, b"", "")  # now in its own cache: not asked again
    assert info["source"] == "cache" and asked == ["cpu"]

    # a reply under another key (another toolchain or flags) is refused: the worker builds the sources itself
    other = workspace.validate(relu_with_body("for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0 ? x[i] : 0;"), "cpu")
    ev2 = _evaluator(sb_cfg, tmp_path / "2", lambda f, b: _reply(ok=True, artifact_key=built.key, artifact=b"junk"))
    lib, info = ev2._artifact(other, b"", "")
    assert info["source"] == "local_build" and "refused" in info and lib is not None and lib.read_bytes() != b"junk"


def test_no_answer_builds_locally_and_a_reported_failure_is_the_policys(sb_cfg, tmp_path):
    from cluster.bus.rpc import RequestTimeout

    files = workspace.validate(relu_solution(), "cpu")

    def timeout(f, b):
        raise RequestTimeout("no reply")

    lib, info = _evaluator(sb_cfg, tmp_path / "t", timeout)._artifact(files, b"", "")
    assert lib is not None and info["source"] == "local_build" and "RequestTimeout" in info["fetch_error"]
    # the compile worker's own failure (fault infra) is no verdict: built here too
    lib, info = _evaluator(sb_cfg, tmp_path / "i", lambda f, b: _reply(ok=False, fault="infra", error="disk full")) \
        ._artifact(files, b"", "")
    assert lib is not None and info["source"] == "local_build" and "disk full" in info["fetch_error"]
    # its verdict on the sources is the policy's compile failure (nothing is built here)
    bad = _reply(ok=False, fault="policy", error="compilation failed", log="error: nonsense", violations=["x"])
    lib, info = _evaluator(sb_cfg, tmp_path / "p", lambda f, b: bad)._artifact(files, b"", "")
    assert lib is None and not info["ok"] and info["source"] == "compile_worker" and info["violations"] == ["x"]
