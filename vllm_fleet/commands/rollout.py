"""`vllm-fleet rollout INVENTORY`: converge hosts batch by batch, health-gated, rolling back failures.

Each batch runs the very same packaged deploy as deploy.py (vllm_fleet.deploy.vllm_fleet_deploy)
through pyinfra's Python API (converge + full verification,
a real completion included). Before a host changes, its managed files and its `current` environment
link are snapshotted on the host; a host that fails is restored from that snapshot, restarted and
verified again (rolled back). More failed hosts than --max-fail stops the rollout: later hosts are
untouched. pyinfra's own `--serial` takes hosts in set order, one at a time, and cannot roll back.
With a canary (commands/canary.py), its hosts are the first batch, and the fleet's Prometheus judges
them against the rest of their models before the next batch: proceed, roll them back, or stop.

A host ends in one of STATES: `untouched` (never reached: a later batch after a stop, or input that
the deploy refused before any change), `unchanged` (the deploy ran and verified, and pyinfra reports no
operation that changed the host), `updated`, `rolled back` (failed, restored and verified) or `failed`.
Input that the deploy refuses (a DeployError: an invalid host, a missing model_source, ...) stops the
rollout with pyinfra's message, exit status 2, like `pyinfra INVENTORY deploy.py` does.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllm_fleet import fleet_check, wheelhouses
from vllm_fleet.commands import canary as canary_batch, gateway_drain, gateway_rollout, rollback
from vllm_fleet.config import ConfigError, ConfigErrors, split_names
from vllm_fleet.fleet import Fleet
from vllm_fleet.gateway import find_gateway
from vllm_fleet.plan import plan_fleet, plan_host
from vllm_fleet.render import environment_spec, manifest_path

STATES = ("untouched", "unchanged", "updated", "rolled back", "failed")
EXIT_INVALID = 2


class RolloutStopped(Exception):
    """The deploy refused the input of a batch before changing anything there: the rollout stops.

    `message` is what pyinfra's CLI prints for it; `results` are every host's state so far.
    """

    def __init__(self, message: str, results: list["HostResult"]):
        super().__init__(message)
        self.message, self.results = message, results


@dataclass
class HostResult:
    name: str
    state: str = "untouched"  # one of STATES
    before: dict[str, Any] = field(default_factory=dict)  # manifest before (environment, hashes)
    after: dict[str, Any] = field(default_factory=dict)
    started: float | None = None
    finished: float | None = None
    error: str | None = None

    def row(self) -> dict[str, Any]:
        out = asdict(self)
        out["seconds"] = round(self.finished - self.started, 1) if self.started and self.finished else None
        return out


def parse_batch(text: str, total: int) -> int:
    """'2' -> 2 hosts a batch; '25%' -> a quarter of the hosts (at least one)."""
    if text.endswith("%"):
        share = float(text[:-1])
        if not 0 < share <= 100:
            raise ValueError(f"--batch {text}: a percentage must be in (0, 100]")
        return max(1, math.floor(total * share / 100))
    size = int(text)
    if size < 1:
        raise ValueError(f"--batch {text}: at least 1 host")
    return size


def _check_wheelhouses(configs: dict[str, Any], everyone: list) -> None:
    """Every host's wheelhouse serves its environment, checked before the first batch: a later
    batch's host (the gateway's, a node's) that its wheelhouse cannot serve is refused before the
    first host changes, not when its batch comes. Planned from the declared GPUs, as `vllm-fleet
    plan` does; a host that can be planned only from its live GPUs is checked by its own batch's
    deploy (before any of its changes)."""
    try:
        plans = {p.name: p for p in plan_fleet(list(everyone)).hosts}
    except ConfigErrors:
        plans = {}
        for config in configs.values():
            if not config.member_of and not any(inst.nodes for inst in config.instances):
                try:
                    plans[config.name] = plan_host(config)
                except ConfigErrors:
                    pass
    problems = [problem for name, config in configs.items() if name in plans
                for problem in [wheelhouses.wheelhouse_problem(name, config.settings.vllm_wheelhouse,
                                                          environment_spec(config, plans[name]))] if problem]
    if problems:
        raise ConfigErrors(problems)


def _load_error(exc: BaseException) -> tuple[BaseException, bool]:
    """(the exception the deploy raised, whether it is refused input rather than a bug).

    Where pyinfra_cli wrapped it in an UnexpectedExternalError (a click exception whose str() fails:
    it has no `message`, as exec_file does for a deploy file's error), the original is its
    `exception`. Input errors: vllm_fleet.deploy.DeployError, ConfigError(s) and pyinfra's own
    errors (what pyinfra's CLI prints as a one-line "pyinfra error").
    """
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra_cli.exceptions import UnexpectedExternalError

    from vllm_fleet.deploy import DeployError

    cause = exc.exception if isinstance(exc, UnexpectedExternalError) else exc
    return cause, isinstance(cause, (DeployError, ConfigError, ConfigErrors, PyinfraError))


def _error_text(exc: BaseException) -> str:
    if isinstance(exc, ConfigError):
        return f"error: {exc.located()}"
    return str(exc) if exc.args else type(exc).__name__


def changed_operations(state, host) -> list[str]:
    """The names of the operations that changed `host`, from pyinfra's results of the run.

    pyinfra counts an operation as changed when it succeeded with commands to run (what its
    CLI prints as "Success" rather than "No Change"). The deploy's python.call steps that only
    observe (the deploy lock, the verification, the Ray cluster's checks) always "run": they are
    not changes; a Ray worker's join check is one only when it (re)started the worker.
    """
    from pyinfra.api.command import FunctionCommand

    from vllm_fleet.deploy.outcome import observing_calls

    observing = observing_calls(state, host.name)
    names = []
    for op_hash in state.get_op_order():
        op_data = state.ops[host].get(op_hash)
        if op_data is None:
            continue
        meta = op_data.operation_meta
        if not meta.is_complete() or not meta.did_change():
            continue
        commands = meta._commands or []  # pyinfra has no public accessor for the executed commands
        if all(isinstance(c, FunctionCommand) and c.function in observing for c in commands):
            continue
        names.append(", ".join(sorted(state.op_meta[op_hash].names)) or op_hash)
    return names


def _converge_batch(inventory: str, names: list[str], configs: dict, results: dict[str, HostResult],
                    log, gateway_config=None, groups: list[tuple[str, ...]] = (),
                    fleet: Fleet | None = None, gateways: list | None = None) -> None:
    """Snapshot, drain the batch from the fleet gateway, run the deploy on the batch through pyinfra's
    API, roll back each failed host, put the batch back into the gateway. `fleet`: the rollout's, whose
    parse of each host the batch's deploy keeps where the host's data is unchanged. `gateways`: the
    fleet's gateways when there are several (gateway_rollout.stepped_aside drains every router and
    moves the floating address; gateway_rollout.BatchRefused when it cannot: nothing converged)."""
    from vllm_fleet.commands.connection import connected
    from vllm_fleet.connect.remote import run

    gw_name = gateway_config.name if gateway_config is not None else None
    reach = names + ([gw_name] if gw_name and gw_name not in names else [])
    reach += [c.name for c in gateways or () if c.name not in reach]
    # The inventory file is read again for each batch, not the rollout's Inventory reused: pyinfra's
    # Host objects keep one run's state (the operation order of pyinfra/api/state.py get_op_order
    # among it), so each batch's run needs Hosts of its own. What is parsed is not parsed again
    # (fleet, state.reuse_parsed_fleet).
    with connected(inventory, reach) as (state, active):
        def snapshot(name: str) -> None:
            res = results[name]
            res.started = time.time()
            if active[name] is None:
                res.state, res.error, res.finished = "failed", "unreachable over SSH", time.time()
                return
            ok, out, err = run(active[name], rollback.snapshot_command(configs[name]), timeout=120)
            if not ok:
                res.state, res.error = "failed", f"snapshot failed: {err.strip()[-300:]}"
                return
            res.before = json.loads(out.strip() or "{}")

        # The batch's hosts at once, in pyinfra's greenlet pool: a batch of 12 costs one round trip.
        state.pool.map(snapshot, names)
        batch = [n for n in names if active[n] is not None and results[n].state == "untouched"]
        for group in groups:  # a node group converges whole or not at all
            out = [n for n in group if n in names and n not in batch]
            for n in group:
                if out and n in batch:
                    batch.remove(n)
                    res = results[n]
                    res.error, res.finished = (f"not converged: node {out[0]} of its multi-node instance "
                                               f"failed before the deploy ({results[out[0]].error})"), time.time()
                    log(f"{n}: left as it is: node {out[0]} of its node group failed before the deploy")
        if not batch:
            return
        if gateways:
            aside = [gateway_rollout.Gateway(c.name, c, active.get(c.name)) for c in gateways]
            try:
                with gateway_rollout.stepped_aside(aside, batch, active, configs, log):
                    _deploy_outside(state, batch, active, configs, results, log, groups, fleet)
            except gateway_rollout.BatchRefused as exc:
                for n in batch:
                    if results[n].state == "untouched":
                        results[n].error, results[n].finished = str(exc), time.time()
                raise
            return
        gw_host = active.get(gw_name) if gw_name else None
        drained = gateway_drain.Drained()  # filled as workers leave: put back even if the drain fails
        if gw_name and gw_host is None:
            log(f"gateway on {gw_name}: unreachable over SSH; the batch is not drained (requests to "
                "its instances may fail while they restart)")
        elif gw_host is not None:
            try:
                gateway_drain.drain(gw_host, gateway_config, batch, active, configs, log, drained)
            except Exception as exc:  # noqa: BLE001 - the gateway is best effort; the rollout goes on
                log(f"gateway on {gw_name}: could not drain ({exc}); requests may fail during restarts")
        # The deploy runs on every active host: only the batch's (the gateway host stays connected
        # for the drain, a host whose snapshot failed is skipped), then they are active again.
        try:
            _deploy_outside(state, batch, active, configs, results, log, groups, fleet)
        finally:
            try:
                gateway_drain.restore(gw_host, gateway_config, drained, log)
            except Exception as exc:  # noqa: BLE001
                log(f"gateway on {gw_name}: could not put the batch back ({exc}): run the deploy "
                    f"on {gw_name} (its unit re-registers every backend)")


def _deploy_outside(state, batch: list[str], active: dict, configs: dict, results: dict[str, HostResult],
                    log, groups: list[tuple[str, ...]] = (), fleet: Fleet | None = None) -> None:
    """The deploy on the batch only: the other connected hosts (the gateways, kept connected for the
    drain; a host whose snapshot failed) are left out of the run, then active again."""
    outside = {h for n, h in active.items() if h is not None and n not in batch}
    state.active_hosts -= outside
    try:
        _deploy_batch(state, batch, active, configs, results, log, groups, fleet)
    finally:
        state.active_hosts |= outside - set(state.failed_hosts)


def _deploy_batch(state, batch: list[str], active: dict, configs: dict, results: dict[str, HostResult],
                  log, groups: list[tuple[str, ...]] = (), fleet: Fleet | None = None) -> None:
    """The packaged deploy on the batch (already connected and snapshotted); roll back each failed
    host, and every node of a multi-node instance one of whose nodes failed (the group is one unit).

    Its run options are the batch's: executed (not dry), every host of the batch at once (not
    serial: a node group is in one batch and converges together), limited to the batch."""
    from pyinfra.api.exceptions import PyinfraError
    from pyinfra.api.operations import run_ops
    from pyinfra.api.state import StateStage
    from pyinfra_cli.util import load_func

    from vllm_fleet.deploy import RunOptions, vllm_fleet_deploy
    from vllm_fleet.deploy.outcome import failure_reason
    from vllm_fleet.deploy.state import reuse_parsed_fleet
    from vllm_fleet.connect.remote import run

    if fleet is not None:  # every host was parsed before the first batch: not again for each batch
        reuse_parsed_fleet(state, fleet)
    state.limit_hosts = [active[n] for n in batch]
    state.set_stage(StateStage.Prepare)
    state.current_op_file_number = 0
    state.current_deploy_filename = None  # no deploy file: operations are ordered by their whole call stack
    options = RunOptions(dry=False, serial=False, limit=tuple(batch),
                         command=f"vllm-fleet rollout, batch {' '.join(batch)}")
    try:
        with _ordered_like_the_cli():
            load_func(state, vllm_fleet_deploy, options=options)
    except Exception as exc:  # noqa: BLE001 - DeployError or a bug in the deploy: nothing was changed yet
        cause, refused = _load_error(exc)
        text = _error_text(cause)
        for n in batch:
            res = results[n]
            res.error, res.finished = text.splitlines()[0] if refused else text, time.time()
            res.state = "untouched" if refused else "failed"
        if refused:
            raise RolloutStopped(text, list(results.values())) from None
        import traceback

        log("the deploy raised an unexpected exception (a bug; nothing was changed on "
            f"{', '.join(batch)}):\n" + "".join(traceback.format_exception(cause)).rstrip())
        return
    state.set_stage(StateStage.Execute)
    try:
        run_ops(state)
    except PyinfraError:  # "No hosts remaining!": every host of the batch failed
        pass
    failed = {h.name for h in state.failed_hosts}
    for group in groups:  # one node failed: every node of the group goes back, in order
        nodes = [n for n in group if n in batch]
        down = [n for n in nodes if n in failed]
        if not down:
            continue
        for n in nodes:
            res = results[n]
            res.error = (failure_reason(state, n) or "the deploy failed on this host (see pyinfra's "
                         "output above)") if n in failed else (f"its multi-node instance's node {down[0]} failed: "
                                                               "the node group is rolled back as one")
        log(f"{', '.join(nodes)}: node {', '.join(down)} of the node group failed, rolling the group back")
        ok, message = rollback.roll_back_group([active[n] for n in nodes], [configs[n] for n in nodes],
                                       [results[n].before for n in nodes])
        for n in nodes:
            res = results[n]
            res.state, res.error = ("rolled back" if ok else "failed"), f"{res.error}; rollback: {message}"
            res.after, res.finished = res.before, time.time()
    for n in batch:
        if results[n].state != "untouched":  # its node group was rolled back above
            continue
        res = results[n]
        if n not in failed:
            ok, out, _err = run(active[n], f"cat {shlex.quote(manifest_path(configs[n]))}")
            res.after = json.loads(out or "{}") if ok else {}
            changes = changed_operations(state, active[n])
            res.state, res.finished = ("updated" if changes else "unchanged"), time.time()
            log(f"{n}: updated ({len(changes)} operation(s) changed it) and verified" if changes
                else f"{n}: unchanged (no operation changed it) and verified")
            continue
        res.error = (failure_reason(state, n)
                     or "the deploy failed on this host (see pyinfra's output above)")
        log(f"{n}: failed, rolling back")
        ok, message = rollback.roll_back(active[n], configs[n], res.before)
        res.state = "rolled back" if ok else "failed"
        res.error += f"; rollback: {message}"
        res.after = res.before
        res.finished = time.time()


def make_batches(names: list[str], size: int, groups: list[tuple[str, ...]]) -> list[list[str]]:
    """`names` in order, `size` at a time, except that the nodes of a multi-node instance (`groups`)
    are one unit: they go together, in the batch of the first of them, whatever the size (a half
    updated group would run two Ray or vLLM versions in one cluster)."""
    group_of = {n: g for g in groups for n in g}
    batches: list[list[str]] = []
    current: list[str] = []
    placed: set[str] = set()
    for name in names:
        if name in placed:
            continue
        unit = [n for n in group_of.get(name, (name,)) if n in names]
        if current and len(current) + len(unit) > size:
            batches.append(current)
            current = []
        current += unit
        placed.update(unit)
        if len(current) >= size:
            batches.append(current)
            current = []
    if current:
        batches.append(current)
    return batches


@contextmanager
def _ordered_like_the_cli():
    """Order the deploy's operations as `pyinfra INVENTORY deploy.py` does: by where the deploy code
    calls them (pyinfra/api/operation.py solve_operation_consistency, CLI mode), not by how many
    operations each host had before (its API mode). Hosts whose steps differ then still run each
    step together: a multi-node instance's head restarts Ray before its workers rejoin
    (deploy/ray.py ray_service); in API mode a worker's 11th operation would run beside the head's 11th."""
    import pyinfra

    before = pyinfra.is_cli
    pyinfra.is_cli = True
    try:
        yield
    finally:
        pyinfra.is_cli = before


def rollout(inventory: str, *, batch: str = "1", max_fail: int = 0, limit: list[str] | None = None,
            order: list[str] | None = None, log=print,
            canary: canary_batch.CanaryRequest | None = None) -> list[HostResult]:
    """`canary`: the canary batch asked for (commands/canary.py), whose report it receives; without
    one, the hosts with vllm_rollout_canary = True are the canary."""
    from vllm_fleet import deploy
    from vllm_fleet.commands import connection

    connection.install()  # gevent, before pyinfra loads the inventory and connects
    deploy.install()  # what the deploy changes in pyinfra, as the root deploy.py has it
    fleet = Fleet.load(inventory, limit)
    # What `vllm-fleet check` finds, before the first batch connects: every problem at once.
    found = fleet_check.problems(fleet, inventory=inventory)
    if found:
        raise ConfigErrors(found)
    everyone = fleet.every()  # every host must parse: the gateway and the node groups are the fleet's
    groups = [g.nodes for g in fleet.node_groups()]
    # A node of a multi-node instance brings its whole group (it is updated as one): Fleet.selected.
    names = list(fleet.selected)
    if order:
        unknown = [n for n in order if n not in names]
        if unknown:
            raise ConfigError(f"--order names unknown hosts: {', '.join(unknown)}",
                              fix="use host names of the inventory (after --limit)")
        names = order + [n for n in names if n not in order]
    configs = {name: fleet.configs[name] for name in fleet.selected}
    _check_wheelhouses(configs, everyone)
    # The fleet's gateway, wherever it is (in --limit or not): the batches are drained from it.
    gateway_config = find_gateway(everyone)  # (and config.check_fleet of every host, gateway or not)
    # Several gateways: every router drains each batch, and they converge one at a time.
    gateways = [c for c in everyone if c.settings.vllm_gateway is True]
    several = gateways if len(gateways) > 1 else None
    size = parse_batch(batch, len(names))
    results = {n: HostResult(n) for n in names}
    canary = canary if canary is not None else canary_batch.CanaryRequest()
    canary_plan = canary_batch.plan(canary, everyone, names)
    if canary_plan is not None:  # the canary first, on its own; then the rest as --batch says
        rest = [n for n in names if n not in canary_plan.hosts]
        if several and sum(name in canary_plan.hosts for name in (c.name for c in several)) > 1:
            raise ConfigError(f"the canary {', '.join(canary_plan.hosts)} holds more than one of the gateways "
                              "behind the floating address, which converge one at a time",
                              fix="name one gateway at most in --canary (or vllm_rollout_canary)")
        batches = [list(canary_plan.hosts)] + make_batches(rest, size, groups)
    else:
        batches = make_batches(names, size, groups)
    if several:
        batches = gateway_rollout.one_gateway_per_batch(batches, [c.name for c in several])
    done = 0
    for number, group in enumerate(batches, 1):
        log(f"batch {number}: {', '.join(group)}")
        try:
            _converge_batch(inventory, group, configs, results, log, gateway_config, groups, fleet, several)
        except gateway_rollout.BatchRefused as exc:
            log(f"stopping: batch {number} not converged: {exc}; {len(names) - done} host(s) left untouched")
            break
        done += len(group)
        failures = [r for r in results.values() if r.state in ("failed", "rolled back")]
        if len(failures) > max_fail:
            log(f"stopping: {len(failures)} host(s) failed (--max-fail {max_fail}); "
                f"{len(names) - done} host(s) left untouched")
            break
        if number == 1 and canary_plan is not None and not canary_batch.after_canary_batch(
                canary_plan, canary, inventory, configs, everyone, results, gateway_config, log):
            log(f"stopping after the canary: {len(names) - done} host(s) left untouched")
            break
    return list(results.values())



def print_table(results: list[HostResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="vllm-fleet rollout")
    for column in ("host", "instance", "before (env / config hash)", "after (env / config hash)", "state",
                   "time"):
        table.add_column(column)
    colour = {"updated": "green", "unchanged": "green", "rolled back": "yellow", "failed": "red",
              "untouched": "dim"}
    for res in results:
        before, after = rollback.manifest_summary(res.before), rollback.manifest_summary(res.after)
        instances = sorted(set(before["config_hash"]) | set(after["config_hash"])) or ["-"]
        for inst in instances:
            table.add_row(res.name, inst,
                          f"{Path(before['environment'] or '-').name} / {before['config_hash'].get(inst) or '-'}",
                          f"{Path(after['environment'] or '-').name} / {after['config_hash'].get(inst) or '-'}",
                          f"[{colour[res.state]}]{res.state}[/{colour[res.state]}]",
                          f"{res.row()['seconds']} s" if res.row()["seconds"] is not None else "-")
    Console(width=170).print(table)
    for res in results:
        if res.error:
            print(f"{res.name}: {res.error}", file=sys.stderr)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet rollout", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Deploy the fleet batch by batch: each batch runs the same deploy as `pyinfra INVENTORY
deploy.py` (the same secrets from this workstation) and is verified, a real completion
included, before the next. Before a host changes, its managed files and its environment link
are saved on it; a host that fails is restored from them, restarted and verified again (rolled
back). More failed hosts than --max-fail stop the rollout: later hosts stay untouched. With a
gateway, a batch's backends leave it first (their requests finish) and return once verified.
With several gateways (a floating address): they leave every router (a router that cannot
drain them stops the rollout there), a batch holds one gateway at most, and the address moves
off the gateway holding it before that one converges.
Each host ends untouched, unchanged, updated, rolled back or failed.
Exit status: 0 every host updated or unchanged, 1 otherwise, 2 input the deploy refused
before any change.""",
        epilog="""\
examples:
  vllm-fleet rollout inventory/prod.py --batch 25%
      a quarter of the hosts at a time
  vllm-fleet rollout inventory/prod.py --max-fail 1 --order gpu-a100-01,gpu-h100-01,gpu-mixed-01
      one host at a time in this order, going on after one failure
  vllm-fleet rollout inventory/prod.py --canary gpu-h100-01 --observe 10m
      gpu-h100-01 first; after 10 minutes of traffic the fleet's Prometheus compares it with the
      rest of its model (docs/deploy-steps.md): the rest follows, or it is rolled back""")
    parser.add_argument("inventory", help="the pyinfra inventory file, e.g. inventory/prod.py")
    parser.add_argument("--batch", default="1", metavar="N|N%",
                        help="hosts per batch: a number, or a percentage of the hosts (default 1)")
    parser.add_argument("--max-fail", type=int, default=0, metavar="N",
                        help="failed hosts tolerated before the rollout stops (default 0)")
    parser.add_argument("--limit", action="append", metavar="NAMES",
                        help="only these hosts or groups (comma-separated; repeatable)")
    parser.add_argument("--order", metavar="HOSTS",
                        help="the hosts' order (comma-separated inventory names; default: the inventory's)")
    parser.add_argument("--canary", metavar="HOSTS",
                        help="converge these hosts first and judge them by the fleet's Prometheus against the "
                             "rest of their models before the rest follows (default: the hosts with "
                             "vllm_rollout_canary = True)")
    parser.add_argument("--observe", metavar="WINDOW",
                        help="with a canary: how long to observe it, 30s, 10m, 1h (default: vllm_canary_observe_s)")
    parser.add_argument("--json", action="store_true",
                        help="print each host's state (and the canary's figures) as JSON on stdout (progress "
                             "goes to stderr)")
    args = parser.parse_args(argv)
    limit = split_names(args.limit)
    order = split_names([args.order] if args.order else None)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    canary = canary_batch.CanaryRequest(split_names([args.canary]) if args.canary else None, args.observe)
    try:
        if args.observe is not None:
            canary_batch.parse_observe(args.observe)  # refused before the inventory is read
        results = rollout(args.inventory, batch=args.batch, max_fail=args.max_fail, limit=limit,
                          order=order, log=log, canary=canary)
    except RolloutStopped as exc:
        if args.json:
            json.dump({"hosts": [r.row() for r in exc.results], "error": exc.message}, sys.stdout, indent=2)
            sys.stdout.write("\n")
        elif any(r.state != "untouched" for r in exc.results):  # earlier batches did run
            print_table(exc.results)
        print(exc.message, file=sys.stderr)
        print("the rollout stopped: the hosts of this batch and later ones are untouched", file=sys.stderr)
        return EXIT_INVALID
    except ConfigErrors as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_INVALID
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc.located() if isinstance(exc, ConfigError) else exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.json:
        json.dump({"hosts": [r.row() for r in results], **({"canary": canary.report} if canary.report else {})},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(results)
        canary_batch.main_report(canary.report, args.json)
    judged = canary.report is None or canary.report["decision"] == "proceed"
    return 0 if judged and all(r.state in ("updated", "unchanged") for r in results) else 1
