"""The execution filter: every rule rejects a task built to break it; a good task passes all of them.

All sources run in real sandboxed children (cluster.tasks.filter_runner), torch.compile with inductor.
"""
from __future__ import annotations

import pytest

from cluster.tasks.filter import RULES, FilterConfig
from cluster.tasks.filter_runner import filter_sources
from tests.tasks.helpers import BROKEN, CRASH, GOOD, HANG, TOO_FAST


@pytest.fixture(scope="module")
def verdicts():
    names = ["good", *BROKEN]
    sources = [GOOD, *BROKEN.values()]
    out = filter_sources(sources, FilterConfig(backend="cpu", min_ms=0.002, max_ms=20.0), workers=1,
                         timeout_s=120)
    return dict(zip(names, out))


def test_every_rule_has_a_breaking_task():
    assert set(BROKEN) == set(RULES)


def test_good_task_passes_every_rule(verdicts):
    v = verdicts["good"]
    assert v.ok, v
    assert v.rule == "" and v.eager_ms > 0 and v.compile_ms > 0 and v.output_shape == [128, 256]


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_rule_rejects_its_breaking_task(verdicts, rule):
    v = verdicts[rule]
    assert not v.ok
    assert v.rule == rule, f"{rule}: got {v.rule}: {v.reason}"
    assert v.reason


def test_window_rejects_too_fast_task():
    fast = filter_sources([TOO_FAST], FilterConfig(backend="cpu", min_ms=1.0, max_ms=20.0, check_compile=False))[0]
    assert not fast.ok and fast.rule == "runtime_window" and fast.eager_ms < 1.0


def test_hanging_or_crashing_task_is_killed_and_the_batch_continues():
    cfg = FilterConfig(backend="cpu", min_ms=0.0, max_ms=1000.0, check_compile=False)
    out = filter_sources([TOO_FAST, HANG, CRASH, TOO_FAST], cfg, timeout_s=4, start_s=90)
    assert [v.ok for v in out] == [True, False, False, True]
    assert out[1].rule == "timeout" and out[2].rule == "crash"


def test_the_tasks_of_the_input_domain_cheats_are_refused_at_admission():
    """The red team's identity 'ReLU' (reward 3 from the oracle until its centred check) needs a task on which
    returning the input is exact; the filter refuses every such task too, so none reaches training."""
    from tests.sandbox import redteam_cases as rc
    from tests.sandbox.helpers import shrunk_task

    names = sorted({c.task for c in rc.CASES if c.why == rc.FIX_CENTRED})
    assert names, "no input-domain case left in the red team"
    out = filter_sources([shrunk_task(rc.TASKS[n][0], **rc.TASKS[n][1]) for n in names],
                         FilterConfig(backend="cpu", min_ms=0.0, max_ms=1e4, check_compile=False), workers=1)
    assert [(v.ok, v.rule) for v in out] == [(False, "identity")] * len(names), [(v.rule, v.reason) for v in out]
