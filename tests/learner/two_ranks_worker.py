"""One rank of the two-rank test: train 3 PPO steps on a fixed batch, then dump parameters (run as a script)."""
from __future__ import annotations

import json
import os
import sys


def main(rank: int, world: int, port: int, out: str, model: str, zero_stage: int) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch

    from learner import engine as eng
    from tests.learner.conftest import learner_cfg

    cfg = learner_cfg(stage="ppo", zero_stage=zero_stage, token_budget=128)
    eng.setup_env(cfg)
    eng.init_distributed()
    from learner.data import from_trajectory
    from learner.trainer import Trainer
    from tests.learner.helpers import make_traj

    tr = Trainer(cfg, model)
    batch = [from_trajectory(make_traj(f"e{i}", n=40 + 4 * i, prompt=8, seed=i, reward=(-1.0) ** i))
             for i in range(6)]
    mine, pads = tr._local_batches(batch)
    metrics = [tr.step(batch) for _ in range(3)]
    params = {}
    for name, p in tr.policy.module.named_parameters():
        params["policy." + name] = p
    for name, p in tr.critic.module.named_parameters():
        params["critic." + name] = p
    if zero_stage == 3:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(params.values())):
            flat = {k: v.detach().clone() for k, v in params.items()}
    else:
        flat = {k: v.detach().clone() for k, v in params.items()}
    torch.save(flat, out + ".pt")
    with open(out + ".json", "w") as f:
        json.dump({"local_episodes": [e for mb in mine for e in mb.episode_ids], "pads": len(pads),
                   "metrics": metrics}, f)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]))
