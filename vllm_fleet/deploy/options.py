"""How this run was asked to go: the options the deploy's caller passes in (never read from argv here).

pyinfra 3.10 keeps `--dry` and `--serial` in its CLI (neither is on its State or Config), so the
root deploy.py hands its own command line to `RunOptions.from_pyinfra_cli`; `vllm-fleet rollout`
builds the options of each batch itself. The limit is pyinfra's: `state.limit_hosts` (its
`--limit`, or the batch rollout sets).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from vllm_fleet.host.lock import redacted


@dataclass(frozen=True)
class RunOptions:
    """dry: nothing will execute (pyinfra `--dry`): the deploy takes no lock and never waits for one.
    serial: pyinfra runs the whole deploy on one host, then the next (`--serial`): the nodes of a
    multi-node instance, which converge together, are refused.
    limit: the hosts this run converges, by name (None: every inventory host). The deploy plans
    the whole inventory whatever it is (a gateway's backends, a node's group).
    command: what started the run, as the deploy lock shows it to a deploy it refuses (no secret:
    from_pyinfra_cli hides them)."""

    dry: bool = False
    serial: bool = False
    limit: tuple[str, ...] | None = None
    command: str = "a vllm-fleet deploy"

    @classmethod
    def from_pyinfra_cli(cls, arguments: Sequence[str], state) -> "RunOptions":
        """The options of `pyinfra [ARGUMENTS] INVENTORY deploy.py` (its arguments as the root
        deploy.py received them: `sys.argv[1:]`), the limit from pyinfra's `state`."""
        return cls(dry="--dry" in arguments, serial="--serial" in arguments, limit=limit_of(state),
                   command=" ".join(["pyinfra", *redacted(list(arguments))]))


def limit_of(state) -> tuple[str, ...] | None:
    """The names of the hosts pyinfra limits this run to (`state.limit_hosts`), None when unlimited."""
    hosts = getattr(state, "limit_hosts", None)
    return None if hosts is None else tuple(host.name for host in hosts)
