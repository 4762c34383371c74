"""`kernelrl bench learner`'s plain PyTorch baseline (learner/bench.py PlainLoop)."""
from __future__ import annotations


def test_the_plain_loops_mixed_optimizer_steps_fp32_masters_and_copies_them_back(tiny_model):
    """`bench learner plain=mixed`: the baseline that keeps fp32 master weights as DeepSpeed's bf16 mode does."""
    import torch

    from cluster.config import load
    from learner.bench import PlainLoop, _samples

    cfg = load(None, ["learner.dtype=bf16", "learner.critic_lr=1e-2"])
    pl = PlainLoop(cfg, tiny_model, torch.device("cpu"), mixed=True)
    head = pl.critic.value_head.weight
    before = head.detach().clone()
    pl.step(_samples(2, 64, int(pl.policy.config.vocab_size)))
    masters = pl.masters[id(pl.critic)]
    assert head.dtype == torch.bfloat16 and all(m.dtype == torch.float32 for m in masters)
    assert not torch.equal(head, before)  # the zero-initialised head gets the value loss's gradient
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(pl.critic.parameters(), masters))
    assert all(p.grad is None for p in pl.critic.parameters())  # moved to the masters
