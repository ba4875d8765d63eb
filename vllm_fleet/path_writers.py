"""One writer per host path: the rule, and what each writer writes.

Every step of the deploy decides from what the host had when the run read it, so a path written by
two steps (a directory the deploy makes that is also a rendered file, two model_source directories
synced into one model path, an instance's env file that is the downloads' token file) would have
one write go unseen. `path_clashes` is the one rule that refuses it, and a synced model owns its
whole directory besides (the sync deletes what model_source lacks, so nothing else may live below
it). Every writer comes from the host's HostLayout (and its instances' models and adapters). Where
it runs, all before any host changes:
- `vllm-fleet check`, `plan` and `render`, and the deploy's check of the run before the first lock
  (fleet_check), on the paths the host's settings give it (`declared_writers`), before any host is
  reached; `plan` and `render` again with the planned instances' names (placement "auto" may split
  an instance by GPU model);
- `prepare_host` (the deploy's plan and `vllm-fleet status`), on what it actually rendered
  (`rendered_writers`), so a file the layout does not foresee, or one path rendered twice, is
  refused too.

A path is compared as the host's filesystem names it: '//', '/./' and a trailing '/' spell the same
path (host paths that spell it so are refused as input already: kinds.host_path_problem), while
'/srv/M' and '/srv/m' are two: Linux's filesystems (ext4, XFS, tmpfs) compare names byte for byte,
so taking them as one would refuse inventories that are right (ext4's case folding is set per
directory and off unless asked for; a host whose roots fold case is not one this rule foresees). Pure.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from vllm_fleet import gateway
from vllm_fleet.config import ConfigError, HostConfig, InstanceConfig, service_user_directories
from vllm_fleet.config.adapters import host_directory
from vllm_fleet.environment import envs_root
from vllm_fleet.host_layout import host_layout
from vllm_fleet.rules.hub import instance_downloads

HUB_TOKEN_WRITER = "the Hugging Face token file of the downloads"


class Writer(NamedTuple):
    """A path on the host and who writes it, in words. `instance`: the instance whose key puts the
    path there (its files, its model's sync), the one an error names; `source`: a sync's
    workstation directory (one source synced for two instances is one writer)."""

    path: str
    who: str
    instance: str | None = None
    source: str | None = None


def managed_directories(config: HostConfig, *, front: bool) -> list[Writer]:
    """The directories of the host's services, in the order the deploy makes them: the config
    directory, the front's secrets directory (`front`: when the host runs a front) and the service
    user's (service_user_directories). deploy.managed.service_directories gives each its owner and mode."""
    layout = host_layout(config)
    dirs = [Writer(layout.config_dir, "the config directory")]
    if front:
        dirs.append(Writer(layout.front_secrets_dir, "the front's secrets directory"))
    dirs += [Writer(path, f"the service user's directory {path}") for path in service_user_directories(config.settings)]
    return dirs


def layout_directories(config: HostConfig, instances: Sequence[InstanceConfig]) -> list[Writer]:
    """The other directories the deploy (or a rollout) makes or links under the host's roots: the
    uploads, the rollback snapshots, the environments and their `current` link, Ray's directories on
    a node of a multi-node instance, the fleet Prometheus' directories on its host."""
    layout = host_layout(config)
    dirs = [Writer(layout.upload_dir, "the uploads directory"), Writer(layout.rollback_dir, "the rollback directory"),
            Writer(envs_root(layout.root), "the environments directory"),
            Writer(layout.current, "the environments' current link")]
    if any(inst.nodes for inst in instances):
        dirs += [Writer(layout.ray["temp"], "Ray's directory"), Writer(layout.ray["spill"], "Ray's spill directory")]
    if config.settings.vllm_monitoring is True:
        monitoring = layout.monitoring
        dirs += [Writer(monitoring["dir"], "Prometheus' directory"),
                 Writer(monitoring["targets_dir"], "Prometheus' targets")]
    return dirs


def downloads_from_hub(instances: Sequence[InstanceConfig]) -> bool:
    """Whether the host downloads anything from the hub (its token file exists only then)."""
    return any(instance_downloads(inst.model, inst.tokenizer) or any(a.model for a in inst.adapters)
               for inst in instances)


def declared_writers(config: HostConfig, instances: Sequence[InstanceConfig],
                     names: Iterable[str] | None = None) -> list[Writer]:
    """Every path the host's settings give it a writer for, without planning or rendering: the
    directories, the files (declared_files), each synced model and adapter path and, where the host
    downloads from the hub, the token file. `instances`: those whose model the host holds (its own,
    and on a Ray worker the multi-node instance it serves a stage of); `names`: as declared_files
    takes them. A list, not a mapping: two writers of one path both stay in it."""
    directories = managed_directories(config, front=_has_front(config)) + layout_directories(config, instances)
    token = ([Writer(host_layout(config).hub_token_file, HUB_TOKEN_WRITER)] if downloads_from_hub(instances) else [])
    return [*directories, *declared_files(config, instances, names), *token, *_model_writers(instances),
            *adapter_writers(config, instances)]


def declared_files(config: HostConfig, instances: Sequence[InstanceConfig],
                   names: Iterable[str] | None = None) -> list[Writer]:
    """The files the host's settings give it (what render writes): the manifest, each instance's
    files, the Ray unit on a node, the front's, gateway's and monitoring's files where the settings
    ask for them. `names`: the planned instances' names, where a plan is at hand (placement "auto"
    may split an instance by GPU model), else the declared ones."""
    layout, settings = host_layout(config), config.settings
    files = [Writer(layout.manifest, "the deploy manifest")]
    for name in (names if names is not None else [inst.name for inst in config.instances]):
        files += [Writer(path, f"instance {name}'s {kind}", instance=name) for kind, path in layout.instance(name).items()]
    if any(inst.nodes for inst in instances):  # a node of a multi-node instance runs Ray
        files.append(Writer(layout.ray["unit"], "the Ray unit"))
    if config.instances:  # render.adapter_host_files
        files.append(Writer(layout.model_access, "the module vLLM loads (token counting, model access)"))
    if any(inst.adapters for inst in config.instances):  # render.adapter_host_files, render.adapter_files
        files.append(Writer(layout.adapter_loader, "the adapters' loader"))
        files += [Writer(layout.instance_adapters(inst.name), f"instance {inst.name}'s adapters list", instance=inst.name)
                  for inst in config.instances if inst.adapters]
    floating = settings.vllm_gateway is True and settings.vllm_gateway_address is not None
    groups = [(_has_front(config), layout.front, "front"), (settings.vllm_gateway is True, layout.gateway, "gateway"),
              (floating, layout.floating, "floating address"),
              (settings.vllm_metrics is True, layout.metrics, "metrics"),
              (settings.vllm_monitoring is True, layout.monitoring, "monitoring")]
    tls, prefix = settings.vllm_tls is True, gateway.prefix_routing(config)
    for wanted, paths, what in groups:
        files += [Writer(path, f"the {what}'s {kind}") for kind, path in paths.items() if wanted
                  # the certificate, its key and the trusted CAs only with vllm_tls; the keyer only on a
                  # gateway with the "prefix" policy; Prometheus' directories are layout_directories'
                  and (tls or not kind.startswith("tls_")) and (prefix or kind != "prefix_key")
                  and kind not in ("dir", "targets_dir")]
    if settings.vllm_gateway is True:  # a client limited to some models
        files += [Writer(layout.client_models(c.name), f"client {c.name}'s model list")
                  for c in config.api_clients if c.models is not None]
    return files


def rendered_writers(config: HostConfig, instances: Sequence[InstanceConfig], names: Iterable[str],
                     rendered: Sequence[str]) -> list[Writer]:
    """What a prepared host's run writes: every declared writer (with the planned instances' names),
    and a writer of its own for each rendered file the layout does not foresee, or foresees fewer
    times than render wrote it (`rendered`: the rendered files' paths)."""
    names = list(names)
    declared = Counter(_normal(writer.path) for writer in declared_files(config, instances, names))
    written = Counter(_normal(path) for path in rendered)
    extra = [Writer(path, f"the rendered file {Path(path).name}")
             for path in sorted(written) for _ in range(written[path] - declared[path])]
    return [*declared_writers(config, instances, names), *extra]


def path_clashes(config: HostConfig, writers: Iterable[Writer], *,
                 synced: Sequence[InstanceConfig] = ()) -> list[ConfigError]:
    """The rule: no host path has two writers, and nothing but its own sync lives below a synced
    model (`synced`: the instances whose model the host holds; those with a model_source own their
    model's directory). Each error names the host, the instance and the key a user changes, and the
    fix; the cases the input makes most often have words of their own (two model_source directories
    synced into one path, an instance named `hub` whose env file would be the downloads' token file,
    one path rendered twice)."""
    by_path: dict[str, list[Writer]] = {}
    for writer in writers:
        same = by_path.setdefault(_normal(writer.path), [])
        if writer.source is None or writer.who not in {other.who for other in same}:  # one sync is one writer
            same.append(writer)
    errors = [_clash(config, path, whos) for path, whos in sorted(by_path.items()) if len(whos) > 1]
    seen: set[str] = set()
    for inst in synced:
        model = _normal(inst.model)
        if not inst.model_source or len(by_path.get(model, ())) > 1 or model in seen:
            continue  # said above, or for the other instance of the same sync
        seen.add(model)
        inside = sorted(path for path in by_path if path.startswith(model.rstrip("/") + "/"))
        if inside:
            errors.append(ConfigError(
                f"model path {model} is synced from model_source (the sync deletes what the source lacks), "
                f"and {inside[0]} ({by_path[inside[0]][0].who}) is inside it", host=config.name, instance=inst.name,
                key="model", fix="give the model a directory of its own, e.g. under vllm_models_dir"))
    return errors


def _clash(config: HostConfig, path: str, writers: list[Writer]) -> ConfigError:
    """The error of one path with several writers: the words, instance, key and fix of its case."""
    syncs = [w for w in writers if w.source is not None]
    if len(syncs) == len(writers) and all(w.who.startswith("the model sync ") for w in syncs):
        by_source = {w.source: w.instance for w in syncs}
        return ConfigError(f"instances {' and '.join(str(i) for i in by_source.values())} sync different "
                           f"model_source directories ({', '.join(str(s) for s in by_source)}) into the same host "
                           f"path {path}", host=config.name, instance=list(by_source.values())[-1], key="model",
                           fix="give each model_source a model path of its own")
    envs = [w.instance for w in writers if w.instance and w.who.endswith("'s env")]
    if len(writers) == 2 and len(envs) == 1 and any(w.who == HUB_TOKEN_WRITER for w in writers):
        return ConfigError(f"instance {envs[0]}'s env file would be {path}, the file of the Hugging Face token the "
                           "downloads use", host=config.name, instance=envs[0], key="name",
                           fix=f"rename the instance (any name but {envs[0]!r})")
    if len({w.who for w in writers}) == 1:
        inst = writers[0].instance  # named twice among the planned instances: a split's part is <name>-<GPU model>
        return ConfigError(f"{path} would be written by two of the host's rendered files"
                           + (f" (two planned instances named {inst}: placement 'split' names each part of an "
                              "instance <name>-<GPU model>)" if inst else ""), host=config.name,
                           instance=inst, key="name" if inst else "vllm_instances", fix="give the instance another name")
    message = f"{path} would be written by {' and by '.join(w.who for w in writers)}"
    if syncs:
        return ConfigError(message, host=config.name, instance=syncs[0].instance, key="model",
                           fix="give the model a path of its own, e.g. under vllm_models_dir")
    files = [w.instance for w in writers if w.instance]
    if files:  # an instance's file
        return ConfigError(message, host=config.name, instance=files[0], key="name",
                           fix="rename the instance (its files are <vllm_config_dir>/<name>.* and its unit "
                               "vllm-<name>.service)")
    if path.startswith(config.settings.vllm_config_dir.rstrip("/") + "/"):
        return ConfigError(message, host=config.name, key="vllm_instances",
                           fix="rename the instance (its files are <vllm_config_dir>/<name>.*)")
    return ConfigError(message, host=config.name, key="vllm_config_dir",
                       fix="give each directory knob (vllm_config_dir, vllm_root, vllm_state_dir and those below "
                           "it) a directory of its own")


def _has_front(config: HostConfig) -> bool:
    # render_front.front_files: instances, the gateway or metrics give a host its front.
    settings = config.settings
    return bool(config.instances) or settings.vllm_gateway is True or settings.vllm_metrics is True


def _model_writers(instances: Sequence[InstanceConfig]) -> list[Writer]:
    # One sync per model path and source, the source as the workstation names it: two instances
    # syncing one directory spelled two ways are one writer.
    writers = []
    for inst in instances:
        if inst.model_source:
            source = str(Path(inst.model_source).expanduser())
            writers.append(Writer(inst.model, f"the model sync of {source}", instance=inst.name, source=source))
    return writers


def adapter_writers(config: HostConfig, instances: Sequence[InstanceConfig]) -> list[Writer]:
    """Each source adapter's directory on the host (config.adapters.host_directory): the adapter's
    sync writes it, and owns it as a model sync owns its model's."""
    models_dir = config.settings.vllm_models_dir
    writers = []
    for inst in instances:
        for adapter in inst.adapters:
            if adapter.source:
                source = str(Path(adapter.source).expanduser())
                writers.append(Writer(host_directory(models_dir, inst.name, adapter),
                                      f"the adapter sync of {source}", instance=inst.name, source=source))
    return writers


def _normal(path: str) -> str:
    """The path as the host's filesystem resolves its spelling: '//' and '/./' are '/', a trailing
    '/' is none (no '..': a host path with one is refused as input, and lexically it could name
    another directory than through a link)."""
    path = re.sub(r"/(\./)+", "/", re.sub(r"/+", "/", path + "/"))
    return path.rstrip("/") or "/"
