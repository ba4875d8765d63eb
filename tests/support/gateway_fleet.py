"""The gateway's fleet, offline: three CPU hosts serving two names (one name on two hosts), h1 the
gateway (gateway_fleet), and the files rendered for the gateway host (gateway_render)."""

from __future__ import annotations

from support.fleet_helpers import API_KEY
from vllm_fleet.config import parse_host
from vllm_fleet.gateway import fleet_backends
from vllm_fleet.plan import plan_fleet
from vllm_fleet.render import Secrets, render_host


def cpu_instance(name: str, served: str, port: int = 8000, max_len: int = 2048) -> dict:
    return {"name": name, "model": "/models/tiny", "served_model_name": served, "port": port,
            "max_model_len": max_len}


def gateway_fleet(**gateway_settings):
    """Two served names over three instances, one name on two hosts; h1 is the gateway."""
    data = [
        ("h1", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.1", "vllm_gateway": True,
                "vllm_instances": [cpu_instance("a", "alpha")], **gateway_settings}),
        ("h2", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.2",
                "vllm_instances": [cpu_instance("b", "beta", max_len=4096)]}),
        ("h3", {"vllm_target": "cpu", "vllm_advertise_address": "h3.example",
                "vllm_instances": [cpu_instance("b2", "beta", port=8001)]}),
    ]
    hosts = [parse_host(name, d) for name, d in data]
    return hosts, plan_fleet(hosts)


def gateway_render(secrets=Secrets(API_KEY), **settings) -> dict:
    """The files rendered for h1, the gateway host, by path (`settings`: more of its data)."""
    hosts, plan = gateway_fleet(**settings)
    return {f.path: f for f in render_host(hosts[0], plan.hosts[0], secrets,
                                           backends=fleet_backends(hosts, plan))}
