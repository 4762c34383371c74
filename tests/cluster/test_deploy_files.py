"""Every shipped deployment file parses and references real CLI commands, flags and config fields."""
from pathlib import Path

import pytest
import yaml

from cluster.cli import build_parser
from cluster.config import load

DEPLOY = Path(__file__).resolve().parents[2] / "cluster" / "deploy"


def _docs():
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                yield path.name, doc


def _containers(doc):
    spec = doc.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("containers", [])


def test_manifests_parse_and_have_kinds():
    kinds = {doc["kind"] for _, doc in _docs()}
    assert {"Kafka", "KafkaNodePool", "KafkaTopic", "Deployment", "StatefulSet", "ScaledObject", "ConfigMap"} <= kinds


def test_commands_parse_with_the_real_cli(tmp_path):
    parser = build_parser()
    commands = [(name, c["command"]) for name, doc in _docs() for c in _containers(doc)]
    assert {cmd[cmd.index("--config") + 2] for _, cmd in commands} >= {"actor", "learner", "compile-worker", "eval-worker"}
    for name, cmd in commands:
        assert cmd[0] == "kernelrl", name
        try:
            parser.parse_args(cmd[1:])
        except SystemExit:
            pytest.fail(f"{name}: `{' '.join(cmd)}` is not accepted by the kernelrl CLI")


def test_configmap_is_a_valid_kernelrl_config(tmp_path):
    cm = next(doc for _, doc in _docs() if doc["kind"] == "ConfigMap")
    f = tmp_path / "kernelrl.toml"
    f.write_text(cm["data"]["kernelrl.toml"])
    cfg = load(f, environ={})
    assert cfg.sandbox.backend == "cuda" and cfg.bus.bootstrap_servers.endswith(":9092")


def test_scalers_watch_real_groups_and_topics():
    from cluster.run_loop import ACTOR_GROUP

    triggers = {doc["metadata"]["name"]: doc["spec"]["triggers"][0]["metadata"]
                for _, doc in _docs() if doc["kind"] == "ScaledObject"}
    assert triggers["actor"]["consumerGroup"] == "krl." + ACTOR_GROUP and triggers["actor"]["topic"] == "krl.tasks"
    assert triggers["compile-worker"]["topic"] == "krl.tool.compile"


def test_mirrormaker_config():
    props = {}
    for line in (DEPLOY / "mirrormaker" / "mm2.properties").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            k, _, v = line.partition("=")
            props[k.strip()] = v.strip()
    assert props["clusters"] == "rollout, train"
    assert props["rollout->train.topics"] == r"krl\.trajectories"
    assert "krl\\.weights" in props["train->rollout.topics"]
    assert int(props["producer.override.max.request.size"]) >= 8 * 1024 * 1024
