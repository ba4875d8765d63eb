"""One writer per host path: the rule, and what each writer writes.

Every step of the deploy decides from what the host had when the run read it, so a path written by
two steps (a directory the deploy makes that is also a rendered file, two model_source directories
synced into one model path, an instance's env file that is the downloads' token file) would have
one write go unseen. `path_clashes` is the one rule that refuses it. `vllm-fleet check`, `plan` and
`render` apply it to the paths the host's settings give it (`declared_writers`, from its HostLayout),
before any host is reached; the deploy applies it again to the files it actually rendered
(`rendered_writers`), so a file that the layout does not foresee is still checked. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePosixPath

from vllm_fleet.config import (ConfigError, HostConfig, InstanceConfig, config_dir_clashes, service_user_directories,
                               synced_model_clashes)
from vllm_fleet.host_layout import HostLayout, host_layout
from vllm_fleet.rules.hub import instance_downloads

#: (path on the host, who writes it, in words)
Writer = tuple[str, str]


def managed_directories(config: HostConfig, *, front: bool) -> list[Writer]:
    """The directories the deploy makes, in the order it makes them: the config directory, the
    front's secrets directory (`front`: when the host runs a front) and the service user's
    (service_user_directories). deploy.managed.service_directories gives each its owner and mode."""
    layout = host_layout(config)
    dirs = [(layout.config_dir, "Config directory")]
    if front:
        dirs.append((layout.front_secrets_dir, "Front secrets directory"))
    dirs += [(path, f"Directory {path}") for path in service_user_directories(config.settings)]
    return dirs


def downloads_from_hub(instances: Sequence[InstanceConfig]) -> bool:
    """Whether the host downloads anything from the hub (its token file exists only then)."""
    return any(instance_downloads(inst.model, inst.tokenizer) for inst in instances)


def declared_writers(config: HostConfig, instances: Sequence[InstanceConfig],
                     names: Iterable[str] | None = None) -> list[Writer]:
    """Every path the host's settings give it a writer for, without planning or rendering: the
    managed directories, each instance's files, the front's, gateway's and monitoring's files where
    the settings ask for them, the manifest, the hub's token file and each synced model path.
    `instances`: those whose model the host holds (its own, and on a Ray worker the multi-node
    instance it serves a stage of); `names`: the planned instances' names, where a plan is at hand
    (placement "auto" may split an instance by GPU model), else the declared ones."""
    layout, settings = host_layout(config), config.settings
    front = bool(config.instances) or settings.vllm_gateway is True or settings.vllm_metrics is True
    files: dict[str, str] = {layout.manifest: "manifest"}
    for name in (names if names is not None else [inst.name for inst in config.instances]):
        files.update({path: f"{name}'s {kind}" for kind, path in layout.instance(name).items()})
    if any(inst.nodes for inst in instances):  # a node of a multi-node instance runs Ray
        files[layout.ray["unit"]] = "the Ray unit"
    groups: list[tuple[bool, Mapping[str, str], str]] = [
        (front, _front_files(layout, tls=settings.vllm_tls is True), "front"), (settings.vllm_gateway is True, layout.gateway, "gateway"),
        (settings.vllm_metrics is True, layout.metrics, "metrics"),
        (settings.vllm_monitoring is True, _monitoring_files(layout), "monitoring")]
    for wanted, paths, what in groups:
        if wanted:
            files.update({path: f"the {what}'s {kind}" for kind, path in paths.items()})
    if settings.vllm_gateway is True:
        files.update({layout.client_models(c.name): f"client {c.name}'s model list" for c in config.api_clients
                      if c.models is not None})  # a client limited to some models
    directories = [(path, name.lower()) for path, name in managed_directories(config, front=front)]
    return [*directories, *_file_writers(files), *_model_writers(instances)]


def rendered_writers(instances: Sequence[InstanceConfig], files: Iterable[str], *,
                     directories: Iterable[Writer]) -> list[Writer]:
    """What the deploy writes on the host: the directories it makes, the files it rendered and each
    synced model path (the hub's token file: path_clashes adds it)."""
    return [*directories, *_file_writers(dict.fromkeys(files, "")), *_model_writers(instances)]


def path_clashes(config: HostConfig, instances: Sequence[InstanceConfig], writers: Iterable[Writer], *,
                 hub_downloads: bool | None = None) -> list[ConfigError]:
    """The rule: no host path has two writers. The cases a user can make by the input come first,
    each with its own message and fix (config.host: two model_source directories synced into one
    path, an instance named `hub` whose env file would be the downloads' token file); any other
    pair of writers is refused after them all the same. `hub_downloads`: whether the host
    downloads from the hub, which writes the token file (None: derived from `instances`)."""
    downloads = downloads_from_hub(instances) if hub_downloads is None else hub_downloads
    errors = synced_model_clashes(config, instances) + config_dir_clashes(config, instances, hub_downloads=downloads)
    if errors:
        return errors
    if downloads:
        writers = [*writers, (host_layout(config).hub_token_file, "the Hugging Face token file of the downloads")]
    by_path: dict[str, list[str]] = {}
    for path, who in writers:
        names = by_path.setdefault(_normal(path), [])
        if who not in names:  # one writer named twice (one file, one synced source) is one
            names.append(who)
    synced = {_normal(inst.model): inst.name for inst in instances if inst.model_source}
    config_dir = config.settings.vllm_config_dir.rstrip("/") + "/"
    errors = []
    for path, whos in sorted(by_path.items()):
        if len(whos) < 2:
            continue
        message = f"{path} would be written by {' and by '.join(whos)}"
        if path in synced:
            errors.append(ConfigError(message, host=config.name, instance=synced[path], key="model",
                                      fix="give the model a path of its own, e.g. under vllm_models_dir"))
        else:
            errors.append(ConfigError(
                message, host=config.name, key="vllm_instances" if path.startswith(config_dir) else "vllm_config_dir",
                fix="rename the instance (any name but 'hub'), or give vllm_config_dir a directory of its own "
                    "(not one the deploy makes below vllm_state_dir)"))
    return errors


def _file_writers(files: Mapping[str, str]) -> list[Writer]:
    # Rendered files are one writer each: the step that writes rendered files, by name.
    return [(path, f"the rendered file {PurePosixPath(path).name}") for path in files]


def _model_writers(instances: Sequence[InstanceConfig]) -> list[Writer]:
    # One sync per model path and source (synced_model_clashes refuses two sources for one path).
    return [(inst.model, f"the model sync of {inst.model_source}") for inst in instances if inst.model_source]


def _front_files(layout: HostLayout, *, tls: bool) -> dict[str, str]:
    # The certificate, its key and the trusted CAs only with vllm_tls.
    return {kind: path for kind, path in layout.front.items() if tls or not kind.startswith("tls_")}


def _monitoring_files(layout: HostLayout) -> dict[str, str]:
    # The monitoring paths that are files: its directories are made by the Prometheus step.
    return {kind: path for kind, path in layout.monitoring.items() if kind not in ("dir", "targets_dir")}


def _normal(path: str) -> str:
    return path.rstrip("/") or "/"
