"""Task folders: import a KernelBench checkout, list, and publish schemas.Task messages to the tasks topic."""
from __future__ import annotations

import time

import pytest

from cluster.tasks.dataset import DatasetError, import_dir, load_tasks
from cluster.tasks.decontam import default_eval_dir
from cluster.cli import build_parser


def test_import_kernelbench_level1(tmp_path):
    out = tmp_path / "kb"
    entries = import_dir(default_eval_dir(), out, backend="cuda", levels=[1])
    assert len(entries) == 100
    loaded = load_tasks(out)
    assert len(loaded) == 100 and {e.level for e in loaded} == {1} and {e.backend for e in loaded} == {"cuda"}
    assert len({e.task_id for e in loaded}) == 100
    relu = next(e for e in loaded if e.name == "ReLU")
    assert relu.model_py == (default_eval_dir() / "level1" / "19_ReLU.py").read_text()
    with pytest.raises(DatasetError):
        load_tasks(out, backend="cpu")


def test_unindexed_folder_is_scanned_with_levels():
    entries = load_tasks(default_eval_dir(), default_backend="cuda")
    assert len(entries) == 200 and {e.level for e in entries} == {1, 2}


def test_publish_feeds_the_tasks_topic(cfg, tmp_path):
    from actors.cmd_tasks import run
    from cluster.bus.client import Bus
    from schemas import topics
    from schemas.messages import Task

    folder = tmp_path / "kb"
    import_dir(default_eval_dir(), folder, backend="cuda", levels=[2])
    args = build_parser().parse_args(["tasks", "publish", "--dir", str(folder), "--backend", "cuda", "--limit", "5"])
    assert run(args, cfg) == 0
    want = {e.task_id: e for e in load_tasks(folder)[:5]}
    got = {}
    cons = Bus(cfg, client_id="test-tasks").consumer([topics.TASKS], group_id="test-tasks")
    deadline = time.monotonic() + 30
    try:
        while len(got) < 5 and time.monotonic() < deadline:
            for rec in cons.poll(timeout_s=0.5):
                assert isinstance(rec.msg, Task) and rec.key in (rec.msg.task_id, rec.msg.task_id.encode())
                got[rec.msg.task_id] = rec.msg
    finally:
        cons.close()
    assert set(got) == set(want)
    for tid, msg in got.items():
        assert msg.model_py == want[tid].model_py and msg.level == 2 and msg.backend == "cuda"


def test_synthesize_writes_filtered_decontaminated_tasks(tmp_path):
    from cluster.cli import main

    out = tmp_path / "synth"
    rc = main(["tasks", "synthesize", "--n", "3", "--backend", "cpu", "--out", str(out), "--seed", "5",
               "--mix", "1:1,2:1,3:1", "--min-ms", "0", "--max-ms", "500", "--no-compile-check",
               "--max-candidates", "30"])
    assert rc == 0
    entries = load_tasks(out, backend="cpu")
    assert len(entries) == 3 and len({e.name for e in entries}) == 3
    for e in entries:
        assert (out / e.file).read_text() == e.model_py
        assert e.level == (1 if e.metadata["n_ops"] == 1 else 2)
        assert e.metadata["decontam"]["max_similarity"] <= 0.9
        assert e.metadata["filter"]["eager_ms"] > 0 and e.metadata["filter"]["compiled"] is False
        assert e.to_message().model_py == e.model_py


def test_verify_reruns_the_filter_on_a_folder(tmp_path, capsys):
    from cluster.cli import main

    out = tmp_path / "synth"
    assert main(["tasks", "synthesize", "--n", "2", "--backend", "cpu", "--out", str(out), "--seed", "9",
                 "--mix", "2:1", "--min-ms", "0", "--max-ms", "500", "--no-compile-check", "--eval-set", ""]) == 0
    capsys.readouterr()
    assert main(["tasks", "verify", "--dir", str(out), "--backend", "cpu", "--min-ms", "0", "--max-ms", "500",
                 "--no-compile-check"]) == 0
    assert "2/2 tasks pass the filter on cpu" in capsys.readouterr().out
    # a window no task can meet: every task is rejected and the command fails
    assert main(["tasks", "verify", "--dir", str(out), "--backend", "cpu", "--min-ms", "400", "--max-ms", "500",
                 "--no-compile-check"]) == 1
    assert "REJECT runtime_window" in capsys.readouterr().out


def test_verify_write_marks_rejected_tasks_and_loaders_leave_them_out(tmp_path, capsys):
    """A task rejected on the real device (e.g. too fast on the GPU) stays in the index, marked; training skips it."""
    from cluster.tasks.dataset import DatasetError, load_tasks
    from cluster.cli import main

    out = tmp_path / "synth"
    assert main(["tasks", "synthesize", "--n", "2", "--backend", "cpu", "--out", str(out), "--seed", "9",
                 "--mix", "2:1", "--min-ms", "0", "--max-ms", "500", "--no-compile-check", "--eval-set", ""]) == 0
    ids = sorted(e.task_id for e in load_tasks(out, backend="cpu"))
    window = ["--backend", "cpu", "--no-compile-check", "--write"]
    assert main(["tasks", "verify", "--dir", str(out), "--min-ms", "400", "--max-ms", "500", *window]) == 1
    rows = load_tasks(out, backend="cpu", include_rejected=True)
    assert sorted(e.task_id for e in rows) == ids  # nothing dropped from the index
    for e in rows:
        assert e.metadata["rejected"]["rule"] == "runtime_window" and e.metadata["runtime_verified"] is False
    with pytest.raises(DatasetError, match="2 rejected by `tasks verify` are left out"):
        load_tasks(out, backend="cpu")
    capsys.readouterr()
    assert main(["tasks", "list", "--dir", str(out)]) == 0
    assert capsys.readouterr().out.count("REJECTED on cpu: runtime_window") == 2
    # a later run that passes restores them, with the runtime measured
    assert main(["tasks", "verify", "--dir", str(out), "--min-ms", "0", "--max-ms", "500", *window]) == 0
    back = load_tasks(out, backend="cpu")
    assert sorted(e.task_id for e in back) == ids
    assert all("rejected" not in e.metadata and e.metadata["runtime_verified"] and
               e.metadata["filter"]["backend"] == "cpu" for e in back)
