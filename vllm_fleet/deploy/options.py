"""How this run was asked to go: the options the deploy's caller passes in (nothing here reads the
process's command line).

pyinfra 3.10 keeps `--dry` and `--serial` in its CLI: neither is on its State or Config, and the
CLI's own parse of its command line (click's context) lives in the CLI's greenlet, which the
greenlets pyinfra runs a deploy file in cannot see. So the deploy file pyinfra's CLI runs (the root
deploy.py, a team's own) hands its command line to `RunOptions.from_pyinfra_cli`, which parses it
with pyinfra's own parser; `vllm-fleet rollout` builds the options of each batch itself. The limit
is pyinfra's: `state.limit_hosts` (its `--limit`, or the batch rollout sets).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyinfra

from vllm_fleet.connect.lock import redacted


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
    def from_pyinfra_cli(cls, arguments: Sequence[str], state) -> "RunOptions | None":
        """The options of `pyinfra [ARGUMENTS] INVENTORY DEPLOY_FILE`, `arguments` being the command
        line pyinfra's CLI was started with (`sys.argv[1:]` in the deploy file it runs), read by
        pyinfra's own parser; the limit from pyinfra's `state`.

        None when they are unknown: this process is not pyinfra's CLI (pyinfra's Python API runs the
        deploy file: its caller, not a command line, decides what executes), or `arguments` are not
        a command line pyinfra accepts. vllm_fleet_deploy refuses a run whose options are None."""
        if not pyinfra.is_cli:
            return None
        parsed = pyinfra_cli_parameters(arguments)
        if parsed is None:
            return None
        return cls(dry=bool(parsed["dry"]), serial=bool(parsed["serial"]), limit=limit_of(state),
                   command=" ".join(["pyinfra", *redacted(list(arguments))]))


def pyinfra_cli_parameters(arguments: Sequence[str]) -> dict | None:
    """pyinfra's CLI's parameters (its click command's: `dry`, `serial`, `limit`, ...) for
    `arguments`, parsed as that CLI parses them and nothing run; None when they do not parse."""
    import click
    from pyinfra_cli.cli import cli  # imported already in a process pyinfra's CLI runs

    try:
        context = cli.make_context("pyinfra", list(arguments))
    except (click.ClickException, click.exceptions.Exit):  # a bad command line, or --help's exit
        return None
    return context.params


def limit_of(state) -> tuple[str, ...] | None:
    """The names of the hosts pyinfra limits this run to (`state.limit_hosts`), None when unlimited."""
    hosts = getattr(state, "limit_hosts", None)
    return None if hosts is None else tuple(host.name for host in hosts)
