"""GPU placement of `kernelrl up --backend cuda` (cluster/launch/placement.py) with fake NVML lists, and the role
specs `up` would start with them: each role's CUDA_VISIBLE_DEVICES / --device, the learner's torchrun launcher.
Nothing is started (no vLLM, no GPU)."""
from __future__ import annotations

import pytest

from cluster.config import Config, validate
from cluster.errors import ConfigError, SetupError
from cluster.launch.placement import Gpu, place


def gpus(n: int) -> list[Gpu]:
    return [Gpu(i, f"GPU-{i:04d}") for i in range(n)]


def idx(gs) -> list[int]:
    return [g.index for g in gs]


def test_one_gpu_everything_shares_it_as_before():
    p = place(gpus(1), learner_ranks=1, actors=2, gpus_per_actor=1, eval_workers=0)
    assert idx(p.learner) == [0] and [idx(a) for a in p.actors] == [[0], [0]] and idx(p.eval_workers) == [0]
    assert p.shared


def test_one_gpu_shares_whatever_the_counts_that_fit_one_gpu():
    p = place(gpus(1), learner_ranks=1, actors=0, gpus_per_actor=4, eval_workers=2)  # scripted actors: no vLLM
    assert idx(p.learner) == [0] and p.actors == [] and idx(p.eval_workers) == [0, 0] and p.shared


def test_two_gpus_learner_and_actor_apart_and_the_auto_eval_worker_shares_the_last():
    p = place(gpus(2), learner_ranks=1, actors=1, gpus_per_actor=1, eval_workers=0)
    assert idx(p.learner) == [0] and [idx(a) for a in p.actors] == [[1]] and idx(p.eval_workers) == [1]
    assert p.shared


def test_four_gpus_default_counts_give_each_role_its_own():
    p = place(gpus(4), learner_ranks=1, actors=1, gpus_per_actor=1, eval_workers=0)
    assert p.describe() == {"learner": [0], "actor-0": [1], "eval-worker-0": [2], "eval-worker-1": [3],
                            "shared": False, "unused": []}


def test_eight_gpus_two_learner_ranks_two_tp2_actors_and_the_rest_evaluate():
    p = place(gpus(8), learner_ranks=2, actors=2, gpus_per_actor=2, eval_workers=0)
    assert idx(p.learner) == [0, 1] and [idx(a) for a in p.actors] == [[2, 3], [4, 5]]
    assert idx(p.eval_workers) == [6, 7] and not p.shared and p.unused == []


def test_eight_gpus_explicit_eval_workers_leave_the_rest_unused():
    p = place(gpus(8), learner_ranks=4, actors=1, gpus_per_actor=1, eval_workers=1)
    assert idx(p.learner) == [0, 1, 2, 3] and [idx(a) for a in p.actors] == [[4]]
    assert idx(p.eval_workers) == [5] and idx(p.unused) == [6, 7]


def test_no_vllm_actor_needs_no_gpu():
    p = place(gpus(2), learner_ranks=1, actors=0, gpus_per_actor=4, eval_workers=0)
    assert idx(p.learner) == [0] and p.actors == [] and idx(p.eval_workers) == [1]


@pytest.mark.parametrize("n, counts, need", [
    (1, dict(learner_ranks=2, actors=1, gpus_per_actor=1, eval_workers=0), 3),  # one GPU shares only 1 rank
    (1, dict(learner_ranks=1, actors=1, gpus_per_actor=2, eval_workers=0), 3),
    (4, dict(learner_ranks=2, actors=2, gpus_per_actor=2, eval_workers=0), 6),  # the auto eval worker may share
    (4, dict(learner_ranks=1, actors=1, gpus_per_actor=1, eval_workers=3), 5),  # an explicit count may not
    (8, dict(learner_ranks=8, actors=1, gpus_per_actor=1, eval_workers=0), 9),
])
def test_too_few_gpus_is_an_error_naming_fields_and_counts(n, counts, need):
    with pytest.raises(SetupError) as e:
        place(gpus(n), **counts)
    msg = str(e.value)
    assert f"need at least {need} GPU(s), NVML lists {n}" in msg
    for field in ("cluster.learner_ranks", "cluster.actors", "actor.tensor_parallel_size", "cluster.eval_workers"):
        assert field in msg
    assert f"cluster.learner_ranks={counts['learner_ranks']}" in msg


def test_no_gpu_at_all_is_an_error():
    with pytest.raises(SetupError, match="NVML lists no GPU"):
        place([], 1, 1, 1, 0)


def _cfg(**sets) -> Config:
    from cluster.config import set_value

    cfg = Config()
    set_value(cfg, "sandbox.backend", "cuda")
    for path, value in sets.items():
        set_value(cfg, path.replace("__", "."), value)
    return validate(cfg)


def test_up_role_specs_carry_the_placement(tmp_path):
    """`up`'s plan on a fake 8-GPU host: the learner as 2 torchrun ranks on GPUs 0-1, each actor its TP pair by
    UUID, an evaluation worker per remaining GPU by NVML index; scripted actors and compile workers untouched."""
    from cluster.launch.run_loop import _plan

    cfg = _cfg(cluster__learner_ranks=2, cluster__actors=2, actor__tensor_parallel_size=2, cluster__scripted_actors=1)
    specs, described = _plan(cfg, gpus=gpus(8))
    by = {s.name: s for s in specs}
    learner = by["learner"]
    assert learner.env == {"CUDA_VISIBLE_DEVICES": "GPU-0000,GPU-0001", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert learner.launcher[:2] == ["-m", "torch.distributed.run"]
    assert learner.launcher[learner.launcher.index("--nproc-per-node") + 1] == "2"
    assert int(learner.launcher[learner.launcher.index("--shutdown-timeout") + 1]) < learner.grace_s
    assert by["actor-0"].env["CUDA_VISIBLE_DEVICES"] == "GPU-0002,GPU-0003"
    assert by["actor-1"].env["CUDA_VISIBLE_DEVICES"] == "GPU-0004,GPU-0005"
    evals = sorted((n, s.argv) for n, s in by.items() if n.startswith("eval-worker"))
    assert evals == [("eval-worker-0", ["eval-worker", "--device", "6"]),
                     ("eval-worker-1", ["eval-worker", "--device", "7"])]
    assert "CUDA_VISIBLE_DEVICES" not in by["actor-scripted-0"].env and by["compile-worker-0"].env == {}
    assert described["learner"] == [0, 1] and described["actor-1"] == [4, 5] and not described["shared"]


def test_up_role_specs_on_one_gpu_and_on_cpu():
    from cluster.launch.run_loop import _plan

    specs, described = _plan(_cfg(), gpus=gpus(1))
    by = {s.name: s for s in specs}
    assert by["learner"].launcher == [] and by["learner"].env["CUDA_VISIBLE_DEVICES"] == "GPU-0000"
    assert by["actor-0"].env["CUDA_VISIBLE_DEVICES"] == "GPU-0000"
    assert by["eval-worker-0"].argv == ["eval-worker", "--device", "0"] and described["shared"]
    cpu = Config()
    cpu.cluster.learner_ranks = 2
    specs, described = _plan(cpu)  # the CPU backend: no NVML, no GPU env; several learner ranks over gloo
    by = {s.name: s for s in specs}
    assert described is None and by["learner"].env == {} and by["actor-0"].env == {}
    assert "--standalone" in by["learner"].launcher and by["eval-worker-0"].argv[-2:] == ["--device", "cpu"]


def test_up_plan_too_few_gpus_is_the_runs_error():
    from cluster.launch.run_loop import _plan

    with pytest.raises(SetupError, match=r"cluster.actors=3 .* need at least 5 GPU\(s\), NVML lists 4"):
        _plan(_cfg(cluster__actors=3, cluster__eval_workers=1), gpus=gpus(4))


def test_supervisor_puts_the_launcher_between_interpreter_and_cli(tmp_path):
    """The argv `up` runs: python <launcher> -m cluster.cli ... learner ... (torchrun runs the CLI per rank)."""
    import sys

    from cluster.launch.supervisor import RoleSpec, Supervisor

    sup = Supervisor(tmp_path, [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv))"])
    rp = sup.add(RoleSpec("x", ["tail"], restart=False, launcher=["-I"]))
    rp.proc.wait(timeout=30)
    assert rp.proc.args == [sys.executable, "-I", "-c", "import sys, json; print(json.dumps(sys.argv))", "tail"]


@pytest.mark.parametrize("path, value", [("actor.tensor_parallel_size", 0), ("actor.pipeline_parallel_size", -1),
                                         ("cluster.learner_ranks", 0), ("cluster.eval_workers", -1)])
def test_config_refuses_counts_below_their_minimum(path, value):
    from cluster.config import set_value

    cfg = Config()
    set_value(cfg, path, value)
    with pytest.raises(ConfigError, match=rf"{path}: must be .*got {value}"):
        validate(cfg)


def test_vllm_engine_args_carry_the_parallel_sizes(tiny_model_dir):
    from actors.policy_vllm import engine_args

    acfg = Config().actor
    acfg.tensor_parallel_size, acfg.pipeline_parallel_size = 2, 1
    args = engine_args(tiny_model_dir, acfg, max_model_len=256)
    assert args.tensor_parallel_size == 2 and args.pipeline_parallel_size == 1
    default = engine_args(tiny_model_dir, Config().actor, max_model_len=256)
    assert default.tensor_parallel_size == 1 and default.pipeline_parallel_size == 1


@pytest.fixture(scope="module")
def tiny_model_dir() -> str:
    import os
    from pathlib import Path

    from cluster.models.tiny import build_tiny_model

    cache = os.environ.get("KERNELRL_CACHE", str(Path.home() / ".cache" / "kernelrl"))
    return str(build_tiny_model(os.environ.get("KERNELRL_TEST_TINY_MODEL") or Path(cache) / "tiny-model"))


def test_vllm_cpu_workers_split_the_cores_where_numa_nodes_are_too_few(monkeypatch):
    """vLLM-CPU binds each TP/PP worker to a NUMA node of its own and refuses with fewer nodes than workers:
    there the actor splits its cores between the workers (unless VLLM_CPU_OMP_THREADS_BIND says otherwise)."""
    from pathlib import Path

    from actors.policy_vllm import cpu_worker_binding

    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1, 2, 3, 5})
    numa = len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))
    assert cpu_worker_binding(1) is None
    assert cpu_worker_binding(2) == (None if numa >= 2 else "0,1|2,3")
    if numa < 6:
        with pytest.raises(SetupError, match=r"actor.tensor_parallel_size x actor.pipeline_parallel_size = 6: .* "
                                             r"may use 5 core\(s\)"):
            cpu_worker_binding(6)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    assert cpu_worker_binding(2) is None
