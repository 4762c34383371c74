"""The learner's stage schedule: which stage (and learning rate) each step runs, from one config string.

``learner.stages = "rft:40@1e-3,ppo:60@3e-4"`` runs 40 rejection fine-tuning steps, then 60 PPO steps,
in one process without a restart (the CUDA Agent recipe: warm-up, RFT, critic pre-training, PPO). Each
part is ``stage:steps`` with an optional ``@lr`` for the policy (default: ``learner.actor_lr``). Steps count
from the start of training, so a restarted learner resumes in the stage its checkpointed step is in.
Pure Python: the config validates schedules without importing torch.
"""
from __future__ import annotations

from dataclasses import dataclass

STAGES = ("warmup", "rft", "critic", "ppo")


@dataclass(frozen=True)
class StagePlan:
    stage: str
    steps: int
    lr: float | None = None  # policy learning rate in this stage (None: learner.actor_lr)


def parse(text: str, field: str = "learner.stages") -> list[StagePlan]:
    """``"rft:40@1e-3,ppo:60"`` -> plans; raises ValueError naming the field and the bad part."""
    plans = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        head, _, lr_text = part.partition("@")
        stage, _, steps_text = head.partition(":")
        stage = stage.strip()
        if stage not in STAGES:
            raise ValueError(f"{field}: unknown stage {stage!r} in {part!r} (known: {', '.join(STAGES)})")
        try:
            steps = int(steps_text)
            lr = float(lr_text) if lr_text else None
        except ValueError:
            raise ValueError(f"{field}: {part!r} is not stage:steps[@lr] (e.g. rft:40@1e-3)") from None
        if steps <= 0 or (lr is not None and not lr > 0):
            raise ValueError(f"{field}: {part!r} needs steps > 0 and a learning rate > 0")
        plans.append(StagePlan(stage, steps, lr))
    return plans


class Schedule:
    """Stage of each step; a schedule of one plan with no end stands for the plain ``learner.stage``."""

    def __init__(self, plans: list[StagePlan], default_stage: str, default_lr: float) -> None:
        self.plans = plans
        self.default = StagePlan(default_stage, 0, default_lr)
        self.default_lr = default_lr

    @classmethod
    def from_config(cls, lc) -> "Schedule":
        return cls(parse(getattr(lc, "stages", "") or ""), lc.stage, lc.actor_lr)

    @property
    def total_steps(self) -> int:
        """Steps of the whole schedule (0: no schedule, run until stopped)."""
        return sum(p.steps for p in self.plans)

    def at(self, done_steps: int) -> StagePlan:
        """The plan of the step that runs after ``done_steps`` steps (the last plan goes on past the end)."""
        if not self.plans:
            return self.default
        end = 0
        for p in self.plans:
            end += p.steps
            if done_steps < end:
                return p
        return self.plans[-1]

    def lr_at(self, done_steps: int) -> float:
        plan = self.at(done_steps)
        return plan.lr if plan.lr is not None else self.default_lr

    def describe(self) -> str:
        if not self.plans:
            return self.default.stage
        return " -> ".join(f"{p.stage} x{p.steps}" + (f" @{p.lr:g}" if p.lr else "") for p in self.plans)
