"""pyinfra's Python API for the `vllm-fleet` commands that reach hosts (status, rollout, unlock, gpus).

The same inventory loader, SSH settings (keys, known_hosts, host key checking) and connector as
`pyinfra INVENTORY deploy.py`: nothing here opens a connection of its own. Importing this changes
nothing; a command calls install() before it loads an inventory or connects.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import gevent.monkey
from pyinfra.api import Config, State
from pyinfra.api.connect import connect_all, disconnect_all
from pyinfra.api.exceptions import PyinfraError
from pyinfra.context import ctx_state

from vllm_fleet.config import read_pyinfra_inventory

CONNECT_TIMEOUT_S = 10  # an unreachable host is reported failed after this, never waited on longer


def install() -> None:
    """gevent's patches of the standard library (sockets, threads, ...), for the whole process:
    pyinfra reaches hosts in parallel in gevent's greenlets, which take turns only where a socket
    or a lock is gevent's. Idempotent; as pyinfra's own CLI does (pyinfra_cli/__init__.py), and as
    pyinfra asks of a script using its API, before anything opens a socket."""
    if not gevent.monkey.is_module_patched("socket"):
        gevent.monkey.patch_all()
    # paramiko logs a host that drops the connection as a traceback; with no handler of its own,
    # Python prints it on stderr above the report, which already says the host is unreachable. A
    # handler that drops it keeps that off the terminal (a logging setup of the caller's still sees it).
    logging.getLogger("paramiko").addHandler(logging.NullHandler())


def load_pyinfra_inventory(path: str | Path, cwd: str | Path | None = None):
    """The pyinfra Inventory of an inventory file (config.read_pyinfra_inventory: one loader for both)."""
    return read_pyinfra_inventory(path, cwd=cwd)


@contextmanager
def connected(inventory, hosts: list[str] | None = None, *, parallel: int | None = None
              ) -> Iterator[tuple[State, dict[str, object]]]:
    """Connect to the inventory's hosts (or only `hosts`), yield (state, {name: Host or None}).
    `inventory`: an inventory file, or a pyinfra Inventory already loaded (Fleet.pyinfra_inventory).

    A host that cannot be reached maps to None; the others are connected. Always disconnects.
    """
    if isinstance(inventory, (str, Path)):
        inventory = load_pyinfra_inventory(inventory)
    config = Config(CONNECT_TIMEOUT=CONNECT_TIMEOUT_S, PARALLEL=parallel or 0)
    state = State(inventory, config)
    if hosts is not None:
        state.limit_hosts = [inventory.get_host(name) for name in hosts]
    with ctx_state.use(state):
        try:
            connect_all(state)
        except PyinfraError:  # "No hosts remaining!": none could be reached; they map to None
            pass
        try:
            wanted = hosts if hosts is not None else [h.name for h in inventory]
            active = {h.name: h for h in state.activated_hosts}
            yield state, {name: active.get(name) for name in wanted}
        finally:
            disconnect_all(state)


