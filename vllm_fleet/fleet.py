"""The fleet: every host of an inventory, parsed once, as one pure value.

`Fleet.load(inventory, limit)` reads the inventory once (pyinfra's own loader, group_data included:
config.read_pyinfra_inventory) and parses every host's data once (config.parse_host), keeping each host's
errors beside the hosts that parse: a host outside --limit whose data is broken stops only what
needs it. Everything that acts on a fleet asks it, so none parses or widens on its own:

- the hosts of the run: the hosts --limit names (`matched`), widened to the other nodes of their
  multi-node instances (`selected`: a node group is planned, checked and converged as one);
  `hosts()` checks them together (config.check_fleet), `plan()` plans them;
- the gateway (`gateway`, `gateway_backends`): planned from every host of the inventory whatever
  --limit keeps, since a gateway that knew only the limited hosts would drop the others' backends;
- one host's prepared plan and files (`prepare`, `prepare_for_drift`) from what discovery read on
  it (prepared.Discovered), with the node group it is a node of and, on the gateway host, the
  fleet's backends: what the deploy writes and what `vllm-fleet status` compares with.

Pure: the inventory file is read (and its Python run, as pyinfra does), no host is reached.

    fleet = Fleet.load("inventory/prod.py", limit=["gpu-mixed-01"])
    plan = fleet.plan()                      # the limited hosts, with their node groups
    backends = fleet.gateway_backends()      # the whole fleet's
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from vllm_fleet.config import (ConfigError, ConfigErrors, HostConfig, InstanceConfig, NodeGroup, Settings, check_fleet,
                               inventory_rows, limited_rows, node_group_of, node_groups, parse_host,
                               read_pyinfra_inventory)
from vllm_fleet import path_writers
from vllm_fleet.gateway import Backend, GatewayAccess, find_gateway, find_gateways, fleet_backends, gateway_access
from vllm_fleet.monitoring.targets import ScrapeTarget, fleet_targets
from vllm_fleet.plan import FleetPlan, HostPlan, plan_fleet
from vllm_fleet.prepared import Discovered, PreparedHost, node_group_plans, prepare_host
from vllm_fleet.render import Secrets

#: One host as the inventory gives it: (name, its data with group_data merged in, its groups).
Row = tuple[str, dict[str, Any], list[str]]


class GatewayUnplanned(ConfigErrors):
    """The gateway's backends cannot be planned: some host of the fleet cannot be planned from its
    declared data (the gateway plans every inventory host to know its backends)."""


@dataclass(frozen=True, eq=False)
class Fleet:
    """Every host of one inventory, parsed once. Build it with `load` (an inventory file),
    `from_rows` (what config.load_inventory returns: tests' and benches' rows), `from_pyinfra` (a loaded pyinfra Inventory)
    or `of` (hosts already parsed)."""

    inventory: str  # the inventory file, as messages name it
    names: tuple[str, ...]  # every host of the inventory, in its order
    configs: Mapping[str, HostConfig]  # every host whose data parses
    errors: Mapping[str, ConfigErrors]  # every host whose data does not: why
    matched: tuple[str, ...]  # the hosts --limit names (every host without one), in inventory order
    selected: tuple[str, ...]  # `matched` and the other nodes of their node groups, in inventory order
    #: Hosts whose data sets vllm_gateway = True (read before validation: a broken one counts).
    declared_gateways: tuple[str, ...] = field(default=())
    #: The pyinfra Inventory it was read from, when it was (`load`, `from_pyinfra`): the commands
    #: that connect to the hosts reuse it rather than read the file again.
    pyinfra_inventory: Any = field(default=None, compare=False, repr=False)
    #: Each host's data as it was parsed, as text, every knob's default filled in (_parsed_form): what
    #: `parsed_config` and `from_rows(parsed=...)` compare a host's data with to reuse its parse.
    parsed_data: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    # --- building ------------------------------------------------------------------------------------

    @classmethod
    def load(cls, inventory: str | Path, limit: list[str] | None = None, *,
             cwd: str | Path | None = None) -> Fleet:
        """Read and parse the inventory once. ConfigError: the file cannot be loaded, or --limit
        matches no host; a host's invalid data is kept in `errors`, not raised."""
        loaded = read_pyinfra_inventory(inventory, cwd=cwd)
        return cls.from_rows(inventory_rows(loaded), limit, inventory=str(inventory), pyinfra_inventory=loaded)

    @classmethod
    def from_pyinfra(cls, inventory, limit: list[str] | None = None) -> Fleet:
        """The fleet of a pyinfra Inventory already loaded (the deploy's `state.inventory`)."""
        return cls.from_rows(inventory_rows(inventory), limit, pyinfra_inventory=inventory)

    @classmethod
    def of(cls, configs: Iterable[HostConfig]) -> Fleet:
        """The fleet of hosts already parsed (every one selected): one host alone, a test's."""
        configs = {c.name: c for c in configs}
        names = tuple(configs)
        return cls(inventory="the given hosts", names=names, configs=MappingProxyType(configs),
                   errors=MappingProxyType({}), matched=names, selected=names,
                   declared_gateways=tuple(n for n, c in configs.items() if c.settings.vllm_gateway is True))

    @classmethod
    def from_rows(cls, rows: Iterable[Row], limit: list[str] | None = None, *,
                  inventory: str = "the inventory", pyinfra_inventory: Any = None,
                  parsed: Fleet | None = None) -> Fleet:
        """Parse every host of `rows` once; `limit` keeps hosts or groups by name, as pyinfra's
        --limit does (a limit that matches nothing is an error: pyinfra itself only warns).
        `parsed`: a fleet read before from the same inventory (rollout's, for each batch's run):
        a host whose data has not changed since keeps its config or errors, not parsed again."""
        rows = list(rows)
        configs: dict[str, HostConfig] = {}
        errors: dict[str, ConfigErrors] = {}
        parsed_data: dict[str, str] = {}
        for name, data, _groups in rows:
            parsed_data[name] = _parsed_form(data)
            if parsed is not None and parsed.parsed_data.get(name) == parsed_data[name]:
                if name in parsed.configs:
                    configs[name] = parsed.configs[name]
                else:
                    errors[name] = parsed.errors[name]
                continue
            try:
                configs[name] = parse_host(name, data)
            except ConfigErrors as exc:
                # Kept as a value, without its traceback: its frames would keep their callers' locals
                # (the deploy's run State, which caches this Fleet) alive.
                errors[name] = exc.with_traceback(None)
        matched = [name for name, _data, _groups in limited_rows(rows, limit, inventory)]
        wanted = _with_node_group_peers(matched, rows)
        return cls(inventory=inventory, names=tuple(name for name, _d, _g in rows),
                   configs=MappingProxyType(configs), errors=MappingProxyType(errors), matched=tuple(matched),
                   selected=tuple(name for name, _d, _g in rows if name in wanted),
                   declared_gateways=tuple(name for name, data, _g in rows if data.get("vllm_gateway") is True),
                   pyinfra_inventory=pyinfra_inventory, parsed_data=MappingProxyType(parsed_data))

    def parsed_config(self, name: str, data: Mapping[str, Any]) -> HostConfig | None:
        """Host `name`'s config when this fleet parsed it from `data` (the deploy's own host: its
        data inside the deploy, pyinfra's deploy data defaults included); None when the data differs
        (changed since, or another host's) or did not parse: the caller parses it itself."""
        if name not in self.configs or self.parsed_data.get(name) != _parsed_form(data):
            return None
        return self.configs[name]

    # --- the hosts of the run ------------------------------------------------------------------------

    def configs_of(self, names: Iterable[str]) -> list[HostConfig]:
        """The configs of `names`, in that order. ConfigErrors: every error of those whose data
        does not parse (the others' are not this caller's to report)."""
        names = list(names)
        broken = [e for name in names if name in self.errors for e in self.errors[name].errors]
        if broken:
            raise ConfigErrors(broken)
        return [self.configs[name] for name in names]

    def hosts(self) -> list[HostConfig]:
        """The selected hosts (the limit and its node groups), validated together: ConfigErrors
        with every problem of theirs, and what only the fleet can check (config.check_fleet: the
        gateway, the node groups, names served twice) against every host of the inventory."""
        hosts = self.configs_of(self.selected)
        check_fleet(hosts, list(self.names), every=list(self.configs.values()))
        clashes = self.path_problems(hosts)
        if clashes:
            raise ConfigErrors(clashes)
        return hosts

    def path_problems(self, hosts: Iterable[HostConfig], plans: Iterable[HostPlan] | None = None) -> list[ConfigError]:
        """The paths of `hosts` that two of the deploy's steps would write (path_writers: the one
        rule, here on the paths each host's settings give it; prepare_host applies it again to what
        it rendered). `plans`: the hosts' plans, in their order, whose instances' names are the
        files' (placement "auto" may split an instance by GPU model). A Ray worker holds its node
        group's model too."""
        hosts = list(hosts)
        names: list[list[str] | None] = ([[inst.name for inst in p.instances] for p in plans] if plans is not None
                                         else [None] * len(hosts))
        errors = []
        for config, planned in zip(hosts, names, strict=True):
            held = self.held_instances(config)
            errors += path_writers.path_clashes(config, path_writers.declared_writers(config, held, planned),
                                                synced=held)
        return errors

    def held_instances(self, config: HostConfig) -> list[InstanceConfig]:
        """The instances whose model host `config` holds: its own, and on a Ray worker the
        multi-node instance it serves a stage of (as its head declares it)."""
        group = node_group_of(list(self.configs.values()), config.name)
        return [*config.instances, *([group.instance] if group and group.head != config.name else [])]

    def plan(self) -> FleetPlan:
        """The selected hosts planned from their declared data (`vllm-fleet plan`), the one-writer
        rule applied again with the planned instances' names."""
        hosts = self.hosts()
        plan = plan_fleet(hosts)
        clashes = self.path_problems(hosts, plan.hosts)
        if clashes:
            raise ConfigErrors(clashes)
        return plan

    def every(self, own: HostConfig | None = None) -> list[HostConfig]:
        """Every host of the inventory, in its order, whatever the limit. `own`: this host's config
        as discovery filled it in, in place of its declared one. ConfigErrors: every error of the
        other hosts whose data does not parse."""
        names = [n for n in self.names if own is None or n != own.name]
        configs = {c.name: c for c in self.configs_of(names)}
        if own is not None:
            configs[own.name] = own
        return [configs[n] for n in self.names]

    def node_groups(self) -> list[NodeGroup]:
        """The multi-node instances of the fleet (every host must parse: ConfigErrors)."""
        return node_groups(self.every())

    # --- the gateway ---------------------------------------------------------------------------------

    def gateway(self) -> HostConfig | None:
        """The fleet's (first) gateway host, or None. Gateways check_fleet refuses, or a host that
        does not parse while one is declared: ConfigErrors."""
        if not self.declared_gateways:
            return None
        return find_gateway(self.every())

    def gateway_access(self) -> GatewayAccess | None:
        """What every front must know of the fleet's gateways (where their requests come from, the
        URL clients use, the gateways behind a floating address), read from the gateway hosts' data
        alone; None without a gateway. ConfigErrors: a gateway host's data does not parse."""
        if not self.declared_gateways:
            return None
        return gateway_access(*self.configs_of(self.declared_gateways))

    def gateways(self) -> list[HostConfig]:
        """The fleet's gateway hosts, in inventory order ([] without one). ConfigErrors: gateways
        check_fleet refuses, or a host that does not parse while one is declared."""
        if not self.declared_gateways:
            return []
        return find_gateways(self.every())

    def gateway_backends(self, own: HostConfig | None = None, own_plan: HostPlan | None = None) -> list[Backend]:
        """Every instance of every inventory host, planned by the same planner as the deploy
        (plan_fleet), whether or not the host is in the limit: the gateway's backends ([] for a
        fleet without a gateway). `own`/`own_plan`: the host preparing itself (the deploy on the
        gateway host), planned from its live facts, the others from their declared data.
        ConfigErrors: a host's data does not parse; GatewayUnplanned: a host cannot be planned."""
        if own is None and not self.declared_gateways:
            return []
        configs, fleet_plan = self._planned_fleet(own, own_plan)
        return fleet_backends(configs, fleet_plan)

    def monitoring_targets(self, own: HostConfig | None = None, own_plan: HostPlan | None = None) -> list[ScrapeTarget]:
        """Every scrape target of every inventory host (monitoring.targets), planned as the gateway's
        backends are (gateway_backends: the same planner, own and own_plan, errors)."""
        configs, fleet_plan = self._planned_fleet(own, own_plan)
        return fleet_targets(configs, fleet_plan)

    def _planned_fleet(self, own: HostConfig | None, own_plan: HostPlan | None) -> tuple[list[HostConfig], FleetPlan]:
        """Every inventory host planned (plan_fleet), `own` as its live facts made it."""
        configs = self.every(own)
        live = ({own.name: own_plan.gpus} if own is not None and own_plan is not None
                and own_plan.gpu_source == "live" else None)
        try:
            check_fleet(configs)
            fleet = plan_fleet(configs, live=live)
        except ConfigErrors as exc:
            raise GatewayUnplanned(exc.errors) from None
        plans = [own_plan if own_plan is not None and p.name == own.name else p for p in fleet.hosts]
        return configs, FleetPlan(plans)

    # --- one host, prepared --------------------------------------------------------------------------

    def node_group_configs(self, own: HostConfig) -> dict[str, HostConfig]:
        """The configs a host plans its node group from (prepared.node_group_plans). A host that
        may be a node (it names a vllm_private_interface, which every node needs) is refused while
        another host's data does not parse: that host may be its head, and a worker that missed its
        group would remove its Ray unit. ConfigErrors."""
        broken = {name: exc for name, exc in self.errors.items() if name != own.name}
        if broken and own.settings.vllm_private_interface:
            name, exc = next(iter(broken.items()))
            raise ConfigErrors([ConfigError(
                f"host {name}'s data does not parse, so whether {own.name} is a node of a multi-node "
                f"instance cannot be told ({exc.errors[0].located()})", host=own.name, key="nodes",
                fix=f"fix {name}'s host data (or take it out of the inventory)")])
        return dict(self.configs)

    def prepare(self, found: Discovered, secrets: Secrets | None = None) -> PreparedHost:
        """What the deploy writes on the host discovery read: its plan (with the node group it is
        a node of: PreparedHost.node_groups) and every file, on the gateway host with the whole
        fleet's backends. ConfigErrors (GatewayUnplanned: see gateway_backends)."""
        own = found.config

        def backends_for(plan: HostPlan) -> list[Backend] | None:
            return self.gateway_backends(own, plan) if own.settings.vllm_gateway else None

        def targets_for(plan: HostPlan) -> list[ScrapeTarget] | None:
            return self.monitoring_targets(own, plan) if own.settings.vllm_monitoring else None

        groups = node_group_plans(found, self.node_group_configs(own))
        return prepare_host(found, secrets, backends_for, node_groups=groups, targets_for=targets_for,
                            gateway_access=self.gateway_access())

    def prepare_for_drift(self, found: Discovered) -> PreparedHost:
        """The host's files as `vllm-fleet status` compares them: as `prepare` makes them, with
        placeholders for secrets and no backends in the gateway's own files (status compares each
        instance's files, not the gateway's), the node group planned from the hosts that parse."""
        own = found.config
        groups = node_group_plans(found, dict(self.configs) or {own.name: own})
        return prepare_host(found, backends_for=lambda plan: [] if own.settings.vllm_gateway else None,
                            node_groups=groups,
                            targets_for=lambda plan: [] if own.settings.vllm_monitoring else None,
                            gateway_access=self.gateway_access())


def load_fleet(path: str | Path, *, limit: list[str] | None = None,
               cwd: str | Path | None = None) -> list[HostConfig]:
    """Load and validate the hosts of an inventory that a run acts on: --limit widened to whole node
    groups (a multi-node instance is planned and checked with every one of its nodes).
    Raises ConfigErrors with all problems."""
    return Fleet.load(path, limit, cwd=cwd).hosts()


def _parsed_form(data: Mapping[str, Any]) -> str:
    """What a host's parse is reused by: its data with every knob's default under its own values
    (what parse_host makes of it either way, and what the deploy's host.data holds: the packaged
    deploy's data_defaults are these defaults), as text. Text, so that data changed in place later
    (a deploy file editing host.data's lists) is a difference, and True is not 1; data that prints
    differently each time (an object without a repr of its own) is parsed again, never reused."""
    return repr({**Settings.defaults(), **data})


def _with_node_group_peers(names: list[str], rows: list[Row]) -> set[str]:
    """`names` plus the other nodes of every multi-node instance that lists one of them, read from the
    raw host data (before validation: a malformed entry is reported by parse_host instead)."""
    wanted = set(names)
    for _name, data, _groups in rows:
        entries = data.get("vllm_instances")
        for entry in entries if isinstance(entries, (list, tuple)) else ():
            nodes = entry.get("nodes") if isinstance(entry, dict) else None
            if isinstance(nodes, (list, tuple)) and wanted & {n for n in nodes if isinstance(n, str)}:
                wanted.update(n for n in nodes if isinstance(n, str))
    known = {n for n, _d, _g in rows}
    return wanted & known
