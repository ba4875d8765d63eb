"""The run's state for one host: what `prepare` decided (Deployment), what each step's operations
changed (Changes, read by the later steps when they execute), and why a host failed (for callers
that run the deploy through pyinfra's API)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from pyinfra import logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations.util import any_changed

from vllm_fleet.config import ConfigError, HostConfig, InstanceConfig, inventory_rows, parse_host
from vllm_fleet.fleet import Fleet
from vllm_fleet.rules import host_packages as os_packages
from vllm_fleet.plan import HostPlan
from vllm_fleet.render import RenderedFile, Secrets

from . import handlers

if TYPE_CHECKING:
    from pyinfra.api.operation import OperationMeta

    from vllm_fleet import gateway


class DeployError(PyinfraError):
    """Invalid input found while preparing, or the deploy called without its run options: pyinfra
    stops the run before any host is changed."""


def fail(errors: list[ConfigError]) -> None:
    """Stop the whole run on bad input, every error located, before any host changes."""
    text = "\n".join(f"error: {e.located()}" for e in errors)
    logger.error(text)
    raise DeployError(f"{text}\nnothing was changed on any host")


@dataclass
class ServiceChanges:
    """What may change one service of the host: the operations notifying it, by kind of change (its
    row of handlers.HANDLERS). `instance`: an instance's name (its model sync notifies it too)."""

    service: str
    instance: str | None = None
    by_kind: dict[str, list["OperationMeta"]] = field(default_factory=dict)


@dataclass
class Changes:
    """The operations the steps added, by what they change. Whether one changed the host is known
    only once it ran, so each question below is a callable that pyinfra's `_if` asks at execution;
    what the answer means for a service is handlers.HANDLERS'.

    environment and model_syncs (steps 4 and 3) notify every service whose row names "environment"
    or "model"; services holds what step 7 wrote for each service, by its unit; a unit absent there
    is one this host does not run."""

    environment: "OperationMeta | None" = None
    model_syncs: dict[str, "OperationMeta"] = field(default_factory=dict)  # instance name -> its model's sync
    services: dict[str, ServiceChanges] = field(default_factory=dict)  # unit -> what may change it
    removed_files: list["OperationMeta"] = field(default_factory=list)  # of units no longer planned

    def notify(self, unit: str, service: str, kind: str, operation: "OperationMeta", *,
               instance: str | None = None) -> "OperationMeta":
        """Record that `operation` (a file step 7 writes) is a change of `kind` to `unit`, the
        HANDLERS row `service`; returns it. A kind the row does not declare is refused."""
        handlers.action(service, kind)
        changes = self.services.setdefault(unit, ServiceChanges(service, instance))
        changes.by_kind.setdefault(kind, []).append(operation)
        return operation

    def has(self, unit: str) -> bool:
        return unit in self.services

    def _notifying(self, unit: str, action: str) -> list["OperationMeta"]:
        """The operations whose change has `action` on `unit` (handlers.RESTART or RELOAD)."""
        changes = self.services[unit]
        row = handlers.HANDLERS[changes.service]
        found = [op for kind, ops in changes.by_kind.items() if row[kind] == action for op in ops]
        if row.get("environment") == action and self.environment is not None:
            found.append(self.environment)
        if row.get("model") == action and changes.instance in self.model_syncs:
            found.append(self.model_syncs[changes.instance])
        return found

    def restarts(self, unit: str) -> Callable[[], bool]:
        """Whether `unit` restarts: a change of one of its RESTART kinds."""
        return any_changed(*self._notifying(unit, handlers.RESTART))

    def reloads(self, unit: str) -> Callable[[], bool]:
        """Whether `unit` reloads: a change of one of its RELOAD kinds, and none that restarts it."""
        restart, reload = self.restarts(unit), any_changed(*self._notifying(unit, handlers.RELOAD))
        return lambda: reload() and not restart()

    def unit_files(self) -> list["OperationMeta"]:
        """Every operation writing or removing a unit file: systemd reloads after any of them."""
        return [op for changes in self.services.values() for op in changes.by_kind.get("unit", [])] + self.removed_files

    def any_unit_file_changed(self) -> Callable[[], bool]:
        return any_changed(*self.unit_files())


@dataclass
class Deployment:
    """What `prepare` found and decided for this host, and what its steps' operations change."""

    config: HostConfig
    plan: HostPlan
    files: dict[str, RenderedFile]
    secrets: Secrets
    changes: Changes = field(default_factory=Changes)  # filled as the steps add their operations
    missing_packages: list[os_packages.Need] = field(default_factory=list)  # installed in step 5
    package_family: str | None = None  # "debian" (apt) or "rhel" (dnf)
    backends: "list[gateway.Backend] | None" = None  # the fleet's, on the gateway host (vllm_gateway)
    #: On a Ray worker of a multi-node instance: that instance as its head declares it. Each node
    #: loads its pipeline stage's weights from the same model path, so a worker gets the model too.
    node_instance: InstanceConfig | None = None
    #: On the gateway host: the gateway's check, when the instances' verification made it (its
    #: "result"), for the gateway's own verification (deploy/gateway.py checked_with_the_instances).
    gateway_outcome: dict[str, Any] = field(default_factory=dict)

    def model_instances(self) -> list[InstanceConfig]:
        """The instances whose model this host needs (InstanceConfig): its own, and on a Ray
        worker the multi-node instance it serves a stage of."""
        return [*self.config.instances, *([self.node_instance] if self.node_instance is not None else [])]


# Why a host failed, for callers that run the deploy through pyinfra's API (`vllm-fleet rollout`):
# pyinfra records that a host failed, not why. Keyed by the run's State, so two runs in one process
# never mix, and dropped with it.
_FAILURES: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()


def record_failure(host, text: str) -> None:
    """Keep what made this host fail (its refusal, a verification's failure) for failure_reason()."""
    _FAILURES.setdefault(host.state, {})[host.name] = text


def failure_reason(state, host_name: str) -> str | None:
    """What the deploy said made `host_name` fail in the run of `state`; None when it said nothing
    (pyinfra's own error, an operation's failure: pyinfra's output has it)."""
    return _FAILURES.get(state, {}).get(host_name)


# The run's inventory as one Fleet, parsed once per run (keyed by its State) whatever the number of
# hosts: each host takes its own config from it (host_config), a node learns its multi-node group
# from it, the gateway host its backends. pyinfra runs the deploy once per host: anything fleet-wide
# computed there is computed once per run here, not once per host.
_FLEETS: "weakref.WeakKeyDictionary[Any, Fleet]" = weakref.WeakKeyDictionary()
# A fleet its caller read already from the same inventory (reuse_parsed_fleet), by the run's State.
_PARSED_BEFORE: "weakref.WeakKeyDictionary[Any, Fleet]" = weakref.WeakKeyDictionary()


def run_fleet(state) -> Fleet:
    """Every host of the run's inventory (`state.inventory`, whatever --limit keeps), parsed once."""
    fleet = _FLEETS.get(state)
    if fleet is None:
        # From the rows, not Fleet.from_pyinfra: a Fleet that kept the Inventory (which holds its
        # State) would keep this cache's key alive.
        fleet = _FLEETS[state] = Fleet.from_rows(inventory_rows(state.inventory),
                                                 parsed=_PARSED_BEFORE.get(state))
    return fleet


def reuse_parsed_fleet(state, fleet: Fleet) -> None:
    """Let the run of `state` keep `fleet`'s parse of every host whose data has not changed since
    `fleet` read it: `vllm-fleet rollout` runs the deploy batch by batch, each batch a run of its own
    over the inventory read again, and would otherwise parse every host of the fleet once a batch."""
    # Without its Inventory: an Inventory a run used holds that run's State (pyinfra's State sets
    # inventory.state), and a value that kept its key alive would never leave this cache.
    _PARSED_BEFORE[state] = replace(fleet, pyinfra_inventory=None)


def host_config(host) -> HostConfig:
    """The current host's config, from its data as the deploy reads it (host.data). The run's Fleet
    parsed every host's data already: that parse, unless this host's data changed since (a deploy
    file of one's own that sets host.data before this deploy) or did not parse, where it is parsed
    here, its errors its own. ConfigErrors."""
    data = host.data.dict()
    config = run_fleet(host.state).parsed_config(host.name, data)
    return config if config is not None else parse_host(host.name, data)
