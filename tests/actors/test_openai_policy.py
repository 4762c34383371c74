"""The OpenAI-compatible backend through the same agent loop, against a local chat-completions endpoint."""
from __future__ import annotations

import pytest

from actors.agent import EpisodeLimits
from actors.policy_openai import EndpointError, OpenAIPolicy
from actors.toolcall import format_call
from tests.chat_endpoint import Endpoint

from .conftest import actor_cfg
from .helpers import make_episode, relu_task


def test_openai_backend_runs_the_agent_loop(aloop, tokenizer, tmp_path, monkeypatch):
    ep_srv = Endpoint([format_call("bash", {"command": "echo from-endpoint"}), format_call("finish", {})])
    monkeypatch.setenv("KRL_TEST_KEY", "sk-test")
    acfg = actor_cfg(openai_base_url=ep_srv.url, openai_model="m1", openai_api_key_env="KRL_TEST_KEY").actor
    try:
        policy = OpenAIPolicy(tokenizer, acfg)
        ep = make_episode(policy, relu_task(), tmp_path, EpisodeLimits(max_turns=5))
        traj = aloop.run(ep.run())
    finally:
        ep_srv.close()
    assert traj.end_reason == "finish" and len(traj.turns) == 2
    assert traj.has_logprobs is False and traj.metadata["trainable"] is False
    assert (traj.policy_version[traj.loss_mask.astype(bool)] == -1).all()
    (p1, auth, b1), (_, _, b2) = ep_srv.requests
    assert p1 == "/v1/chat/completions" and auth == "Bearer sk-test" and b1["model"] == "m1"
    assert [m["role"] for m in b1["messages"]] == ["system", "user"]
    assert [m["role"] for m in b2["messages"]] == ["system", "user", "assistant", "tool"]
    assert "from-endpoint" in b2["messages"][-1]["content"]


def test_openai_backend_errors_are_clear(aloop, tokenizer, tmp_path):
    from actors.policy import GenRequest

    srv = Endpoint([])
    try:
        policy = OpenAIPolicy(tokenizer, actor_cfg(openai_base_url=srv.url).actor)
        with pytest.raises(EndpointError, match="HTTP 500"):
            aloop.run(policy.generate(GenRequest([1], 8, "r", messages=[{"role": "user", "content": "x"}])))
    finally:
        srv.close()
    with pytest.raises(Exception, match="openai_base_url is empty"):
        OpenAIPolicy(tokenizer, actor_cfg().actor)
