"""`learner.deepspeed_json`: DeepSpeed's own knobs laid over the config the learner builds, validated by name, and
honoured by a real DeepSpeed engine."""
from __future__ import annotations

import pytest

from cluster.config import ConfigError, validate
from learner.engine import ds_config

from .conftest import learner_cfg


def test_overrides_merge_key_by_key_and_keep_the_rest():
    cfg = learner_cfg(zero_stage=1, deepspeed_json='{"zero_optimization": {"reduce_bucket_size": 123},'
                                                  ' "gradient_clipping": 0.5}')
    got = ds_config(cfg, 1e-3)
    assert got["zero_optimization"] == {"stage": 1, "reduce_bucket_size": 123}
    assert got["gradient_clipping"] == 0.5
    assert got["optimizer"]["params"]["lr"] == 1e-3  # untouched parts stay
    assert ds_config(learner_cfg(zero_stage=2), 1e-3)["zero_optimization"] == {"stage": 2}


@pytest.mark.parametrize("raw, why", [("{not json", "not JSON"), ("[1, 2]", "must be a JSON object")])
def test_a_bad_value_names_the_field(raw, why):
    with pytest.raises(ConfigError, match=f"learner.deepspeed_json: {why}"):
        validate(learner_cfg(deepspeed_json=raw))


def test_a_real_engine_takes_the_override(ds_process, tiny_model):
    from learner.trainer import Trainer

    tr = Trainer(learner_cfg(ds_process, zero_stage=0, deepspeed_json='{"gradient_clipping": 0.25}'), tiny_model)
    assert tr.policy.gradient_clipping() == 0.25 and tr.critic.gradient_clipping() == 0.25
    assert tr.policy.zero_optimization_stage() == 0


def test_bf16_runs_without_deepspeeds_overflow_scan_as_fp32_does():
    assert ds_config(learner_cfg(), 1e-3)["bf16"]["check_grad_overflow"] is False
    on = learner_cfg(deepspeed_json='{"bf16": {"check_grad_overflow": true}}')
    assert ds_config(on, 1e-3)["bf16"] == {"enabled": False, "check_grad_overflow": True}


def test_a_step_with_non_finite_gradients_is_skipped_or_stops_the_learner(ds_process, tiny_model, caplog):
    import torch

    from cluster.errors import DivergedError
    from learner.trainer import Trainer

    from .test_stages import _batch

    tr = Trainer(learner_cfg(ds_process, stage="rft", zero_stage=1), tiny_model)
    batch = [s for s in _batch() if s.reward > 0]
    assert tr.step(batch)["loss"] > 0  # a finite step goes through
    with torch.no_grad():
        next(tr.policy.module.parameters()).view(-1)[0] = float("nan")
    tr.step(batch)  # fp32: DeepSpeed skips it (as bf16 with its overflow scan would), and says so
    assert not tr.policy.was_step_applied() and "DeepSpeed skipped this step" in caplog.text
    # bf16 without the scan (a GPU only) applies it: what the trainer sees then, on a step that was applied
    with pytest.raises(DivergedError, match="policy's gradient norm is inf and the step was applied"):
        Trainer._step(_Applied(tr.policy), "policy")


class _Applied:
    """The engine as a bf16 engine without the overflow scan leaves it: the non-finite step applied."""

    def __init__(self, engine):
        self.engine = engine

    def step(self):  # the step's norm stays the one just computed (inf); only its outcome differs
        self.engine._step_applied = True

    def __getattr__(self, name):
        return getattr(self.engine, name)
