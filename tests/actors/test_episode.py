"""Episodes without the bus: token-exact streams, malformed calls, turn and context caps."""
from __future__ import annotations

import json

import numpy as np

from actors.agent import EpisodeLimits
from actors.policy import ScriptedPolicy
from actors.toolcall import format_call

from .helpers import make_episode, relu_task


def _call(name, **args):
    return format_call(name, args)


def _spans(traj):
    """(generated spans, observation spans) of the flat stream, from the turn boundaries."""
    gens = [(t.gen_start, t.gen_end) for t in traj.turns]
    obs = [(a[1], b[0]) for a, b in zip(gens, gens[1:])]
    return gens, obs


def test_scripted_episode_builds_an_exact_token_stream(aloop, tokenizer, tmp_path):
    script = [
        "Let me look. " + _call("bash", command="echo hi > note.txt && cat note.txt"),
        _call("read", path="note.txt") + _call("write", path="model.py", content="x"),
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>',  # malformed JSON
        _call("read", path="note.txt"),  # repeats turn 2's first call
        "done " + _call("finish", summary="ok"),
    ]
    policy = ScriptedPolicy(tokenizer, script)
    ep = make_episode(policy, relu_task(), tmp_path, EpisodeLimits(max_turns=10, max_context_tokens=8192))
    traj = aloop.run(ep.run())

    assert traj.end_reason == "finish" and len(traj.turns) == 5
    assert traj.has_logprobs is False and not traj.logprobs.any()
    assert traj.reward == -1.0 and "no evaluation" in traj.evidence["error"]  # no model_new.py written
    # the stream: prompt, then exactly the ids the policy produced, then observations (mask 0)
    gens, obs = _spans(traj)
    assert gens[0][0] == traj.prompt_len
    eos = tokenizer.eos_token_id
    for (a, b), text in zip(gens, script):
        assert traj.token_ids[a:b].tolist() == tokenizer.encode(text, add_special_tokens=False) + [eos]
        assert traj.loss_mask[a:b].all() and (traj.policy_version[a:b] == 0).all()
    masked = np.ones(len(traj.token_ids), bool)
    for a, b in gens:
        masked[a:b] = False
    assert not traj.loss_mask[masked].any() and (traj.policy_version[masked] == -1).all()
    obs_text = [tokenizer.decode(traj.token_ids[a:b].tolist()) for a, b in obs]
    assert "hi" in obs_text[0] and "[exit code 0]" in obs_text[0]
    assert "model.py is read-only" in obs_text[1] and "     1\thi" in obs_text[1]
    assert "malformed tool call" in obs_text[2] and "not valid JSON" in obs_text[2]
    assert obs_text[0].startswith("\n<|im_start|>user\n<tool_response>")  # the template's own glue
    assert [t.malformed_tool_call for t in traj.turns] == [False, False, True, False, False]
    assert [t.repeated_action for t in traj.turns] == [False, False, False, True, False]
    assert traj.turns[0].tool_name == "bash" and traj.turns[1].tool_name == "read,write"
    assert traj.turns[-1].tool_name == "finish" and traj.turns[0].tool_latency_s > 0
    assert traj.token_ids[traj.prompt_len - 3:traj.prompt_len].tolist() == \
        tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)[-3:]


def test_no_tool_call_and_unknown_tool_become_observations(aloop, tokenizer, tmp_path):
    script = ["I am thinking without tools.", _call("rm_rf", path="/"), _call("finish")]
    ep = make_episode(ScriptedPolicy(tokenizer, script), relu_task(), tmp_path, EpisodeLimits(max_turns=5))
    traj = aloop.run(ep.run())
    _, obs = _spans(traj)
    texts = [tokenizer.decode(traj.token_ids[a:b].tolist()) for a, b in obs]
    assert "no tool call found" in texts[0] and "unknown tool 'rm_rf'" in texts[1]
    assert [t.malformed_tool_call for t in traj.turns] == [False, True, False]
    assert traj.end_reason == "finish"


def test_turn_cap_with_the_real_engine(aloop, engine, tmp_path):
    limits = EpisodeLimits(max_turns=3, max_new_tokens=12, max_context_tokens=16384)
    ep = make_episode(engine, relu_task(), tmp_path, limits)
    traj = aloop.run(ep.run())
    assert traj.end_reason == "turn_cap" and len(traj.turns) == 3
    assert traj.has_logprobs
    gen_mask = traj.loss_mask.astype(bool)
    assert gen_mask.sum() == sum(t.gen_end - t.gen_start for t in traj.turns)
    assert (traj.logprobs[gen_mask] < 0).all() and (traj.logprobs[~gen_mask] == 0).all()
    assert (traj.policy_version[gen_mask] == engine.version).all()
    # the last turn's observation is not appended: the stream ends with generated tokens
    assert traj.turns[-1].gen_end == len(traj.token_ids)


def test_context_cap_with_the_real_engine(aloop, engine, tmp_path):
    probe = make_episode(engine, relu_task(), tmp_path / "probe", EpisodeLimits())
    prompt_len = len(probe.renderer.prompt_ids(probe.renderer.system_text(probe.skill_md),
                                               __import__("actors.agent", fromlist=["x"]).task_prompt(
                                                   probe.task, False)))
    cap = prompt_len + 40
    ep = make_episode(engine, relu_task(), tmp_path, EpisodeLimits(max_turns=50, max_new_tokens=30,
                                                                   max_context_tokens=cap))
    traj = aloop.run(ep.run())
    assert traj.end_reason == "context_cap"
    assert len(traj.token_ids) <= cap and len(traj.turns) >= 1
    # a prompt that alone exceeds the cap ends the episode before any generation
    ep2 = make_episode(engine, relu_task(), tmp_path / "small", EpisodeLimits(max_context_tokens=prompt_len - 1))
    t2 = aloop.run(ep2.run())
    assert t2.end_reason == "context_cap" and len(t2.turns) == 0 and len(t2.token_ids) == prompt_len


def test_trajectory_round_trips_through_the_codec(aloop, tokenizer, tmp_path):
    from schemas import codec
    from schemas.messages import Trajectory

    ep = make_episode(ScriptedPolicy(tokenizer, [_call("todo_write", todos=[{"content": "a"}]), _call("finish")]),
                      relu_task(), tmp_path, EpisodeLimits())
    traj = aloop.run(ep.run())
    back = codec.decode(codec.encode(traj), expected=Trajectory)
    assert back.token_ids.tolist() == traj.token_ids.tolist() and back.turns == traj.turns
    assert json.loads(json.dumps(back.evidence, default=str))["error"]
