"""Scripted episodes against the real compile and evaluation workers (CPU backend) over the real broker."""
from __future__ import annotations

import signal
import threading
import time

import pytest

from actors.agent import EpisodeLimits
from actors.policy import ScriptedPolicy
from actors.toolcall import format_call

from .helpers import make_episode, relu_solution, relu_task
from .workers import signal_group, start_worker, wait_busy


@pytest.fixture
def wcfg(make_cfg, tmp_path):
    cfg = make_cfg()
    cfg.sandbox.artifact_cache_dir = str(tmp_path / "artifacts")
    return cfg


@pytest.fixture
def rclient(wcfg):
    from cluster.bus.client import AsyncRequestClient, Bus

    bus = Bus(wcfg, client_id="actor-test")
    client = AsyncRequestClient(bus, name="actor-test")
    yield client
    client.close()
    bus.close()


def write_calls(files):
    return [format_call("write", {"path": p, "content": t}) for p, t in files.items()]


def test_scripted_episode_reward_matches_the_workers_verdict(aloop, tokenizer, wcfg, rclient, spawn, tmp_path):
    start_worker(spawn, wcfg, "compile", tmp_path)
    start_worker(spawn, wcfg, "eval", tmp_path)
    files = relu_solution()
    broken = dict(files, **{"kernels/relu.cpp": files["kernels/relu.cpp"].replace("int64_t n)", "int64_t n")})
    script = write_calls(broken) + [format_call("compile", {})] + write_calls(files) + [
        format_call("compile", {}), format_call("verify", {}), format_call("profile", {}), format_call("finish", {})]
    ep = make_episode(ScriptedPolicy(tokenizer, script), relu_task(), tmp_path / "ws",
                      EpisodeLimits(max_turns=20), client=rclient, tool_timeout_s=240)
    traj = aloop.run(ep.run(), timeout=600)
    assert traj.end_reason == "finish"
    obs = [tokenizer.decode(traj.token_ids[a.gen_end:b.start + (b.gen_start - b.start)].tolist())
           for a, b in zip(traj.turns, traj.turns[1:])]
    assert "compile: FAILED" in obs[2] and "compile: ok" in obs[5]
    assert "correct: True" in obs[6] and "speedup_vs_eager" in obs[7]
    last = ep.remote.evaluations[-1].result  # the worker's own reply to the final (profile) evaluation
    assert ep.remote.evaluations[-1].mode == "both" and len(ep.remote.evaluations) == 2
    assert last.correct and last.compiled and last.reward >= 1.0 and last.worker.startswith("eval-cpu")
    # the actor sent the artifact's key, not its bytes: the evaluation worker took it from the cache it shares with
    # the compile worker (or asked the compile worker), and built nothing itself
    assert last.evidence["compile"]["source"] in ("cache", "compile_worker"), last.evidence["compile"]
    creply = ep.remote._last_compile[1]  # nor did the compile worker send the library's bytes to the actor
    assert creply.ok and creply.artifact_key and creply.artifact == b""
    assert traj.reward == last.reward and traj.evidence["request_id"] == last.request_id
    assert traj.evidence["correct"] is True and traj.evidence["speedup_vs_eager"] == last.speedup_vs_eager
    assert traj.evidence["stats"]["final_eval_s"] == 0.0  # the profile already covered the final workspace

    # a solution that does not compile: the final evaluation (run by the actor) gives -1
    ep2 = make_episode(ScriptedPolicy(tokenizer, write_calls(broken) + [format_call("finish", {})]), relu_task(),
                       tmp_path / "ws2", EpisodeLimits(), client=rclient, tool_timeout_s=240, episode_id="ep-2")
    t2 = aloop.run(ep2.run(), timeout=600)
    assert t2.reward == -1.0 and t2.evidence["compiled"] is False and t2.evidence["stats"]["final_eval_s"] > 0

    # single-turn mode: one response holding the whole solution; the actor extracts, compiles, evaluates
    answer = ("Here is my solution.\n```python model_new.py\n" + files["model_new.py"] + "```\n"
              "### kernels/relu.cpp\n```cpp\n" + files["kernels/relu.cpp"] + "```\n")
    ep3 = make_episode(ScriptedPolicy(tokenizer, [answer]), relu_task(), tmp_path / "ws3",
                       EpisodeLimits(mode="single_turn"), client=rclient, tool_timeout_s=240, episode_id="ep-3")
    t3 = aloop.run(ep3.run(), timeout=600)
    (rec,) = ep3.remote.evaluations
    assert t3.mode == "single_turn" and len(t3.turns) == 1 and t3.end_reason == "finish"
    assert t3.turns[0].gen_end == len(t3.token_ids) and not t3.turns[0].malformed_tool_call
    assert rec.mode == "both" and rec.result.correct and t3.reward == rec.result.reward >= 1.0
    assert ep3.workspace.solution_files() == files


def test_tool_timeout_becomes_an_observation(aloop, tokenizer, wcfg, rclient, tmp_path):
    # no worker is running: the compile request times out, the episode goes on and ends normally;
    # a lost reply is the infrastructure's fault: the reward is undetermined, not the policy's -1
    script = write_calls(relu_solution()) + [format_call("compile", {}), format_call("finish", {})]
    ep = make_episode(ScriptedPolicy(tokenizer, script), relu_task(), tmp_path / "ws", EpisodeLimits(),
                      client=rclient, tool_timeout_s=1.0)
    t0 = time.monotonic()
    traj = aloop.run(ep.run())
    assert time.monotonic() - t0 < 15
    t = traj.turns
    obs = tokenizer.decode(traj.token_ids[t[2].gen_end:t[3].gen_start].tolist())
    assert "timed out" in obs and "infrastructure failure" in obs and traj.end_reason == "finish"
    assert traj.reward_status == "undetermined" and traj.reward != traj.reward  # NaN: never a -1 it did not earn
    assert "final evaluation failed (infrastructure)" in traj.evidence["undetermined"]


def _wait_serving(aloop, rclient, timeout_s=60.0):
    """A compile request with no files gets an immediate error reply once a worker serves the topic."""
    from schemas import topics
    from schemas.messages import CompileRequest, CompileResult, RequestHeader

    probe = CompileRequest(header=RequestHeader(), episode_id="probe", files={}, backend="cpu")
    reply = aloop.run(rclient.request(topics.TOOL_COMPILE, probe, timeout_s=timeout_s, retries=0))
    assert isinstance(reply, CompileResult) and not reply.ok


def _compile_episode(tokenizer, rclient, tmp_path, nonce):
    files = relu_solution()
    files["kernels/relu.cpp"] += f"\n// nonce {nonce}\n"  # a fresh build, not a cache hit
    # model_new.py is removed before finishing: no final evaluation (no evaluation worker here)
    script = write_calls(files) + [format_call("compile", {}), format_call("bash", {"command": "rm model_new.py"}),
                                   format_call("finish", {})]
    return make_episode(ScriptedPolicy(tokenizer, script), relu_task(), tmp_path / f"ws-{nonce}",
                        EpisodeLimits(), client=rclient, tool_timeout_s=60.0, episode_id=f"ep-{nonce}")


def _run_async(aloop, coro):
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("r", aloop.run(coro, timeout=300)))
    th.start()
    return th, box


def test_worker_killed_mid_call_request_is_redelivered(aloop, tokenizer, wcfg, rclient, spawn, tmp_path):
    a = start_worker(spawn, wcfg, "compile", tmp_path, "a")
    _wait_serving(aloop, rclient)
    ep = _compile_episode(tokenizer, rclient, tmp_path, "kill")
    th, box = _run_async(aloop, ep.run())
    wait_busy(a)  # worker A is compiling our request
    signal_group(a, signal.SIGKILL)
    start_worker(spawn, wcfg, "compile", tmp_path, "b")  # B gets the uncommitted request
    th.join(300)
    traj = box["r"]
    t = traj.turns
    obs = tokenizer.decode(traj.token_ids[t[2].gen_end:t[3].gen_start].tolist())
    assert "compile: ok" in obs, obs
    assert ep.remote.compiles == 1 and rclient.stats["replies"] >= 1


def test_hung_worker_reply_is_deduplicated(aloop, tokenizer, wcfg, rclient, spawn, tmp_path):
    a = start_worker(spawn, wcfg, "compile", tmp_path, "a")
    _wait_serving(aloop, rclient)
    ep = _compile_episode(tokenizer, rclient, tmp_path, "hang")
    before = dict(rclient.stats)
    th, box = _run_async(aloop, ep.run())
    wait_busy(a)
    signal_group(a, signal.SIGSTOP)  # A hangs mid-compile: the group moves its partition to B
    try:
        start_worker(spawn, wcfg, "compile", tmp_path, "b")
        th.join(300)
    finally:
        signal_group(a, signal.SIGCONT)  # A wakes up, finishes and answers the same request again
    traj = box["r"]
    t = traj.turns
    assert "compile: ok" in tokenizer.decode(traj.token_ids[t[2].gen_end:t[3].gen_start].tolist())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        extra = rclient.stats["duplicates"] + rclient.stats["late"] - before.get("duplicates", 0) - \
            before.get("late", 0)
        if extra >= 1:
            break
        time.sleep(0.2)
    assert extra >= 1, f"the second reply was not seen and dropped: {dict(rclient.stats)}"
    assert rclient.stats["replies"] - before.get("replies", 0) == 1  # exactly one reply was delivered
