"""Which GPU(s) each role of `kernelrl up --backend cuda` gets on a multi-GPU host (pure; NVML read separately).

Layout, in NVML order: the learner's ranks on the first GPUs (one each), then each vLLM actor on the next
tensor_parallel_size x pipeline_parallel_size GPUs, then one evaluation worker per GPU left (or
cluster.eval_workers of them). Roles never share a GPU, except: on a one-GPU host everything shares it (the
single-GPU layout `up` always had), and when the learner and the actors take every GPU an automatic
(cluster.eval_workers = 0) evaluation worker shares the last one, with a warning (its timings contend).
"""
from __future__ import annotations

import dataclasses
import logging

from cluster.errors import SetupError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Gpu:
    index: int  # NVML index (PCI bus order): what `eval-worker --device N` takes
    uuid: str  # what CUDA_VISIBLE_DEVICES gets: stable whatever CUDA's own ordering


@dataclasses.dataclass
class Placement:
    learner: list[Gpu]
    actors: list[list[Gpu]]  # per vLLM actor
    eval_workers: list[Gpu]  # per evaluation worker (its --device)
    shared: bool = False  # some GPU holds more than one role
    unused: list[Gpu] = dataclasses.field(default_factory=list)

    def describe(self) -> dict:
        """For the run report and the log: role -> NVML indices."""
        out = {"learner": [g.index for g in self.learner]}
        out.update({f"actor-{i}": [g.index for g in gs] for i, gs in enumerate(self.actors)})
        out.update({f"eval-worker-{i}": [g.index] for i, g in enumerate(self.eval_workers)})
        out["shared"] = self.shared
        out["unused"] = [g.index for g in self.unused]
        return out


def visible_devices(gpus: list[Gpu]) -> str:
    return ",".join(g.uuid for g in gpus)


def place(gpus: list[Gpu], learner_ranks: int, actors: int, gpus_per_actor: int, eval_workers: int) -> Placement:
    """The layout for these counts (``actors``: vLLM actors only; ``eval_workers`` 0 = one per GPU left).

    Raises SetupError naming the config fields when the roles need more GPUs than ``gpus`` holds."""
    n = len(gpus)
    if n == 0:
        raise SetupError("sandbox.backend 'cuda': NVML lists no GPU on this machine (use --backend cpu)")
    heavy = learner_ranks + actors * gpus_per_actor
    need = heavy + max(eval_workers, 1)  # every role on GPUs of its own
    counts = (f"cluster.learner_ranks={learner_ranks} + cluster.actors={actors} x {gpus_per_actor} GPU(s) "
              f"(actor.tensor_parallel_size x actor.pipeline_parallel_size) + cluster.eval_workers={eval_workers}"
              f"{' (auto)' if not eval_workers else ''}")
    if n == 1 and learner_ranks == 1 and (gpus_per_actor == 1 or not actors) and need > n:
        # the one-GPU layout: every role on GPU 0 (each vLLM engine takes actor.gpu_memory_utilization of it)
        g = gpus[0]
        return Placement([g], [[g] for _ in range(actors)], [g] * max(eval_workers, 1), shared=True)
    if heavy > n or (eval_workers and need > n):
        least = need if eval_workers else heavy  # an automatic evaluation worker may share the last GPU
        raise SetupError(f"kernelrl up --backend cuda: {counts} need at least {least} GPU(s), NVML lists {n}; "
                         "lower those counts (each role gets GPUs of its own; only a one-GPU host shares)")
    learner, rest = gpus[:learner_ranks], gpus[learner_ranks:]
    per_actor = []
    for _ in range(actors):
        per_actor.append(rest[:gpus_per_actor])
        rest = rest[gpus_per_actor:]
    if eval_workers:
        return Placement(learner, per_actor, rest[:eval_workers], unused=rest[eval_workers:])
    if rest:
        return Placement(learner, per_actor, list(rest))
    # every GPU went to the learner and the actors: one evaluation worker shares the last GPU
    return Placement(learner, per_actor, [gpus[-1]], shared=True)


def nvml_gpus() -> list[Gpu]:
    """This machine's GPUs from NVML (no CUDA context is created)."""
    try:
        import pynvml
    except ImportError:
        raise SetupError("sandbox.backend 'cuda': placing roles on GPUs needs nvidia-ml-py "
                         "(pip install nvidia-ml-py)") from None
    try:
        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
                out.append(Gpu(i, uuid.decode() if isinstance(uuid, bytes) else uuid))
            return out
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError as exc:
        raise SetupError(f"sandbox.backend 'cuda': NVML failed: {exc} (driver missing or GPU broken)") from None
