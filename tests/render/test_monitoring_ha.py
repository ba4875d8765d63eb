"""Two monitoring hosts (HA monitoring), offline: each Prometheus scrapes every target on its own and
reads the other's `up` (its /federate, through the other's front with the metrics token), checked by
promtool; what is refused (a third, two that disagree on TLS, a monitoring host the other could not
reach); one monitoring host renders as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from support import real_tool_checks as tools
from support.debian_tool import ToolUnavailable
from support.planning_fixtures import fleet_error_text, host_data, instance
from vllm_fleet.config import parse_host
from vllm_fleet.monitoring.files import monitoring_paths
from vllm_fleet.monitoring.targets import PEER_JOB, PEER_UP, fleet_targets
from vllm_fleet.plan import plan_fleet
from vllm_fleet.render import Secrets, render_host

TOKEN = "mt-" + "cd" * 16
METRICS = {"vllm_metrics": True}


def _instance(name: str, port: int) -> list[dict]:
    return [instance(name=name, served_model_name=f"m-{name}", port=port)]


def fleet(**both):
    hosts = [parse_host("mon1", host_data(vllm_monitoring=True, vllm_advertise_address="10.0.0.31", **METRICS, **both)),
             parse_host("mon2", host_data(vllm_monitoring=True, vllm_advertise_address="10.0.0.32", **METRICS,
                                          instances=_instance("b", 8001), **both)),
             parse_host("box", host_data(vllm_advertise_address="10.0.0.33", **METRICS, instances=_instance("c", 8002),
                                         **both))]
    plan = plan_fleet(hosts)
    return hosts, plan, fleet_targets(hosts, plan)


def rendered(name: str, **both) -> dict:
    hosts, plan, targets = fleet(**both)
    index = [h.name for h in hosts].index(name)
    return {f.path: f for f in render_host(hosts[index], plan.hosts[index],
                                           Secrets("sk-k", host_key="hk-1", metrics_token=TOKEN), targets=targets)}


def config_of(name: str, **both) -> dict:
    files = rendered(name, **both)
    return yaml.safe_load(files[monitoring_paths(parse_host(name, host_data()))["config"]].content)


def test_each_monitoring_host_scrapes_every_target_and_reads_the_others_up_not_its_own():
    for own, peer, address in (("mon1", "mon2", "10.0.0.32:9410"), ("mon2", "mon1", "10.0.0.31:9410")):
        files = rendered(own)
        paths = monitoring_paths(parse_host(own, host_data()))
        vllm = json.loads(files[paths["targets_vllm"]].content)
        assert {e["labels"]["host"] for e in vllm} == {"box", "mon1", "mon2"}  # each its own data, all of it
        jobs = {job["job_name"]: job for job in yaml.safe_load(files[paths["config"]].content)["scrape_configs"]}
        assert sorted(jobs) == sorted(["front", "gpu", "node", "prometheus", "vllm", "vllm-router", PEER_JOB])
        peer_job = jobs[PEER_JOB]
        assert peer_job["static_configs"] == [{"targets": [address], "labels": {"host": peer}}]
        assert peer_job["metrics_path"] == "/prometheus/federate" and peer_job["scheme"] == "http"
        assert peer_job["params"] == {"match[]": ['up{job!~"prometheus|prometheus-peer"}']}
        assert peer_job["authorization"] == {"type": "Bearer", "credentials_file": paths["token"]}
        assert peer_job["honor_labels"] is True  # the other's series keep their job, instance and host
        assert peer_job["metric_relabel_configs"] == [{"source_labels": ["__name__"], "regex": "up",
                                                       "target_label": "__name__", "replacement": PEER_UP}]
        assert all(TOKEN not in f.content for p, f in files.items() if p != paths["token"]
                   and f.path != "/etc/vllm-fleet/front-secrets/keys.conf")


def test_over_tls_the_peer_is_read_over_https_checked_with_the_hosts_cas():
    config = config_of("mon1", vllm_tls=True)
    peer_job = next(job for job in config["scrape_configs"] if job["job_name"] == PEER_JOB)
    trust = monitoring_paths(parse_host("mon1", host_data()))["trust"]
    assert peer_job["scheme"] == "https" and peer_job["tls_config"] == {"ca_file": trust}


def test_one_monitoring_host_has_no_peer_job_and_the_same_config_as_before():
    hosts = [parse_host("mon1", host_data(vllm_monitoring=True, vllm_advertise_address="10.0.0.31", **METRICS)),
             parse_host("box", host_data(vllm_advertise_address="10.0.0.33", **METRICS, instances=_instance("c", 8002)))]
    plan = plan_fleet(hosts)
    targets = fleet_targets(hosts, plan)
    assert PEER_JOB not in {t.job for t in targets}
    files = {f.path: f for f in render_host(hosts[0], plan.hosts[0], Secrets("sk-k", host_key="hk-1",
                                                                              metrics_token=TOKEN), targets=targets)}
    assert PEER_JOB not in files[monitoring_paths(hosts[0])["config"]].content


def test_promtool_accepts_both_monitoring_hosts_configs_and_rules(tmp_path):
    hosts, plan, targets = fleet()
    for index, host in enumerate(hosts[:2]):
        root = tmp_path / host.name
        tools.place(root, render_host(host, plan.hosts[index], Secrets("sk-k", host_key="hk-1", metrics_token=TOKEN),
                                      targets=targets))
        try:
            assert tools.promtool_problems(root, host) == ("", "")
        except ToolUnavailable as exc:
            pytest.skip(str(exc))
    # promtool refuses a broken peer job (so its pass above means something).
    config = Path(root, monitoring_paths(hosts[1])["config"].lstrip("/"))
    config.write_text(config.read_text().replace("honor_labels: true", "honor_labels: maybe"))
    assert "cannot unmarshal !!str `maybe` into bool" in tools.promtool_problems(root, hosts[1])[0]


# --- refused --------------------------------------------------------------------------------------

def test_a_third_monitoring_host_is_refused_naming_it_with_the_fix():
    text = fleet_error_text([
        ("a", host_data(vllm_monitoring=True, **METRICS)),
        ("b", host_data(vllm_monitoring=True, **METRICS, instances=_instance("b", 8001))),
        ("c", host_data(vllm_monitoring=True, **METRICS, instances=_instance("c", 8002)))])
    assert "host c, key vllm_monitoring" in text and "a fleet has one Prometheus, or two" in text
    assert "host b, key vllm_monitoring" not in text


def test_two_monitoring_hosts_that_disagree_on_tls_are_refused():
    text = fleet_error_text([
        ("a", host_data(vllm_monitoring=True, vllm_tls=True, **METRICS)),
        ("b", host_data(vllm_monitoring=True, vllm_tls=False, **METRICS, instances=_instance("b", 8001)))])
    assert "host b, key vllm_tls" in text and "the two scrape the same fronts and each other" in text


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_a_monitoring_host_at_loopback_is_refused_since_the_other_scrapes_it(address):
    text = fleet_error_text([
        ("a", host_data(vllm_monitoring=True, vllm_advertise_address=address, **METRICS)),
        ("b", host_data(vllm_monitoring=True, vllm_advertise_address="10.0.0.32", **METRICS,
                        instances=_instance("b", 8001)))])
    assert "host a, key vllm_advertise_address" in text and "on the monitoring host b that is itself" in text


def test_the_plan_names_both_monitoring_hosts(tmp_path):
    from support.planning_fixtures import run_cli

    hosts = [("mon1", host_data(vllm_monitoring=True, vllm_advertise_address="10.0.0.31", **METRICS)),
             ("mon2", host_data(vllm_monitoring=True, vllm_advertise_address="10.0.0.32", **METRICS,
                                instances=_instance("b", 8001)))]
    (tmp_path / "inv.py").write_text(f"hosts = {hosts!r}\n")
    result = run_cli("plan", "inv.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "monitoring: Prometheus on mon1 at http://10.0.0.31:9410/prometheus/" in result.stdout
    assert "; and on mon2, each scraping the same and the other (HA)" in result.stdout


def test_the_peers_up_is_named_where_the_rules_check_their_names():
    from vllm_fleet.monitoring import metric_names

    assert PEER_UP in metric_names.SYNTHETIC and metric_names.source_of(PEER_UP) is None
