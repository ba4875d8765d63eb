"""Monitoring (vllm_fleet/monitoring/): a host's metrics behind its front, and the one host that
runs the fleet's Prometheus."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_fleet.config.knobs.common import BOOL, INT64_GIB_MAX
from vllm_fleet.config.schema import knob, section


@section("Monitoring: Prometheus, its targets and alerts (docs/monitoring.md)")
@dataclass(frozen=True)
class MonitoringKnobs:
    vllm_metrics: bool = knob(
        False, "True: the fleet's Prometheus scrapes this host, through its front", **BOOL,
        notes="""
        True: this host's metrics are scraped by the fleet's Prometheus, through its front only: vLLM's own
        /metrics on each instance port, and on <vllm_bind_host>:<vllm_metrics_port> /metrics/node (Debian's
        prometheus-node-exporter, installed by the deploy), /metrics/gpu (per GPU: NVML through vLLM's
        vendored pynvml, else nvidia-smi), /metrics/front (nginx's counters, the model storage, the TLS
        certificate's end) and, on the gateway host, /metrics/router (vllm-router). Each needs the metrics
        token (vllm_metrics_token_env, below) as its bearer token: 401 without it. What answers behind the
        front listens on 127.0.0.1 at the ports after vllm_metrics_port (+1 the host exporter, +2 nginx's
        counters, +3 the node exporter, +4 Prometheus, +5 its Alertmanager), not at 9100/9090/9093: exporters the
        host runs keep theirs.
        """)
    vllm_metrics_port: int = knob(
        9410, "the front's metrics listener; it and the 5 after it: no instance's ports", low=1024, high=65530,
        must="a port number from 1024 to 65530 (the 5 ports after it are the exporters' and Alertmanager's, on "
             "127.0.0.1, where their non-root users cannot bind a port below 1024)")
    vllm_monitoring: bool = knob(
        False, "True on the host (or the two hosts) that run the fleet's Prometheus", **BOOL,
        fix="vllm_monitoring = True on the one host (or two) that run the fleet's Prometheus",
        notes="""
        True on ONE host, or on TWO for HA monitoring (three are an error; it needs vllm_metrics too): it
        runs Debian's prometheus package as its own unit (vllm-fleet-prometheus.service, user prometheus) on
        127.0.0.1, reached through its front at <vllm_metrics_port>/prometheus/ (metrics token), scraping
        every vllm_metrics host of the inventory from the targets `vllm-fleet render` also writes (a host
        added or removed changes only those files: Prometheus rereads them, no restart), with the fleet's
        alert rules. With two, each scrapes every target on its own (each keeps its own data) and reads
        the other's view of them: alerts when the other is down or when the two disagree (docs/monitoring.md).
        Beside each, Debian's prometheus-alertmanager (vllm-fleet-alertmanager.service, a user of its own,
        127.0.0.1 only, no cluster port) sends the alerts to vllm_alert_receivers.
        """)
    vllm_monitoring_scrape_interval_s: int = knob(
        15, "seconds between two scrapes of every target", low=1, high=3600,
        must="a number of seconds from 1 to 3600")
    vllm_monitoring_retention_days: int = knob(
        15, "samples older than this are dropped", low=1, high=36500, must="a number of days from 1 to 36500")
    vllm_monitoring_retention_gib: float = knob(
        10.0, "and beyond this size, the oldest first", low=0.01, high=INT64_GIB_MAX,
        must=f"a number of GiB from 0.01 to {INT64_GIB_MAX} (Prometheus counts the size in bytes in an int64)")
    vllm_monitoring_down_for_s: int = knob(
        120, "an instance, exporter or gateway backend down this long: alert", low=0, high=86400,
        must="a number of seconds from 0 to 86400")
    vllm_alert_receivers: dict[str, dict[str, Any]] = knob(
        {}, "who the alerts reach: webhooks, mailboxes; {}: none (status still lists them)",
        kind="a dict of receivers", shallow=True,
        fix='vllm_alert_receivers = {"ops-hook": {"url": "https://hooks.example.org/alertmanager"}}',
        notes="""
        Read on the monitoring host. Every alert goes to every receiver, grouped by alert and host; a host
        down (VllmFleetHostDown) holds back the alerts of that host's instances and targets. Each receiver is
        a webhook or a mailbox:
          vllm_alert_receivers = {
              "ops-hook":    {"url": "https://hooks.example.org/alertmanager", "token_env": "OPS_HOOK_TOKEN"},
              "chat":        {"url_env": "CHAT_WEBHOOK_URL"},
              "oncall-mail": {"to": "oncall@example.org", "from": "alerts@example.org",
                              "smarthost": "mail.example.org:587", "auth_username": "alerts",
                              "password_env": "SMTP_PASSWORD"},
          }
        url: an http(s) URL without user:password or query string (it stands in alertmanager.yml as is);
        url_env: instead, a workstation variable holding the whole URL (one with a token in it: a secret);
        token_env: a workstation variable holding a bearer token Alertmanager sends (Authorization: Bearer).
        to / from: one address each; smarthost: host:port of the relay (STARTTLS unless require_tls is
        False); auth_username with password_env: its login, the password from the workstation. Secrets are
        read like the API keys (never in the inventory, a unit, argv or a diff) and reach only
        Alertmanager: its config is a root-only file systemd hands to the unit alone (LoadCredential).
        """)
    vllm_alert_group_wait_s: int = knob(
        30, "seconds Alertmanager waits to gather a new group's alerts into one message", low=0, high=3600,
        must="a number of seconds from 0 to 3600")
    vllm_alert_group_interval_s: int = knob(
        300, "seconds between two messages about one group's changes (new alerts, resolved ones)", low=1,
        high=86400, must="a number of seconds from 1 to 86400")
    vllm_alert_repeat_interval_s: int = knob(
        14400, "seconds before a group still firing is sent again", low=60, high=2592000,
        must="a number of seconds from 60 to 2592000 (30 days)")
