"""What `prepare` needs from the rest of the inventory, in one place: every host's parsed data (once
per run), the configs a node learns its multi-node group from, and the gateway's backends (every
host planned). Only prepare calls these."""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import host, logger

from vllm_fleet import gateway
from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig, check_fleet, parse_host
from vllm_fleet.plan import FleetPlan, HostPlan, plan_fleet

from .state import fail

# Every inventory host's parsed data, once per run (keyed by the run's State): a node of a
# multi-node instance learns its group from the head's declaration (config.node_group_of).
_CONFIGS: "weakref.WeakKeyDictionary[Any, tuple[dict[str, HostConfig], dict[str, ConfigErrors]]]" = \
    weakref.WeakKeyDictionary()


def inventory_configs(state) -> tuple[dict[str, HostConfig], dict[str, ConfigErrors]]:
    """Every inventory host's config (whether or not in this run's limit), and the errors of
    those whose data does not parse."""
    cached = _CONFIGS.get(state)
    if cached is None:
        cached = ({}, {})
        for other in state.inventory:
            try:
                cached[0][other.name] = parse_host(other.name, other.data.dict())
            except ConfigErrors as exc:
                cached[1][other.name] = exc
        _CONFIGS[state] = cached
    return cached


def group_configs(config: HostConfig) -> dict[str, HostConfig]:
    """The inventory's configs, for node_group_plans. A host that may be a node (it names a
    vllm_private_interface, which every node needs) stops when another host's data does not parse:
    that host may be its head, and a worker that missed its group would remove its Ray unit."""
    configs, broken = inventory_configs(host.state)
    broken = {name: exc for name, exc in broken.items() if name != config.name}
    if broken and config.settings.vllm_private_interface:
        name, exc = next(iter(broken.items()))
        fail([ConfigError(f"host {name}'s data does not parse, so whether {config.name} is a node of a "
                          f"multi-node instance cannot be told ({exc.errors[0].located()})", host=config.name,
                          key="nodes", fix=f"fix {name}'s host data (or take it out of the inventory)")])
    return configs


def fleet_backends(config: HostConfig, plan: HostPlan) -> list[gateway.Backend]:
    """The gateway's backends: every instance of every inventory host, planned by the same planner
    (plan_fleet: this host from its live facts, the others from their declared data, whether or not
    they are in this run's limit). A host that cannot be planned offline stops this host's deploy
    with its errors: a gateway that silently lost a host's backends would drop them from the router."""
    parsed, broken = inventory_configs(host.state)  # parsed once per run, for every host
    configs = []
    for other in host.state.inventory:  # (pyinfra's `inventory` context is unset under rollout's API use)
        if other.name == config.name:
            configs.append(config)
        elif other.name in broken:
            fail(broken[other.name].errors)
        else:
            configs.append(parsed[other.name])
    try:
        check_fleet(configs)
        fleet = plan_fleet(configs, live={config.name: plan.gpus} if plan.gpu_source == "live" else None)
    except ConfigErrors as exc:
        logger.error(f"{host.print_prefix}this host is the fleet's gateway: it plans every inventory host "
                     "(from its declared data) to know its backends, and these cannot be planned:")
        fail(exc.errors)
    plans = [plan if p.name == config.name else p for p in fleet.hosts]  # this host's, with live facts
    return gateway.fleet_backends(configs, FleetPlan(plans))
