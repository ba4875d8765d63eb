"""Rollout's side of two or more gateways behind the floating address (vllm_gateway_address).

- Every router drains the batch. A batch's backends leave every gateway's router before the batch
  converges (each router sends requests to every backend: draining one leaves the others sending),
  and come back to every router after. All or nothing: a gateway that cannot be drained (its host
  unreachable over SSH, its router up but not answering, a removal refused) stops the batch before
  it converges, and the routers already drained get their backends back.
- One gateway a batch (one_gateway_per_batch): while a gateway converges, the others serve; two at
  once could leave no gateway ready.
- The address leaves the holder first (address_moved_away): keepalived is stopped on the gateway
  holding the address (a stopping VRRP master sends priority 0, so a backup takes over at once;
  with nopreempt nothing else moves it), the rollout waits until another gateway holds it (`ip -o
  addr` on each), converges the host, then starts keepalived again: it comes back as a backup and
  the address stays where it went. Before that, the holder holds new connections to the address
  (nftables), lets its front end the open ones, waits (at most MOVE_QUIET_S) until none is open and
  takes the address off its interface at that moment (quiet_then_stop_command): a connection open
  on the holder when the address leaves it is lost (the holder can no longer answer from the
  address, the new holder resets it), while a held one is only late. The holder is
  converged only when another gateway is ready (its readiness check passes and its keepalived
  runs); else the batch stops.

Pure planning (one_gateway_per_batch, holds_address) and the commands (holds_command, ...) are
testable offline; the rest runs them over SSH through connect.remote.
"""

from __future__ import annotations

import shlex
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable

from vllm_fleet.commands import gateway_drain
from vllm_fleet.config import HostConfig
from vllm_fleet.gateway import CHECK_PYTHON, KEEPALIVED_UNIT, floating_ip, floating_paths
from vllm_fleet.host_layout import FRONT_UNIT

#: How long the holder waits for its clients' open connections to end before the address leaves it
#: (new ones held meanwhile): a request longer than that, in flight then, is cut.
MOVE_QUIET_S = 10
#: How long another gateway has to take the address once keepalived stops on the holder (VRRP: at
#: once on the holder's priority-0 advert; 3 adverts and the skew, under 2 s, without it).
MOVE_TIMEOUT_S = 15
#: How long keepalived has to come back (active) on the converged gateway.
REJOIN_TIMEOUT_S = 30
POLL_S = 0.25


class BatchRefused(Exception):
    """The batch cannot converge without failing clients' requests: nothing of it was changed."""


@dataclass
class Gateway:
    """One of the fleet's gateways as a batch sees it: its config and its connection (None:
    unreachable over SSH)."""

    name: str
    config: HostConfig
    host: Any = None


def one_gateway_per_batch(batches: list[list[str]], gateways: list[str]) -> list[list[str]]:
    """`batches` with at most one gateway in each: a batch's second (third, ...) gateway goes into a
    batch of its own right after it, in order. A node group holding two gateways stays whole (its
    nodes converge together); check_fleet's gateways are rarely nodes."""
    out: list[list[str]] = []
    for batch in batches:
        first, rest = [], []
        for name in batch:
            (rest if name in gateways and any(n in gateways for n in first) else first).append(name)
        out.append(first)
        out += [[name] for name in rest]
    return out


def holds_command(config: HostConfig) -> str:
    """The IPv4 addresses on the gateway's floating interface, one line each (`ip -o -4 addr`)."""
    return f"ip -o -4 addr show dev {shlex.quote(config.settings.vllm_gateway_interface)}"


def holds_address(output: str, address: str) -> bool:
    """Whether `ip -o -4 addr show dev IF` output lists `address` (the floating one, no prefix)."""
    for line in output.splitlines():
        words = line.split()
        if "inet" in words and words.index("inet") + 1 < len(words):
            if words[words.index("inet") + 1].split("/", 1)[0] == address:
                return True
    return False


def ready_command(config: HostConfig) -> str:
    """Exit status 0 when this gateway could take the address: keepalived runs and keepalived's own
    readiness check (router up with a healthy backend, front answering) passes."""
    return (f"systemctl is-active --quiet {KEEPALIVED_UNIT} && "
            f"{CHECK_PYTHON} -I {shlex.quote(floating_paths(config)['check'])}")


HOLD_TABLE = "vllm_fleet_address_move"


def hold_rules(address: str, port: int) -> str:
    """nftables' rules (a table of their own) that drop new connections to the floating address's
    gateway port, and nothing else: a SYN without ACK. Dropped, not refused: the client sends its
    SYN again a second later (then 2, 4 s later), by then to the gateway the address went to."""
    return (f"table inet {HOLD_TABLE} {{\n"
            f"  chain input {{\n"
            f"    type filter hook input priority -10; policy accept;\n"
            f"    ip daddr {address} tcp dport {int(port)} tcp flags & (syn | ack) == syn drop\n"
            f"  }}\n"
            f"}}")


def quiet_then_stop_command(config: HostConfig, quiet_s: int = MOVE_QUIET_S) -> str:
    """On the holder, in one command (so that only milliseconds lie between the last connection
    ending and the address leaving):

    1. hold new connections to the address (hold_rules): under steady traffic there is otherwise
       never a moment with none open;
    2. reload the front: nginx's old workers close their idle keep-alive connections at once and end
       the others after the request in flight (`Connection: close`), so a client's pooled connection
       is not cut in the middle of a request;
    3. wait (at most `quiet_s`) until no connection is open or opening on the address's port;
    4. take the address off the interface and stop keepalived (a stopping master advertises priority
       0: a backup takes the address at once);
    5. drop the hold (on any exit, a signal's too: a hold left behind would drop the clients of this
       gateway the next time it holds the address; stopped before step 4, the address stays).

    Without `nft` (a gateway not deployed since nftables became a package of gateways), it warns and
    moves at the first quiet moment, as before: connections opened in the meantime may be cut."""
    address, port = floating_ip(config), config.settings.vllm_gateway_port
    interface = shlex.quote(config.settings.vllm_gateway_interface)
    prefix = config.settings.vllm_gateway_address.split("/", 1)[1]
    listen = shlex.quote(f"{address}:{port}")
    connections = f"ss -Htn state established state syn-recv src {listen} 2>/dev/null"
    return (f"trap 'nft delete table inet {HOLD_TABLE} 2>/dev/null' EXIT; trap 'exit 1' HUP INT TERM PIPE; held=0; "
            f"if printf '%s\\n' {shlex.quote(hold_rules(address, port))} | nft -f -; then held=1; else "
            f"echo 'nftables: new connections to the floating address are not held (nft failed or is missing); "
            f"the move waits for a quiet moment only' >&2; fi; "
            f"systemctl reload --no-block {FRONT_UNIT}; "
            f"start=$(date +%s); end=$((start + {int(quiet_s)})); "
            f"while [ -n \"$({connections})\" ] && [ \"$(date +%s)\" -lt \"$end\" ]; do sleep 0.02; done; "
            f"open=$({connections} | wc -l); "
            f"ip addr del {shlex.quote(f'{address}/{prefix}')} dev {interface}; "
            f"echo \"held=$held open=$open waited=$(($(date +%s) - start))\"; "
            f"{connections} | head -n 5 | sed 's/^/still open: /' ; "
            f"systemctl stop {KEEPALIVED_UNIT}")


def move_report(output: str) -> dict[str, int] | None:
    """quiet_then_stop_command's `held=1 open=0 waited=2` line as numbers (None when absent)."""
    for line in output.splitlines():
        words = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if set(words) == {"held", "open", "waited"} and all(v.isdigit() for v in words.values()):
            return {k: int(v) for k, v in words.items()}
    return None


def describe_move(holder: str, output: str, err: str) -> str:
    """What the holder saw before the address left it, for the rollout's log."""
    report = move_report(output)
    if report is None:
        return f"{holder}: the move said nothing of its connections ({(err.strip() or output.strip())[-200:]})"
    held = "new connections held" if report["held"] else "new connections NOT held (nft failed or is missing)"
    if report["open"]:
        cut = [line.removeprefix("still open: ") for line in output.splitlines() if line.startswith("still open: ")]
        return (f"{holder}: {held}; {report['open']} connection(s) still open after {report['waited']} s were cut "
                f"({'; '.join(cut)})")
    return f"{holder}: {held}; every open connection ended within {report['waited']} s"


def start_command() -> str:
    return f"systemctl start {KEEPALIVED_UNIT} && systemctl is-active --quiet {KEEPALIVED_UNIT}"


# --- over SSH ------------------------------------------------------------------------------------

def _run(host, command: str, timeout: int = 60) -> tuple[bool, str, str]:
    from vllm_fleet.connect import remote

    return remote.run(host, command, timeout=timeout)


def holders(gateways: list[Gateway]) -> list[str]:
    """The gateways that hold the floating address now (one, when all is well)."""
    out = []
    for gw in gateways:
        if gw.host is None:
            continue
        ok, text, _err = _run(gw.host, holds_command(gw.config), timeout=30)
        if ok and holds_address(text, floating_ip(gw.config)):
            out.append(gw.name)
    return out


def drain_from_every_router(gateways: list[Gateway], batch: list[str], hosts: dict[str, Any],
                            configs: dict[str, HostConfig], log: Callable[[str], None]
                            ) -> dict[str, gateway_drain.Drained]:
    """Take the batch's backends out of every gateway's router, then wait once for their requests in
    flight (whichever router sent them). Any router that cannot be drained: the ones already drained
    get their backends back, and BatchRefused says why."""
    drained: dict[str, gateway_drain.Drained] = {}
    ports: dict[str, list[int]] = {}
    try:
        for gw in gateways:
            if gw.host is None:
                raise gateway_drain.DrainError(
                    f"gateway on {gw.name}: unreachable over SSH, so its router cannot be drained (it may still "
                    "send the batch requests)")
            done = drained.setdefault(gw.name, gateway_drain.Drained())
            for name, found in gateway_drain.take_out(gw.host, gw.config, batch, configs, log, done,
                                                      strict=True).items():
                ports[name] = sorted(set(ports.get(name, [])) | set(found))
    except Exception as exc:  # noqa: BLE001 - a probe's failure too: the batch must not go on half drained
        problems = restore_on_every_router(gateways, drained, log)
        back = f"; putting the others back failed: {'; '.join(problems)}" if problems else ""
        raise BatchRefused(f"the batch was not drained from every gateway ({exc}): not converged, so that no "
                           f"router sends it requests while it restarts{back}") from None
    timeout_s = int(gateways[0].config.settings.vllm_gateway_drain_timeout_s)  # the same on every gateway
    gateway_drain.wait_until_idle(hosts, ports, timeout_s, log)
    return drained


def restore_on_every_router(gateways: list[Gateway], drained: dict[str, gateway_drain.Drained],
                            log: Callable[[str], None]) -> list[str]:
    """Put the drained backends back into each router that took them out; what failed, per gateway
    (each is tried: one router's failure leaves the others' restore to run)."""
    problems = []
    for gw in gateways:
        done = drained.get(gw.name)
        if done is None or not done.workers:
            continue
        try:
            errors = gateway_drain.restore(gw.host, gw.config, done, log, named=True)
        except Exception as exc:  # noqa: BLE001
            errors = [str(exc)]
        if errors:
            problems.append(f"gateway on {gw.name}: {'; '.join(errors)} (run the deploy on {gw.name}: its "
                            "router's unit registers every backend)")
    return problems


def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)


@contextmanager
def address_moved_away(holder: Gateway, others: list[Gateway], log: Callable[[str], None]):
    """Move the floating address from `holder` to another ready gateway for the time of the block,
    then let keepalived on `holder` rejoin as a backup. BatchRefused (nothing changed) when no
    other gateway is ready or none takes the address."""
    address = floating_ip(holder.config)
    ready = [gw.name for gw in others if gw.host is not None and _run(gw.host, ready_command(gw.config))[0]]
    if not ready:
        raise BatchRefused(
            f"{holder.name} holds the floating address {address} and no other gateway is ready to take it "
            f"({', '.join(gw.name for gw in others) or 'there is none'}: keepalived stopped, readiness check "
            f"failing or unreachable): converging it would leave the clients with no gateway")
    started = time.monotonic()
    ok, out, err = _run(holder.host, quiet_then_stop_command(holder.config), timeout=MOVE_QUIET_S + 60)
    log(describe_move(holder.name, out, err))
    took: list[str] = []

    def moved() -> bool:
        took[:] = holders(others)
        return bool(took)

    if ok:
        _wait_for(moved, MOVE_TIMEOUT_S)
    if not took:
        _run(holder.host, start_command(), timeout=60)  # the only ready holder takes it back
        raise BatchRefused(f"the floating address {address} did not move from {holder.name} to another gateway "
                           f"within {MOVE_TIMEOUT_S} s ({err.strip()[-300:] or 'no other gateway took it'}): "
                           f"keepalived is started again there and {holder.name} is not converged")
    log(f"floating address {address}: moved from {holder.name} to {took[0]} in "
        f"{time.monotonic() - started:.1f} s, before {holder.name} converges")
    try:
        yield took[0]
    finally:
        rejoin(holder, took[0], log)


def rejoin(gateway: Gateway, holder: str, log: Callable[[str], None]) -> None:
    """keepalived started again on a converged gateway: a backup (nopreempt: the address stays on
    `holder`)."""
    if not _wait_for(lambda: _run(gateway.host, start_command(), timeout=60)[0], REJOIN_TIMEOUT_S):
        log(f"gateway on {gateway.name}: keepalived did not start again; it takes no part in the floating "
            f"address until it runs (`systemctl start {KEEPALIVED_UNIT}` on {gateway.name}, or deploy it)")
        return
    log(f"gateway on {gateway.name}: keepalived started again, a backup (the address stays on {holder})")


@contextmanager
def stepped_aside(gateways: list[Gateway], batch: list[str], hosts: dict[str, Any],
                  configs: dict[str, HostConfig], log: Callable[[str], None]):
    """For the time of the block (the batch's deploy): the batch drained from every gateway's router,
    and the floating address away from a gateway of the batch that holds it. After it, keepalived
    back on that gateway (a backup), then the backends back into every router. BatchRefused before
    the block when either cannot be done (the routers already drained are put back)."""
    drained = drain_from_every_router(gateways, batch, hosts, configs, log)
    try:
        in_batch = [gw for gw in gateways if gw.name in batch]
        holding = holders(in_batch) if in_batch else []
        if holding:
            holder = next(gw for gw in in_batch if gw.name == holding[0])
            with address_moved_away(holder, [gw for gw in gateways if gw is not holder], log):
                yield
        else:
            yield
    finally:
        for problem in restore_on_every_router(gateways, drained, log):
            log(problem)
