"""The prepared host: everything vllm-fleet derives for one host, made by one function.

`prepare_host` takes what discovery read from the host (a Discovered: vllm_fleet/facts/discovery.py
reads it, the config with its models' own numbers, the live GPUs and their interconnect) and returns
the plan and every file rendered from it. The deploy (deploy.prepare: its steps and verification
read the Deployment built around it) and `vllm-fleet status` (drift, the front) both take a
PreparedHost from here, through the fleet (vllm_fleet/fleet.py: Fleet.prepare): neither plans or
renders on its own, so what status compares a host with is what the deploy would write.
Pure: no host is reached here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from vllm_fleet import path_writers
from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig, NodeGroup, check_fleet, node_group_of
from vllm_fleet.gateway import Backend, GatewayAccess
from vllm_fleet.monitoring.targets import ScrapeTarget
from vllm_fleet.plan import HostPlan, Interconnect, NodeGroupPlan, plan_host, plan_node_group
from vllm_fleet.render import RenderedFile, Secrets, instance_paths, manifest_path, render_host


@dataclass(frozen=True)
class Discovered:
    """What the plan needs from the host, as `discover` read it."""

    config: HostConfig  # its instances with the numbers of their model's own config.json
    live: tuple | None  # the GPUs nvidia-smi lists (None: a CPU host, or no answer: see the errors)
    topology: dict[str, Any] | None  # NVML's P2P/NVLink/processes report, when available
    interconnect: Interconnect | None  # what the planner makes of it
    #: The addresses of vllm_private_interface (None: not set, or no such interface on the host):
    #: a node of a multi-node instance must have there the address its group uses for it.
    private_addresses: tuple[str, ...] | None = None


@dataclass
class PreparedHost:
    """One host's plan and rendered files, and the config they were made from."""

    config: HostConfig  # with each instance's model numbers as discovery read them
    plan: HostPlan
    files: dict[str, RenderedFile]  # path on the host -> the file
    backends: list[Backend] | None = None  # the fleet's, rendered into the gateway host's files
    #: The multi-node instance this host is a node of, planned (None: in none).
    node_groups: list[NodeGroupPlan] | None = None

    def instance_file(self, name: str, kind: str) -> RenderedFile:
        """An instance's rendered file: kind is "unit", "config" or "env"."""
        return self.files[instance_paths(self.config, name)[kind]]

    @property
    def manifest(self) -> RenderedFile:
        return self.files[manifest_path(self.config)]


def prepare_host(found: Discovered, secrets: Secrets | None = None,
                 backends_for: Callable[[HostPlan], list[Backend] | None] | None = None,
                 node_groups: list[NodeGroupPlan] | None = None,
                 targets_for: Callable[[HostPlan], list[ScrapeTarget] | None] | None = None,
                 gateway_access: GatewayAccess | None = None) -> PreparedHost:
    """Plan the host from what discovery found (ConfigErrors when it cannot be planned), then render
    every file. `backends_for(plan)`: the fleet's gateway backends, on the gateway host (they need
    this host's plan); `secrets`: None renders placeholders (status compares no secret file);
    `node_groups`: the multi-node instance this host is a node of, planned (plan_node_group), or
    None when it is in none; `targets_for(plan)`: the fleet's scrape targets, on the monitoring host;
    `gateway_access`: the fleet's gateway, when it has one (the fronts take /v1/ from it only)."""
    plan = plan_host(found.config, found.live, found.interconnect, node_groups=node_groups)
    backends = backends_for(plan) if backends_for else None
    targets = targets_for(plan) if targets_for else None
    rendered = render_host(found.config, plan, secrets, backends, targets, gateway_access)
    # The one-writer rule again, on what was planned and rendered (a split instance's names, a file
    # the layout does not foresee); check and plan applied it to what the settings declare.
    me = found.config
    held = [*me.instances, *(g.group.instance for g in node_groups or [] if g.group.head != me.name)]
    clashes = path_writers.path_clashes(me, path_writers.rendered_writers(
        me, held, [inst.name for inst in plan.instances], [f.path for f in rendered]), synced=held)
    if clashes:
        raise ConfigErrors(clashes)
    files = {f.path: f for f in rendered}
    return PreparedHost(found.config, plan, files, backends, node_groups)


def node_group_plans(found: Discovered, configs: dict[str, HostConfig]) -> list[NodeGroupPlan] | None:
    """The multi-node instance this host is a node of, planned: None when it is in none.

    Planned on every node alike: this host's GPUs as nvidia-smi lists them (found.live), the other
    nodes' as declared (each node checks its own live GPUs against its declaration when it plans,
    so they agree), every node's address on the nodes' network from the inventory
    (vllm_advertise_address, else ssh_hostname: plan.node_addresses). This host's own address must
    be on its vllm_private_interface (discovery read it): Ray binds there (`ray start
    --node-ip-address`, VLLM_HOST_IP) and the others reach it there. Raises ConfigErrors."""
    me = found.config
    fleet = {**configs, me.name: me}  # this host with its model numbers as discovery read them
    group = node_group_of(list(fleet.values()), me.name)
    if group is None:
        return None
    absent = [n for n in group.nodes if n not in fleet]
    if absent:  # not in the inventory (a typo in `nodes`), or its data does not parse
        raise ConfigErrors([ConfigError(f"node {absent[0]} of multi-node instance {group.instance.name} "
                                        "is not a host of the inventory, or its data could not be read",
                                        host=me.name, instance=group.instance.name, key="nodes",
                                        fix=f"name inventory hosts in 'nodes', and fix {absent[0]}'s host data")])
    # As declared (a head's instance, once discovery filled in its model's numbers, would differ
    # from the copy a worker sees through shared group data).
    check_fleet([configs.get(n, fleet[n]) for n in group.nodes], inventory=list(fleet))
    if group.head == me.name:  # the instance with the numbers of the model's own config.json
        group = NodeGroup(next(i for i in me.instances if i.name == group.instance.name))
    group_plan = plan_node_group(group, {n: fleet[n] for n in group.nodes}, live={me.name: found.live})
    role = group_plan.roles[me.name]
    interface = me.settings.vllm_private_interface
    if found.private_addresses is None:
        raise ConfigErrors([ConfigError(
            f"interface {interface} (vllm_private_interface) does not exist on this host; it is node "
            f"{me.name} of multi-node instance {role.instance}", host=me.name, instance=role.instance,
            key="vllm_private_interface", fix="name the interface of the nodes' isolated network (`ip -o addr` "
                                              "on the host lists them)")])
    if role.address not in found.private_addresses:
        raise ConfigErrors([ConfigError(
            f"the node group of {role.instance} reaches {me.name} at {role.address}, but its "
            f"vllm_private_interface {interface} has {', '.join(found.private_addresses) or 'no address'}: "
            "Ray binds to that interface, so the other nodes could not reach this one",
            host=me.name, instance=role.instance, key="vllm_advertise_address",
            fix=f"set vllm_advertise_address = '{(found.private_addresses or ['<its address>'])[0]}' on "
                f"{me.name} (the address on the nodes' network), or name the interface that has "
                f"{role.address} in vllm_private_interface")])
    return [group_plan]
