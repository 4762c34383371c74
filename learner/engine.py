"""DeepSpeed set-up: process environment, engine config, and the distributed helpers the learner uses.

On a machine without CUDA the CPU accelerator is used (gloo, fp32); its first
start JIT-builds a shared-memory op, cached under <cache_dir>/torch_extensions
(TORCH_EXTENSIONS_DIR) so later starts reuse it. Adam is torch's own
(``torch_adam``), so nothing else is compiled.
"""
from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

from cluster.config import deepspeed_overrides
from cluster.errors import SetupError

log = logging.getLogger(__name__)


def extensions_dir(cfg) -> str:
    return str(Path(cfg.broker.cache_dir).expanduser() / "torch_extensions")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_env(cfg) -> None:
    """Environment DeepSpeed reads at import and init; single-process defaults when no launcher set them."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir(cfg))
    Path(os.environ["TORCH_EXTENSIONS_DIR"]).mkdir(parents=True, exist_ok=True)
    if "DS_ACCELERATOR" not in os.environ:
        import torch

        os.environ["DS_ACCELERATOR"] = "cuda" if torch.cuda.is_available() else "cpu"
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def launcher_summary() -> str:
    """Where this process's rank came from, for the start-up log line."""
    env = os.environ
    launcher = "torchrun" if "TORCHELASTIC_RUN_ID" in env else "the environment"
    return (f"from {launcher}: local rank {env.get('LOCAL_RANK', '0')} of {env.get('LOCAL_WORLD_SIZE', '?')}, "
            f"node {env.get('GROUP_RANK', '?')}, rendezvous {env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}")


def check_local_device(local: int, count: int, visible: str | None) -> None:
    """A rank's GPU must exist: LOCAL_RANK indexes the GPUs this process sees (CUDA_VISIBLE_DEVICES)."""
    if not 0 <= local < count:
        raise SetupError(f"LOCAL_RANK {local}: this process sees {count} GPU(s) (CUDA_VISIBLE_DEVICES="
                         f"{visible!r}); run at most that many learner ranks per node (--nproc-per-node, "
                         "cluster.learner_ranks)")


def on_gpu() -> bool:
    return os.environ.get("DS_ACCELERATOR") == "cuda"


def init_distributed() -> None:
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        if on_gpu():
            import torch

            check_local_device(local_rank(), torch.cuda.device_count(), os.environ.get("CUDA_VISIBLE_DEVICES"))
            torch.cuda.set_device(local_rank())
        if not on_gpu():
            from deepspeed.comm.torch import build_shm_op

            with _extension_build_guard():  # build (or load) the op alone: ranks rendezvous below
                build_shm_op()
        if int(os.environ.get("WORLD_SIZE", "1")) == 1:
            # one process needs no rendezvous: torch's TCPStore on MASTER_PORT would listen on every
            # interface, whatever MASTER_ADDR says; an in-memory store opens no socket
            dist.init_process_group("nccl" if on_gpu() else "gloo", store=dist.HashStore(), rank=0, world_size=1)
        deepspeed.init_distributed(dist_backend="nccl" if on_gpu() else "gloo", auto_mpi_discovery=False)


class _extension_build_guard:
    """Serialise DeepSpeed's JIT op build across processes and clear a stale torch baton.

    torch's FileBaton is a plain ``lock`` file: a learner SIGKILLed mid-build leaves it
    behind and every later start waits on it forever. An flock (released by the kernel
    when its holder dies, however it dies) is held around the build; whoever holds it
    knows any baton left in the extensions folder is stale and removes it.
    """

    def __enter__(self):
        import fcntl
        from pathlib import Path

        root = os.environ.get("TORCH_EXTENSIONS_DIR")
        self._fh = None
        if not root:
            return self
        Path(root).mkdir(parents=True, exist_ok=True)
        self._fh = open(Path(root) / ".kernelrl-build.flock", "w")  # closed in __exit__
        fcntl.flock(self._fh, fcntl.LOCK_EX)
        for baton in Path(root).glob("*/lock"):
            log.warning("removing stale torch extension lock %s (its builder died)", baton)
            baton.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc):
        if self._fh is not None:
            self._fh.close()  # releases the flock
        return False


def _merged(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` laid over it; nested objects merge key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def ds_config(cfg, lr: float) -> dict:
    lc = cfg.learner
    if lc.dtype == "bf16" and not on_gpu():
        raise SetupError("learner.dtype: 'bf16' needs a GPU here; use 'fp32' on CPU")
    return _merged(_ds_base(lc, lr), deepspeed_overrides(lc))


def _ds_base(lc, lr: float) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,  # micro-batches vary per step: step() is the boundary
        "gradient_clipping": lc.grad_clip,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "betas": [0.9, lc.adam_beta2], "eps": 1e-8,
                                                   "weight_decay": 0.0, "torch_adam": True}},
        "zero_optimization": {"stage": lc.zero_stage},
        # bf16 has fp32's exponent range: DeepSpeed's per-parameter overflow scan (an amax and a copy per tensor,
        # ~0.13 s of a 0.5B model's 0.8 s PPO step on an H100) guards fp16's loss scaling, and fp32 runs without it;
        # the trainer checks the gradient norm after every step instead (Trainer._step)
        "bf16": {"enabled": lc.dtype == "bf16", "check_grad_overflow": False},
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }


def make_engine(model, cfg, lr: float):
    import deepspeed

    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters()
                                                                     if p.requires_grad],
                                      config=ds_config(cfg, lr))
    return engine


def comm_device():
    """Where collective tensors live: the current GPU under NCCL, the CPU under gloo."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if on_gpu() else torch.device("cpu")


def device():
    return comm_device()


def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def broadcast_object(obj, src: int = 0):
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_sum(values: list[float]) -> list[float]:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=comm_device())
    dist.all_reduce(t)
    return t.cpu().tolist()


def all_reduce_max(value: int) -> int:
    import torch
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64, device=comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
