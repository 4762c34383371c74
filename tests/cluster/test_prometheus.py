"""The roles' /metrics text is valid Prometheus (checked by prometheus_client's own parser) and the
endpoint binds the configured cluster.metrics_host."""
import json
import re
import socket
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from actors import actor as actor_mod
from cluster import metrics
from cluster.launch import dashboard
from cluster.config import ConfigError, load
from learner.role import LearnerRole
from schemas.messages import Trajectory, TurnInfo

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
DEPLOY_CONFIG = Path(__file__).resolve().parents[2] / "cluster" / "deploy" / "k8s" / "config.yaml"


def _get(host: str, port: int, path: str) -> str:
    with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as r:
        return r.read().decode()


def _families(text: str) -> dict:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    untyped = sorted(n for n, f in fams.items() if f.type == "untyped")
    assert not untyped, f"series without a matching # TYPE line: {untyped}"
    for f in fams.values():
        for s in f.samples:
            assert NAME.match(s.name), s.name
    return fams


def _value(fam, name: str, **labels) -> float:
    found = [s.value for s in fam.samples if s.name == name and s.labels == labels]
    assert len(found) == 1, (name, labels, fam.samples)
    return found[0]


@pytest.fixture
def reg(monkeypatch):
    """A fresh registry behind the module functions the roles call (metrics.inc, observe, ...)."""
    r = metrics.Registry()
    for fn, method in (("inc", r.inc), ("set_gauge", r.set), ("add_gauge", r.add), ("observe", r.observe),
                       ("bucket", r.bucket)):
        monkeypatch.setattr(metrics, fn, method)
    return r


def _record_role_stats(reg: metrics.Registry) -> None:
    """What an actor, a learner and a worker record, through their own code."""
    turns = [TurnInfo(0, 1, 2, "compile", 0.25), TurnInfo(2, 3, 4, "verify", 0.5),
             TurnInfo(4, 5, 6, "compile", 0.75), TurnInfo(6, 7, 8, "bash", 9.0)]
    traj = Trajectory("e1", "t1", "a1", loss_mask=np.array([0, 1, 1, 1], np.uint8), turns=turns, reward=1.0)
    metrics.add_gauge("episodes_in_flight", 1)  # as Actor._episode brackets an episode
    actor_mod._record_episode(traj, 2.5)
    learner = SimpleNamespace(step=3, version=2, ingest=SimpleNamespace(dropped={"stale": 2, 'bad "x"\\': 1}))
    LearnerRole._record(learner, {"policy_loss": 0.5, "tokens": 100.0, "trajectories": 4.0, "step_s": float("nan")})
    job = metrics.Metered(lambda msg: msg, registry=reg)
    job("a")
    job("b")
    reg.info.update({"role": "actor", "policy": 'scripted "q"\nx'})


def test_role_stats_scrape_as_valid_prometheus_with_labels(reg):
    _record_role_stats(reg)
    server = metrics.serve(0, "127.0.0.1", registry=reg)
    port = server.server_address[1]
    try:
        text = _get("127.0.0.1", port, "/metrics")
        snap = json.loads(_get("127.0.0.1", port, "/metrics.json"))
    finally:
        server.shutdown()
        server.server_close()
    fams = _families(text)
    lat = fams["kernelrl_tool_latency_s"]
    assert lat.type == "summary"
    assert {s.labels.get("tool") for s in lat.samples} == {"compile", "verify"}  # bash is local: not recorded
    assert _value(lat, "kernelrl_tool_latency_s_count", tool="compile") == 2
    assert _value(lat, "kernelrl_tool_latency_s_sum", tool="compile") == 1.0
    assert _value(lat, "kernelrl_tool_latency_s", tool="verify", quantile="0.99") == 0.5
    assert fams["kernelrl_episodes_finished"].type == "counter"
    assert _value(fams["kernelrl_episodes_finished"], "kernelrl_episodes_finished_total") == 1
    assert _value(fams["kernelrl_generated_tokens"], "kernelrl_generated_tokens_total") == 3
    assert _value(fams["kernelrl_tool_calls_sent"], "kernelrl_tool_calls_sent_total") == 3
    assert fams["kernelrl_episodes_in_flight"].type == "gauge"
    assert _value(fams["kernelrl_reward"], "kernelrl_reward", value="1.0") == 1
    dropped = fams["kernelrl_learner_dropped"]
    assert _value(dropped, "kernelrl_learner_dropped", reason="stale") == 2
    assert _value(dropped, "kernelrl_learner_dropped", reason='bad "x"\\') == 1  # escaped and read back
    assert np.isnan(_value(fams["kernelrl_learner_step_s"], "kernelrl_learner_step_s"))
    assert _value(fams["kernelrl_learner_step"], "kernelrl_learner_step") == 3
    assert _value(fams["kernelrl_jobs_done"], "kernelrl_jobs_done_total") == 2
    assert _value(fams["kernelrl_job_s"], "kernelrl_job_s_count") == 2
    assert _value(fams["kernelrl_info"], "kernelrl_info", role="actor", policy='scripted "q"\nx') == 1
    # the JSON consumers keep their keys: the dashboard still finds the per-tool latencies
    assert snap["summaries"]["tool_latency_s.compile"]["count"] == 2
    screen = dashboard.render({"actor-0": snap}, {}, started=0.0)
    assert re.search(r"tool compile .* n 2", screen) and "in flight    1" in screen, screen


def test_dotted_and_odd_names_render_as_valid_families():
    reg = metrics.Registry()
    reg.observe("legacy.compile", 1.0)
    reg.set("odd-name/x", 2.0)
    reg.inc("already_total", 4.0)
    fams = _families(reg.prometheus())
    assert _value(fams["kernelrl_legacy"], "kernelrl_legacy_count", key="compile") == 1
    assert _value(fams["kernelrl_odd_name_x"], "kernelrl_odd_name_x") == 2.0
    assert _value(fams["kernelrl_already"], "kernelrl_already_total") == 4.0
    with pytest.raises(ValueError, match=r"metric 'x': label name 'bad-label'"):
        reg.inc("x", **{"bad-label": "v"})
    with pytest.raises(ValueError, match=r"label name 'quantile'"):
        reg.observe("x", 1.0, quantile="0.5")


def _own_address() -> str | None:
    """A non-loopback IPv4 address of this machine (the one its default route leaves by), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # UDP: no packet is sent
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_metrics_host_from_config_is_what_the_socket_binds(monkeypatch):
    own = _own_address()
    monkeypatch.setenv("KERNELRL_METRICS_PORT", "0")
    local = load(environ={}).cluster.metrics_host
    assert local == "127.0.0.1"
    everywhere = load(environ={"KRL__CLUSTER__METRICS_HOST": "0.0.0.0"}).cluster.metrics_host
    for host in (local, everywhere):
        server = metrics.serve_from_env("probe", host)  # the call every role makes
        port = server.server_address[1]
        try:
            assert server.socket.getsockname()[0] == host
            assert _get("127.0.0.1", port, "/healthz") == "ok\n"
            if own and host == everywhere:
                assert _get(own, port, "/healthz") == "ok\n"
            elif own:
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection((own, port), timeout=2).close()
        finally:
            server.shutdown()
            server.server_close()


def test_metrics_host_is_validated_and_deployments_bind_every_interface(tmp_path):
    for bad in ("", "  ", "a b", "10.0.0.1,10.0.0.2", "[::]"):
        with pytest.raises(ConfigError, match=r"cluster\.metrics_host: .*got " + re.escape(repr(bad))):
            load(environ={"KRL__CLUSTER__METRICS_HOST": bad})
    cm = next(d for d in yaml.safe_load_all(DEPLOY_CONFIG.read_text()) if d and d["kind"] == "ConfigMap")
    f = tmp_path / "kernelrl.toml"
    f.write_text(cm["data"]["kernelrl.toml"])
    assert load(f, environ={}).cluster.metrics_host == "0.0.0.0"
