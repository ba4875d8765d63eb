"""What the fleet will be, from its hosts' declared data: each host's endpoints with their scheme, its
instances (unit, port, served name), the gateway, the monitoring host and the clients with their
models and limits. `vllm-fleet check` and `vllm-fleet plan` print it; `plan --json` holds it under
"fleet_summary". Pure: no plan is needed (the ports and names are declared), no file is read.

Every text in it passed the input boundary (config: names, served names, paths), so it is printed
as it is; a key's source is named, never a key. A key file's path is shown through the caller's
`show_path` (workstation_files.shown: only when something is there, since a key pasted where its
file's path belongs can look like a path), and not at all without one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from vllm_fleet.config import HostConfig, instance_unit
from vllm_fleet.config.clients import FLEET_KEY_CLIENT, ApiClient
from vllm_fleet.gateway import gateway_url, url_host
from vllm_fleet.monitoring.targets import PROMETHEUS_PREFIX


def _scheme(config: HostConfig) -> str:
    return "https" if config.settings.vllm_tls is True else "http"


def _client(client: ApiClient, hosts: list[str], show_path: Callable[[str], str] | None) -> dict[str, Any]:
    path = show_path(client.key_file) if show_path and client.key_file else "(path not shown)"
    return {"name": client.name,
            "key_source": f"${client.key_env}" if client.key_env else f"file {path}",
            "models": list(client.models) if client.models is not None else None,
            "requests_per_minute": client.requests_per_minute, "hosts": hosts}


def fleet_summary(hosts: list[HostConfig], every: list[HostConfig] | None = None,
                  show_path: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The summary of `hosts` (a --limit's, or the whole inventory); `every`: every host of the
    inventory that parses, where the gateway and the monitoring host are found whatever the limit;
    `show_path`: how a key file's path is shown (not at all without it)."""
    every = every if every is not None else hosts
    out: dict[str, Any] = {"hosts": [], "gateway": None, "monitoring": None, "clients": []}
    gateway = next((c for c in every if c.settings.vllm_gateway is True), None)
    for config in hosts:
        settings, scheme = config.settings, _scheme(config)
        address = url_host(settings.vllm_advertise_address)
        # With a gateway, an instance port takes /v1/ from the gateway host only unless the host opens it.
        gateway_only = gateway is not None and settings.vllm_direct_access is not True
        entry = {"name": config.name, "scheme": scheme, "address": settings.vllm_advertise_address,
                 "instances": [{"name": inst.name, "unit": instance_unit(inst.name), "port": inst.port,
                                "served_model_name": inst.served_model_name,
                                "adapters": [adapter.name for adapter in inst.adapters],
                                "url": f"{scheme}://{address}:{inst.port}/v1", "gateway_only": gateway_only,
                                "nodes": list(inst.nodes) if inst.nodes else None}
                               for inst in config.instances],
                 "node_of": [{"instance": inst.name, "head": inst.head} for inst in config.member_of],
                 "gateway": settings.vllm_gateway is True, "metrics": settings.vllm_metrics is True,
                 "monitoring": settings.vllm_monitoring is True}
        out["hosts"].append(entry)
    if gateway is not None:
        out["gateway"] = {"host": gateway.name, "url": gateway_url(gateway), "scheme": _scheme(gateway),
                          # every gateway behind the floating address (vllm_gateway_address), in inventory order
                          "hosts": [c.name for c in every if c.settings.vllm_gateway is True],
                          "floating_address": gateway.settings.vllm_gateway_address,
                          "models": sorted({name for c in every for i in c.instances
                                            for name in (i.served_model_name, *(a.name for a in i.adapters))})}
    monitor = next((c for c in every if c.settings.vllm_monitoring is True), None)
    if monitor is not None:
        url = (f"{_scheme(monitor)}://{url_host(monitor.settings.vllm_advertise_address)}:"
               f"{monitor.settings.vllm_metrics_port}{PROMETHEUS_PREFIX}/")
        out["monitoring"] = {"host": monitor.name, "url": url, "token_env": monitor.settings.vllm_metrics_token_env,
                             # two with HA monitoring: each scrapes every target and the other
                             "hosts": [c.name for c in every if c.settings.vllm_monitoring is True],
                             "scrapes": [c.name for c in every if c.settings.vllm_metrics is True],
                             # where each receiver's secrets come from, never a secret
                             "alert_receivers": [r.as_dict() for r in monitor.alert_receivers]}
    clients: dict[ApiClient, list[str]] = {}
    for config in hosts:
        for client in config.api_clients:
            clients.setdefault(client, []).append(config.name)
    out["clients"] = [_client(client, names, show_path) for client, names in clients.items()]
    return out


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The summary as text, a line each."""
    lines = [f"What the fleet will be ({len(summary['hosts'])} host(s)):"]
    for host in summary["hosts"]:
        roles = [r for r, on in (("gateway", host["gateway"]), ("monitoring", host["monitoring"]),
                                 ("metrics", host["metrics"])) if on]
        lines.append(f"  {host['name']}: {host['scheme']} at {host['address']}"
                     + (f" ({', '.join(roles)})" if roles else ""))
        for inst in host["instances"]:
            nodes = f" on nodes {', '.join(inst['nodes'])}" if inst["nodes"] else ""
            only = " (the gateway's only: clients use the gateway)" if inst["gateway_only"] else ""
            adapters = f" and its adapters {', '.join(inst['adapters'])}" if inst["adapters"] else ""
            lines.append(f"    {inst['name']}: {inst['unit']}, port {inst['port']}, serves "
                         f"{inst['served_model_name']}{adapters} at {inst['url']}{nodes}{only}")
        for node in host["node_of"]:
            lines.append(f"    a node of multi-node instance {node['instance']} (its head: {node['head']})")
        if not host["instances"] and not host["node_of"]:
            lines.append("    no instance")
    gateway = summary["gateway"]
    where = gateway and (f"{', '.join(gateway['hosts'])} (the floating address {gateway['floating_address']}, moved "
                         "by keepalived)" if gateway["floating_address"] else gateway["host"])
    lines.append(f"  gateway: {gateway['url']} on {where}, models {', '.join(gateway['models']) or 'none'}"
                 if gateway else "  gateway: none (clients reach each instance at its own URL)")
    monitoring = summary["monitoring"]
    lines.append(f"  monitoring: Prometheus on {monitoring['host']} at {monitoring['url']} (bearer token "
                 f"${monitoring['token_env']}), scraping {', '.join(monitoring['scrapes']) or 'no host'}"
                 + (f"; and on {', '.join(monitoring['hosts'][1:])}, each scraping the same and the other (HA)"
                    if len(monitoring["hosts"]) > 1 else "")
                 + "; alerts to "
                 + (", ".join(f"{r['name']} ({r['kind']})" for r in monitoring["alert_receivers"]) or "no receiver "
                    "(`vllm-fleet status` lists them)")
                 if monitoring else "  monitoring: none")
    lines.append("  clients:")
    for client in summary["clients"]:
        models = ", ".join(client["models"]) if client["models"] is not None else "every model"
        limit = (f"{client['requests_per_minute']} requests a minute" if client["requests_per_minute"]
                 else "no limit")
        hosts = (f" (on {', '.join(client['hosts'])})"
                 if len(summary["clients"]) > 1 and len(client["hosts"]) < len(summary["hosts"]) else "")
        what = "one key for every request" if client["name"] == FLEET_KEY_CLIENT else "its own key"
        lines.append(f"    {client['name']}: {what}, from {client['key_source']}; {models}; {limit}{hosts}")
    return lines
