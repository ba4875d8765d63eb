"""Everything that can be wrong with a fleet before a host is reached: what `vllm-fleet check`
prints, what the deploy checks before the first host's lock, and `vllm-fleet rollout` before its
first batch (read on the workstation alone: the inventory, group data, and the secrets' files and
variables; no host is connected).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from vllm_fleet import fleet_secrets
from vllm_fleet.config import ConfigError, ConfigErrors, check_fleet, unused_group_data
from vllm_fleet.fleet import Fleet


def problems(fleet: Fleet, names: list[str] | tuple[str, ...] | None = None, *, inventory: str | Path | None = None,
             cwd: str | Path | None = None, environ: Mapping[str, str] | None = None) -> list[ConfigError]:
    """Every problem of the hosts `names` (default: the fleet's selected hosts) found without
    connecting: their data, the fleet's rules, every secret they read; with `inventory` (the file
    the fleet was read from, and `cwd` where pyinfra runs), the group-data files no host reads."""
    names = list(fleet.selected if names is None else names)
    errors = [e for name in names if name in fleet.errors for e in fleet.errors[name].errors]
    configs = [fleet.configs[name] for name in names if name in fleet.configs]
    every = [fleet.configs[name] for name in fleet.names if name in fleet.configs]
    try:
        check_fleet(configs, list(fleet.names), every=every)
    except ConfigErrors as exc:
        errors += exc.errors
    errors += fleet.path_problems(configs)
    if inventory is not None and fleet.pyinfra_inventory is not None:
        errors += unused_group_data(inventory, fleet.pyinfra_inventory, cwd=cwd)
    errors += fleet_secrets.check_secrets(configs, lambda: every, environ)
    return errors
