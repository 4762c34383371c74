"""Scratch experiment (not committed): RFT leaving entropy, then PPO on bigger batches; curve per version."""
import json
import os

from tests.learning.test_learning import run_learning


def test_zz(cfg, tiny_model, tmp_path):
    stages = os.environ.get("ZZ_STAGES", "rft:2@3e-3,ppo:6@5e-4")
    extra = os.environ.get("ZZ_EXTRA", "").split()
    rep = run_learning(cfg, tiny_model, tmp_path / "report.json", stages=stages, extra=extra)
    out = os.environ.get("ZZ_OUT", "/tmp/zz_report.json")
    with open(out, "w") as f:
        json.dump(rep, f)
    for r in rep["learning"]["by_version"]:
        print(r.get("version"), r.get("stage"), r.get("episodes"), r.get("pass_rate"))
    print([round(s.get("reward_logp_cov", 0) or 0, 4) for s in rep["learner_curve"]])
    print([round(s.get("entropy", 0) or 0, 4) for s in rep["learner_curve"]])
