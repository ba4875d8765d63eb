"""What no single host can check (check_fleet): one model per served name, the gateways (one, or
several behind one floating address) against every host they reach, the clients' models, one source
per secret; and, from config/node_groups.py, the multi-node instances' node groups and Ray's ports."""

from __future__ import annotations

import ipaddress
import posixpath
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config.clients import FLEET_KEY_CLIENT
from vllm_fleet.config.errors import ConfigError, ConfigErrors, did_you_mean
from vllm_fleet.config.host import HostConfig
from vllm_fleet.config.instance import InstanceConfig
from vllm_fleet.config.node_groups import check_node_groups, check_ray_ports


def check_fleet(hosts: list[HostConfig], inventory: list[str] | None = None,
                every: list[HostConfig] | None = None) -> None:
    """What no single host can check: one gateway in the fleet, or several behind one floating
    address that agree (_check_floating_address), and with one, an address the gateway can reach
    every host with instances at; the multi-node instances' nodes
    (check_node_groups); the models the clients name, served somewhere in the fleet; each secret
    read from a source of its own. `inventory`: every host name of the inventory (default: the
    hosts'), for a --limit that loaded only some; `every`: every host of the inventory whose data
    parses (default: `hosts`), whose instances serve what a client may name. Raises ConfigErrors."""
    inventory = inventory or [h.name for h in hosts]
    errors: list[ConfigError] = check_node_groups(hosts, inventory)
    errors += _check_served_names(hosts)
    errors += _check_client_models(hosts, every if every is not None else hosts, inventory)
    errors += _check_secret_sources(hosts)
    errors += check_ray_ports(hosts)
    errors += _check_one_machine_per_host(every if every is not None else hosts)
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
    owners: dict[str, str] = {}
    for gateway in floating:
        own = gateway.advertise_address
        if own in owners:
            errors.append(ConfigError(
                f"this gateway's own address {own!r} is also the gateway {owners[own]}'s: keepalived would send "
                "each one's adverts to itself, neither would hear the other, and both would take the floating "
                f"address {address}", host=gateway.name, key="vllm_advertise_address",
                fix=f"give each gateway its own address on {network} (vllm_advertise_address, or its ssh_hostname)"))
        owners.setdefault(own, gateway.name)
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


def connection_target(host: HostConfig) -> tuple[str, int]:
    """Where the deploy's SSH connection goes: pyinfra's ssh_hostname (else the inventory name) and
    ssh_port; an IP address in its one spelling, a DNS name without case or its root's dot."""
    name = (host.ssh_hostname or host.name).strip()
    try:
        name = str(ipaddress.ip_address(name.strip("[]")))
    except ValueError:
        name = name.rstrip(".").lower()
    return name, host.ssh_port


def _check_one_machine_per_host(hosts: list[HostConfig]) -> list[ConfigError]:
    """Two inventory hosts that connect to one machine would each own its files: the front's config,
    the manifest, and the units each deploy removes as stale (the other's instances)."""
    errors: list[ConfigError] = []
    first: dict[tuple[str, int], str] = {}
    for host in hosts:
        target = connection_target(host)
        if target in first:
            errors.append(ConfigError(
                f"this host connects to the same machine as {first[target]} ({target[0]}, SSH port {target[1]}): "
                "each one's deploy would take the other's instances for stale ones and remove them, and write its "
                "own front and manifest over the other's", host=host.name, key="ssh_hostname",
                fix=f"declare the machine once, with every instance in {first[target]}'s vllm_instances; or give "
                    "this host the address of the machine it is"))
        first.setdefault(target, host.name)
    return errors


#: Monitoring hosts a fleet may have: one Prometheus, or two that scrape the same targets (HA).
MAX_MONITORS = 2


def _check_monitoring(hosts: list[HostConfig]) -> list[ConfigError]:
    """At most MAX_MONITORS Prometheus in the fleet (two: HA monitoring, each scraping every target
    and the other); each scrapes the fronts that speak HTTPS only if it checks their certificates,
    with the CAs its own host trusts (vllm_tls there); every host it scrapes but its own at an
    address another host can connect to (not loopback: that would be the monitoring host itself,
    filed under the other's name; with two, each monitoring host is the other's target too). Every
    monitored host expects the token of one variable: the token Prometheus sends is read once."""
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
        if host.settings.vllm_metrics is not True or monitors == [host]:
            continue
        address = host.advertise_address
        problem = kinds.connect_address_problem(address)
        scraper = next(m for m in monitors if m is not host)
        if not problem and kinds.ip_literal(address) and ipaddress.ip_address(address).is_loopback:
            problem = f"{address!r} is loopback: on the monitoring host {scraper.name} that is itself"
        if problem:
            errors.append(ConfigError(
                f"the fleet's Prometheus would scrape this host at {address!r}: {problem}", host=host.name,
                key="vllm_advertise_address",
                fix="vllm_advertise_address = '10.0.0.11' (the address the monitoring host connects to), "
                    "or set ssh_hostname"))
    for other in monitors[MAX_MONITORS:]:
        errors.append(ConfigError(
            f"hosts {', '.join(m.name for m in monitors[:MAX_MONITORS])} and {other.name} all set vllm_monitoring = "
            f"True: a fleet has one Prometheus, or two (HA monitoring, each scraping every target and the other)",
            host=other.name, key="vllm_monitoring",
            fix=f"keep vllm_monitoring = True on one or two of them (e.g. {monitors[0].name} and {monitors[1].name}) "
                "and remove it from the others; set it in those hosts' data in the inventory, not in group data "
                "(which sets it on every host of the group)"))
    for other in monitors[1:MAX_MONITORS]:
        leader = monitors[0]
        if other.settings.vllm_tls != leader.settings.vllm_tls:
            errors.append(ConfigError(
                f"this monitoring host has vllm_tls {other.settings.vllm_tls!r}, the monitoring host {leader.name} "
                f"{leader.settings.vllm_tls!r}: the two scrape the same fronts and each other, over one scheme",
                host=other.name, key="vllm_tls", fix="vllm_tls set once, in the fleet's group data"))
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
    (read when set), the alert receivers' secrets (the monitoring host), and the key of the host's
    own TLS certificate."""
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
    for receiver in host.alert_receivers:  # the monitoring host's alone (parse_host)
        for key, env in receiver.secret_envs():
            out.append((f"alert receiver {receiver.name}'s {key.removesuffix('_env')}", f"${env}",
                        f"vllm_alert_receivers.{receiver.name}.{key}"))
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
