"""Every shipped deployment file parses and references real CLI commands, flags, config fields, images
(built by the Dockerfiles under cluster/deploy/docker) and volumes."""
import json
import re
import tempfile
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
    assert {"Kafka", "KafkaNodePool", "KafkaTopic", "Deployment", "StatefulSet", "ScaledObject", "ConfigMap",
            "Service"} <= kinds


def _torchrun(cmd: list[str]):
    """torchrun's own parser on a manifest's command: the launcher's options and the kernelrl argv it runs."""
    from torch.distributed.run import get_args_parser

    assert cmd[0] == "torchrun", cmd
    try:
        return get_args_parser().parse_args(cmd[1:])
    except SystemExit:
        pytest.fail(f"`{' '.join(cmd)}` is not accepted by torchrun")


def _kernelrl_argv(cmd: list[str]) -> list[str]:
    """The `kernelrl ...` argv a container runs, directly or through torchrun -m cluster.cli."""
    if cmd[0] == "torchrun":
        args = _torchrun(cmd)
        assert args.module and args.training_script == "cluster.cli", cmd  # the CLI's module, once per rank
        return ["kernelrl", *args.training_script_args]
    return cmd


def test_commands_parse_with_the_real_cli(tmp_path):
    parser = build_parser()
    commands = [(name, _kernelrl_argv(c["command"])) for name, doc in _docs() for c in _containers(doc)]
    assert {cmd[cmd.index("--config") + 2] for _, cmd in commands} >= {"actor", "learner", "compile-worker", "eval-worker"}
    for name, cmd in commands:
        assert cmd[0] == "kernelrl", name
        try:
            parser.parse_args(cmd[1:])
        except SystemExit:
            pytest.fail(f"{name}: `{' '.join(cmd)}` is not accepted by the kernelrl CLI")


def _workload(kind: str, name: str) -> dict:
    return next(doc for _, doc in _docs() if doc["kind"] == kind and doc["metadata"]["name"] == name)


def test_learner_runs_one_torchrun_per_node_with_a_rank_per_gpu():
    """One pod per node (replicas = --nnodes), GPUs per pod = --nproc-per-node, c10d rendezvous on the first
    pod's stable name behind a headless service that publishes not-ready pods, pods started in parallel, and
    torchrun's shutdown timeout inside the pod's grace period."""
    sts = _workload("StatefulSet", "learner")
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    args = _torchrun(container["command"])
    assert int(args.nnodes) == sts["spec"]["replicas"] >= 2
    assert int(args.nproc_per_node) == int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert args.rdzv_backend == "c10d" and args.max_restarts == 0
    assert not args.standalone and args.node_rank == 0  # ranks come from the rendezvous, not the manifest
    host, port = args.rdzv_endpoint.rsplit(":", 1)
    ns, svc_name = sts["metadata"]["namespace"], sts["spec"]["serviceName"]
    assert host == f"{sts['metadata']['name']}-0.{svc_name}.{ns}.svc.cluster.local", host  # one store host
    svc = _workload("Service", svc_name)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert int(port) in {p["port"] for p in svc["spec"]["ports"]}
    assert int(port) in {p["containerPort"] for p in container["ports"]}
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert 0 < args.shutdown_timeout < pod["terminationGracePeriodSeconds"]
    # every rank sees the one checkpoint folder: a shared (ReadWriteMany) claim, not one volume per pod
    cfg = _config()
    claims = {doc["metadata"]["name"]: doc for _, doc in _docs() if doc["kind"] == "PersistentVolumeClaim"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mount = next(m for m in container["volumeMounts"] if Path(cfg.learner.checkpoint_dir).is_relative_to(m["mountPath"]))
    claim = volumes[mount["name"]]["persistentVolumeClaim"]["claimName"]
    assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"], claim
    assert "volumeClaimTemplates" not in sts["spec"]


def test_actor_pods_hold_the_gpus_one_vllm_engine_spans():
    cfg = _config()
    (container,) = _workload("Deployment", "actor")["spec"]["template"]["spec"]["containers"]
    gpus = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == cfg.actor.tensor_parallel_size * cfg.actor.pipeline_parallel_size


def test_configmap_is_a_valid_kernelrl_config(tmp_path):
    cm = next(doc for _, doc in _docs() if doc["kind"] == "ConfigMap")
    f = tmp_path / "kernelrl.toml"
    f.write_text(cm["data"]["kernelrl.toml"])
    cfg = load(f, environ={})
    assert cfg.sandbox.backend == "cuda" and cfg.bus.bootstrap_servers.endswith(":9092")


def test_scalers_watch_real_groups_and_topics():
    from cluster.launch.run_loop import ACTOR_GROUP

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
    assert props["train->rollout.topics"].split(", ")[:2] == ["krl\\.weights", "krl\\.weights\\.chunks"]
    assert props["replication.policy.class"].endswith("IdentityReplicationPolicy")
    for side in ("rollout", "train"):
        assert int(props[f"{side}.producer.max.request.size"]) > 16 * 1024 * 1024
        assert int(props[f"{side}.consumer.max.partition.fetch.bytes"]) > 16 * 1024 * 1024


DOCKER = DEPLOY / "docker"


def _dockerfiles() -> dict[str, str]:
    """Image name (the ``docker build ... -t NAME`` each Dockerfile documents) -> the Dockerfile's text."""
    out = {}
    for path in sorted(DOCKER.glob("Dockerfile.*")):
        text = path.read_text()
        tags = re.findall(r"docker build -f (\S+) -t (\S+) \.", text)
        assert len(tags) == 1 and tags[0][0] == str(path.relative_to(DEPLOY.parents[1])), (path.name, tags)
        out[tags[0][1]] = text
    return out


def _config():
    cm = next(doc for _, doc in _docs() if doc["kind"] == "ConfigMap")
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "kernelrl.toml"
        f.write_text(cm["data"]["kernelrl.toml"])
        return load(f, environ={})


def test_dockerfiles_set_up_the_project_like_a_fresh_machine():
    images = _dockerfiles()
    assert set(images) == {"kernelrl:cpu", "kernelrl:cuda"}
    assert re.search(r"^FROM nvidia/cuda:\S+-devel-", images["kernelrl:cuda"], re.M)  # nvcc for the workers
    assert re.search(r"^FROM python:3\.1[1-9]", images["kernelrl:cpu"], re.M)
    for name, text in images.items():
        assert "bash cluster/scripts/setup.sh" in text and (DEPLOY.parents[1] / "cluster/scripts/setup.sh").is_file()
        assert "bubblewrap" in text and "jre" in text, name  # the sandbox; Java for the embedded broker
        cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M)[1])
        assert cmd[0] == "kernelrl", name
        env = dict(re.findall(r"(KRL__\w+|KERNELRL_METRICS_PORT)=(\S+)", text))
        assert env["KRL__CLUSTER__METRICS_HOST"] == "0.0.0.0", name  # probes and Prometheus come from outside
        assert "VOLUME [\"/models\"]" in text, name


def test_manifests_run_the_built_images_and_nvcc_roles_get_the_cuda_one():
    images = _dockerfiles()
    used = {c["name"]: c["image"] for _, doc in _docs() for c in _containers(doc)}
    assert set(used.values()) <= set(images), used
    assert _config().sandbox.backend == "cuda"
    assert used["compile-worker"] == used["eval-worker"] == "kernelrl:cuda"
    assert used["actor"] == used["learner"] == "kernelrl:cuda"


def test_volumes_hold_the_model_and_the_weights_the_config_names():
    cfg = _config()
    claims = {doc["metadata"]["name"] for _, doc in _docs() if doc["kind"] == "PersistentVolumeClaim"}
    pods = {doc["metadata"]["name"]: doc["spec"]["template"]["spec"] for _, doc in _docs()
            if doc["kind"] in ("Deployment", "StatefulSet")}
    for name, spec in pods.items():
        for v in spec.get("volumes", []):
            if "persistentVolumeClaim" in v:
                assert v["persistentVolumeClaim"]["claimName"] in claims, (name, v)
    for role in ("actor", "learner"):
        mounts = [m["mountPath"] for c in pods[role]["containers"] for m in c["volumeMounts"]]
        for field, path in (("actor.model_path", cfg.actor.model_path),
                            ("learner.weight_fs_dir", cfg.learner.weight_fs_dir)) + \
                ((("learner.checkpoint_dir", cfg.learner.checkpoint_dir),) if role == "learner" else ()):
            assert any(Path(path).is_relative_to(m) for m in mounts), f"{role}: {field} {path} is on no volume"
