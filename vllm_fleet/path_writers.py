"""One writer per host path: the rule, and what each writer writes.

Every step of the deploy decides from what the host had when the run read it, so a path written by
two steps (a directory the deploy makes that is also a rendered file, two model_source directories
synced into one model path, an instance's env file that is the downloads' token file) would have
one write go unseen. `path_clashes` is the rule that refuses it, and a synced model owns its whole
directory besides (the sync deletes what model_source lacks, so nothing else may live below it).
`vllm-fleet check`, `plan` and `render` apply it to the paths the host's settings give it
(`declared_writers`, from its HostLayout), before any host is reached; the deploy applies it again
to the files it actually rendered (`rendered_writers`), so a file that the layout does not foresee
is still checked. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from vllm_fleet.config import (ConfigError, HostConfig, InstanceConfig, config_dir_clashes, service_user_directories,
                               synced_model_clashes)
from vllm_fleet.config.adapters import host_directory
from vllm_fleet.environment import envs_root
from vllm_fleet.host_layout import host_layout
from vllm_fleet.rules.hub import instance_downloads

#: (path on the host, who writes it, in words)
Writer = tuple[str, str]


def managed_directories(config: HostConfig, *, front: bool) -> list[Writer]:
    """The directories of the host's services, in the order the deploy makes them: the config
    directory, the front's secrets directory (`front`: when the host runs a front) and the service
    user's (service_user_directories). deploy.managed.service_directories gives each its owner and mode."""
    layout = host_layout(config)
    dirs = [(layout.config_dir, "the config directory")]
    if front:
        dirs.append((layout.front_secrets_dir, "the front's secrets directory"))
    dirs += [(path, f"the service user's directory {path}") for path in service_user_directories(config.settings)]
    return dirs


def layout_directories(config: HostConfig, instances: Sequence[InstanceConfig]) -> list[Writer]:
    """The other directories the deploy (or a rollout) makes or links under the host's roots: the
    uploads, the rollback snapshots, the environments and their `current` link, Ray's directories on
    a node of a multi-node instance, the fleet Prometheus' directories on its host."""
    layout = host_layout(config)
    dirs = [(layout.upload_dir, "the uploads directory"), (layout.rollback_dir, "the rollback directory"),
            (envs_root(layout.root), "the environments directory"), (layout.current, "the environments' current link")]
    if any(inst.nodes for inst in instances):
        dirs += [(layout.ray["temp"], "Ray's directory"), (layout.ray["spill"], "Ray's spill directory")]
    if config.settings.vllm_monitoring is True:
        monitoring = layout.monitoring
        dirs += [(monitoring["dir"], "Prometheus' directory"), (monitoring["targets_dir"], "Prometheus' targets")]
    return dirs


def downloads_from_hub(instances: Sequence[InstanceConfig]) -> bool:
    """Whether the host downloads anything from the hub (its token file exists only then)."""
    return any(instance_downloads(inst.model, inst.tokenizer) or any(a.model for a in inst.adapters)
               for inst in instances)


def declared_writers(config: HostConfig, instances: Sequence[InstanceConfig],
                     names: Iterable[str] | None = None) -> list[Writer]:
    """Every path the host's settings give it a writer for, without planning or rendering: the
    directories, the files (declared_files) and each synced model path. `instances`: those whose
    model the host holds (its own, and on a Ray worker the multi-node instance it serves a stage
    of); `names`: as declared_files takes them. A list, not a mapping: two writers of one path both
    stay in it."""
    directories = managed_directories(config, front=_has_front(config)) + layout_directories(config, instances)
    return [*directories, *declared_files(config, instances, names), *_model_writers(instances),
            *adapter_writers(config, instances)]


def declared_files(config: HostConfig, instances: Sequence[InstanceConfig],
                   names: Iterable[str] | None = None) -> list[Writer]:
    """The files the host's settings give it (what render writes): the manifest, each instance's
    files, the Ray unit on a node, the front's, gateway's and monitoring's files where the settings
    ask for them. `names`: the planned instances' names, where a plan is at hand (placement "auto"
    may split an instance by GPU model), else the declared ones."""
    layout, settings = host_layout(config), config.settings
    files = [(layout.manifest, "the deploy manifest")]
    for name in (names if names is not None else [inst.name for inst in config.instances]):
        files += [(path, f"instance {name}'s {kind}") for kind, path in layout.instance(name).items()]
    if any(inst.nodes for inst in instances):  # a node of a multi-node instance runs Ray
        files.append((layout.ray["unit"], "the Ray unit"))
    if config.instances:  # render.adapter_host_files
        files.append((layout.model_access, "the module vLLM loads (token counting, model access)"))
    if any(inst.adapters for inst in config.instances):  # render.adapter_host_files, render.adapter_files
        files.append((layout.adapter_loader, "the adapters' loader"))
        files += [(layout.instance_adapters(inst.name), f"instance {inst.name}'s adapters list")
                  for inst in config.instances if inst.adapters]
    groups = [(_has_front(config), layout.front, "front"), (settings.vllm_gateway is True, layout.gateway, "gateway"),
              (settings.vllm_metrics is True, layout.metrics, "metrics"),
              (settings.vllm_monitoring is True, layout.monitoring, "monitoring")]
    tls = settings.vllm_tls is True
    for wanted, paths, what in groups:
        files += [(path, f"the {what}'s {kind}") for kind, path in paths.items() if wanted
                  # the certificate, its key and the trusted CAs only with vllm_tls; Prometheus'
                  # directories are layout_directories'
                  and (tls or not kind.startswith("tls_")) and kind not in ("dir", "targets_dir")]
    if settings.vllm_gateway is True:  # a client limited to some models
        files += [(layout.client_models(c.name), f"client {c.name}'s model list")
                  for c in config.api_clients if c.models is not None]
    return files


def rendered_writers(config: HostConfig, instances: Sequence[InstanceConfig], files: Iterable[str], *,
                     directories: Iterable[Writer]) -> list[Writer]:
    """What the deploy writes on the host: the directories it makes, the files it rendered and each
    synced model and adapter path (the hub's token file: path_clashes adds it)."""
    return [*directories, *((path, f"the rendered file {PurePosixPath(path).name}") for path in files),
            *_model_writers(instances), *adapter_writers(config, instances)]


def rendered_twice(config: HostConfig, paths: Sequence[str]) -> list[ConfigError]:
    """The paths of a render that two of its files share (the later one would replace the earlier)."""
    twice = sorted({path for path in paths if paths.count(path) > 1})
    return [ConfigError(f"{path} would be written by two of the host's rendered files", host=config.name,
                        key="vllm_instances", fix="give the instance another name")
            for path in twice]


def path_clashes(config: HostConfig, instances: Sequence[InstanceConfig], writers: Iterable[Writer], *,
                 hub_downloads: bool | None = None) -> list[ConfigError]:
    """The rule: no host path has two writers, and nothing but its own sync lives below a synced
    model. The cases a user can make by the input come first, each with its own message and fix
    (config.host: two model_source directories synced into one path, an instance named `hub` whose
    env file would be the downloads' token file); any other pair of writers is refused after them
    all the same. `hub_downloads`: whether the host downloads from the hub, which writes the token
    file (None: derived from `instances`)."""
    downloads = downloads_from_hub(instances) if hub_downloads is None else hub_downloads
    errors = synced_model_clashes(config, instances) + config_dir_clashes(config, instances, hub_downloads=downloads)
    if errors:
        return errors
    if downloads:
        writers = [*writers, (host_layout(config).hub_token_file, "the Hugging Face token file of the downloads")]
    by_path: dict[str, list[str]] = {}
    for path, who in writers:
        names = by_path.setdefault(_normal(path), [])
        if who not in names:  # one writer named twice (one synced source for two instances) is one
            names.append(who)
    synced = {_normal(inst.model): inst.name for inst in instances if inst.model_source}
    config_dir = config.settings.vllm_config_dir.rstrip("/") + "/"
    errors = []
    for path, whos in sorted(by_path.items()):
        if len(whos) > 1:
            message = f"{path} would be written by {' and by '.join(whos)}"
            if path in synced:
                errors.append(ConfigError(message, host=config.name, instance=synced[path], key="model",
                                          fix="give the model a path of its own, e.g. under vllm_models_dir"))
            elif path.startswith(config_dir):
                errors.append(ConfigError(message, host=config.name, key="vllm_instances",
                                          fix="rename the instance (its files are <vllm_config_dir>/<name>.*)"))
            else:
                errors.append(ConfigError(message, host=config.name, key="vllm_config_dir",
                                          fix="give each directory knob (vllm_config_dir, vllm_root, vllm_state_dir "
                                              "and those below it) a directory of its own"))
    for model, name in sorted(synced.items()):
        if len(by_path[model]) > 1:
            continue  # said above
        inside = sorted(path for path in by_path if path.startswith(model.rstrip("/") + "/"))
        if inside:
            errors.append(ConfigError(
                f"model path {model} is synced from model_source (the sync deletes what the source lacks), "
                f"and {inside[0]} ({by_path[inside[0]][0]}) is inside it", host=config.name, instance=name,
                key="model", fix="give the model a directory of its own, e.g. under vllm_models_dir"))
    return errors


def _has_front(config: HostConfig) -> bool:
    # render.front_files: instances, the gateway or metrics give a host its front.
    settings = config.settings
    return bool(config.instances) or settings.vllm_gateway is True or settings.vllm_metrics is True


def _model_writers(instances: Sequence[InstanceConfig]) -> list[Writer]:
    # One sync per model path and source, the source as synced_model_clashes compares it: two
    # instances syncing one directory spelled two ways are one writer.
    return [(inst.model, f"the model sync of {Path(inst.model_source).expanduser()}")
            for inst in instances if inst.model_source]


def adapter_writers(config: HostConfig, instances: Sequence[InstanceConfig]) -> list[Writer]:
    """Each source adapter's directory on the host (config.adapters.host_directory): the adapter's
    sync writes it, and owns it as a model sync owns its model's."""
    models_dir = config.settings.vllm_models_dir
    return [(host_directory(models_dir, inst.name, adapter), f"the adapter sync of {Path(adapter.source).expanduser()}")
            for inst in instances for adapter in inst.adapters if adapter.source]


def _normal(path: str) -> str:
    return path.rstrip("/") or "/"
