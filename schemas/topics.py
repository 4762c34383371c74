"""Logical topic names (DESIGN.md); the configured prefix is prepended by the bus."""
from __future__ import annotations

TASKS = "tasks"
TOOL_COMPILE = "tool.compile"
TOOL_EVALUATE_PREFIX = "tool.evaluate"  # one topic per device kind: tool.evaluate.cpu, tool.evaluate.cuda
TOOL_REPLIES = "tool.replies"
TRAJECTORIES = "trajectories"
WEIGHTS = "weights"
WEIGHTS_CHUNKS = "weights.chunks"
DLQ = "dlq"
LEARNER_LOG = "learner.log"  # TrainStep records: which episodes each checkpointed step trained


def evaluate_topic(device_kind: str) -> str:
    """The evaluate topic for a device kind ('cpu' or 'cuda')."""
    return f"{TOOL_EVALUATE_PREFIX}.{device_kind}"


ALL = (TASKS, TOOL_COMPILE, evaluate_topic("cpu"), evaluate_topic("cuda"), TOOL_REPLIES,
       TRAJECTORIES, WEIGHTS, WEIGHTS_CHUNKS, DLQ, LEARNER_LOG)
