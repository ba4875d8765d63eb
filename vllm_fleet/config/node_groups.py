"""Multi-node instances (Ray): one node group per instance with `nodes`, and what its nodes must
agree on (check_fleet runs these checks with the fleet's others): the head's settings copied to
every node, Ray's ports kept apart from the ports clients reach, each instance declared once."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet import kinds
from vllm_fleet.config.errors import ConfigError, did_you_mean
from vllm_fleet.config.host import HostConfig
from vllm_fleet.config.instance import HOST_DEFAULTS, InstanceConfig
from vllm_fleet.config.ports import host_ports, monitoring_ports


@dataclass(frozen=True)
class NodeGroup:
    """One multi-node instance and the hosts it runs on: a Ray cluster whose head (nodes[0]) runs
    `vllm serve` and whose other nodes run only a Ray worker. Found from the head's declaration, so
    a node that does not repeat the instance still learns its part (node_group_of)."""

    instance: InstanceConfig  # as the head declares it

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.instance.nodes or ()

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[str, ...]:
        return self.nodes[1:]


def node_groups(hosts: list[HostConfig]) -> list[NodeGroup]:
    """Every multi-node instance of the fleet, in inventory order of their heads."""
    return [NodeGroup(inst) for host in hosts for inst in host.instances if inst.nodes]


def node_group_of(hosts: list[HostConfig], name: str) -> NodeGroup | None:
    """The node group host `name` belongs to (as head or as worker), or None. A host is in at most
    one (check_fleet): it runs one Ray node, unit vllm-fleet-ray.service."""
    return next((g for g in node_groups(hosts) if name in g.nodes), None)


_RAY_SAME = "Ray refuses nodes of another Ray or Python version"
_COPIED = ("vLLM copies the head's VLLM_*, HF_* and NCCL_* variables to every Ray worker "
           "(vllm/ray/ray_env.py), so the workers use the head's value")
#: What every node of a group must share, and why.
_NODE_GROUP_SAME = {
    "vllm_ray_version": _RAY_SAME,
    "vllm_python_version": _RAY_SAME,
    "vllm_version": "each node's Ray workers run the vLLM of that node's own environment",
    "vllm_package": "each node's Ray workers run the vLLM of that node's own environment",
    "vllm_private_interface": _COPIED + " (NCCL_SOCKET_IFNAME)",
    "vllm_hf_home": _COPIED + " (HF_HOME: where the workers look for the model)",
    "vllm_cache_root": _COPIED + " (VLLM_CACHE_ROOT)",
    "vllm_state_dir": _COPIED + " (VLLM_CONFIG_ROOT)",
}


def check_node_groups(hosts: list[HostConfig], inventory: list[str] | tuple[str, ...]) -> list[ConfigError]:
    """Multi-node instances against the whole inventory: nodes exist, run CUDA, have a private
    interface, agree on what must be the same, and belong to one group each; non-head nodes
    repeat a group's instance only as the head declares it."""
    errors: list[ConfigError] = []
    by_name = {h.name: h for h in hosts}
    member: dict[str, str] = {}  # node -> the instance whose group it is in
    for group in node_groups(hosts):
        errors.extend(_check_group(group, by_name, inventory, member))
    for host in hosts:
        errors.extend(_check_repeats(host, by_name))
    return errors


def _check_group(group: NodeGroup, by_name: dict[str, HostConfig], inventory: list[str] | tuple[str, ...],
                 member: dict[str, str]) -> list[ConfigError]:
    inst, head = group.instance, by_name[group.head]
    errors: list[ConfigError] = []

    def error(message: str, fix: str, key: str = "nodes") -> None:
        errors.append(ConfigError(message, host=head.name, instance=inst.name, key=key, fix=fix))

    for node in group.nodes:
        if node not in inventory:
            guess = did_you_mean(node, list(inventory))
            error(f"node {node!r} is not a host of the inventory",
                  f"did you mean '{guess}'?" if guess else f"use inventory host names ({', '.join(inventory)})")
            continue
        if node in member:
            error(f"node {node} is already in the node group of instance {member[node]}: a host runs one "
                  "Ray node (vllm-fleet-ray.service)", "give each multi-node instance its own hosts")
            continue
        member[node] = inst.name
        config = by_name.get(node)
        if config is None:
            continue  # in the inventory but not loaded (a --limit): load_fleet adds group peers
        if config.settings.vllm_target != "cuda":
            error(f"node {node} has vllm_target {config.settings.vllm_target!r}; a multi-node instance runs on "
                  "GPU servers (vllm_target 'cuda') only", f"set vllm_target = 'cuda' on {node}, or take it "
                                                          "out of nodes")
        if config.settings.vllm_private_interface is None:
            error(f"node {node} has no vllm_private_interface: vLLM's security guide says inter-node "
                  "traffic (torch.distributed, Ray) is unauthenticated and must stay on an isolated network",
                  f"set vllm_private_interface on {node} to the interface of that network, e.g. 'eth1'",
                  key="vllm_private_interface")
        address_problem = kinds.connect_address_problem(config.settings.vllm_advertise_address)
        if address_problem:
            error(f"node {node}'s address {address_problem} (it goes into every node's IPAddressAllow= and "
                  "Ray's --address)", f"set vllm_advertise_address on {node} to its address on the private "
                  "network, e.g. '10.0.0.12'", key="vllm_advertise_address")
        for key, why in _NODE_GROUP_SAME.items():  # knobs by name: the table says which must agree
            mine, heads = config.settings[key], head.settings[key]
            if mine != heads and None not in (mine, heads):
                error(f"node {node} has {key} {mine!r} but the head {head.name} has {heads!r}; "
                      f"every node of the group needs the same: {why}",
                      f"set {key} = {heads!r} on every node of {list(group.nodes)}", key=key)
    errors.extend(_check_ray_port(group, head))
    return errors


def _check_ray_port(group: NodeGroup, head: HostConfig) -> list[ConfigError]:
    """The head's Ray port (GCS) is none of the ports the head's listeners take: its SSH port, the
    instance and engine ports, the gateway's (its router's included) and the monitoring ports."""
    port, ssh_port = head.settings.vllm_ray_port, head.ssh_port
    if port == ssh_port:
        return [ConfigError(f"vllm_ray_port {port} is this host's SSH port", host=head.name,
                            instance=group.instance.name, key="vllm_ray_port",
                            fix=f"vllm_ray_port = {HOST_DEFAULTS['vllm_ray_port']}")]
    # The gateway's port and the monitoring ports are check_ray_ports' (it names them as the listener's).
    reported = {head.settings.vllm_gateway_port} if head.settings.vllm_gateway is True else set()
    if head.settings.vllm_metrics is True:
        reported |= set(monitoring_ports(head.settings).values())
    taken = {number: what for number, what in host_ports(head.settings, head.instances).items()
             if number not in reported}
    if port in taken:
        return [ConfigError(
            f"vllm_ray_port {port} is {taken[port]}", host=head.name, instance=group.instance.name,
            key="vllm_ray_port",
            fix=f"pick a vllm_ray_port no listener of the head uses, e.g. {HOST_DEFAULTS['vllm_ray_port']}")]
    return []


def _check_repeats(host: HostConfig, by_name: dict[str, HostConfig]) -> list[ConfigError]:
    """A non-head node may repeat a group's instance (group data shared with the head) only exactly
    as its head declares it, and never as an instance of its own."""
    errors: list[ConfigError] = []
    for inst in host.member_of:
        assert inst.head is not None  # member_of holds multi-node instances only (parse_host)
        head = by_name.get(inst.head)
        declared = next((i for i in head.instances if i.name == inst.name), None) if head else None
        if declared != inst:
            why = ("differs from the head's declaration" if declared is not None else
                   f"its head {inst.head} does not declare it" + ("" if head else " (not loaded)"))
            errors.append(ConfigError(
                f"multi-node instance {inst.name} is declared on node {host.name}, but {why}",
                host=host.name, instance=inst.name, key="nodes",
                fix=f"declare it once, on its head {inst.head} (the other nodes need not repeat it)"))
    groups = {i.name: i.nodes for h in by_name.values() for i in h.instances if i.nodes and host.name in i.nodes[1:]}
    for inst in host.instances:
        if inst.name in groups:
            nodes = groups[inst.name]
            errors.append(ConfigError(
                f"instance {inst.name} is also declared on node {host.name} of its node group "
                f"{list(nodes)}", host=host.name, instance=inst.name, key="nodes",
                fix=f"remove it from {host.name}: the head {nodes[0]} declares it for every node"))
    return errors


#: The ports Ray opens on a node besides the head's vllm_ray_port (`ray start` defaults in
#: ray/scripts/scripts.py and ray/_private/ray_constants.py, Ray 2.60): the head's Ray client server,
#: every node's dashboard agent, and the range its worker processes listen in. The others (node
#: manager, object manager, metrics) are picked by the OS from its ephemeral range.
RAY_HEAD_PORTS = {10001: "Ray's client server"}
RAY_NODE_PORTS = {52365: "Ray's dashboard agent"}
RAY_WORKER_PORTS = range(10002, 20000)


def check_ray_ports(hosts: list[HostConfig]) -> list[ConfigError]:
    """On every node of a multi-node instance, the ports clients reach (the front's instance ports,
    the gateway's) are none of Ray's, which listen on the node's private address; the head's Ray
    port is not its SSH port."""
    errors = []
    by_name = {h.name: h for h in hosts}
    for group in node_groups(hosts):
        for node in group.nodes:
            host = by_name.get(node)
            if host is None:
                continue
            taken = dict(RAY_NODE_PORTS)
            if node == group.head:
                taken.update(RAY_HEAD_PORTS)
                taken[host.settings.vllm_ray_port] = "the head's Ray port (vllm_ray_port)"
            listeners: list[tuple[int, str, str | None, str]] = [(inst.port, f"port {inst.port}", inst.name, "port")
                                                                 for inst in host.instances]
            if host.settings.vllm_gateway is True:
                port = host.settings.vllm_gateway_port
                listeners.append((port, f"vllm_gateway_port {port}", None, "vllm_gateway_port"))
            if host.settings.vllm_metrics is True:  # the metrics listener and the exporters behind it
                listeners += [(port, f"the monitoring port {port} ({kind})", None, "vllm_metrics_port")
                              for kind, port in monitoring_ports(host.settings).items()]
            for port, what, instance, key in listeners:
                why = taken.get(port) or ("in the range Ray's worker processes listen in "
                                          f"({RAY_WORKER_PORTS.start}-{RAY_WORKER_PORTS.stop - 1})"
                                          if port in RAY_WORKER_PORTS else None)
                if why:
                    errors.append(ConfigError(
                        f"{what} is {why}, on this node of multi-node instance {group.instance.name}",
                        host=node, instance=instance, key=key,
                        fix="pick a port outside Ray's: below 10001 (e.g. 8000) or from 20000 to 52364"))
    return errors
