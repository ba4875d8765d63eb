"""The monitoring files a host gets. Pure: strings in, strings out (the exporter's text is its
payload's modules bundled, vllm_fleet.payloads.EXPORTER, never imported).

On every vllm_metrics host (host_metrics_files):

    <vllm_config_dir>/host-exporter.py                  the host exporter (vllm_fleet/payloads/exporter)
    /etc/systemd/system/vllm-fleet-exporter.service     runs it as the service user, on 127.0.0.1
    /etc/systemd/system/vllm-fleet-node-exporter.service  Debian's prometheus-node-exporter, on 127.0.0.1

On the monitoring host (vllm_monitoring; prometheus_files):

    /etc/systemd/system/vllm-fleet-prometheus.service   Debian's prometheus, as its user, on 127.0.0.1
    /etc/systemd/system/vllm-fleet-alertmanager.service Debian's prometheus-alertmanager, a user of its own
    <vllm_config_dir>-prometheus/alertmanager.yml       its routes and receivers (secret; root 0600:
                                                        systemd hands it to the unit, alerting.py)
    <vllm_config_dir>-prometheus/prometheus.yml         the scrape jobs (targets.prometheus_config)
    <vllm_config_dir>-prometheus/rules.yml              the alert rules (rules.alert_rules)
    <vllm_config_dir>-prometheus/targets/<job>.json     every job's targets (targets.file_sd)
    <vllm_config_dir>-prometheus/metrics-token          the metrics token (secret; root:prometheus 0640)
    <vllm_config_dir>-prometheus/trust.pem              with TLS: the CAs that check the fronts

A directory of its own, root:prometheus: vllm_config_dir is the service user's group's only (0750).

What changes what: the exporter's or a unit's text restarts its unit; prometheus.yml or the rules
reload Prometheus (SIGHUP); a target list changes nothing else (Prometheus rereads it);
alertmanager.yml or its unit restart Alertmanager (its config is a copy systemd makes at the start).
"""

from __future__ import annotations

import math
from functools import partial

from vllm_fleet import payloads
from vllm_fleet.config import HostConfig, monitoring_ports
from vllm_fleet.host_layout import (ALERTMANAGER_UNIT, EXPORTER_UNIT, NODE_EXPORTER_UNIT, PROMETHEUS_UNIT,
                                    host_layout)
from vllm_fleet.plan import HostPlan
from vllm_fleet.templating import RenderedFile, front_paths, jinja_environment

from . import alerting, rules
from .targets import JOBS, PEER_JOB, PROMETHEUS_PREFIX, ScrapeTarget, file_sd, prometheus_config

MONITORING_UNITS = (EXPORTER_UNIT, NODE_EXPORTER_UNIT, PROMETHEUS_UNIT, ALERTMANAGER_UNIT)
#: Debian's own units of these packages, by the need that installs them: they listen on every
#: interface without a token, so a deploy that installs a package masks its unit first (the
#: package's postinst would start it). One the host had before is left alone.
STOCK_UNITS = {"node_exporter": "prometheus-node-exporter.service", "prometheus": "prometheus.service",
               "alertmanager": "prometheus-alertmanager.service"}
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"
PROMETHEUS_USER = "prometheus"  # made by both Debian packages
PROMETHEUS_STATE = "vllm-fleet-prometheus"  # /var/lib/<this>: the TSDB (StateDirectory=)
SYSTEM_PYTHON = "/usr/bin/python3"  # the exporter needs the standard library only
TOKEN_PLACEHOLDER = "placeholder: the deploy writes the metrics token here\n"


def exporter_source() -> str:
    """The exporter's text, as the host gets it: one script, its payload's modules bundled."""
    return payloads.script(payloads.EXPORTER)


def metrics_paths(config: HostConfig) -> dict[str, str]:
    """HostLayout.metrics of the host."""
    return host_layout(config).metrics


def monitoring_paths(config: HostConfig) -> dict[str, str]:
    """HostLayout.monitoring of the host."""
    return host_layout(config).monitoring


def monitoring_unit_files(config: HostConfig) -> dict[str, list[str]]:
    """Each monitoring unit's files, its unit file last (how a later run finds what is left)."""
    metrics, prometheus = metrics_paths(config), monitoring_paths(config)
    return {EXPORTER_UNIT: [metrics["exporter"], metrics["exporter_unit"]],
            NODE_EXPORTER_UNIT: [metrics["node_exporter_unit"]],
            PROMETHEUS_UNIT: [prometheus["config"], prometheus["rules"], prometheus["token"], prometheus["trust"],
                              *[prometheus[f"targets_{job}"] for job in JOBS], prometheus["unit"]],
            ALERTMANAGER_UNIT: [prometheus["alertmanager_config"], prometheus["alertmanager_unit"]]}


def exporter_command(config: HostConfig, env_prefix: str | None) -> str:
    """The exporter's ExecStart=: what it reads, each path checked by the config (no quoting needed)."""
    settings, ports = config.settings, monitoring_ports(config.settings)
    parts = [SYSTEM_PYTHON, "-I", metrics_paths(config)["exporter"], "--listen", f"127.0.0.1:{ports['exporter']}",
             "--front-status", f"http://127.0.0.1:{ports['stub_status']}/stub_status"]
    for path in sorted({settings.vllm_models_dir, settings.vllm_hf_home}):
        parts += ["--storage", path]
    if settings.vllm_tls is True:
        parts += ["--tls-cert", front_paths(config)["tls_cert"]]
    if env_prefix:
        parts += ["--vllm-env", env_prefix]
    return " ".join(parts)


def host_metrics_files(config: HostConfig, plan: HostPlan, env_prefix: str | None) -> list[RenderedFile]:
    """A vllm_metrics host's exporter and its node exporter (none without vllm_metrics).
    `env_prefix`: the host's vLLM environment, whose vendored pynvml the exporter loads (None: the
    host has none)."""
    if config.settings.vllm_metrics is not True:
        return []
    paths, jenv = metrics_paths(config), jinja_environment()
    nvml_env = env_prefix if plan.instances else None  # vLLM is installed where it serves
    context = {"host": config, "ports": monitoring_ports(config.settings), "bind": config.settings.vllm_bind_host}
    exporter_unit = jenv.get_template("host-exporter.service.j2").render(
        **context, script=paths["exporter"], env_prefix=nvml_env or "(no vLLM here)",
        command=exporter_command(config, nvml_env))
    node_unit = jenv.get_template("node-exporter.service.j2").render(**context, binary=NODE_EXPORTER)
    return [RenderedFile(paths["exporter"], exporter_source()),
            RenderedFile(paths["exporter_unit"], exporter_unit),
            RenderedFile(paths["node_exporter_unit"], node_unit)]


def prometheus_files(config: HostConfig, targets: list[ScrapeTarget], metrics_token: str | None,
                     placeholders: bool, trust_pem: str | None = None,
                     alert_secrets: alerting.AlertSecrets | None = None) -> list[RenderedFile]:
    """The monitoring host's Prometheus: unit, config, rules, every job's targets and the token file
    (a placeholder when `placeholders`: vllm-fleet render knows no secret); its Alertmanager's config
    and unit. `trust_pem`: the CAs the host trusts (its front's trust.pem, vllm_tls), with which
    Prometheus checks the fronts' HTTPS; `alert_secrets`: the receivers' secrets (alerting.py)."""
    settings, paths = config.settings, monitoring_paths(config)
    https = any(t.scheme == "https" for t in targets)
    ca_file = paths["trust"] if https else None
    peers = [t for t in targets if t.job == PEER_JOB and t.labels.get("host") != config.name]
    unit = jinja_environment().get_template("prometheus.service.j2").render(
        host=config, ports=monitoring_ports(settings), bind=settings.vllm_bind_host, prefix=PROMETHEUS_PREFIX,
        targets_dir=paths["targets_dir"], config_file=paths["config"], binary=PROMETHEUS, promtool=PROMTOOL,
        state_dir_name=PROMETHEUS_STATE, retention_days=settings.vllm_monitoring_retention_days,
        retention_mib=math.ceil(settings.vllm_monitoring_retention_gib * 1024))
    config_text = prometheus_config(config, targets_dir=paths["targets_dir"], rules_file=paths["rules"],
                                    token_file=paths["token"], ca_file=ca_file, peers=peers,
                                    alertmanager=alerting.alertmanager_url(config))
    rules_text = rules.alert_rules(settings.vllm_monitoring_down_for_s, tls=ca_file is not None)
    token = TOKEN_PLACEHOLDER if placeholders or not metrics_token else metrics_token + "\n"
    group_file = partial(RenderedFile, group=PROMETHEUS_USER, mode="0640")
    trust = [group_file(paths["trust"], trust_pem or "# placeholder: the CAs the host trusts\n")] if https else []
    return [RenderedFile(paths["unit"], unit),
            *trust,
            group_file(paths["config"], config_text),
            group_file(paths["rules"], rules_text),
            *[group_file(paths[f"targets_{job}"], file_sd(targets, job)) for job in JOBS],
            group_file(paths["token"], token, secret=not placeholders),
            RenderedFile(paths["alertmanager_config"],
                         alerting.alertmanager_config(config, None if placeholders else alert_secrets or {}),
                         mode="0600", secret=not placeholders),
            RenderedFile(paths["alertmanager_unit"], alerting.alertmanager_unit(config, paths["alertmanager_config"]))]
