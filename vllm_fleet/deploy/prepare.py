"""Step 1: the fleet's check on the workstation (once a run: every host's data and secrets, before
any lock), then validate this host's data, take its lock (with the root check), read its facts,
plan and render; every check of the input runs here, before any host is changed.

What the steps read from the host is read in two remote commands (facts.prefetch), both here:
facts/discovery.py's `discovery_queries` before the plan (GPUs, model configs, paths, units, OS
packages; `discover` checks them, and `vllm-fleet status` plans from the same) and
`managed_state_queries` after it (every file, directory, unit, the service account, the model
sync, the environment, the hub cache). The operations then compare against those answers
(facts.get) and send commands only where the host differs.
"""

from __future__ import annotations

import weakref
from typing import Any

from pyinfra import host, logger

from vllm_fleet import fleet_check, fleet_secrets, gateway, wheelhouses
from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig
from vllm_fleet.config.host_checks import ACCOUNT_KNOBS
from vllm_fleet.config.instance import HOST_DEFAULTS
from vllm_fleet.environment import ENV_MARKER
from vllm_fleet.fleet import GatewayUnplanned
from vllm_fleet.facts import batch as facts
from vllm_fleet.rules import gpu_topology
from vllm_fleet.rules import host_packages as os_packages
from vllm_fleet.facts.discovery import discover, discovery_queries
from vllm_fleet.facts.batch import query
from vllm_fleet.facts.host import HostRuntime, HubModelCached, InstalledEnvironment, ManagedUnits
from vllm_fleet.facts.model_sync import ModelSyncState
from vllm_fleet.rules.model_sync import ownership_fix, ownership_problem
from vllm_fleet.rules.ownership import account_problem, directory_problem
from vllm_fleet.config.adapters import host_directory
from vllm_fleet.facts.model_sync import state_query as model_state_query
from vllm_fleet.operations.managed import environment_queries
from vllm_fleet.facts.state import DirectoryState, FileState, NewestMtime, PathOwners, ServiceAccount, UnitState
from vllm_fleet.monitoring.files import MONITORING_UNITS
from vllm_fleet.plan import HostPlan
from vllm_fleet.render import Secrets, environment_spec
from vllm_fleet.host_layout import FRONT_UNIT, RAY_UNIT, host_layout

from . import access
from .managed import (freshness_paths, hub_downloads, hub_token_file, ray_freshness_paths, removed_units,
                     service_accounts, service_directories)
from .options import RunOptions
from .state import Deployment, fail, host_config, run_fleet


def prepare(options: RunOptions = RunOptions()) -> Deployment | None:
    """1. The run's check (check_run, once), then validate this host's data, check that its commands
    run as root and take its deploy lock (one round trip: access.take_lock), read live facts, plan,
    render. Raises DeployError on bad input; None when the host is refused (no root through its
    sudo, another deploy holds the lock)."""
    check_run(host.state, options)
    try:
        config = host_config(host)  # parsed once per run with every other host (state.run_fleet)
    except ConfigErrors as exc:
        fail(exc.errors)
    if not access.take_lock(options.dry, options.command):
        return None
    facts.prefetch(host, discovery_queries(config))  # one remote command
    discovered, errors = discover(host, config)
    if errors:
        fail(errors)
    config, topology, interconnect = discovered.config, discovered.topology, discovered.interconnect
    try:  # the gateway checks its backends' certificates: it trusts their CAs
        trusted = run_fleet(host.state).every(config) if config.settings.vllm_gateway is True else []
    except ConfigErrors as exc:
        fail(exc.errors)
    secrets = read_secrets(config, trusted, getattr(host.data, "ssh_hostname", None))

    try:  # the plan and every file, by the one function status uses too (vllm_fleet/prepared.py)
        prepared = run_fleet(host.state).prepare(discovered, secrets)
    except GatewayUnplanned as exc:
        logger.error(f"{host.print_prefix}this host is the fleet's gateway: it plans every inventory host "
                     "(from its declared data) to know its backends, and these cannot be planned:")
        fail(exc.errors)
    except ConfigErrors as exc:
        fail(exc.errors)
    groups = prepared.node_groups or []
    if groups and options.serial:  # the head's steps wait on its workers' (services)
        fail([ConfigError(f"{config.name} is a node of multi-node instance {groups[0].group.instance.name}, "
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
    deployment = Deployment(config, plan, prepared.files, secrets, missing_packages=absent, package_family=family,
                            backends=prepared.backends, node_instance=worker_of)
    facts.prefetch(host, managed_state_queries(deployment))  # one remote command
    _check_synced_model_dirs(deployment)
    _check_accounts(deployment)
    _check_directories(deployment)
    return deployment


def owned_paths(deployment: Deployment) -> tuple[str, ...]:
    """The directories whose owners _check_directories reads: every managed one, and vllm_root."""
    return tuple(sorted({d.path for d in service_directories(deployment)} | {deployment.config.settings.vllm_root}))


def _check_directories(deployment: Deployment) -> None:
    """Every directory the deploy makes is new or already its own, below directories only root can
    change (ownership.directory_problem). Bad input: refused from the batch prefetch just read,
    before any host changes."""
    config = deployment.config
    settings = config.settings
    owners = facts.get(host, PathOwners, paths=owned_paths(deployment)) or {}
    wanted = [(d.path, d.user) for d in service_directories(deployment)] + [(settings.vllm_root, "root")]
    knobs = {settings[k]: k for k in ("vllm_root", "vllm_config_dir", "vllm_state_dir", "vllm_hf_home",
                                      "vllm_cache_root")}
    errors = []
    for path, owner in wanted:
        problem = directory_problem(owners, path, owner)
        if problem:
            knob = knobs.get(path) or ("vllm_config_dir" if path.startswith(settings.vllm_config_dir + "/")
                                       else "vllm_state_dir")
            errors.append(ConfigError(problem, host=config.name, key=knob,
                                      fix=f"give {knob} a directory of its own (e.g. {HOST_DEFAULTS[knob]!r}): new, or "
                                          f"{owner}'s already, below directories only root may change"))
    if errors:
        fail(errors)


def _check_accounts(deployment: Deployment) -> None:
    """Every user the host's services run as is one the deploy created, or none exists yet
    (rules.ownership.account_problem): an existing account of a person, another daemon or the OS is never
    taken over. Bad input: refused from the batch prefetch just read, before any host changes."""
    config = deployment.config
    errors = []
    for account in service_accounts(deployment):
        found = facts.get(host, ServiceAccount, user=account.user, group=account.user) or {"user": None, "group": None}
        legacy = config.settings.vllm_state_dir if account.user == config.settings.vllm_service_user else None
        problem = account_problem(found, account.user, account.user, legacy_home=legacy)
        if problem:
            knob = next(k for k in ACCOUNT_KNOBS if config.settings[k] == account.user)
            errors.append(ConfigError(
                f"{problem}; it would run {account.role}", host=config.name, key=knob,
                fix=f"{knob} = '<a name no account of this host has>' (the deploy creates it), or remove that "
                    "account if it is a leftover"))
    if errors:
        fail(errors)


# The check of each run (by its State): made by the first host's prepare, failed by every host's.
_CHECKED: "weakref.WeakKeyDictionary[Any, list[ConfigError]]" = weakref.WeakKeyDictionary()


def check_run(state, options: RunOptions) -> None:
    """What `vllm-fleet check` finds (vllm_fleet.fleet_check.problems: every host's data, the fleet's
    rules, every secret of the run's hosts), once a run, on the workstation: the first host's prepare
    runs it before any lock is taken or command sent, so one run reports every missing secret of every
    host and changes none. pyinfra's CLI connects to the hosts before it runs deploy.py; `vllm-fleet
    check` connects to none (it also finds the group-data files no host reads, which only the
    inventory's file tells). DeployError with every problem."""
    errors = _CHECKED.get(state)
    if errors is None:
        fleet = run_fleet(state)
        names = [name for name in fleet.names if options.limit is None or name in options.limit]
        errors = _CHECKED[state] = fleet_check.problems(fleet, names)
    if errors:
        fail(errors)


def describe(deployment: Deployment) -> str:
    """The plan in one line: each instance's unit, port, GPUs and parallel layout."""
    parts = [f"{i.name}: {i.unit_name} port {i.port} GPUs {i.cuda_visible_devices or '-'} "
             f"TP={i.tensor_parallel_size} PP={i.pipeline_parallel_size} DP={i.data_parallel_size}"
             for i in deployment.plan.instances]
    return "; ".join(parts) or "no instances"


def read_secrets(config: HostConfig, fleet_configs: list[HostConfig] | None = None,
                 ssh_hostname: str | None = None) -> Secrets:
    """Every secret this host gets, read on the workstation (fleet_secrets.read_host_secrets: every
    client's API key, or the fleet key; the HF token; the metrics token; the host's own key; with
    vllm_tls its certificate, `fleet_configs` the hosts whose CAs it trusts and `ssh_hostname` an
    address it names too). Every problem at once (DeployError); no value is ever part of a message."""
    try:
        return fleet_secrets.read_host_secrets(config, fleet_configs or [], ssh_hostname)
    except ConfigErrors as exc:
        fail(exc.errors)


def managed_state_queries(deployment: Deployment) -> list[facts.Query]:
    """Everything the steps after prepare() compare with, for one remote command: the service account
    and its directories, the synced models, the environment, the hub cache, every file and unit this
    host gets (and those of removed instances), each instance's process start and file times."""
    config, plan = deployment.config, deployment.plan
    wanted = [query(ServiceAccount, user=account.user, group=account.user) for account in service_accounts(deployment)]
    wanted += [query(DirectoryState, path=directory.path) for directory in service_directories(deployment)]
    wanted.append(query(PathOwners, paths=owned_paths(deployment)))
    wanted += [model_state_query(inst.model) for inst in deployment.model_instances() if inst.model_source]
    wanted += [model_state_query(host_directory(config.settings.vllm_models_dir, inst.name, adapter))
               for inst in deployment.model_instances() for adapter in inst.adapters if adapter.source]
    wanted += environment_queries(environment_spec(config, plan), config.settings.vllm_root)
    wanted.append(query(InstalledEnvironment, current=host_layout(config).current, marker=ENV_MARKER))
    downloads = hub_downloads(deployment)
    wanted += [query(HubModelCached, hf_home=config.settings.vllm_hf_home, model=download.marker_key)
               for _inst, download in downloads]
    if downloads:
        wanted.append(query(FileState, path=hub_token_file(config)))
    wanted += [query(FileState, path=path) for path in sorted(deployment.files)]
    for inst in plan.instances:
        wanted += [query(UnitState, unit=inst.unit_name), query(NewestMtime, paths=freshness_paths(config, inst))]
    for unit in (FRONT_UNIT, gateway.GATEWAY_UNIT, RAY_UNIT, *MONITORING_UNITS):
        wanted.append(query(UnitState, unit=unit))
    if gateway.floating_paths(config)["keepalived"] in deployment.files:
        wanted.append(query(UnitState, unit=gateway.KEEPALIVED_UNIT))
    if plan.ray is not None:
        wanted.append(query(NewestMtime, paths=ray_freshness_paths(config)))
    for unit, _name, paths in removed_units(deployment):
        wanted.append(query(UnitState, unit=unit))
        wanted += [query(FileState, path=path) for path in paths]
    return wanted


def _check_wheelhouse_serves(config: HostConfig, plan: HostPlan) -> None:
    """The wheelhouse holds every package this host's environment installs, for its Python: checked
    while the run is still being planned, so a wheelhouse that lacks one host's package (vllm-router
    on the gateway host, Ray on a node) stops the run before any host changes, not mid-install."""
    problem = wheelhouses.wheelhouse_problem(config.name, config.settings.vllm_wheelhouse, environment_spec(config, plan))
    if problem:
        fail([problem])


def _check_synced_model_dirs(deployment: Deployment) -> None:
    """A model path that model_source is synced to must be vllm-fleet's: its manifest is there, or
    the directory is new or empty (model_sync.ownership_problem). The sync deletes what model_source
    lacks, so `model: /etc`, or a directory holding other models, would lose their files: refused
    from the batch prefetch just read, before any host changes."""
    config = deployment.config
    errors, seen = [], set()
    for inst in deployment.model_instances():
        dest = inst.model.rstrip("/") or "/"
        if not inst.model_source or dest in seen:
            continue
        seen.add(dest)
        sync_state = facts.get(host, ModelSyncState, dest=dest)
        problem = ownership_problem(sync_state, dest) if sync_state is not None else None  # None: model_sync says so
        if problem:
            errors.append(ConfigError(
                f"model path {problem}; syncing model_source {inst.model_source} there would replace or "
                "delete them (the sync removes what model_source lacks)", host=config.name, instance=inst.name,
                key="model", fix=ownership_fix(sync_state, dest, f"under vllm_models_dir: "
                                               f"{config.settings.vllm_models_dir.rstrip('/')}/{inst.name}")))
    if errors:
        fail(errors)


def _missing_packages(config: HostConfig, plan: HostPlan) -> tuple[list[os_packages.Need], str | None]:
    """What the runtime needs from the OS and the host lacks; a refusal, before any change, when
    vllm-fleet may not install it (vllm_install_host_packages = False) or cannot (no apt/dnf)."""
    required = os_packages.needs(
        config.settings.vllm_target, config.settings.vllm_python_version, config.settings.vllm_env_manager,
        eager_only=all(inst.config.enforce_eager for inst in plan.instances),
        has_instances=bool(plan.instances), gateway=config.settings.vllm_gateway is True,
        metrics=config.settings.vllm_metrics is True, monitoring=config.settings.vllm_monitoring is True,
        floating=config.settings.vllm_gateway is True and config.settings.vllm_gateway_address is not None,
        prefix_routing=gateway.prefix_routing(config))
    if not required:
        return [], None
    present, family = facts.get(host, HostRuntime, python_version=config.settings.vllm_python_version)
    absent = os_packages.missing(required, present)
    refused = os_packages.not_installable(absent, family)
    if refused:
        fail([ConfigError(refused[0], host=config.name, key="vllm_gateway_policy", fix=refused[1])])
    if absent and (family is None or not config.settings.vllm_install_host_packages):
        message, fix = os_packages.refusal(absent, family)
        fail([ConfigError(message, host=config.name, key="vllm_install_host_packages", fix=fix)])
    return absent, family
