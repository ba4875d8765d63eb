"""Every scrape target of the fleet, from the same plans as the deploy, and the Prometheus config
that reads them. Pure: no I/O.

A host with vllm_metrics is scraped through its front only (nginx checks the metrics token):

    job          where                                         what answers behind the front
    vllm         <address>:<instance port>/metrics             that instance's vLLM
    node         <address>:<vllm_metrics_port>/metrics/node    prometheus-node-exporter (127.0.0.1)
    front        <address>:<vllm_metrics_port>/metrics/front   the host exporter: nginx's counters, storage, TLS
    gpu          <address>:<vllm_metrics_port>/metrics/gpu     the host exporter: every GPU (hosts with GPUs)
    vllm-router  <address>:<vllm_metrics_port>/metrics/router  vllm-router (the gateway host)

With two monitoring hosts (vllm_monitoring on both: the fleet's HA monitoring), each scrapes every
target above on its own (each keeps its own data), and the other's `up` of them (PEER_JOB):

    prometheus-peer  <address>:<vllm_metrics_port>/prometheus/federate   the other Prometheus' `up`,
                                                                          renamed PEER_UP (peer_scrape_job)

so that each can say when the other is down, and when the two disagree about a target (the rules
VllmFleetMonitoringPeerDown and VllmFleetMonitorsDisagree).

Each job's targets are one Prometheus file_sd list (JSON); a target's labels say which host (the
inventory name), which instance and which served model it is, and carry its scheme and path
(`__scheme__`, `__metrics_path__`), so prometheus.yml names only the files. A host added or removed
changes those files alone, which Prometheus rereads by itself: no reload, no restart.

Example:

    fleet = Fleet.load("inventory/prod.py")
    targets = fleet_targets(fleet.hosts(), fleet.plan())
    print(file_sd(targets, "vllm"))
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import yaml

from vllm_fleet.config import HostConfig, monitoring_ports
from vllm_fleet.host_layout import SCRAPE_JOBS
from vllm_fleet.plan import FleetPlan, HostPlan

#: Jobs in the order prometheus.yml lists them.
JOBS = SCRAPE_JOBS
#: Where each host-level job is on the front's metrics listener.
METRICS_PATHS = {"node": "/metrics/node", "front": "/metrics/front", "gpu": "/metrics/gpu",
                 "vllm-router": "/metrics/router"}
#: Prometheus' own path: it serves under /prometheus/ (so the front can pass that prefix on).
PROMETHEUS_PREFIX = "/prometheus"
#: The job that reads the other monitoring host's Prometheus (two monitoring hosts only): not a
#: file_sd list (each monitoring host has its own peer), a static job in prometheus.yml.
PEER_JOB = "prometheus-peer"
#: What the other Prometheus' `up` of each target is called here (its labels kept as they were).
PEER_UP = "vllm_fleet_peer_up"


@dataclass(frozen=True)
class ScrapeTarget:
    """One target: a job, the address Prometheus dials, and the labels its series get."""

    job: str
    address: str  # host:port (IPv6 in brackets)
    scheme: str  # http or https (vllm_tls)
    path: str
    labels: dict[str, str] = field(default_factory=dict)

    def file_sd_entry(self) -> dict:
        return {"targets": [self.address],
                "labels": {"__scheme__": self.scheme, "__metrics_path__": self.path, **self.labels}}


def _address(config: HostConfig, port: int) -> str:
    address = config.settings.vllm_advertise_address or config.name
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def host_targets(config: HostConfig, plan: HostPlan) -> list[ScrapeTarget]:
    """The targets of one host: none without vllm_metrics. Its GPUs only where the plan has GPUs."""
    settings = config.settings
    if settings.vllm_metrics is not True:
        return []
    scheme = "https" if settings.vllm_tls is True else "http"
    host = {"host": config.name}
    out = [ScrapeTarget("vllm", _address(config, inst.port), scheme, "/metrics",
                        {**host, "vllm_instance": inst.name, "served_model": inst.config.served_model_name})
           for inst in plan.instances]
    metrics = _address(config, monitoring_ports(settings)["metrics"])
    jobs = ["node", "front"]
    if plan.gpus:
        jobs.append("gpu")
    if settings.vllm_gateway is True:
        jobs.append("vllm-router")
    out += [ScrapeTarget(job, metrics, scheme, METRICS_PATHS[job], dict(host)) for job in jobs]
    return out


def fleet_targets(configs: list[HostConfig], fleet_plan: FleetPlan) -> list[ScrapeTarget]:
    """Every host's targets, in inventory order; with two monitoring hosts, then each one's Prometheus
    as the other's peer (peer_targets)."""
    by_name = {c.name: c for c in configs}
    return ([t for p in fleet_plan.hosts if p.name in by_name for t in host_targets(by_name[p.name], p)]
            + peer_targets(configs))


def peer_targets(configs: list[HostConfig]) -> list[ScrapeTarget]:
    """Each monitoring host's Prometheus, through its front's metrics listener (the metrics token),
    labelled with its host: a monitoring host scrapes the others' (prometheus_config). None with one."""
    monitors = [c for c in configs if c.settings.vllm_monitoring is True]
    if len(monitors) < 2:
        return []
    return [ScrapeTarget(PEER_JOB, _address(c, monitoring_ports(c.settings)["metrics"]),
                         "https" if c.settings.vllm_tls is True else "http", f"{PROMETHEUS_PREFIX}/federate",
                         {"host": c.name}) for c in monitors]


def peer_scrape_job(peers: list[ScrapeTarget], *, token_file: str, ca_file: str | None) -> dict:
    """The job reading the other Prometheus' `up` of every target (its /federate, the metrics token),
    renamed PEER_UP with its own labels (honor_labels): `up{job="prometheus-peer"}` says whether the
    other answers, PEER_UP what it sees. Its own self-scrape and its view of us are left out."""
    job: dict = {"job_name": PEER_JOB, "honor_labels": True, "metrics_path": peers[0].path,
                 "scheme": peers[0].scheme,
                 "params": {"match[]": [f'up{{job!~"prometheus|{PEER_JOB}"}}']},
                 "authorization": {"type": "Bearer", "credentials_file": token_file}}
    if ca_file:
        job["tls_config"] = {"ca_file": ca_file}
    job["static_configs"] = [{"targets": [t.address], "labels": dict(t.labels)} for t in peers]
    job["metric_relabel_configs"] = [{"source_labels": ["__name__"], "regex": "up", "target_label": "__name__",
                                      "replacement": PEER_UP}]
    return job


def file_sd(targets: list[ScrapeTarget], job: str) -> str:
    """One job's file_sd list (Prometheus' JSON form), in a stable order."""
    entries = [t.file_sd_entry() for t in targets if t.job == job]
    return json.dumps(entries, indent=2, sort_keys=True) + "\n"


def scrape_jobs(*, targets_dir: str, token_file: str, ca_file: str | None, interval_s: int | None) -> list[dict]:
    """One scrape job per file_sd list, each with the metrics token (read from `token_file`: never in
    the config) and, with TLS, the CAs that check the fronts' certificates (`ca_file`). `interval_s`:
    the scrape interval, which bounds each scrape's timeout (None: Prometheus' own global timeout)."""
    jobs = []
    for job in JOBS:
        scrape: dict = {"job_name": job}
        if interval_s is not None:  # a scrape may take at most the interval (Prometheus refuses more)
            scrape["scrape_timeout"] = f"{min(10, interval_s)}s"
        scrape.update({"authorization": {"type": "Bearer", "credentials_file": token_file},
                       "file_sd_configs": [{"files": [f"{targets_dir}/{job}.json"]}]})
        if ca_file:
            scrape["tls_config"] = {"ca_file": ca_file}
        jobs.append(scrape)
    return jobs


def prometheus_config(monitor: HostConfig, *, targets_dir: str, rules_file: str, token_file: str,
                      ca_file: str | None, peers: Sequence[ScrapeTarget] = (),
                      alertmanager: str | None = None) -> str:
    """prometheus.yml of the monitoring host: Prometheus itself, then scrape_jobs; with `peers` (the
    other monitoring host's Prometheus), peer_scrape_job; its alerts go to `alertmanager` (host:port on
    the loopback; None: nowhere)."""
    settings = monitor.settings
    interval = f"{settings.vllm_monitoring_scrape_interval_s}s"
    own = monitoring_ports(settings)["prometheus"]
    jobs = [{"job_name": "prometheus", "metrics_path": f"{PROMETHEUS_PREFIX}/metrics",
             "static_configs": [{"targets": [f"127.0.0.1:{own}"], "labels": {"host": monitor.name}}]}]
    jobs += scrape_jobs(targets_dir=targets_dir, token_file=token_file, ca_file=ca_file,
                        interval_s=settings.vllm_monitoring_scrape_interval_s)
    if peers:
        jobs.append(peer_scrape_job(list(peers), token_file=token_file, ca_file=ca_file))
    config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
              "rule_files": [rules_file], "scrape_configs": jobs}
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    header = (f"# Managed by vllm-fleet: the fleet's Prometheus on {monitor.name}. Targets: {targets_dir}/<job>.json\n"
              "# (rewritten by each deploy; Prometheus rereads them by itself).\n")
    return header + yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
