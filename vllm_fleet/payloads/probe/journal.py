"""What systemd and the journal say of a unit: its last lines, how its main process last ended,
why it is failing, and the front's access log counted by client."""

import json
import re
import signal
import subprocess

from vllm_fleet.payloads.probe.host import show


def journal(unit, lines=40):
    return subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
                          capture_output=True, text=True).stdout


def how_it_ended(unit, since):
    """How the unit's main process last ended: 'killed by signal KILL', 'exit status 1'.

    Read from systemd's own journal line ("Main process exited, code=killed, status=9/KILL"): once
    Restart= has started a new process, the unit's ExecMain* properties describe that one.
    """
    out = subprocess.run(["journalctl", "-u", unit, "--since", f"@{int(since)}", "--no-pager", "-o", "cat"],
                         capture_output=True, text=True).stdout
    found = re.findall(r"Main process exited, code=(\w+), status=(\S+)", out)
    if found:
        code, status = found[-1]
        if code in ("killed", "dumped"):
            return f"killed by signal {status.split('/')[-1].rstrip('.')}"
        return f"exit status {status.split('/')[0].rstrip('.')}"
    props = show(unit, "Result", "ExecMainCode", "ExecMainStatus")
    if props["ExecMainCode"] in ("2", "3") and props["ExecMainStatus"].isdigit():  # CLD_KILLED, CLD_DUMPED
        try:
            return f"killed by signal {signal.Signals(int(props['ExecMainStatus'])).name.removeprefix('SIG')}"
        except ValueError:
            pass
    return f"result {props['Result'] or 'unknown'}"


FAILING_STATES = ("failed", "auto-restart")  # ActiveState failed, or SubState between restarts


def unit_failure(unit, props, lines=200):
    """Why a unit is failed or waiting to restart: systemd's Result (exit-code, timeout,
    start-limit-hit, ...), its restart count and the journal's last lines (the workstation
    diagnoses them); None for a unit that is not failing."""
    if props["ActiveState"] != "failed" and props["SubState"] not in FAILING_STATES:
        return None
    return {"result": props.get("Result") or show(unit, "Result")["Result"], "restarts": props["NRestarts"],
            "journal": journal(unit, lines).splitlines()}


def requests_by_client(since="-1h"):
    """The front's access log (one JSON line per request, journald tag vllm_fleet_access) counted by
    client and status class: {client: {"2xx": n, "4xx": n, ...}}; "" is a request with no known key."""
    out = subprocess.run(["journalctl", "-t", "vllm_fleet_access", "--since", since, "-o", "cat", "--no-pager"],
                         capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        try:
            entry = json.loads(line)
            klass = f"{int(entry['status']) // 100}xx"
        except (ValueError, KeyError, TypeError):
            continue
        per = counts.setdefault(str(entry.get("client", "")), {})
        per[klass] = per.get(klass, 0) + 1
    return counts
