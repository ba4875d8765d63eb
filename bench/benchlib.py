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
import tempfile
import threading
import time
from dataclasses import dataclass
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


@dataclass
class Measured:
    """A finished process as a bench measures it: exit status, output, wall seconds, the CPU
    seconds it and the children it waited for used (user + system), and its peak resident memory
    (the largest of it and those children: getrusage's ru_maxrss)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    cpu_s: float
    peak_rss_mib: float
    machine_cpu_s: float = 0.0  # every CPU's busy time meanwhile: the sandbox hosts' work included

    def usage(self) -> dict[str, float]:
        """What a bench records of the run beside its time (converge.report.usage_summary reads it)."""
        return {"cpu_s": self.cpu_s, "peak_rss_mib": self.peak_rss_mib, "machine_cpu_s": self.machine_cpu_s}


def machine_busy_s() -> float:
    """This machine's CPU time spent not idle since boot (/proc/stat's first line), in seconds."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_measured(argv: list[str], timeout: float, **popen) -> Measured:
    """Run argv to its end (SIGKILL past `timeout`) and measure it with wait4, which reports the
    resources of that one child, where RUSAGE_CHILDREN would add up every child the bench ever had."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start, busy = time.monotonic(), machine_busy_s()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, **popen)
        killer = threading.Timer(timeout, lambda: os.kill(proc.pid, signal.SIGKILL))
        killer.start()
        try:
            _pid, status, usage = os.wait4(proc.pid, 0)
        except BaseException:  # SIGTERM or Ctrl-C of the bench: the tool must not outlive it
            proc.kill()
            os.waitpid(proc.pid, 0)
            proc.returncode = -signal.SIGKILL
            raise
        finally:
            killer.cancel()
        seconds = time.monotonic() - start
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        return Measured(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                        seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, machine_busy_s() - busy)


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
    """`run()` the bench. SIGTERM (a CI timeout) ends it like Ctrl-C; a sandbox host that does not
    come up ends it with the harness's message (the host and its nspawn log); however it ends, what it had
    measured is reported (`report_so_far`, when bench.result holds something) and everything it
    started is stopped (bench.cleanup), then `stopped` says so, on bench.out."""
    from vllm_fleet.sandbox.hosts import SandboxError

    signal.signal(signal.SIGTERM, _interrupt)
    try:
        return run()
    except BaseException as exc:
        if bench.result:
            print("\nthe bench stopped early; what it measured so far:", file=bench.out)
            report_so_far(bench.result)
        if isinstance(exc, SandboxError):  # a host that did not come up: its name and log, no traceback
            raise SystemExit(f"the sandbox could not start: {exc}") from None
        raise
    finally:
        bench.cleanup()
        print(stopped, file=bench.out)


def print_json(result: dict[str, Any]) -> None:
    """--json: the result as one JSON document on stdout."""
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")
