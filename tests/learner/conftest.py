"""Fixtures of the learner tests: the tiny model, a DeepSpeed-ready process, learner configs."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from cluster.config import Config


def _cache_dir() -> str:
    # Persistent across sessions: the tiny model and DeepSpeed's JIT-built shm op are reused.
    return os.environ.get("KERNELRL_CACHE", str(Path.home() / ".cache" / "kernelrl"))


@pytest.fixture(scope="session")
def tiny_model() -> str:
    from cluster.models.tiny import build_tiny_model

    return build_tiny_model(os.environ.get("KERNELRL_TEST_TINY_MODEL") or Path(_cache_dir()) / "tiny-model")


def learner_cfg(base: Config | None = None, **learner) -> Config:
    cfg = base or Config()
    cfg.broker.cache_dir = cfg.broker.cache_dir if base is not None else _cache_dir()
    lc = cfg.learner
    lc.actor_lr, lc.critic_lr, lc.token_budget, lc.batch_trajectories = 1e-3, 1e-3, 4096, 4
    for k, v in learner.items():
        setattr(lc, k, v)
    return cfg


@pytest.fixture(scope="session")
def ds_process():
    """This process as a 1-rank gloo group; builds (first time on a machine) or loads the shm op from the cache."""
    from learner import engine as eng

    cfg = learner_cfg()
    os.environ["TORCH_EXTENSIONS_DIR"] = eng.extensions_dir(cfg)  # subprocesses inherit it: no rebuild
    eng.setup_env(cfg)
    eng.init_distributed()
    # The group exists now; keep the rendezvous variables out of subprocesses started by later tests.
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # DeepSpeed engines still read LOCAL_RANK
        os.environ.pop(key, None)
    return cfg
