"""Reading the tools' output: where a pyinfra run's wall time goes (its phases), remote commands,
SSH connections and file transfers per host from pyinfra's --debug and ansible-playbook's -vvv
output, and Ansible's PLAY RECAP and changed lines."""

from __future__ import annotations

import re

from converge.settings import DEPLOY_NAME

# Where a pyinfra run's wall time goes: the lines pyinfra's CLI (and deploy.py's operations) print as
# each phase begins, in order. A phase lasts until the next one found begins; the first, from the
# process's start to pyinfra's first line, is the interpreter with pyinfra's imports.
PHASE_MARKERS = (
    ("interpreter start-up and imports", None),
    ("config and inventory", "--> Loading config"),
    ("SSH connections", "--> Connecting to hosts"),
    ("deploy.py's prepare: the lock (with the root check), fact batches, plan, render", "--> Preparing operation files"),
    ("operations before verification", "--> Beginning operation run"),
    ("verification of the instances (a 1-token completion each)", f"Starting operation: {DEPLOY_NAME} | Verify instances"),
    ("verification of the gateway", f"Starting operation: {DEPLOY_NAME} | Verify the gateway"),
    ("results and disconnecting", "--> Results"),
)


def phase_split(timed_lines: list[tuple[float, str]], end: float) -> list[tuple[str, float]]:
    """[(phase, seconds)] from a run's output lines with the seconds since its start at which each
    was printed, and the run's total; phases whose marker never appeared are left out."""
    found: list[tuple[str, float]] = [(PHASE_MARKERS[0][0], 0.0)]
    for label, marker in PHASE_MARKERS[1:]:
        at = next((t for t, line in timed_lines if marker in line), None)
        if at is not None and at >= found[-1][1]:
            found.append((label, at))
    bounds = [t for _label, t in found[1:]] + [end]
    return [(label, round(stop - start, 3)) for (label, start), stop in zip(found, bounds, strict=True)]


_PYINFRA_COMMAND = re.compile(r"Running command on ([^\s:]+):")
_PYINFRA_CONNECT = re.compile(r"Connecting to: (\S+) \((.*)")
_PYINFRA_PORT = re.compile(r"'port': (\d+)")
_PYINFRA_LOCK = re.compile(r"\[([^\]\s]+)\]\s+deploy lock \S+ taken")
_ANSIBLE_EXEC = re.compile(r"<([^>]+)> SSH: EXEC (ssh|sftp|scp) (.*)")
_ANSIBLE_PORT = re.compile(r"-o Port=(\d+)")
_SSH_CONNECT = re.compile(r"debug1: Connecting to (\S+) \[[^\]]*\] port (\d+)\.")


def _bucket(counts: dict[str, dict[str, int]], name: str) -> dict[str, int]:
    return counts.setdefault(name, {"commands": 0, "connections": 0, "transfers": 0})


def _tally(names) -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = {}
    for name in names:
        _bucket(counts, name)
    return counts


def pyinfra_counts(log: str, endpoints: dict[tuple[str, int], str]) -> dict[str, dict[str, int]]:
    """Per host, from `pyinfra --debug` output: remote commands (each `Running command on`, plus the
    deploy lock's command, which runs on a channel of its own and is logged only as `deploy lock ...
    taken`), SSH connections (`Connecting to: ADDRESS (kwargs)`, the port in the kwargs, 22 when
    absent) and file uploads (`Attempting upload`: not named per host; counted under "*")."""
    counts = _tally(endpoints.values())
    for line in log.splitlines():
        if m := _PYINFRA_COMMAND.search(line):
            _bucket(counts, m.group(1))["commands"] += 1
        elif m := _PYINFRA_CONNECT.search(line):
            port = _PYINFRA_PORT.search(m.group(2))
            name = endpoints.get((m.group(1), int(port.group(1)) if port else 22), m.group(1))
            _bucket(counts, name)["connections"] += 1
        elif m := _PYINFRA_LOCK.search(line):
            _bucket(counts, m.group(1))["commands"] += 1
        elif "Attempting upload of" in line:
            _bucket(counts, "*")["transfers"] += 1
    return counts


def ansible_counts(log: str, endpoints: dict[tuple[str, int], str]) -> dict[str, dict[str, int]]:
    """Per host, from `ansible-playbook -vvv` output (with ANSIBLE_SSH_VERBOSITY=1): remote commands
    (each `SSH: EXEC ssh`: with pipelining one per module run), file transfers (`SSH: EXEC sftp/scp`)
    and SSH connections (ssh's own `debug1: Connecting to ADDRESS [..] port N.`: only a command that
    opens a connection prints it; one that goes through the control master does not). Hosts are
    told apart by address and port (`-o Port=N`; 22 when absent)."""
    counts = _tally(endpoints.values())
    for line in log.splitlines():
        if m := _ANSIBLE_EXEC.search(line):
            port = _ANSIBLE_PORT.search(m.group(3))
            name = endpoints.get((m.group(1), int(port.group(1)) if port else 22), m.group(1))
            key = "commands" if m.group(2) == "ssh" else "transfers"
            _bucket(counts, name)[key] += 1
        for m in _SSH_CONNECT.finditer(line):
            name = endpoints.get((m.group(1), int(m.group(2))), m.group(1))
            _bucket(counts, name)["connections"] += 1
    return counts


_RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def play_recap(text: str) -> dict[str, dict[str, int]]:
    """Ansible's PLAY RECAP: {host: {ok, changed, unreachable, failed}}."""
    return {m.group(1): dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()[1:]), strict=True))
            for m in _RECAP.finditer(text)}


def changed_lines(text: str) -> list[str]:
    """The `changed: [host] ...` lines of Ansible's output (what a run that should be a no-op changed)."""
    return [line.strip() for line in text.splitlines() if line.startswith("changed: [")]

