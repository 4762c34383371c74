"""Pure logic: tool-call parsing, single-turn extraction, out-of-order offset commits."""
from __future__ import annotations

from dataclasses import dataclass

from actors import tool_specs
from actors.extract import extract_files
from actors.offsets import OffsetTracker
from actors.toolcall import MAX_CALLS_PER_TURN, parse


def test_parse_good_calls_and_tolerated_variants():
    p = parse('a <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call> b '
              '<tool_call>\n```json\n{"name": "read", "arguments": "{\\"path\\": \\"x\\"}"}\n```\n</tool_call>',
              tool_specs.NAMES)
    assert not p.malformed
    assert [(c.name, c.arguments) for c in p.calls] == [("bash", {"command": "ls"}), ("read", {"path": "x"})]


def test_parse_malformed_calls_are_errors_not_exceptions():
    cases = {
        "<tool_call>not json</tool_call>": "not valid JSON",
        "<tool_call>[1, 2]</tool_call>": "must be a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': 'needs a string "name"',
        '<tool_call>{"name": "bash", "arguments": 3}</tool_call>': "must be an object",
        '<tool_call>{"name": "bash", "arguments": "{bad"}</tool_call>': "string that is not JSON",
        '<tool_call>{"name": "nope"}</tool_call>': "unknown tool",
        '<tool_call>{"name": "bash"': "unterminated",
        'x</tool_call>': "without a matching",
        "<tool_call></tool_call>": "empty",
    }
    for text, needle in cases.items():
        p = parse(text, tool_specs.NAMES)
        assert p.malformed and not p.calls and needle in p.errors[0], (text, p.errors)
    many = '<tool_call>{"name": "glob", "arguments": {"pattern": "*"}}</tool_call>' * (MAX_CALLS_PER_TURN + 2)
    p = parse(many, tool_specs.NAMES)
    assert len(p.calls) == MAX_CALLS_PER_TURN and p.malformed
    assert parse("plain prose", tool_specs.NAMES).calls == [] and not parse("plain", None).malformed


def test_extract_single_turn_files():
    text = ('Here it is.\n```python model_new.py\nclass ModelNew: pass\n```\n'
            '### kernels/relu.cpp\n```cpp\nint x;\n```\n'
            '<file path="kernels/k.h">#pragma once\n</file>\n```cpp ../evil.cpp\nbad\n```')
    files = extract_files(text)
    assert files == {"model_new.py": "class ModelNew: pass\n", "kernels/relu.cpp": "int x;\n",
                     "kernels/k.h": "#pragma once\n"}
    assert extract_files("```python\nimport torch\nclass ModelNew(nn.Module): pass\n```") == {
        "model_new.py": "import torch\nclass ModelNew(nn.Module): pass\n"}
    assert extract_files("no code at all") == {}


@dataclass
class Rec:
    topic: str
    partition: int
    offset: int


def test_offsets_commit_only_contiguous_finished_prefix():
    t = OffsetTracker()
    recs = [Rec("tasks", 0, o) for o in (5, 6, 7)] + [Rec("tasks", 1, 0)]
    for r in recs:
        t.delivered(r)
    assert t.done(recs[1]) is None  # offset 6 finished before 5: nothing may be committed yet
    assert t.done(recs[3]) is recs[3]  # other partition is independent
    assert t.done(recs[0]) is recs[1]  # 5 done -> commit through 6
    assert t.done(recs[2]) is recs[2] and t.pending() == 0


def test_episode_reward_final_or_best():
    from actors.tools_remote import EvalRecord, episode_reward
    from schemas.messages import EvaluateResult

    def rec(mode, reward, rid):
        return EvalRecord(mode, f"d{rid}", EvaluateResult(request_id=rid, episode_id="e", task_id="t", compiled=True,
                                                          correct=reward > 0, reward=reward))

    evals = [rec("both", 3.0, "a"), rec("verify", 1.0, "b"), rec("both", 1.0, "c"), rec("verify", -1.0, "d")]
    assert episode_reward(evals, "final")[0] == -1.0 and episode_reward(evals, "final")[1]["request_id"] == "d"
    r, ev = episode_reward(evals, "best")
    assert r == 3.0 and ev["request_id"] == "a" and ev["evaluations"] == 4
    assert episode_reward([], "best")[0] == -1.0
