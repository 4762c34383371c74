"""128k-token trajectories: through the real broker into a micro-batch of their own; chunked log-probs are exact."""
from __future__ import annotations

import time

import torch

from learner.data import pack
from learner.ingest import Ingest
from schemas import topics

from .helpers import make_traj

LONG = 131072


def test_128k_trajectory_through_kafka_into_its_own_microbatch(cfg):
    from kafka import TopicPartition

    from cluster.bus.client import Bus
    from schemas.messages import Trajectory

    bus = Bus(cfg, client_id="long-test")
    prod = bus.producer()
    big = make_traj("long", n=LONG, prompt=2048, obs=(60000, 61000))
    metas = [prod.send(topics.TRAJECTORIES, t, key="k").get(timeout=60)
             for t in (make_traj("short-a"), big, make_traj("short-b"))]
    prod.close()
    part = metas[0].partition
    cons = bus.consumer([topics.TRAJECTORIES], None, assign=[(topics.TRAJECTORIES, part)], expected=Trajectory)
    cons.kafka.seek(TopicPartition(bus.topic(topics.TRAJECTORIES), part), 0)
    ing = Ingest("ppo", max_staleness=4)
    deadline = time.monotonic() + 30
    while ing.ready() < 3 and time.monotonic() < deadline:
        for rec in cons.poll(timeout_s=0.5):
            ing.offer(rec.msg, rec.partition, rec.offset)
    cons.close()
    bus.close()
    got = ing.take(3, 0)
    assert [s.episode_id for s in got] == ["short-a", "long", "short-b"]
    long = got[1]
    assert long.num_tokens == LONG and (long.token_ids == big.token_ids).all()
    assert int(long.loss_mask.sum()) == LONG - 2048 - 1000
    groups = pack(got, token_budget=65536)
    assert [s.episode_id for s in groups[0]] == ["long"] and len(groups) == 2


def test_chunked_logprobs_match_full_logits_with_gradients(tiny_model):
    from learner.models import load_policy, token_logprobs

    model = load_policy(tiny_model)
    ids = torch.randint(10, 1000, (2, 300))
    att = torch.ones_like(ids)
    att[1, 250:] = 0
    lp_chunked, ent = token_logprobs(model, ids, att, want_entropy=True, chunk=64)  # checkpointed chunks
    lp_chunked[:, 1:250].sum().backward()
    g_chunked = model.lm_head.weight.grad.clone() if model.lm_head.weight.grad is not None else None
    model.zero_grad()
    logits = model(input_ids=ids, attention_mask=att).logits.float()
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    ref[:, :249].sum().backward()
    assert torch.allclose(lp_chunked[:, 1:].detach(), ref.detach(), atol=1e-5)
    assert lp_chunked[:, 0].abs().sum() == 0
    assert g_chunked is not None and torch.allclose(g_chunked, model.lm_head.weight.grad, atol=1e-5)
    p = torch.softmax(logits[:, :-1], -1)
    ref_ent = -(p * torch.log_softmax(logits[:, :-1], -1)).sum(-1)
    assert torch.allclose(ent[:, 1:], ref_ent.detach(), atol=1e-4)


def test_selected_logprobs_match_the_full_ones_and_leave_the_rest_zero(tiny_model):
    """``select`` (the trainer passes the loss mask): the vocabulary projection runs on the selected positions
    only; their log-probs, entropies and gradients are the full computation's, every other position holds 0, and
    a micro-batch with nothing selected (padding) still has a graph to run backward through."""
    from learner.models import load_policy, token_logprobs

    model = load_policy(tiny_model)
    ids = torch.randint(10, 1000, (2, 300))
    att = torch.ones_like(ids)
    att[1, 250:] = 0
    sel = torch.zeros(ids.shape)
    sel[0, 40:90] = 1  # two generated spans in one row, one in the other
    sel[0, 200:260] = 1
    sel[1, 120:250] = 1
    full, full_ent = token_logprobs(model, ids, att, want_entropy=True, chunk=64)
    (full * sel).sum().backward()
    g_full = model.lm_head.weight.grad.clone()
    model.zero_grad()
    part, part_ent = token_logprobs(model, ids, att, want_entropy=True, chunk=16, select=sel)
    (part * sel).sum().backward()
    on = sel > 0
    assert torch.allclose(part[on].detach(), full[on].detach(), atol=1e-5)
    assert torch.allclose(part_ent[on], full_ent[on], atol=1e-4)
    assert part[~on].abs().sum() == 0 and part_ent[~on].abs().sum() == 0
    assert torch.allclose(model.lm_head.weight.grad, g_full, atol=1e-5)
    model.zero_grad()
    none, _ = token_logprobs(model, ids, att, select=torch.zeros(ids.shape))
    assert none.abs().sum() > 0 and none.requires_grad  # one position kept: the graph exists (its mask is 0)
    (none * 0).sum().backward()
