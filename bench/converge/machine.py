"""The machine side of the converge bench: one run's state (the sandbox and its hosts, a temp dir,
the API key, the relays), the tools run as processes (deploy.py and the render with pyinfra, the
playbook with ansible-playbook), the hosts' state checked after every run, the inventories written
for each tool, and the A B A B alternation of two tools. Everything it starts is stopped by
Bench.cleanup()."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from benchlib import REPO, SANDBOX_INVENTORY, Relay, cpu_sandbox, inventory_dir, run_measured
from converge.inventories import (ansible_host_vars, ansible_inventory, fleet_inventory_source, known_hosts_line,
                                  pyinfra_inventory_source, rendered_src, ssh_vars)
from converge.report import fmt_summary, ratio, summary, usage_summary
from converge.settings import (ANSIBLE_DIR, ANSIBLE_REQUIREMENT, DRIFT_LINE, DRIFT_ROLE, PLAYBOOK, RENDER_DEPLOY,
                               TOOL_NAMES)
from converge.tool_output import phase_split, play_recap


class Bench:
    """State of one bench run; everything it starts is stopped by cleanup()."""

    def __init__(self, args: argparse.Namespace, out):
        from vllm_fleet.sandbox import harness, hosts

        self.args = args
        self.out = out
        self.harness = harness
        self.tmp = Path(tempfile.mkdtemp(prefix="vfcb-"))  # 0700; short: ssh control sockets live here
        if getattr(args, "engine", "vllm") == "vllm":  # rollout_bench's args: the real engine only
            self.base_inventory = SANDBOX_INVENTORY
            self.sandbox = cpu_sandbox()
        else:  # a fleet of its own: --hosts stand-in hosts on a subnet of their own
            self.base_inventory = inventory_dir(self.tmp, "fleet") / "sandbox.py"
            self.base_inventory.write_text(fleet_inventory_source(args.hosts))
            self.sandbox = hosts.load(self.base_inventory)
        self.hosts = {h.name: h for h in self.sandbox.hosts}
        self.host_names = [h.name for h in self.sandbox.hosts]
        self.api_key = "skbench" + secrets.token_hex(12)  # letters and digits: the same in any escaping
        self.env: dict[str, str] = {}
        self.relays: list[Relay] = []
        self.ansible_cmd: list[str] = []
        self.records: dict[str, dict[str, Any]] = {}
        self.baseline: dict[str, dict[str, Any]] = {}
        self.leaks: list[str] = []
        self.violations: list[str] = []
        self.control_dirs = 0
        self.last_usage: dict[str, float] = {}  # the CPU seconds and peak RSS of the last tool run
        self.result: dict[str, Any] | None = None

    def log(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    # --- tools ---

    def ensure_ansible(self) -> str:
        if self.args.ansible_playbook:
            self.ansible_cmd = [self.args.ansible_playbook]
        else:
            script = Path(sys.executable).parent / "ansible-playbook"
            if not script.exists():
                self.log(f"installing {ANSIBLE_REQUIREMENT} into {sys.prefix} ...")
                subprocess.run([sys.executable, "-m", "pip", "install", "-q", ANSIBLE_REQUIREMENT], check=True)
            # Through this Python, not the script's shebang (a moved venv's shebang may be stale).
            self.ansible_cmd = [sys.executable, str(script)]
        proc = subprocess.run([*self.ansible_cmd, "--version"], capture_output=True, text=True, check=True)
        m = re.search(r"core ([\d.]+\w*)", proc.stdout)
        return m.group(1) if m else proc.stdout.splitlines()[0]

    def ansible_env(self, control_dir: Path, ssh_verbosity: int = 0) -> dict[str, str]:
        home = self.tmp / "ansible-home"
        env = {k: v for k, v in self.env.items() if k != "VLLM_FLEET_API_KEY"}  # the playbook needs no key
        env.update(ANSIBLE_CONFIG=str(ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_HOME=str(home),
                   ANSIBLE_FORKS=str(self.ansible_forks()),
                   ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_SSH_CONTROL_PATH_DIR=str(control_dir),
                   ANSIBLE_SSH_VERBOSITY=str(ssh_verbosity), ANSIBLE_NOCOLOR="1", PYTHONUNBUFFERED="1")
        return env

    def ansible_forks(self) -> int:
        """As many hosts at once as pyinfra takes (its default parallel: CPUs x 20, at most the
        hosts), at least ansible.cfg's 10: neither tool waits on the other's smaller pool."""
        return max(10, min((os.cpu_count() or 1) * 20, len(self.host_names)))

    def check_output(self, label: str, text: str) -> None:
        if self.api_key in text:
            self.leaks.append(label)
            self.log(f"  WARNING: the API key appears in the output of {label}")

    def run_pyinfra(self, inventory: Path, label: str, debug: bool = False, deploy: Path | None = None,
                    extra: tuple[str, ...] = (), env: dict[str, str] | None = None,
                    runner: tuple[str, ...] = ()) -> tuple[float, str]:
        argv = [sys.executable, *runner, "-m", "pyinfra", "-y", *extra, *(["--debug"] if debug else []), str(inventory),
                str(deploy or "deploy.py")]
        proc = run_measured(argv, timeout=3600, cwd=REPO, env=env or self.env)
        self.last_usage = proc.usage()
        text = proc.stdout + proc.stderr
        self.check_output(label, text)
        if proc.returncode != 0:
            raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{text[-4000:]}")
        return proc.seconds, text

    def cprofile_pyinfra(self, inventory: Path, label: str, top: int = 15) -> list[dict[str, Any]]:
        """One no-op run under cProfile: the `top` functions by the time spent in them (their own,
        not their callees'), with their call counts and cumulative time."""
        import pstats

        out = self.tmp / "noop.prof"
        self.run_pyinfra(inventory, label, runner=("-m", "cProfile", "-o", str(out)))
        stats = pstats.Stats(str(out))
        rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
        return [{"function": f"{Path(path).name}:{line}({name})" if path != "~" else name,
                 "where": _short_path(path), "calls": calls, "own_s": own, "cumulative_s": cumulative}
                for (path, line, name), (_prim, calls, own, cumulative, _callers) in rows]

    def profile_pyinfra(self, inventory: Path, label: str) -> dict[str, Any]:
        """One no-op run with its output read as it comes: the wall time per phase (phase_split) and
        the CPU seconds the pyinfra process used on this machine (user + system)."""
        argv = [sys.executable, "-u", "-m", "pyinfra", "-y", str(inventory), "deploy.py"]
        before = os.times()
        start = time.monotonic()
        proc = subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True)
        lines = [(time.monotonic() - start, line) for line in proc.stdout]
        proc.wait(timeout=600)
        end = time.monotonic() - start
        after = os.times()
        text = "".join(line for _t, line in lines)
        self.check_output(label, text)
        if proc.returncode != 0:
            raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{text[-4000:]}")
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        return {"seconds": end, "cpu_s": cpu, "phases": phase_split(lines, end)}

    def run_ansible(self, inventory: Path, label: str, verbose: bool = False,
                    ssh_verbosity: int | None = None) -> tuple[float, str, int]:
        """One playbook run; its control masters are closed after it (by PID). (seconds, output,
        masters it left)."""
        self.control_dirs += 1
        control_dir = self.tmp / f"cp{self.control_dirs}"
        control_dir.mkdir(mode=0o700)
        argv = [*self.ansible_cmd, "-i", str(inventory), *(["-vvv"] if verbose else []), str(PLAYBOOK)]
        if ssh_verbosity is None:
            ssh_verbosity = 1 if verbose else 0
        env = self.ansible_env(control_dir, ssh_verbosity)
        try:
            proc = run_measured(argv, timeout=1800, cwd=REPO, env=env)
        finally:
            masters = close_masters(control_dir)
        seconds = proc.seconds
        self.last_usage = proc.usage()
        text = proc.stdout + proc.stderr
        self.check_output(label, text)
        recap = play_recap(text)
        if proc.returncode != 0 or any(r["failed"] or r["unreachable"] for r in recap.values()):
            raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{text[-4000:]}")
        return seconds, text, masters

    # --- hosts ---

    def host_state(self) -> dict[str, dict[str, Any]]:
        """Per host: sha256 of every managed file and MainPID of every unit (root, over direct SSH)."""
        def one(name: str) -> tuple[str, dict[str, Any]]:
            record = self.records[name]
            paths = [f["path"] for f in record["files"]]
            units = ansible_host_vars(record, self.tmp)["vf_units"]
            command = (f"sha256sum -- {' '.join(map(shlex.quote, paths))} 2>&1; echo @@pids; "
                       + "; ".join(f"echo {shlex.quote(u)} $(systemctl show -p MainPID --value {shlex.quote(u)})"
                                   for u in units))
            proc = self.sandbox.run(name, command, timeout=60)
            files_part, _, pids_part = proc.stdout.partition("@@pids\n")
            files = {}
            for line in files_part.splitlines():
                digest, _, path = line.partition("  ")
                if path:
                    files[path] = digest
            pids = dict(line.split(" ", 1) for line in pids_part.splitlines() if " " in line)
            return name, {"files": files, "pids": pids}
        with ThreadPoolExecutor(len(self.records)) as pool:
            return dict(pool.map(one, sorted(self.records)))

    def expected_files(self) -> dict[str, dict[str, str]]:
        return {name: {f["path"]: hashlib.sha256(f["content"].encode()).hexdigest() for f in rec["files"]}
                for name, rec in self.records.items()}

    def check_state(self, label: str) -> None:
        """The hosts as the baseline: every managed file as rendered, no unit restarted."""
        state = self.host_state()
        problems = []
        for name, now in state.items():
            base = self.baseline[name]
            changed = sorted(p for p in base["files"] if now["files"].get(p) != base["files"][p])
            restarted = sorted(u for u in base["pids"] if now["pids"].get(u) != base["pids"][u])
            if changed:
                problems.append(f"{name}: files differ: {', '.join(changed)}")
            if restarted:
                problems.append(f"{name}: restarted: {', '.join(restarted)}")
        if problems:
            text = f"{label}: hosts not as before the run: " + "; ".join(problems)
            self.violations.append(text)
            self.log(f"  WARNING: {text}")
            self.baseline = state  # report each change once

    def on_every_host(self, what: str, command_for: Callable[[str, dict[str, Any]], str], timeout: int = 60) -> None:
        """Run command_for(host, its render record) on every host at once; the first failure stops
        the bench, saying which host could not do `what`."""
        def one(name: str) -> None:
            proc = self.sandbox.run(name, command_for(name, self.records[name]), timeout=timeout)
            if proc.returncode != 0:
                raise SystemExit(f"{name}: could not {what}: {proc.stderr.strip()}")
        with ThreadPoolExecutor(len(self.records)) as pool:
            list(pool.map(one, sorted(self.records)))

    def inject_drift(self) -> None:
        def command(name: str, record: dict[str, Any]) -> str:
            path = next(f["path"] for f in record["files"] if f["role"] == DRIFT_ROLE)
            return f"printf %s {shlex.quote(DRIFT_LINE)} >> {shlex.quote(path)}"
        self.on_every_host(f"edit its {DRIFT_ROLE} file", command)

    def remove_services(self) -> None:
        """Before a first-converge run: the instances' and the front's units stopped, disabled and
        removed with their files, as on a host that has its environment and model but no service."""
        def command(name: str, record: dict[str, Any]) -> str:
            files = [f for f in record["files"] if f["role"].startswith(("instance-", "front-"))]
            units = sorted({f["unit_name"] for f in files if f["unit_name"]})
            return (f"systemctl disable --now --quiet {' '.join(map(shlex.quote, units))}; "
                    f"rm -f -- {' '.join(shlex.quote(f['path']) for f in files)} && systemctl daemon-reload")
        self.on_every_host("remove the services", command, timeout=120)

    def check_converged(self, label: str) -> None:
        """After a first-converge run: every managed file as rendered, every unit running; the
        hosts' state is then the baseline of the runs that follow."""
        state = self.host_state()
        expected = self.expected_files()
        problems = []
        for name, now in state.items():
            wrong = sorted(p for p, digest in expected[name].items() if now["files"].get(p) != digest)
            stopped = sorted(u for u, pid in now["pids"].items() if pid.strip() in ("", "0"))
            if wrong:
                problems.append(f"{name}: files not as rendered: {', '.join(wrong)}")
            if stopped:
                problems.append(f"{name}: not running: {', '.join(stopped)}")
        if problems:
            text = f"{label}: not converged: " + "; ".join(problems)
            self.violations.append(text)
            self.log(f"  WARNING: {text}")
        self.baseline = state

    # --- inventories ---

    def pyinfra_inventory(self, name: str, relays: dict[str, dict[str, Any]] | None = None,
                          instance_changes: dict[str, Any] | None = None) -> Path:
        path = inventory_dir(self.tmp, name) / "sandbox.py"  # the group's name: group_data/sandbox.py applies
        path.write_text(pyinfra_inventory_source(self.base_inventory, relays, instance_changes))
        return path

    def run_fleet_command(self, argv: list[str], label: str) -> tuple[float, str]:
        """One `vllm-fleet ...` run (this Python's), measured like the tools' runs; (seconds, stdout)."""
        proc = run_measured([sys.executable, "-m", "vllm_fleet.cli", *argv], timeout=3600, cwd=REPO, env=self.env)
        self.last_usage = proc.usage()
        self.check_output(label, proc.stdout + proc.stderr)
        if proc.returncode != 0:
            raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
        return proc.seconds, proc.stdout

    def endpoints(self, ports: dict[str, int] | None) -> dict[tuple[str, int], str]:
        if ports is None:
            return {(h.address, 22): n for n, h in self.hosts.items()}
        return {("127.0.0.1", port): n for n, port in ports.items()}

    def relay_known_hosts(self, ports: dict[str, int], tag: str) -> Path:
        from vllm_fleet.sandbox.image import host_key_path

        path = self.tmp / f"known_hosts-{tag}"
        lines = []
        for name, port in ports.items():
            public = Path(f"{host_key_path(self.hosts[name])}.pub").read_text()
            lines.append(known_hosts_line("127.0.0.1", port, public))
        path.write_text("".join(lines))
        path.chmod(0o600)
        return path

    def relay_inventory(self, relay: Relay, tag: str) -> tuple[Path, Path]:
        """A pyinfra inventory (inv-TAG) whose hosts are reached through `relay`, and the known_hosts
        file it checks their keys against (for the playbook's inventory too)."""
        known_hosts = self.relay_known_hosts(relay.ports, tag)
        inventory = self.pyinfra_inventory(f"inv-{tag}", {n: {"hostname": "127.0.0.1", "port": p,
                                                              "known_hosts": str(known_hosts)}
                                                          for n, p in relay.ports.items()})
        return inventory, known_hosts

    def ansible_inventory(self, name: str, ports: dict[str, int] | None = None,
                          known_hosts: Path | None = None) -> Path:
        hosts = {}
        for host_name, record in sorted(self.records.items()):
            h = self.hosts[host_name]
            address, port = (h.address, 22) if ports is None else ("127.0.0.1", ports[host_name])
            hosts[host_name] = {**ssh_vars(address, port, h.login_user, str(h.ssh_key),
                                           str(known_hosts or h.known_hosts)),
                                **ansible_host_vars(record, self.tmp / "files")}
        path = self.tmp / f"{name}.yml"
        path.write_text(json.dumps(ansible_inventory(hosts), indent=1))
        return path

    def render(self, inventory: Path, tag: str) -> dict[str, dict[str, Any]]:
        """Every file deploy.py manages on each host, rendered by vllm-fleet (a --dry pyinfra run)."""
        out = self.tmp / f"render-{tag}"
        out.mkdir(mode=0o700)
        self.run_pyinfra(inventory, f"render ({tag})", deploy=RENDER_DEPLOY, extra=("--dry",),
                         env=dict(self.env, VLLM_FLEET_BENCH_RENDER_DIR=str(out)))
        records = {}
        for name in self.host_names:
            path = out / f"{name}.json"
            if not path.exists():
                raise SystemExit(f"render ({tag}): nothing rendered for {name}")
            records[name] = json.loads(path.read_text())
        return records

    def write_rendered_files(self) -> None:
        for name, record in self.records.items():
            for f in record["files"]:
                target = rendered_src(self.tmp / "files", name, f["path"])
                target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(f["content"])

    # --- scenarios ---

    def alternate(self, label: str, ours: Callable[[], float], theirs: Callable[[], float],
                  before: Callable[[], None] | None = None,
                  check: Callable[[str], None] | None = None,
                  names: tuple[str, str] = ("ours", "ansible")) -> dict[str, Any]:
        """A B A B ...: --runs of each; each run checked afterwards (`check`, by default against the
        baseline: nothing changed). `names`: the two tools' keys in the result (the second is the
        reference the ratio divides by)."""
        times: dict[str, list[float]] = {name: [] for name in names}
        usage: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for i in range(self.args.runs):
            for tool, fn in zip(names, (ours, theirs), strict=True):
                if before:
                    before()
                self.last_usage = {}
                seconds = fn()
                times[tool].append(seconds)
                usage[tool].append(self.last_usage)
                (check or self.check_state)(f"{label}, {tool} run {i + 1}")
            self.log(f"  {label}: run {i + 1}/{self.args.runs}: "
                     + ", ".join(f"{TOOL_NAMES[t]} {times[t][-1]:.2f} s" for t in names))
        result = {tool: dict(summary(times[tool]), **usage_summary(usage[tool])) for tool in names}
        result["ratio"] = ratio(result[names[0]], result[names[1]])
        self.log(f"{label}: " + ", ".join(f"{TOOL_NAMES[t]} {fmt_summary(result[t])}" for t in names)
                 + f", {TOOL_NAMES[names[0]]}/{TOOL_NAMES[names[1]]} {result['ratio']:.2f}")
        return result

    def start_relay(self, rtt_ms: float) -> Relay:
        relay = Relay(rtt_ms, {n: (h.address, 22) for n, h in self.hosts.items()}, self.tmp)
        self.relays.append(relay)
        return relay

    def cleanup(self) -> None:
        for relay in self.relays:
            relay.stop()
        for d in sorted(self.tmp.glob("cp*")):
            close_masters(d)
        try:
            self.harness.down(self.sandbox)
            self.report_leftovers()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def report_leftovers(self) -> None:
        """Say what the sandbox's teardown left on this machine (teardown.leftovers), checked, not assumed."""
        from vllm_fleet.sandbox import teardown

        left = teardown.leftovers(self.sandbox)
        self.log(f"after the teardown of {len(self.sandbox.hosts)} hosts: " + (
            "no nspawn process, host process, network namespace, veth, mount, cgroup, bridge or state left"
            if not left else "LEFT BEHIND: " + "; ".join(left)))


def _short_path(path: str) -> str:
    """A profiled function's file, from its package on (vllm_fleet/..., pyinfra/..., gevent/...)."""
    for root in ("site-packages", "lib", REPO.name):  # the innermost first: a venv lies in the repository
        parts = Path(path).parts
        if root in parts:
            return "/".join(parts[len(parts) - parts[::-1].index(root):]) or path
    return path


def close_masters(control_dir: Path) -> int:
    """Close every ssh control master with a socket in control_dir: asks each for its PID (`ssh -O
    check`), tells it to exit (`-O exit`), and SIGTERMs that PID if it is still there after 5 s.
    Returns how many there were."""
    if not control_dir.is_dir():
        return 0
    count = 0
    for sock in sorted(control_dir.iterdir()):
        if not sock.is_socket():
            continue
        count += 1
        base = ["ssh", "-F", "/dev/null", "-o", f"ControlPath={sock}"]
        check = subprocess.run([*base, "-O", "check", "master"], capture_output=True, text=True, timeout=10)
        m = re.search(r"pid=(\d+)", check.stdout + check.stderr)
        subprocess.run([*base, "-O", "exit", "master"], capture_output=True, text=True, timeout=10)
        if m:
            pid = int(m.group(1))
            deadline = time.monotonic() + 5
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            if Path(f"/proc/{pid}").exists():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
    return count
