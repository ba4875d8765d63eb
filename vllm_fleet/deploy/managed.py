"""What the deploy manages on a host, as `prepare` (to read their state) and the steps (to manage
them) both need it: directories, service accounts, upload and token files, what a process must be
younger than, the hub downloads, the units the plan no longer has. Every path comes from the host's
HostLayout (vllm_fleet.host_layout)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyinfra import host

from vllm_fleet import gateway, path_writers
from vllm_fleet.config import HostConfig, instance_of_unit
from vllm_fleet.host_layout import host_layout
from vllm_fleet.facts import batch as facts
from vllm_fleet.rules import hub
from vllm_fleet.facts.host import ManagedUnits
from vllm_fleet.rules.model_sync import MANIFEST_NAME as MODEL_MANIFEST
from vllm_fleet.monitoring.files import MONITORING_UNITS, monitoring_unit_files
from vllm_fleet.host_layout import PROMETHEUS_UNIT
from vllm_fleet.monitoring.files import metrics_paths
from vllm_fleet.render import front_paths, instance_paths, ray_paths
from vllm_fleet.host_layout import FRONT_UNIT, RAY_UNIT

from .state import Deployment


def upload_dir(config: HostConfig) -> str:
    """HostLayout.upload_dir of the host."""
    return host_layout(config).upload_dir


def hub_token_file(config: HostConfig) -> str:
    """HostLayout.hub_token_file of the host."""
    return host_layout(config).hub_token_file


@dataclass(frozen=True)
class ManagedDirectory:
    """A directory the deploy makes and keeps, with its owner and mode."""

    name: str  # the operation's name
    path: str
    mode: str
    user: str
    group: str


def runs_front(deployment: Deployment) -> bool:
    """Whether this run writes the host's front (render gives it one only where it has something to serve)."""
    return front_paths(deployment.config)["unit"] in deployment.files


def service_directories(deployment: Deployment) -> list[ManagedDirectory]:
    """The directories of the host's services (path_writers.managed_directories, in the order they
    are made), with their owners and modes: the config directory (root's; each service's files in it
    carry their own group and mode, so every service's user may pass through it), the front's secrets
    (root's, its user's group alone: front_secrets_dir) and those the service user writes (its home,
    HF_HOME, vLLM's cache and config)."""
    config = deployment.config
    settings = config.settings
    layout, user = host_layout(config), settings.vllm_service_user
    dirs = []
    for path, *_writer in path_writers.managed_directories(config, front=runs_front(deployment)):
        if path == layout.config_dir:
            dirs.append(ManagedDirectory("Config directory", path, "0755", "root", "root"))
        elif path == layout.front_secrets_dir:
            dirs.append(ManagedDirectory("Front secrets directory", path, "0750", "root", settings.vllm_front_user))
        else:
            # The state dir holds vllm_models_dir by default: others may traverse it (0751, not list
            # it), so the login user can upload model files into place (model_sync); what the service
            # writes (HF_HOME, caches, config) stays 0750 below it.
            dirs.append(ManagedDirectory(f"Directory {path}", path, "0751" if path == settings.vllm_state_dir else "0750",
                                         user, user))
    return dirs


@dataclass(frozen=True)
class ServiceAccount:
    """A user the deploy creates for one service (with a group of the same name)."""

    role: str  # what runs as it, in words
    user: str
    home: str


def service_accounts(deployment: Deployment) -> list[ServiceAccount]:
    """The users of the services this host runs: vLLM's and Ray's always (its home is the state
    directory), the front's, the gateway's and the host exporter's where the host runs them, and the
    user of keepalived's readiness check on a gateway behind a floating address."""
    config, files = deployment.config, deployment.files
    settings = config.settings
    accounts = [ServiceAccount("vLLM and Ray", settings.vllm_service_user, settings.vllm_state_dir)]
    for unit_path, role, user in ((front_paths(config)["unit"], "the front (nginx)", settings.vllm_front_user),
                                  (gateway.gateway_paths(config)["unit"], "the gateway (vllm-router)",
                                   settings.vllm_gateway_user),
                                  (metrics_paths(config)["exporter_unit"], "the host exporter",
                                   settings.vllm_exporter_user)):
        if unit_path in files:
            accounts.append(ServiceAccount(role, user, NO_HOME))
    if gateway.floating_paths(config)["keepalived"] in files:
        accounts.append(ServiceAccount("keepalived's readiness check of the gateway",
                                       settings.vllm_gateway_check_user, NO_HOME))
    return accounts


#: The home of a service user that needs none (what Debian's adduser gives such users).
NO_HOME = "/nonexistent"


def freshness_paths(config: HostConfig, inst) -> tuple[str, ...]:
    """What an instance's process must be younger than: its unit, engine config, env file, the
    environment's `current` link (switched when the environment changes) and, for a model synced
    from the workstation, the sync's manifest (renamed into place last, once every file is there)."""
    paths = instance_paths(config, inst.name)
    synced = (f"{inst.config.model}/{MODEL_MANIFEST}",) if inst.config.model_source else ()
    return (paths["unit"], paths["config"], paths["env"], host_layout(config).current) + synced


def ray_freshness_paths(config: HostConfig) -> tuple[str, ...]:
    """What a node's Ray process must be younger than: its unit and the environment's `current`
    link (Ray starts vLLM's workers from that environment)."""
    return ray_paths(config)["unit"], host_layout(config).current


def hub_downloads(deployment: Deployment) -> list[tuple[Any, hub.RepoDownload]]:
    """(instance config, download) of everything the instances load from the hub (on a Ray worker,
    the multi-node instance's model too)."""
    configs = [inst.config for inst in deployment.plan.instances]
    if deployment.node_instance is not None:
        configs.append(deployment.node_instance)
    return [(inst, download) for inst in configs
            for download in [*hub.instance_downloads(inst.model, inst.tokenizer), *adapter_downloads(inst)]]


def adapter_downloads(inst) -> list[hub.RepoDownload]:
    """The instance's LoRA adapters from the hub (config.adapters: a 'model' entry)."""
    return [hub.adapter_download(a.model, a.revision, name=a.name) for a in inst.adapters if a.model]


def removed_units(deployment: Deployment) -> list[tuple[str, str, list[str]]]:
    """(unit, why it stops, its files) of each unit vllm-fleet wrote on this host that the plan no
    longer has: removed instances; the front when no instance is left; the gateway when this host
    is no longer the fleet's gateway; the exporters and Prometheus when monitoring is turned off."""
    config = deployment.config
    wanted = {inst.unit_name for inst in deployment.plan.instances}
    front, gateway_files = front_paths(config), gateway.gateway_paths(config)
    out = []
    for unit in facts.get(host, ManagedUnits):
        if unit in wanted:
            continue
        if unit == gateway.GATEWAY_UNIT:
            if gateway_files["unit"] not in deployment.files:
                # The unit file last: it is how the next run finds what is left (ManagedUnits).
                out.append((unit, "Stop the gateway (this host is no longer the fleet's gateway)",
                            [p for k, p in gateway_files.items() if k != "unit"] + [gateway_files["unit"]]))
        elif unit == FRONT_UNIT:
            if front["unit"] not in deployment.files:
                out.append((unit, "Stop the front (no instance left)",
                            [p for k, p in front.items() if k != "unit"] + [front["unit"]]))
        elif unit in MONITORING_UNITS:
            paths = monitoring_unit_files(config)[unit]
            if paths[-1] not in deployment.files:
                knob = "vllm_monitoring" if unit == PROMETHEUS_UNIT else "vllm_metrics"
                out.append((unit, f"Stop {unit} ({knob} is off on this host)", paths))
        elif unit == RAY_UNIT:
            if ray_paths(config)["unit"] not in deployment.files:
                out.append((unit, "Stop the Ray node (this host is no node of a multi-node instance now)",
                            [ray_paths(config)["unit"]]))
        else:
            name = instance_of_unit(unit) or unit
            paths = instance_paths(config, name)
            adapters = host_layout(config).instance_adapters(name)  # its LoRA adapters' list, if it had one
            out.append((unit, f"Stop removed instance {name}", [paths["config"], paths["env"], adapters,
                                                                paths["unit"]]))
    return out
