"""What no single host can check (check_fleet): the multi-node instances' node groups, one model per
served name, Ray's ports, and the gateway against every host it reaches."""

from __future__ import annotations

import ipaddress
import posixpath
from dataclasses import dataclass
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config.clients import FLEET_KEY_CLIENT
from vllm_fleet.config.errors import ConfigError, ConfigErrors, did_you_mean
from vllm_fleet.config.host import HostConfig
from vllm_fleet.config.instance import HOST_DEFAULTS, InstanceConfig
from vllm_fleet.config.ports import host_ports, monitoring_ports


# --- Multi-node instances (Ray): one node group per instance with `nodes` ------------------------

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


def _check_node_groups(hosts: list[HostConfig], inventory: list[str] | tuple[str, ...]) -> list[ConfigError]:
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
    # The gateway's port and the monitoring ports are _check_ray_ports' (it names them as the listener's).
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


def check_fleet(hosts: list[HostConfig], inventory: list[str] | None = None,
                every: list[HostConfig] | None = None) -> None:
    """What no single host can check: one gateway in the fleet, or several behind one floating
    address that agree (_check_floating_address), and with one, an address the gateway can reach
    every host with instances at; the multi-node instances' nodes
    (_check_node_groups); the models the clients name, served somewhere in the fleet; each secret
    read from a source of its own. `inventory`: every host name of the inventory (default: the
    hosts'), for a --limit that loaded only some; `every`: every host of the inventory whose data
    parses (default: `hosts`), whose instances serve what a client may name. Raises ConfigErrors."""
    inventory = inventory or [h.name for h in hosts]
    errors: list[ConfigError] = _check_node_groups(hosts, inventory)
    errors += _check_served_names(hosts)
    errors += _check_client_models(hosts, every if every is not None else hosts, inventory)
    errors += _check_secret_sources(hosts)
    errors += _check_ray_ports(hosts)
    gateways = [h for h in hosts if h.settings.vllm_gateway is True]
    for other in gateways[1:] if any(g.settings.vllm_gateway_address is None for g in gateways) else ():
        errors.append(ConfigError(
            f"hosts {gateways[0].name} and {other.name} both set vllm_gateway = True without a floating "
            "address: clients would have two endpoints, and nothing moves them from one to the other",
            host=other.name, key="vllm_gateway",
            fix=f"keep vllm_gateway = True on one of them (e.g. {gateways[0].name}) and remove it from "
                "the other (set it in that one host's data, not in group data, which sets it on every host "
                "of the group); or give every gateway the same vllm_gateway_address (e.g. '10.0.0.100/24') "
                "and a vllm_gateway_interface, for two gateways behind one address"))
    errors += _check_floating_address(gateways, every if every is not None else hosts)
    if gateways:
        for host in hosts:
            address = host.settings.vllm_advertise_address
            problem = kinds.connect_address_problem(address)
            if host.instances and problem:
                errors.append(ConfigError(
                    f"the gateway would reach this host's instances at {address!r}: {problem}",
                    host=host.name, key="vllm_advertise_address",
                    fix="vllm_advertise_address = '10.0.0.11' (the address the gateway host connects to), "
                        "or set ssh_hostname"))
        errors += _check_gateway_links(gateways[0], hosts)
        # vllm-router passes the client's key on: every backend must accept the gateway's clients.
        clients = gateways[0].api_clients
        for host in hosts:
            if host.instances and host.api_clients != clients:
                errors.append(ConfigError(
                    f"this host's API clients ({_clients_words(host.api_clients)}) differ from the "
                    f"gateway's ({gateways[0].name}: {_clients_words(clients)}): the gateway passes each "
                    "client's key on, so its backends must accept the same clients with the same models "
                    "and limits", host=host.name,
                    key="vllm_api_clients" if (host.api_clients[0].name != FLEET_KEY_CLIENT
                                               or clients[0].name != FLEET_KEY_CLIENT) else "vllm_api_key_env",
                    fix="set vllm_api_clients (or vllm_api_key_env and vllm_api_key_file) once, in the "
                        "group data every host of the fleet reads"))
    errors += _check_monitoring(hosts)
    if errors:
        raise ConfigErrors(errors)


# --- Two or more gateways behind one floating address (keepalived) --------------------------------

#: What every gateway behind one floating address must share, and why: clients reach whichever holds
#: the address, so each must route as the others do, on the same port, scheme and VRRP instance.
_GATEWAYS_SAME = {
    "vllm_gateway_address": "keepalived moves one address between them",
    "vllm_gateway_vrrp_id": "they are one VRRP router (virtual_router_id) on their network",
    "vllm_gateway_port": "clients keep their URL whichever gateway holds the address",
    "vllm_tls": "clients keep their URL's scheme whichever gateway holds the address",
    "vllm_gateway_version": "every gateway runs the same router",
    "vllm_gateway_policy": "every gateway picks backends the same way",
    "vllm_gateway_health_interval_s": "every gateway drops a failing backend as fast",
    "vllm_gateway_failure_threshold": "every gateway drops a failing backend as fast",
    "vllm_gateway_drain_timeout_s": "a rollout drains a backend from every gateway for as long",
    "vllm_api_clients": "every gateway's front takes the same clients' keys, with the same models and limits",
    "vllm_api_key_env": "every gateway's front takes the same key",
    "vllm_api_key_file": "every gateway's front takes the same key",
}
#: The priority of the first gateway of the inventory (without vllm_gateway_priority), and how much
#: less each next one gets: keepalived's priorities are 1-254, and each gateway's differs.
FIRST_GATEWAY_PRIORITY, GATEWAY_PRIORITY_STEP = 200, 10


def gateway_priorities(gateways: list[HostConfig]) -> dict[str, int]:
    """Each gateway's VRRP priority: its vllm_gateway_priority, else from its place among the gateways
    in inventory order (FIRST_GATEWAY_PRIORITY, then GATEWAY_PRIORITY_STEP less each), never below 1."""
    return {g.name: g.settings.vllm_gateway_priority if g.settings.vllm_gateway_priority is not None
            else max(1, FIRST_GATEWAY_PRIORITY - GATEWAY_PRIORITY_STEP * position)
            for position, g in enumerate(gateways)}


def _own_addresses(host: HostConfig) -> dict[str, str]:
    """The addresses a host already has, as IP literals, each with the key that gives it."""
    found: dict[str, str] = {}
    for key, value in (("ssh_hostname", host.ssh_hostname), ("vllm_advertise_address", host.advertise_address),
                       ("vllm_bind_host", host.settings.vllm_bind_host), ("host name", host.name)):
        if isinstance(value, str) and kinds.ip_literal(value) and "%" not in value:
            found.setdefault(str(ipaddress.ip_address(value)), key)
    return found


def _check_floating_address(gateways: list[HostConfig], every: list[HostConfig]) -> list[ConfigError]:
    """The gateways behind one floating address (vllm_gateway_address) agree on what must be the same
    (_GATEWAYS_SAME); each names its interface, listens on every address (its front must answer on the
    floating one too), and has its own IPv4 address in the floating address's subnet (where keepalived
    speaks to the others, unicast); the address is no host's own; priorities differ."""
    floating = [g for g in gateways if g.settings.vllm_gateway_address is not None]
    if not floating:
        return []
    errors: list[ConfigError] = []
    first = gateways[0]
    for gateway in gateways[1:]:
        for key, why in _GATEWAYS_SAME.items():
            mine, firsts = gateway.settings[key], first.settings[key]
            if mine != firsts:
                errors.append(ConfigError(
                    f"this gateway has {key} {mine!r} but the gateway {first.name} has {firsts!r}; every gateway "
                    f"behind the floating address needs the same: {why}", host=gateway.name, key=key,
                    fix=f"set {key} = {firsts!r} once, in the group data every gateway reads"))
    text = floating[0].settings.vllm_gateway_address
    if kinds.floating_address_problem(text):
        return errors  # reported with the host's own knobs
    interface = ipaddress.IPv4Interface(text)
    address, network = str(interface.ip), interface.network
    for gateway in floating:
        settings = gateway.settings
        if settings.vllm_gateway_interface is None:
            errors.append(ConfigError(
                f"this gateway holds the floating address {text} at times, but names no interface to put it on",
                host=gateway.name, key="vllm_gateway_interface",
                fix=f"vllm_gateway_interface = 'eth0' in {gateway.name}'s data: the interface of its address on "
                    f"{network} (`ip -br addr` on the host)"))
        if settings.vllm_bind_host != "0.0.0.0":
            errors.append(ConfigError(
                f"this gateway's front listens on {settings.vllm_bind_host} only (vllm_bind_host), so it would not "
                f"answer on the floating address {address} while it holds it", host=gateway.name,
                key="vllm_bind_host", fix="vllm_bind_host = '0.0.0.0' on the gateways"))
        own = gateway.advertise_address
        inside = (kinds.ip_literal(own) and "%" not in own and ipaddress.ip_address(own).version == 4
                  and ipaddress.ip_address(own) in network)
        if not inside:
            errors.append(ConfigError(
                f"the floating address {text} is outside this gateway's subnet: its own address {own!r} (its "
                f"vllm_advertise_address; where that is unset, its vllm_bind_host, ssh_hostname or name) is not an "
                f"IPv4 address in {network}, and keepalived sends its adverts from it to the other gateways and "
                "takes the address over on that subnet", host=gateway.name, key="vllm_gateway_address",
                fix=f"vllm_gateway_address = '<a free address of the subnet every gateway is on>/<its prefix>', or "
                    f"vllm_advertise_address = \"<{gateway.name}'s IPv4 address in {network}>\" in its host data"))
    for host in every:
        source = _own_addresses(host).get(address)
        if source is not None:
            errors.append(ConfigError(
                f"the floating address {address} (vllm_gateway_address) is this host's own ({source}): keepalived "
                "would add it to another host's interface too, and two hosts would answer at it",
                host=host.name, key="vllm_gateway_address",
                fix=f"vllm_gateway_address = '<a free address of {network}>/{network.prefixlen}' (no host has it)"))
    seen: dict[int, str] = {}
    for name, priority in gateway_priorities(floating).items():
        if priority in seen:
            errors.append(ConfigError(
                f"this gateway's VRRP priority {priority} is also {seen[priority]}'s: which one takes the floating "
                "address first would be left to their addresses", host=name, key="vllm_gateway_priority",
                fix="give each gateway its own vllm_gateway_priority, or None on all of them (from their inventory "
                    "order)"))
        seen.setdefault(priority, name)
    return errors


def _check_monitoring(hosts: list[HostConfig]) -> list[ConfigError]:
    """At most one Prometheus in the fleet; it scrapes the fronts that speak HTTPS only if it checks
    their certificates, with the CAs its own host trusts (vllm_tls there); every other host it
    scrapes at an address another host can connect to (not loopback: that would be the monitoring
    host itself, filed under the other's name). Every monitored host expects the token of one
    variable: the token Prometheus sends is read once."""
    errors = []
    watched = [h for h in hosts if h.settings.vllm_metrics is True or h.settings.vllm_monitoring is True]
    names = {h.settings.vllm_metrics_token_env for h in watched}
    if len(names) > 1:
        first = watched[0].settings.vllm_metrics_token_env
        for host in watched:
            if host.settings.vllm_metrics_token_env != first:
                errors.append(ConfigError(
                    f"this host reads its metrics token from ${host.settings.vllm_metrics_token_env}, host "
                    f"{watched[0].name} from ${first}: Prometheus sends one token to every host",
                    host=host.name, key="vllm_metrics_token_env",
                    fix="set vllm_metrics_token_env once, in the group data every monitored host reads"))
    monitors = [h for h in hosts if h.settings.vllm_monitoring is True]
    for host in hosts if monitors else []:
        if host.settings.vllm_metrics is not True or host is monitors[0]:
            continue
        address = host.advertise_address
        problem = kinds.connect_address_problem(address)
        if not problem and kinds.ip_literal(address) and ipaddress.ip_address(address).is_loopback:
            problem = f"{address!r} is loopback: on the monitoring host {monitors[0].name} that is itself"
        if problem:
            errors.append(ConfigError(
                f"the fleet's Prometheus would scrape this host at {address!r}: {problem}", host=host.name,
                key="vllm_advertise_address",
                fix="vllm_advertise_address = '10.0.0.11' (the address the monitoring host connects to), "
                    "or set ssh_hostname"))
    for other in monitors[1:]:
        errors.append(ConfigError(
            f"hosts {monitors[0].name} and {other.name} both set vllm_monitoring = True: a fleet has one "
            "Prometheus", host=other.name, key="vllm_monitoring",
            fix=f"keep vllm_monitoring = True on one of them (e.g. {monitors[0].name}) and remove it from the "
                "other; set it in that one host's data in the inventory, not in group data (which sets it on "
                "every host of the group)"))
    if monitors and monitors[0].settings.vllm_tls is True:
        for host in hosts:
            if host.settings.vllm_metrics is True and host.settings.vllm_tls is not True:
                errors.append(ConfigError(
                    f"the monitoring host {monitors[0].name} speaks HTTPS, but would scrape this host over plain "
                    "HTTP: the metrics token would cross the network in clear text", host=host.name, key="vllm_tls",
                    fix="vllm_tls = True on every monitored host (set it once in the fleet's group data)"))
    if monitors and monitors[0].settings.vllm_tls is not True:
        over_tls = [h.name for h in hosts if h.settings.vllm_metrics is True and h.settings.vllm_tls is True]
        if over_tls:
            errors.append(ConfigError(
                f"the monitoring host would scrape {', '.join(over_tls)} over HTTPS without the CAs to check "
                "their certificates (vllm_tls is off on it)", host=monitors[0].name, key="vllm_tls",
                fix="vllm_tls = True on the monitoring host too (set it once in the fleet's group data)"))
    return errors


def _check_gateway_links(gateway: HostConfig, hosts: list[HostConfig]) -> list[ConfigError]:
    """The gateway and its backends speak one scheme: a TLS gateway passing its clients' keys on to a
    plain-HTTP backend would send them in clear text over the fleet's network, and a plain gateway
    has no CAs to check a TLS backend with. Where a backend's front takes /v1/ from the gateway only
    (vllm_direct_access off), it lets in the gateway host's vllm_advertise_address, which must then
    be an IP address (nginx's geo takes no host name)."""
    errors = []
    tls = gateway.settings.vllm_tls is True
    for host in hosts:
        if not host.instances:
            continue
        if (host.settings.vllm_tls is True) != tls:
            errors.append(ConfigError(
                f"the gateway ({gateway.name}) speaks {'HTTPS' if tls else 'plain HTTP'} to its clients, this "
                f"backend {'HTTPS' if host.settings.vllm_tls is True else 'plain HTTP'}: the gateway would pass "
                "the clients' keys on " + ("in clear text" if tls else "without the CAs to check this host's certificate"),
                host=host.name, key="vllm_tls",
                fix=f"vllm_tls = {tls} on every host of the fleet (set it once in the group data)"))
    address = gateway.advertise_address
    closed = [h.name for h in hosts if h.instances and h.settings.vllm_direct_access is not True]
    if closed and not kinds.ip_literal(address):
        errors.append(ConfigError(
            f"the instance ports of {', '.join(closed[:3])}{' ...' if len(closed) > 3 else ''} take requests from "
            f"the gateway only, by its address, but the gateway's address {address!r} (its vllm_advertise_address; "
            "where that is unset, its vllm_bind_host, ssh_hostname or name) is no IP address",
            host=gateway.name, key="vllm_advertise_address",
            fix=f"vllm_advertise_address = \"<{gateway.name}'s IP address on the backends' network>\" in "
                f"{gateway.name}'s host data, or vllm_direct_access = True on the backends (each front then counts "
                "a client's limit on its own)"))
    return errors


def _check_client_models(hosts: list[HostConfig], every: list[HostConfig],
                         inventory: list[str] | tuple[str, ...]) -> list[ConfigError]:
    """Every model a client may use (vllm_api_clients.<name>.models) is a served_model_name of an
    instance of the fleet: a name that none serves gives the client nothing, silently (403 on every
    port, an empty /v1/models). An instance's name given for its served name is the likely slip, so
    the fix names that served name; else the closest served name. Checked only when every host of
    the inventory parses (`every`): a model may be served by a host outside a --limit. Each
    client's model once, where clients are the same on several hosts (group data)."""
    if {h.name for h in every} < set(inventory):
        return []
    served: dict[str, tuple[str, str]] = {}  # served name -> (host, instance) serving it first
    by_instance: dict[str, str] = {}  # instance name -> its served name (the first of that name)
    for host in every:
        for inst in host.instances:
            served.setdefault(inst.served_model_name, (host.name, inst.name))
            by_instance.setdefault(inst.name, inst.served_model_name)
            for adapter in inst.adapters:
                served.setdefault(adapter.name, (host.name, inst.name))
    errors, seen = [], set()
    for host in hosts:
        for client in host.api_clients:
            for model in client.models or ():
                if model in served or (client.name, model) in seen:
                    continue
                seen.add((client.name, model))
                shown = model if kinds.printable(model) else repr(model)
                if model in by_instance:
                    fix = (f"did you mean '{by_instance[model]}'? {model} is the instance's name; clients "
                           f"send its served_model_name, '{by_instance[model]}'")
                else:
                    guess = did_you_mean(model, sorted(served))
                    fix = (f"did you mean '{guess}'?" if guess else
                           f"name one the fleet serves: {', '.join(sorted(served)) or 'none (no instance yet)'}")
                errors.append(ConfigError(
                    f"client {client.name} may use model {shown!r}, which no instance of the fleet serves: "
                    "the client would get 403 for it on every port and an empty /v1/models",
                    host=host.name, key=f"vllm_api_clients.{client.name}.models", fix=fix))
    return errors


def secret_sources(host: HostConfig) -> list[tuple[str, str, str]]:
    """Where the workstation reads each of this host's secrets: (role, source, knob), the source
    "$NAME" (an environment variable) or "file PATH". Roles: each client's key (or the fleet key
    without clients), the metrics token (vllm_metrics or vllm_monitoring), the Hugging Face token
    (read when set), and the key of the host's own TLS certificate."""
    settings, out = host.settings, []
    clients = host.api_clients
    if len(clients) == 1 and clients[0].name == FLEET_KEY_CLIENT:
        out.append(("the fleet's API key", f"${settings.vllm_api_key_env}", "vllm_api_key_env"))
        if settings.vllm_api_key_file:
            out.append(("the fleet's API key", f"file {_normal_path(settings.vllm_api_key_file)}",
                        "vllm_api_key_file"))
    else:
        for client in clients:
            knob = f"vllm_api_clients.{client.name}.key_{'env' if client.key_env else 'file'}"
            if client.key_env:
                source = f"${client.key_env}"
            else:
                assert client.key_file is not None  # a client has key_env or key_file (parse_api_clients)
                source = f"file {_normal_path(client.key_file)}"
            out.append((f"client {client.name}'s key", source, knob))
    if settings.vllm_metrics is True or settings.vllm_monitoring is True:
        out.append(("the metrics token", f"${settings.vllm_metrics_token_env}", "vllm_metrics_token_env"))
    out.append(("the Hugging Face token", f"${settings.vllm_hf_token_env}", "vllm_hf_token_env"))
    if settings.vllm_tls is True and settings.vllm_tls_key_file:
        out.append(("the TLS private key", f"file {_normal_path(settings.vllm_tls_key_file)}", "vllm_tls_key_file"))
    return out


def _normal_path(path: str) -> str:
    """A workstation path as two knobs are compared: '~/a/../k' and '~/k' are one file."""
    return posixpath.normpath(path)


def _check_secret_sources(hosts: list[HostConfig]) -> list[ConfigError]:
    """No two secrets of the fleet come from one variable or one file: two clients reading one key
    source would be one client to the fronts (each could act as the other, and revoking one revokes
    both); the Hugging Face token read from a client's variable or the metrics token's would be
    pushed to every host as that secret too, and the reverse. Reported once per pair of roles. The
    same file under two names (a link) is the workstation's to find (fleet_secrets)."""
    first: dict[str, tuple[str, str, str]] = {}  # source -> (role, host, knob) that reads it first
    errors, seen = [], set()
    for host in hosts:
        for role, source, knob in secret_sources(host):
            other_role, other_host, other_knob = first.setdefault(source, (role, host.name, knob))
            if other_role == role or (source, frozenset((role, other_role))) in seen:
                continue
            seen.add((source, frozenset((role, other_role))))
            where = "" if other_host == host.name else f" on host {other_host}"
            errors.append(ConfigError(
                f"{role} is read from {source}, and so is {other_role} ({other_knob}{where}): each secret "
                "needs a source of its own, or the fleet would take one for the other (a key for another "
                "client, a token pushed where the other goes)", host=host.name, key=knob,
                fix=f"give {role} a variable or file of its own (its own value too, e.g. `openssl rand -hex 32`)"))
    return errors


def _clients_words(clients) -> str:
    return ", ".join(f"{c.name} from {c.source()}" for c in clients) or "none"


def _check_served_names(hosts: list[HostConfig]) -> list[ConfigError]:
    """A served_model_name is one model wherever it is served: the gateway sends a request for it to
    any of its backends, so two models under one name would answer the same client differently."""
    first: dict[str, tuple[str, InstanceConfig]] = {}
    errors = _check_adapter_names(hosts)
    for host in hosts:
        for inst in host.instances:
            other_host, other = first.setdefault(inst.served_model_name, (host.name, inst))
            if _model_identity(other) != _model_identity(inst):
                errors.append(ConfigError(
                    f"served_model_name {inst.served_model_name!r} is {_model_words(inst)} here but "
                    f"{_model_words(other)} on host {other_host} (instance {other.name}): the gateway would "
                    "send a client's requests for it to either", host=host.name, instance=inst.name,
                    key="served_model_name", fix="give each model its own served_model_name"))
    return errors


def _check_adapter_names(hosts: list[HostConfig]) -> list[ConfigError]:
    """An adapter's name is a model name like a served_model_name: none of the fleet's served names,
    and one adapter on one base model wherever it is served (the gateway sends its requests to any
    instance that serves it)."""
    served = {inst.served_model_name: (host.name, inst.name) for host in hosts for inst in host.instances}
    first: dict[str, tuple[str, InstanceConfig, Any]] = {}
    errors = []
    for host in hosts:
        for inst in host.instances:
            for position, adapter in enumerate(inst.adapters):
                key = f"adapters[{position}].name"
                if adapter.name in served:
                    where = served[adapter.name]
                    errors.append(ConfigError(
                        f"the adapter name {adapter.name!r} is the served_model_name of instance {where[1]} on host "
                        f"{where[0]}: clients could not tell the adapter from that model", host=host.name,
                        instance=inst.name, key=key, fix="give the adapter a name no instance serves"))
                    continue
                other_host, other, other_adapter = first.setdefault(adapter.name, (host.name, inst, adapter))
                if other_adapter.identity() != adapter.identity() or \
                        other.served_model_name != inst.served_model_name:
                    errors.append(ConfigError(
                        f"the adapter name {adapter.name!r} is {adapter.words()} on {inst.served_model_name} here but "
                        f"{other_adapter.words()} on {other.served_model_name} on host {other_host} (instance "
                        f"{other.name}): the gateway would send a client's requests for it to either",
                        host=host.name, instance=inst.name, key=key, fix="give each adapter its own name"))
    return errors


def _model_identity(inst: InstanceConfig) -> tuple[str, str | None]:
    """What an instance serves: the workstation directory it syncs, or its model id or path."""
    return (f"source:{inst.model_source}" if inst.model_source else inst.model), inst.tokenizer


def _model_words(inst: InstanceConfig) -> str:
    what = f"model_source {inst.model_source}" if inst.model_source else f"model {inst.model}"
    return what + (f" (tokenizer {inst.tokenizer})" if inst.tokenizer else "")


#: The ports Ray opens on a node besides the head's vllm_ray_port (`ray start` defaults in
#: ray/scripts/scripts.py and ray/_private/ray_constants.py, Ray 2.60): the head's Ray client server,
#: every node's dashboard agent, and the range its worker processes listen in. The others (node
#: manager, object manager, metrics) are picked by the OS from its ephemeral range.
RAY_HEAD_PORTS = {10001: "Ray's client server"}
RAY_NODE_PORTS = {52365: "Ray's dashboard agent"}
RAY_WORKER_PORTS = range(10002, 20000)


def _check_ray_ports(hosts: list[HostConfig]) -> list[ConfigError]:
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
