"""The sandbox's hosts as an inventory file describes them, and what every part of the harness
shares: the names it creates, where it keeps its state, how it runs a machine-side command.

CACHE/sandbox/state/<sandbox id>/<host>/ holds a host's upper, work, root (overlay mount),
nspawn.pid and nspawn.log (CACHE = ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}).
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "vfsbx"  # every name the sandbox creates (netns, links, cgroups, mounts) starts with it


class SandboxError(RuntimeError):
    """A problem the user must fix; the message says what to do."""


def cache_dir() -> Path:
    """Root of everything the sandbox keeps between runs (also read by inventory/sandbox.py)."""
    return Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet")


def _run(*argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Run a machine-side command, text output captured; raise with its stderr when it fails."""
    proc = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise SandboxError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def _short_hash(text: str, length: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


@dataclass(frozen=True)
class SandboxHost:
    """One inventory host as the sandbox boots it."""

    name: str
    address: str
    groups: tuple[str, ...]
    ssh_user: str  # the harness's own login: root (it boots, inspects and breaks hosts)
    login_user: str  # the inventory's ssh_user: what pyinfra and vllm-fleet log in as (sudo for root)
    ssh_key: Path
    known_hosts: Path
    gpus: tuple[dict, ...] | None  # simulated layout, None on hosts without (simulated) GPUs
    # `sandbox_disk_gib`: the host's writes go to a disk of this size of its own (a sparse ext4
    # image, loop-mounted), which it can fill without filling this machine's; None: no limit of its own
    disk_gib: int | None = None

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def veth(self) -> str:
        # Interface names are limited to 15 characters: hash the host name.
        return f"{PREFIX}{_short_hash(self.name)}"

    def ssh_argv(self, command: str, connect_timeout: int = 5) -> list[str]:
        """`ssh` to this host with the inventory's key and strict host key checking."""
        return [
            "ssh", "-i", str(self.ssh_key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null", "-o", f"ConnectTimeout={connect_timeout}",
            "-o", "LogLevel=ERROR", f"{self.ssh_user}@{self.address}", command,
        ]  # fmt: skip


@dataclass
class HostStatus:
    """What `up` and `status` report per host."""

    name: str
    address: str
    groups: list[str]
    running: bool
    state: str  # systemctl is-system-running, or why it could not be asked
    failed_units: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)  # `nvidia-smi -L` lines (simulated)
    pid: int | None = None


@dataclass
class Sandbox:
    """The hosts of one inventory file and where their state lives."""

    inventory: Path
    hosts: list[SandboxHost]

    @property
    def id(self) -> str:
        return _short_hash(str(self.inventory))

    @property
    def state_dir(self) -> Path:
        return cache_dir() / "sandbox" / "state" / self.id

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.id}"

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.ip_network(f"{self.hosts[0].address}/24", strict=False)

    @property
    def gateway(self) -> str:
        """The machine's address on the bridge: the subnet's .1."""
        return str(self.network.network_address + 1)

    @property
    def groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for host in self.hosts:
            for group in host.groups:
                groups.setdefault(group, []).append(host.name)
        return groups

    def host(self, name: str) -> SandboxHost:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(f"no sandbox host {name!r}; hosts: {[h.name for h in self.hosts]}")

    def run(self, host: str | SandboxHost, command: str, timeout: float = 120, check: bool = False):
        """Run a shell command on a host over SSH; returns the CompletedProcess (text)."""
        target = host if isinstance(host, SandboxHost) else self.host(host)
        return subprocess.run(
            target.ssh_argv(command), capture_output=True, text=True, timeout=timeout, check=check
        )


def load(inventory: str | Path) -> Sandbox:
    """Read the hosts with pyinfra's own inventory loader, so the sandbox boots what pyinfra targets."""
    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    path = Path(inventory).resolve()
    if not path.is_file():
        raise SandboxError(f"inventory {inventory} not found")
    with ctx_state.use(State(check_for_changes=False)):
        inv = make_inventory(str(path), cwd=str(path.parent.parent))
    hosts = []
    for host in inv:
        data = host.data
        if not data.get("ssh_hostname") or not data.get("ssh_key") or not data.get("ssh_known_hosts_file"):
            raise SandboxError(f"{path}: host {host.name} needs ssh_hostname, ssh_key and ssh_known_hosts_file")
        gpus = data.get("sandbox_gpus")
        hosts.append(
            SandboxHost(
                name=host.name,
                address=str(data.get("ssh_hostname")),
                groups=tuple(sorted(g for g in host.groups if g != path.stem)),
                ssh_user="root",
                login_user=data.get("ssh_user") or "root",
                ssh_key=Path(data.get("ssh_key")),
                known_hosts=Path(data.get("ssh_known_hosts_file")),
                gpus=tuple(gpus) if gpus else None,
                disk_gib=data.get("sandbox_disk_gib"),
            )
        )
    sandbox = Sandbox(inventory=path, hosts=hosts)
    _validate(sandbox)
    return sandbox


def _validate(sandbox: Sandbox) -> None:
    """One /24 for all hosts (the bridge takes .1), unique addresses, host names usable as hostnames."""
    if not sandbox.hosts:
        raise SandboxError(f"{sandbox.inventory}: no hosts")
    seen: set[str] = set()
    for host in sandbox.hosts:
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,40}", host.name):
            raise SandboxError(f"host name {host.name!r}: use lowercase letters, digits and '-' (max 41)")
        address = ipaddress.ip_address(host.address)
        if address not in sandbox.network or str(address) == sandbox.gateway or address in seen:
            raise SandboxError(
                f"{host.name}: address {address} must be unique, in {sandbox.network} and not {sandbox.gateway}"
            )
        seen.add(address)
        for gpu in host.gpus or ():
            missing = {"name", "memory_mib", "compute_capability"} - set(gpu)
            if missing:
                raise SandboxError(f"{host.name}: sandbox_gpus entry {gpu} lacks {sorted(missing)}")
        if host.disk_gib is not None and (type(host.disk_gib) is not int or not 1 <= host.disk_gib <= 64):
            raise SandboxError(f"{host.name}: sandbox_disk_gib must be a whole number of GiB from 1 to 64")
        bus_ids = [g["pci_bus_id"] for g in host.gpus or () if "pci_bus_id" in g]
        if bus_ids != sorted(bus_ids):
            raise SandboxError(f"{host.name}: sandbox_gpus must be listed in ascending pci_bus_id order")


def _host_dir(sandbox: Sandbox, host: SandboxHost) -> Path:
    return sandbox.state_dir / host.name


def _cgroup_dirs(host: SandboxHost) -> list[Path]:
    """The host's own cgroup in each hierarchy systemd inside needs: name=systemd, unified (v2), memory.

    Hosts started from one shared cgroup fight over system.slice, and services never start.
    """
    dirs = []
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mountpoint, fstype, options = line.split()[:4]
        opts = options.split(",")
        if fstype == "cgroup2" or (fstype == "cgroup" and ("name=systemd" in opts or "memory" in opts)):
            dirs.append(Path(mountpoint) / PREFIX / host.name)
    return dirs
