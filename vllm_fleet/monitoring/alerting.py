"""The fleet's Alertmanager: its config (alertmanager.yml) and unit, rendered. Pure: strings in,
strings out.

Alertmanager (Debian's prometheus-alertmanager) runs beside the fleet's Prometheus on the monitoring
host, as vllm-fleet-alertmanager.service: a user of its own (systemd's DynamicUser), its state in
/var/lib/vllm-fleet-alertmanager, on 127.0.0.1 only, without the cluster listener (gossip to peers it
does not have, on every interface, by default). Its config holds the receivers' secrets (a webhook's
URL or bearer token, the smarthost's password), so it is a root-only file the unit gets through
systemd's LoadCredential: only Alertmanager's process reads it, as a copy systemd makes at each start
(a changed config restarts the unit; Prometheus resends every alert still firing).

Every alert goes to every receiver, grouped by alert name and host. A host down (VllmFleetHostDown:
every target of the host down at once) holds back each other alert with that host's label: one
message says the host is gone, not one per instance and exporter on it.

Example:

    text = alertmanager_config(config, secrets=None)   # placeholders where the secrets go
"""

from __future__ import annotations

import yaml

from vllm_fleet.config import HostConfig, monitoring_ports
from vllm_fleet.config.alert_receivers import NO_RECEIVER, AlertReceiver
from vllm_fleet.host_layout import ALERTMANAGER_UNIT
from vllm_fleet.templating import jinja_environment

from .rules import prometheus_duration

ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
AMTOOL = "/usr/bin/amtool"
ALERTMANAGER_STATE = "vllm-fleet-alertmanager"  # /var/lib/<this>: silences, the notification log
#: The credential's name: the unit reads the config from $CREDENTIALS_DIRECTORY/<this>.
CONFIG_CREDENTIAL = "alertmanager.yml"
#: Where systemd puts the unit's credentials (the value of %d in its unit).
CREDENTIALS_DIR = f"/run/credentials/{ALERTMANAGER_UNIT}"
#: The alert that holds back the others of its host, and the label they share.
HOST_DOWN_ALERT = "VllmFleetHostDown"
GROUP_BY = ("alertname", "host")
#: What `vllm-fleet render` shows where a secret goes (it knows none): values Alertmanager accepts,
#: so that `amtool check-config` reads the rendered file as it reads the deployed one.
PLACEHOLDER_URL = "https://secret.invalid/filled-in-at-deploy-time"
PLACEHOLDER_SECRET = "placeholder-filled-in-at-deploy-time"

#: A receiver's secrets, by (receiver name, key): key is url_env, token_env or password_env.
AlertSecrets = dict[tuple[str, str], str]


def inhibit_rules() -> list[dict]:
    """A host down inhibits every other alert of that host (its instances', its targets', its units')."""
    return [{"source_matchers": [f'alertname="{HOST_DOWN_ALERT}"'],
             "target_matchers": [f'alertname!="{HOST_DOWN_ALERT}"'],
             "equal": ["host"]}]


def _secret(secrets: AlertSecrets | None, receiver: AlertReceiver, key: str, placeholder: str) -> str:
    return placeholder if secrets is None else secrets[(receiver.name, key)]


def receiver_config(receiver: AlertReceiver, secrets: AlertSecrets | None) -> dict:
    """One receiver as alertmanager.yml holds it; `secrets` None: placeholders (vllm-fleet render)."""
    if receiver.kind == "webhook":
        url = receiver.url or _secret(secrets, receiver, "url_env", PLACEHOLDER_URL)
        hook: dict = {"url": url, "send_resolved": True}
        if receiver.token_env:
            hook["http_config"] = {"authorization": {
                "type": "Bearer", "credentials": _secret(secrets, receiver, "token_env", PLACEHOLDER_SECRET)}}
        return {"name": receiver.name, "webhook_configs": [hook]}
    mail: dict = {"to": receiver.to, "from": receiver.sender, "smarthost": receiver.smarthost,
                  "require_tls": receiver.require_tls, "send_resolved": True}
    if receiver.auth_username:
        mail["auth_username"] = receiver.auth_username
        mail["auth_password"] = _secret(secrets, receiver, "password_env", PLACEHOLDER_SECRET)
    return {"name": receiver.name, "email_configs": [mail]}


def alertmanager_config(config: HostConfig, secrets: AlertSecrets | None) -> str:
    """alertmanager.yml of the monitoring host: one route to every receiver, grouped by alert and
    host, and the host-down inhibition. `secrets`: every receiver's secret values (None: placeholders)."""
    settings = config.settings
    receivers = config.alert_receivers
    route: dict = {"receiver": NO_RECEIVER, "group_by": list(GROUP_BY),
                   "group_wait": prometheus_duration(settings.vllm_alert_group_wait_s),
                   "group_interval": prometheus_duration(settings.vllm_alert_group_interval_s),
                   "repeat_interval": prometheus_duration(settings.vllm_alert_repeat_interval_s)}
    if receivers:
        # A route without matchers takes every alert; `continue` passes it on to the next receiver too.
        route["routes"] = [{"receiver": r.name, "continue": True} for r in receivers]
    document = {"route": route, "inhibit_rules": inhibit_rules(),
                "receivers": [{"name": NO_RECEIVER}, *[receiver_config(r, secrets) for r in receivers]]}
    header = (f"# Managed by vllm-fleet: the fleet's Alertmanager on {config.name} (vllm_alert_receivers).\n"
              "# Root's alone: systemd hands it to the unit (LoadCredential); it holds the receivers' secrets.\n")
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=False)


def alertmanager_unit(config: HostConfig, config_file: str) -> str:
    """vllm-fleet-alertmanager.service: Alertmanager on 127.0.0.1 at vllm_metrics_port + 5."""
    return jinja_environment().get_template("alertmanager.service.j2").render(
        host=config, port=monitoring_ports(config.settings)["alertmanager"], binary=ALERTMANAGER, amtool=AMTOOL,
        config_file=config_file, credential=CONFIG_CREDENTIAL, state_dir_name=ALERTMANAGER_STATE)


def alertmanager_url(config: HostConfig) -> str:
    """Where Prometheus (and `vllm-fleet status`, on the host) reach Alertmanager."""
    return f"127.0.0.1:{monitoring_ports(config.settings)['alertmanager']}"
