"""The ports a host's own listeners take, derived from its knobs and instances: each instance's front
port and engine port, the gateway's, the monitoring ones. The rules about them are config/host_checks.py's
(one host) and config/node_groups.py's (Ray's, across a node group)."""

from __future__ import annotations

from typing import Sequence

from vllm_fleet.config.instance import InstanceConfig
from vllm_fleet.config.settings import Settings


def instance_ports(instances: Sequence[InstanceConfig], offset: int,
                   events_offset: int | None = None) -> dict[int, str]:
    """Every port the host's instances listen on, in words: each front port, each engine port, and
    with `events_offset` (vllm_kv_events_port_offset) each KV-event port."""
    taken: dict[int, str] = {}
    for inst in instances:
        taken.setdefault(inst.port, f"the port of instance {inst.name}")
        taken.setdefault(inst.port + offset, f"the engine port of instance {inst.name} "
                                             f"(127.0.0.1:{inst.port + offset})")
    if events_offset is not None:
        for inst in instances:
            taken.setdefault(inst.port + events_offset, f"the KV-event port of instance {inst.name} "
                                                        f"({inst.port} + vllm_kv_events_port_offset {events_offset})")
    return taken


def kv_event_port(inst: InstanceConfig, settings: Settings) -> int | None:
    """The port the instance keeps for vLLM's KV-cache events: its port + vllm_kv_events_port_offset,
    or None without that knob."""
    offset = settings.vllm_kv_events_port_offset
    return None if offset is None else inst.port + offset


def gateway_ports(settings: Settings) -> dict[str, int]:
    """The gateway's ports on its host: `port` (clients: the front's nginx on vllm_bind_host, which
    checks the key), `router` (vllm-router on 127.0.0.1 at port + vllm_backend_port_offset, as vLLM
    sits behind an instance's front: its admin API has no authentication) and `metrics` (its
    Prometheus listener on 127.0.0.1, the port after: its default, 29000, is the same for every
    router and would clash with any other one on the host)."""
    router = settings.vllm_gateway_port + settings.vllm_backend_port_offset
    return {"port": settings.vllm_gateway_port, "router": router, "metrics": router + 1}


def monitoring_ports(settings: Settings) -> dict[str, int]:
    """A vllm_metrics host's ports: `metrics` (the front's metrics listener on vllm_bind_host, which
    checks the metrics token), then on 127.0.0.1 only, the ports after it: `exporter` (the host
    exporter), `stub_status` (the front's own counters), `node_exporter`, and on the monitoring host
    `prometheus`. Not the exporters' usual 9100 and 9090: a node exporter or Prometheus the host
    already runs keeps its port."""
    port = settings.vllm_metrics_port
    ports = {"metrics": port, "exporter": port + 1, "stub_status": port + 2, "node_exporter": port + 3}
    if settings.vllm_monitoring is True:
        ports["prometheus"] = port + 4
        ports["alertmanager"] = port + 5
    return ports


GATEWAY_PORT_NAMES = {"port": "vllm_gateway_port", "router": "the gateway's router port",
                      "metrics": "the gateway's metrics port"}


def host_ports(settings: Settings, instances: Sequence[InstanceConfig]) -> dict[int, str]:
    """Every port the host's own listeners take, in words: each instance's port, engine port and
    KV-event port (with vllm_kv_events_port_offset), the gateway's ports and the monitoring ports (where those are on)."""
    taken = instance_ports(list(instances), settings.vllm_backend_port_offset, settings.vllm_kv_events_port_offset)
    if settings.vllm_gateway is True:
        for kind, number in gateway_ports(settings).items():
            taken.setdefault(number, GATEWAY_PORT_NAMES[kind])
    if settings.vllm_metrics is True:
        for kind, number in monitoring_ports(settings).items():
            taken.setdefault(number, f"the monitoring port {number} ({kind})")
    return taken
