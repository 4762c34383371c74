"""Demonstrations: a task's solution folder is loaded with the task and replayed in the form the episode
mode reads back (pure logic; the replay through the real oracle runs in test_learning.py)."""
from __future__ import annotations

from pathlib import Path

from actors import tool_specs, toolcall
from actors.demos import multi_turn_script, script_for, single_turn_answer
from actors.extract import extract_files
from cluster.launch.feeder import load_task_files

TASKS = Path(__file__).parent / "tasks"


def test_task_folder_carries_its_solution_as_a_demonstration():
    (task,) = load_task_files(TASKS)  # relu.solution/model_new.py is a solution file, not a task
    demo = task.metadata["demonstration"]
    assert sorted(demo) == ["kernels/relu.cpp", "model_new.py"]
    assert "KRL_OP(relu_f32" in demo["kernels/relu.cpp"] and "class ModelNew" in demo["model_new.py"]


def test_single_turn_answer_extracts_back_to_the_same_files():
    (task,) = load_task_files(TASKS)
    files = task.metadata["demonstration"]
    assert extract_files(single_turn_answer(files)) == files
    assert script_for(task, "single_turn") == [single_turn_answer(files)]


def test_multi_turn_script_writes_each_file_then_compiles_verifies_finishes():
    (task,) = load_task_files(TASKS)
    files = task.metadata["demonstration"]
    turns = multi_turn_script(files)
    calls = [toolcall.parse(t, tool_specs.NAMES) for t in turns]
    assert not any(c.malformed or c.errors for c in calls)
    writes = {c.arguments["path"]: c.arguments["content"] for c in calls[0].calls}
    assert writes == files
    assert [c.calls[0].name for c in calls[1:]] == ["compile", "verify", "finish"]


def test_tasks_without_a_solution_have_no_demonstration(tmp_path):
    (tmp_path / "t.py").write_text((TASKS / "relu.py").read_text())
    (task,) = load_task_files(tmp_path)
    assert "demonstration" not in task.metadata and script_for(task, "single_turn") is None
