"""Monitoring offline: the scrape targets from the plans, prometheus.yml, the front's metrics routes
and token, the exporters' and Prometheus' files, and the input they refuse. (On real hosts, with
Prometheus itself: tests/sandbox/test_team_monitoring_sandbox.py.)"""

from __future__ import annotations

import json

import pytest
import yaml

from support.planning_fixtures import TINY_MODEL_INFO, fleet_error_text, host_data, parse_errors, run_cli
from vllm_fleet.config import parse_host
from vllm_fleet.deploy import prepare
from vllm_fleet.deploy.state import DeployError
from vllm_fleet.rules import host_packages
from vllm_fleet.monitoring.files import metrics_paths, monitoring_paths
from vllm_fleet.monitoring.targets import fleet_targets, host_targets
from vllm_fleet.plan import plan_fleet, plan_host
from vllm_fleet.render import Secrets, render_host

TOKEN = "mt-" + "ab" * 16
METRICS = {"vllm_metrics": True}


def _host(name="box", **data):
    return parse_host(name, host_data(placement="single-instance", **data))


def _files(host, secrets=Secrets("sk-k", host_key="hk-1", metrics_token=TOKEN), targets=None, backends=None):
    return {f.path: f for f in render_host(host, plan_host(host), secrets, backends=backends, targets=targets)}


# --- targets ---------------------------------------------------------------------------------------

def test_a_host_without_vllm_metrics_has_no_target_and_no_monitoring_file():
    host = _host()
    assert host_targets(host, plan_host(host)) == []
    files = _files(host)
    assert metrics_paths(host)["exporter_unit"] not in files
    assert "location = /metrics" not in files["/etc/vllm-fleet/front.conf"].content
    assert "$vllm_fleet_metrics_ok" not in files["/etc/vllm-fleet/front-secrets/keys.conf"].content


def test_targets_name_the_host_instance_and_model_and_go_through_the_front():
    host = _host(vllm_advertise_address="10.0.0.5", vllm_tls=True, vllm_gateway=True, **METRICS)
    targets = host_targets(host, plan_host(host))
    by_job = {t.job: t for t in targets}
    assert sorted(by_job) == ["front", "gpu", "node", "vllm", "vllm-router"]
    vllm = by_job["vllm"]
    assert (vllm.address, vllm.scheme, vllm.path) == ("10.0.0.5:8000", "https", "/metrics")
    assert vllm.labels == {"host": "box", "vllm_instance": "gemma", "served_model": "gemma3-12b-q4"}
    assert {t.address for t in targets if t.job != "vllm"} == {"10.0.0.5:9410"}
    assert by_job["gpu"].path == "/metrics/gpu" and by_job["vllm-router"].path == "/metrics/router"


def test_a_cpu_host_has_no_gpu_target_and_ipv6_is_bracketed():
    host = parse_host("cpu", host_data(gpus=None, vllm_target="cpu", vllm_advertise_address="fd00::7", **METRICS,
                                       instances=[{"name": "tiny", "model": "/models/tiny", "served_model_name": "t",
                                                   "port": 8000, "model_info": TINY_MODEL_INFO}]))
    targets = host_targets(host, plan_host(host))
    assert "gpu" not in {t.job for t in targets}
    assert {t.address for t in targets} == {"[fd00::7]:8000", "[fd00::7]:9410"}


def test_the_monitoring_host_renders_every_hosts_targets_and_no_secret_but_the_token_file():
    monitor = _host("mon", vllm_monitoring=True, **METRICS)
    other = _host("other", **METRICS)
    plain = _host("plain")
    fleet = plan_fleet([monitor, other, plain])
    targets = fleet_targets([monitor, other, plain], fleet)
    assert {t.labels["host"] for t in targets} == {"mon", "other"}
    files = _files(monitor, targets=targets)
    paths = monitoring_paths(monitor)
    config = yaml.safe_load(files[paths["config"]].content)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == ["front", "gpu", "node", "prometheus", "vllm", "vllm-router"]
    assert jobs["vllm"]["authorization"] == {"type": "Bearer", "credentials_file": paths["token"]}
    assert "tls_config" not in jobs["vllm"]  # plain HTTP fronts: no CA to check
    assert config["rule_files"] == [paths["rules"]]
    vllm = json.loads(files[paths["targets_vllm"]].content)
    assert [(e["targets"], e["labels"]["host"]) for e in vllm] == [(["mon:8000"], "mon"), (["other:8000"], "other")]
    assert json.loads(files[paths["targets_vllm-router"]].content) == []
    token = files[paths["token"]]
    assert token.secret and token.mode == "0640" and token.group == "prometheus" and token.content == TOKEN + "\n"
    assert all(TOKEN not in f.content for path, f in files.items() if path not in (paths["token"],
                                                                                    "/etc/vllm-fleet/front-secrets/keys.conf"))
    unit = files[paths["unit"]].content
    assert "--web.listen-address=127.0.0.1:9414" in unit and "User=prometheus" in unit
    assert "--storage.tsdb.retention.time=15d --storage.tsdb.retention.size=10240MB" in unit


def test_tls_fronts_are_scraped_over_https_checked_against_the_hosts_trust():
    monitor = _host("mon", vllm_monitoring=True, vllm_tls=True, **METRICS)
    targets = fleet_targets([monitor], plan_fleet([monitor]))
    files, paths = _files(monitor, targets=targets), monitoring_paths(monitor)
    config = yaml.safe_load(files[paths["config"]].content)
    vllm = next(job for job in config["scrape_configs"] if job["job_name"] == "vllm")
    # Prometheus' own copy of the host's trust: vllm_config_dir is the service user's group's only.
    assert vllm["tls_config"] == {"ca_file": "/etc/vllm-fleet-prometheus/trust.pem"}
    assert files[paths["trust"]].content == files["/etc/vllm-fleet/trust.pem"].content
    assert (files[paths["trust"]].group, files[paths["trust"]].mode) == ("prometheus", "0640")
    assert {t.scheme for t in targets} == {"https"}


def test_render_without_the_fleets_targets_on_the_monitoring_host_is_refused():
    monitor = _host("mon", vllm_monitoring=True, **METRICS)
    with pytest.raises(ValueError, match="monitoring host"):
        render_host(monitor, plan_host(monitor), None)


# --- the front: /metrics with the metrics token only -------------------------------------------------

def test_the_front_passes_metrics_only_with_the_token():
    host = _host(vllm_gateway=True, **METRICS)
    files = _files(host, backends=[])
    conf, keys = files["/etc/vllm-fleet/front.conf"].content, files["/etc/vllm-fleet/front-secrets/keys.conf"].content
    assert 'map $http_authorization $vllm_fleet_metrics_ok {\n    default 0;\n    "~^Bearer\\\\ mt\\\\-abab' in keys
    assert "location = /metrics {" in conf and "proxy_pass http://backend_18000/metrics;" in conf
    for path, upstream in (("/metrics/node", "127.0.0.1:9413/metrics"), ("/metrics/gpu", "127.0.0.1:9411/gpu"),
                           ("/metrics/front", "127.0.0.1:9411/front"), ("/metrics/router", "127.0.0.1:19001/metrics")):
        block = conf.split(f"location = {path} {{")[1].split("}\n        location")[0]
        assert "if ($vllm_fleet_metrics_ok = 0)" in block and "return 401" in block
        assert f"proxy_pass http://{upstream};" in block
        assert 'proxy_set_header Authorization "";' in block  # the token goes no further
    assert "listen 0.0.0.0:9410;" in conf and "listen 127.0.0.1:9412;" in conf and "stub_status;" in conf
    assert "/prometheus/" not in conf  # not the monitoring host


def test_a_render_without_secrets_refuses_every_metrics_request():
    host = _host(**METRICS)
    keys = _files(host, secrets=None)["/etc/vllm-fleet/front-secrets/keys.conf"].content
    block = keys.split("$vllm_fleet_metrics_ok {")[1].split("}")[0]
    assert "default 0;" in block and " 1;" not in block


def test_a_changed_token_changes_the_front_keys_file_only():
    host = _host(**METRICS)
    before, after = _files(host), _files(host, secrets=Secrets("sk-k", host_key="hk-1", metrics_token="mt-other-1"))
    assert {p for p in before if before[p].content != after[p].content} == {"/etc/vllm-fleet/front-secrets/keys.conf"}


def test_the_exporters_listen_on_loopback_and_are_given_the_hosts_paths():
    host = _host(vllm_tls=True, **METRICS)
    files, paths = _files(host), metrics_paths(host)
    exporter = files[paths["exporter_unit"]].content
    assert "--listen 127.0.0.1:9411 --front-status http://127.0.0.1:9412/stub_status" in exporter
    assert f"--storage {host.settings.vllm_hf_home} --storage {host.settings.vllm_models_dir} " in exporter
    assert "--tls-cert /etc/vllm-fleet/front-cert.pem" in exporter and "--vllm-env /opt/vllm-fleet/envs/" in exporter
    assert "User=vllm-exporter" in exporter
    node = files[paths["node_exporter_unit"]].content
    assert "--web.listen-address=127.0.0.1:9413" in node and "User=prometheus" in node
    assert files[paths["exporter"]].content.startswith(("#!", '"""'))


# --- refused input ---------------------------------------------------------------------------------

def test_monitoring_without_metrics_on_its_host_is_refused():
    errors = parse_errors(host_data(vllm_monitoring=True))
    assert [(e.key, e.host) for e in errors] == [("vllm_metrics", "box")]
    assert "vllm_metrics = True" in errors[0].fix


@pytest.mark.parametrize("port, what", [(8000, "vllm_metrics_port 8000"), (7997, "the node exporter's port 8000 (vllm_metrics_port + 3)")])
def test_a_metrics_port_on_an_instance_port_is_refused(port, what):
    errors = parse_errors(host_data(vllm_metrics=True, vllm_metrics_port=port))
    assert [(e.host, e.key) for e in errors] == [("box", "vllm_metrics_port")]
    assert errors[0].message == f"{what} is the port of instance gemma", errors


def test_the_metrics_ports_clash_with_the_gateways_and_the_ports_below_1024_are_refused():
    errors = parse_errors(host_data(vllm_metrics=True, vllm_gateway=True, vllm_gateway_port=9411))
    assert [(e.key, e.message) for e in errors] == [
        ("vllm_metrics_port", "the host exporter's port 9411 (vllm_metrics_port + 1) is vllm_gateway_port")]
    low = parse_errors(host_data(vllm_metrics=True, vllm_metrics_port=80))
    assert [e.key for e in low] == ["vllm_metrics_port"] and "from 1024" in low[0].message


def test_every_monitored_host_reads_the_token_from_one_variable():
    text = fleet_error_text([("a", host_data(vllm_monitoring=True, **METRICS)),
                             ("b", host_data(vllm_metrics_token_env="OTHER_TOKEN", **METRICS,
                                             instances=[{"name": "g2", "model": "google/gemma-3-12b-it-qat-q4_0-gguf",
                                                         "served_model_name": "gemma3-12b-q4", "port": 8001}]))])
    assert "host b, key vllm_metrics_token_env" in text and "$OTHER_TOKEN" in text and "one token" in text


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "127.3.0.9"])
def test_a_monitored_host_at_loopback_is_refused_it_would_be_the_monitor_itself(address):
    text = fleet_error_text([("mon", host_data(vllm_monitoring=True, **METRICS)),
                             ("b", host_data(vllm_advertise_address=address, **METRICS,
                                             instances=[{"name": "g2", "model": "google/gemma-3-12b-it-qat-q4_0-gguf",
                                                         "served_model_name": "gemma3-12b-q4", "port": 8001}]))])
    assert "host b, key vllm_advertise_address" in text and "Prometheus would scrape this host" in text
    assert "on the monitoring host mon that is itself" in text


def test_a_monitor_that_cannot_check_tls_is_refused():
    text = fleet_error_text([("a", host_data(vllm_monitoring=True, **METRICS)),
                             ("b", host_data(vllm_tls=True, **METRICS,
                                             instances=[{"name": "g2", "model": "google/gemma-3-12b-it-qat-q4_0-gguf",
                                                         "served_model_name": "gemma3-12b-q4", "port": 8001}]))])
    assert "host a, key vllm_tls" in text
    assert "without the CAs to check their certificates" in text


def test_the_metrics_token_is_required_checked_and_never_an_api_key(monkeypatch, tmp_path):
    host = _host(**METRICS, vllm_workstation_dir=str(tmp_path))
    monkeypatch.setenv("VLLM_FLEET_API_KEY", "sk-same-1f2e3d4c5b")
    monkeypatch.delenv("VLLM_FLEET_METRICS_TOKEN", raising=False)
    with pytest.raises(DeployError, match=r"no metrics token: \$VLLM_FLEET_METRICS_TOKEN is not set"):
        prepare.read_secrets(host)
    monkeypatch.setenv("VLLM_FLEET_METRICS_TOKEN", "sk-same-1f2e3d4c5b")
    with pytest.raises(DeployError) as same:
        prepare.read_secrets(host)
    assert "has the same value as the fleet's API key" in str(same.value) and "sk-same" not in str(same.value)
    monkeypatch.setenv("VLLM_FLEET_METRICS_TOKEN", " mt-spaced ")
    with pytest.raises(DeployError) as spaced:
        prepare.read_secrets(host)
    assert "vllm_metrics_token_env" in str(spaced.value) and "mt-spaced" not in str(spaced.value)
    monkeypatch.setenv("VLLM_FLEET_METRICS_TOKEN", TOKEN)
    assert prepare.read_secrets(host).metrics_token == TOKEN


def test_the_exporters_packages_are_needed_with_metrics_and_prometheus_on_the_monitor():
    def debian(**flags):
        return [n.debian for n in host_packages.needs("cuda", "3.11", "uv", eager_only=False, **flags)]
    assert "prometheus-node-exporter" not in debian(has_instances=True)
    assert debian(has_instances=True, metrics=True)[:2] == ["nginx", "prometheus-node-exporter"]
    assert debian(has_instances=False, metrics=True, monitoring=True) == ["nginx", "prometheus-node-exporter",
                                                                         "prometheus", "prometheus-alertmanager"]
    assert {"prometheus-node-exporter", "prometheus", "prometheus-alertmanager"} <= set(
        host_packages.every_debian_package("3.11"))


def test_render_writes_the_targets_for_a_prometheus_of_ones_own(tmp_path):
    inventory = tmp_path / "inv.py"
    inventory.write_text("hosts = [('gpu-a', {'ssh_hostname': '10.0.0.9', 'vllm_metrics': True,\n"
                         f"  'gpus': {host_data()['gpus']!r}, 'vllm_instances': {host_data()['vllm_instances']!r}}})]\n")
    result = run_cli("render", str(inventory), "--out", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out" / "@prometheus"
    vllm = json.loads((out / "targets" / "vllm.json").read_text())
    assert vllm[0]["targets"] == ["10.0.0.9:8000"] and vllm[0]["labels"]["host"] == "gpu-a"
    fragment = yaml.safe_load((out / "scrape-configs.yml").read_text())
    assert {job["job_name"] for job in fragment["scrape_configs"]} == {"vllm", "vllm-router", "front", "node", "gpu"}
    assert "scrape targets for your own Prometheus" in result.stdout
