"""Config: defaults, TOML, environment and CLI overrides, validation messages."""
import subprocess
import sys
import tomllib

import pytest

from cluster.config import ConfigError, dump_toml, load


def test_precedence_file_env_cli(tmp_path):
    f = tmp_path / "k.toml"
    f.write_text('[actor]\nconcurrency = 3\nmax_turns = 10\n[learner]\nzero_stage = 2\n')
    cfg = load(f, overrides=["actor.max_turns=20"], environ={"KRL__ACTOR__CONCURRENCY": "5"})
    assert cfg.actor.concurrency == 5  # env beats file
    assert cfg.actor.max_turns == 20  # CLI beats file
    assert cfg.learner.zero_stage == 2  # file beats default


@pytest.mark.parametrize("override,needle", [
    ("actor.policy=foo", "actor.policy: 'foo' is not one of"),
    ("learner.lam=x", "learner.lam: expected float, got 'x'"),
    ("actor.concurrency=0", "actor.concurrency: must be > 0, got 0"),
    ("nosuch.field=1", "nosuch.field: unknown config section"),
    ("actor.nosuch=1", "actor.nosuch: unknown field"),
    ("topics.trajectory_max_message_bytes=1000", "topics.trajectory_max_message_bytes: must be >= 8 MiB"),
    ("actor.concurrency", "expected section.field=value"),
    ("actor.weights_keep=-1", "actor.weights_keep: must be >= 0 (0 keeps every version), got -1"),
    ("learner.kl_ref_coef=-0.5", "learner.kl_ref_coef: must be >= 0 (0: no KL penalty), got -0.5"),
    ("learner.adam_beta2=1.0", "learner.adam_beta2: must be in (0, 1), got 1.0"),
    ("learner.advantage=ppo", "learner.advantage: 'ppo' is not one of"),
    ("cluster.tail_episodes=-1", "cluster.tail_episodes: must be >= 0"),
    # the tail needs a deadline: episodes that never come must not hold the run forever
    ("cluster.tail_episodes=16", "cluster.tail_episodes: must be >= 0, and > 0 only with cluster.tail_s > 0"),
])
def test_errors_name_field_and_value(override, needle):
    with pytest.raises(ConfigError) as e:
        load(overrides=[override], environ={})
    assert needle in str(e.value)


def test_kl_reference_needs_an_unpartitioned_policy():
    with pytest.raises(ConfigError, match="learner.kl_ref_coef: needs learner.zero_stage <= 2"):
        load(overrides=["learner.kl_ref_coef=0.5", "learner.zero_stage=3"], environ={})
    assert load(overrides=["learner.kl_ref_coef=0.5", "learner.zero_stage=2"], environ={}).learner.kl_ref_coef == 0.5


def test_bad_toml_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load(tmp_path / "nope.toml", environ={})
    bad = tmp_path / "bad.toml"
    bad.write_text("[actor\n")
    with pytest.raises(ConfigError, match="bad.toml"):
        load(bad, environ={})


def test_dump_roundtrip():
    cfg = load(overrides=["sandbox.atol=0.001", "bus.topic_prefix=x."], environ={})
    assert tomllib.loads(dump_toml(cfg)) == cfg.to_dict()


def test_cli_config_show_and_error():
    out = subprocess.run([sys.executable, "-m", "cluster.cli", "--set", "actor.max_turns=7", "config", "show"],
                         capture_output=True, text=True, check=True).stdout
    assert tomllib.loads(out)["actor"]["max_turns"] == 7
    bad = subprocess.run([sys.executable, "-m", "cluster.cli", "--set", "actor.max_turns=-1", "config", "show"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "actor.max_turns: must be > 0, got -1" in bad.stderr


def test_judges_are_frozen_by_a_timed_job_on_cpu_only_unless_set():
    from cluster.config import freeze_judges

    cfg = load(None, environ={})
    assert freeze_judges(cfg.sandbox, "cpu") and not freeze_judges(cfg.sandbox, "cuda")
    cfg = load(None, environ={"KRL__SANDBOX__GATE_FREEZE_JUDGES": "on"})
    assert freeze_judges(cfg.sandbox, "cuda")
    cfg = load(None, ["sandbox.gate_freeze_judges=off"], environ={})
    assert not freeze_judges(cfg.sandbox, "cpu")
    with pytest.raises(ConfigError, match="sandbox.gate_freeze_judges"):
        load(None, ["sandbox.gate_freeze_judges=maybe"], environ={})


def test_jobs_per_device_by_backend_unless_set():
    from cluster.config import jobs_for

    cfg = load(None, environ={})
    assert cfg.sandbox.jobs_per_device == 0
    assert jobs_for(cfg.sandbox, "cuda") == 4 and jobs_for(cfg.sandbox, "cpu") == 1
    cfg = load(None, ["sandbox.jobs_per_device=2"], environ={})
    assert jobs_for(cfg.sandbox, "cuda") == 2 and jobs_for(cfg.sandbox, "cpu") == 2
    with pytest.raises(ConfigError, match=r"sandbox.jobs_per_device: must be 0 \(by backend\) or 1..64, got -1"):
        load(None, ["sandbox.jobs_per_device=-1"], environ={})
