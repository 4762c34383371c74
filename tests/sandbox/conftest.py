"""Fixtures of the sandbox tests: a fast oracle config, one Evaluator, warmed reference data."""
from __future__ import annotations

import os

import pytest

from tests.sandbox.helpers import RELU_TASK, shrunk_task


def fast_cfg(cache_dir: str):
    from cluster.config import Config

    cfg = Config()
    cfg.broker.cache_dir = cache_dir
    sb = cfg.sandbox
    sb.cpu_flush_mb, sb.trials, sb.max_trials, sb.timing_budget_s, sb.warmup = 8, 5, 20, 0.3, 2
    sb.eval_timeout_s, sb.compile_timeout_s, sb.eval_memory_limit_mb = 60.0, 60.0, 6144
    sb.cpu_threads = 2
    return cfg


@pytest.fixture(scope="session")
def sandbox_cache(tmp_path_factory) -> str:
    # KRL_TEST_SANDBOX_CACHE keeps baselines and inductor's cache between sessions (keys include versions).
    return os.environ.get("KRL_TEST_SANDBOX_CACHE") or str(tmp_path_factory.mktemp("sandbox-cache"))


@pytest.fixture(scope="session")
def sb_cfg(sandbox_cache):
    return fast_cfg(sandbox_cache)


@pytest.fixture(scope="session")
def evaluator(sb_cfg):
    from sandbox_workers.evaluator import Evaluator

    return Evaluator(sb_cfg, "cpu")


@pytest.fixture(scope="session")
def relu_task(evaluator) -> str:
    """The ReLU task at a tiny shape, with its reference data already built (verify mode)."""
    src = shrunk_task(RELU_TASK[0], **RELU_TASK[1])
    evaluator.reference(src, timing=False)
    return src
