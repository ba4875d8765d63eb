"""One host's data -> HostConfig (parse_host): its knobs (Settings), GPUs, instances (each key by its
declaration, config/instance.py), clients and alert receivers, then the rules between them (config/host_checks.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config.alert_receivers import AlertReceiver, parse_alert_receivers
from vllm_fleet.config.clients import ApiClient, parse_api_clients
from vllm_fleet.config.errors import Checker, ConfigErrors
from vllm_fleet.config.gpus import GpuSpec, parse_gpus
from vllm_fleet.config.host_checks import check_host, check_instance, check_text
from vllm_fleet.config.instance import INSTANCE_DECLARED, INSTANCE_KEYS, InstanceConfig
from vllm_fleet.config.schema import HostKnob
from vllm_fleet.config.settings import Settings


@dataclass(frozen=True)
class HostConfig:
    """Everything vllm-fleet reads from one host's data."""

    name: str
    instances: tuple[InstanceConfig, ...]
    gpus: tuple[GpuSpec, ...] | None
    placement: str
    #: The host's knobs, typed (config/settings.py): `host.settings.vllm_root`.
    settings: Settings
    #: Multi-node instances this host is a non-head node of, as its own data repeats them (group
    #: data the head shares); check_fleet requires each to equal the head's declaration. They are
    #: not this host's instances: node_groups() finds every group from the heads.
    member_of: tuple[InstanceConfig, ...] = ()
    #: The port the deploy's SSH connection reaches (pyinfra's ssh_port): no listener may take it.
    ssh_port: int = 22
    #: Who may call the API (vllm_api_clients; without it the one client of vllm_api_key_env), by name.
    api_clients: tuple[ApiClient, ...] = ()
    #: pyinfra's ssh_hostname, the address the deploy connects to (None: the inventory name): an
    #: address the host already has, which no floating address may take.
    ssh_hostname: str | None = None
    #: Who the fleet's alerts reach (vllm_alert_receivers), read on the monitoring host only.
    alert_receivers: tuple[AlertReceiver, ...] = ()

    @property
    def advertise_address(self) -> str:
        """Where other hosts reach this host's front: vllm_advertise_address, which parse_host
        always resolves (_advertise_address)."""
        address = self.settings.vllm_advertise_address
        assert address is not None, f"host {self.name}: a HostConfig not made by parse_host"
        return address


def parse_host(name: str, data: dict[str, Any]) -> HostConfig:
    """Validate one host's data. Raises ConfigErrors listing every problem found."""
    check = Checker(name if kinds.printable(name) else repr(name))
    problem = kinds.inventory_name_problem(name)
    if problem:
        check.error(problem, key="host name", fix="name the host in the inventory with letters, digits, "
                                                   "'.', '-' and '_' (its address goes in ssh_hostname)")
        raise ConfigErrors(check.errors)
    check_text(check, data)
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
        parsed = read_instance(check, raw, position, settings)
        if parsed and parsed.nodes and parsed.head != name:
            member_of.append(parsed)  # the head's instance, seen through shared group data
        elif parsed:
            instances.append(parsed)
    api_clients = parse_api_clients(check, settings.vllm_api_clients, settings.vllm_api_key_env,
                                    settings.vllm_api_key_file)
    # Only the monitoring host's receivers reach a host: others' (shared group data) are not judged.
    alert_receivers = (parse_alert_receivers(check, settings.vllm_alert_receivers)
                       if settings.vllm_monitoring is True else ())
    check_host(check, settings, instances, data)
    if check.errors:
        raise ConfigErrors(check.errors)
    settings = replace(settings, vllm_advertise_address=_advertise_address(name, data, settings))
    ssh_port = data.get("ssh_port", 22)
    ssh_hostname = data.get("ssh_hostname")
    return HostConfig(name=name, instances=tuple(instances), gpus=gpus,
                      placement=settings.placement, settings=settings, member_of=tuple(member_of),
                      ssh_port=ssh_port if isinstance(ssh_port, int) and not isinstance(ssh_port, bool) else 22,
                      api_clients=api_clients, alert_receivers=alert_receivers,
                      ssh_hostname=ssh_hostname if isinstance(ssh_hostname, str) else None)


def read_instance(check: Checker, raw: Any, position: int, settings: Settings) -> InstanceConfig | None:
    """One entry of vllm_instances: each key by its declaration (InstanceConfig), then the rules
    between its keys (check_instance). None when anything is wrong (reported on `check`)."""
    if not isinstance(raw, dict):
        check.error(f"vllm_instances[{position}] must be a dict, got {type(raw).__name__}",
                    key=f"vllm_instances[{position}]",
                    fix="vllm_instances = [{'name': 'gemma', 'model': ..., 'served_model_name': ..., 'port': 8000}]")
        return None
    name = raw.get("name")
    label = name if isinstance(name, str) and name else f"#{position}"
    before = len(check.errors)
    check.unknown_keys(raw, INSTANCE_KEYS, instance=label)
    values: dict[str, Any] = {}
    valid: set[str] = set()  # the keys given or defaulted without a problem
    for key, declared in INSTANCE_DECLARED.items():
        if key in raw:
            errors = len(check.errors)
            values[key] = declared.read(check, raw[key], label, settings)
            if len(check.errors) == errors:
                valid.add(key)
        elif declared.required:
            check.error(f"missing required key '{key}'", instance=label, key=key, fix=f"add '{key}' to the instance")
        else:
            valid.add(key)
            default = declared.declared_default
            if isinstance(default, HostKnob) and not Settings.problem(default.knob, settings[default.knob]):
                values[key] = declared.read(check, settings[default.knob], label, settings)
    check_instance(check, raw, values, valid, label)
    if len(check.errors) > before:
        return None
    return InstanceConfig(**values)


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


#: The file in vllm_config_dir that holds the Hugging Face token of the downloads (root's, 0600).
HUB_TOKEN_FILE = "hub.env"


def service_user_directories(settings: Settings) -> list[str]:
    """The directories the deploy makes for the service user to write, in the order it makes them:
    its home (vllm_state_dir), HF_HOME, VLLM_CACHE_ROOT and VLLM_CONFIG_ROOT (<vllm_state_dir>/config)."""
    return sorted({settings.vllm_state_dir, settings.vllm_hf_home, settings.vllm_cache_root,
                   f"{settings.vllm_state_dir}/config"})
