"""What the sandbox benches share: the repository's paths, the 3 CPU hosts of inventory/sandbox.py,
inventory directories that keep the sandbox's group data, the deploy's environment, processes
stopped by their PID, the delaying TCP relay (bench/latency_relay.py) as a process, a bench run
that reports what it measured however it ends, and the --json document.

Importing it puts the repository on sys.path (the benches run as scripts, outside the install).
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SANDBOX_INVENTORY = REPO / "inventory" / "sandbox.py"
GROUP_DATA = REPO / "inventory" / "group_data"
CPU_HOSTS = ["sbx-cpu1", "sbx-cpu2", "sbx-cpu3"]  # inventory/sandbox.py's cpu_hosts


def cpu_sandbox():
    """The sandbox of inventory/sandbox.py reduced to its 3 CPU hosts."""
    from vllm_fleet.sandbox import harness, hosts

    full = hosts.load(SANDBOX_INVENTORY)
    return harness.Sandbox(full.inventory, [h for h in full.hosts if h.name in CPU_HOSTS])


def inventory_dir(parent: Path, name: str) -> Path:
    """parent/name with a link to inventory/group_data beside the inventory file written there: an
    inventory file named sandbox.py in it gets the sandbox's group data (pyinfra names the group
    after the file)."""
    d = parent / name
    d.mkdir(parents=True, exist_ok=True)
    if not (d / "group_data").exists():
        (d / "group_data").symlink_to(GROUP_DATA)
    return d


def deploy_env(api_key: str, wheelhouse: Path | None = None) -> dict[str, str]:
    """This process's environment with the deploy's API key (and wheelhouse), output unbuffered."""
    env = dict(os.environ, VLLM_FLEET_API_KEY=api_key)
    if wheelhouse is not None:
        env["VLLM_FLEET_WHEELHOUSE"] = str(wheelhouse)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def stop_process(proc: subprocess.Popen, grace_s: float = 5) -> None:
    """SIGTERM a process this bench started, by its PID; SIGKILL when it is still there after grace_s."""
    if proc.poll() is not None:
        return
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=grace_s)


class Relay:
    """bench/latency_relay.py as a process of its own, started here and stopped by its PID."""

    def __init__(self, rtt_ms: float, targets: dict[str, tuple[str, int]], workdir: Path, save_every: float = 0):
        self.rtt_ms = rtt_ms
        self.stats_path = workdir / f"relay-{rtt_ms:g}ms.json"
        argv = [sys.executable, str(BENCH / "latency_relay.py"), "--rtt-ms", f"{rtt_ms:g}",
                "--stats", str(self.stats_path)] + [f"--target={n}={a}:{p}" for n, (a, p) in targets.items()]
        if save_every:  # stats written every so often too, not only when a connection opens or closes
            argv += ["--save-every", f"{save_every:g}"]
        self.stderr = open(workdir / f"relay-{rtt_ms:g}ms.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 15)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.stop()
            raise SystemExit(f"the {rtt_ms:g} ms relay did not start: "
                             f"{(workdir / f'relay-{rtt_ms:g}ms.log').read_text(errors='replace')[-2000:]}")
        self.ports: dict[str, int] = json.loads(line)

    def connections(self) -> dict[str, int]:
        try:
            return dict(json.loads(self.stats_path.read_text())["connections"])
        except (OSError, ValueError, KeyError):
            return {}

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc.stdout.close()
        self.stderr.close()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_to_the_end(bench, run: Callable[[], dict[str, Any]],
                   report_so_far: Callable[[dict[str, Any]], None], stopped: str) -> dict[str, Any]:
    """`run()` the bench. SIGTERM (a CI timeout) ends it like Ctrl-C; however it ends, what it had
    measured is reported (`report_so_far`, when bench.result holds something) and everything it
    started is stopped (bench.cleanup), then `stopped` says so, on bench.out."""
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run()
    except BaseException:
        if bench.result:
            print("\nthe bench stopped early; what it measured so far:", file=bench.out)
            report_so_far(bench.result)
        raise
    finally:
        bench.cleanup()
        print(stopped, file=bench.out)


def print_json(result: dict[str, Any]) -> None:
    """--json: the result as one JSON document on stdout."""
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
