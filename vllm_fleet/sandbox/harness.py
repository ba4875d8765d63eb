"""Sandbox hosts: real systemd + sshd Debian hosts booted with systemd-nspawn on this machine.

Each host of an inventory file boots from a shared, cached, read-only Debian bookworm base under an
overlay of its own, in its own cgroup and network namespace, wired by a veth into a bridge that holds
the subnet's .1 on the machine side. Only simulated GPUs (`sandbox_gpus` host data -> a fake
`nvidia-smi`) are not real. A test harness, not a security boundary: root inside is root outside.

Layout on disk (CACHE = ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}):
  CACHE/sandbox/base-bookworm-<hash>/      the base rootfs (built in a temp dir, renamed when complete)
  CACHE/sandbox/ssh/                        id_ed25519 (client key), hostkeys/<host>/, known_hosts
  CACHE/sandbox/state/<sandbox id>/<host>/  upper, work, root (overlay mount), nspawn.pid, nspawn.log
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.sandbox import nvidia_smi, package_mirror

SUITE = "bookworm"
BASE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "curl",
    "ca-certificates", "iproute2", "procps", "sudo", "libnuma1", "nginx",
)  # fmt: skip
# Debian packages this machine needs, by the command that proves each is there.
MACHINE_PACKAGES = {"debootstrap": "debootstrap", "systemd-nspawn": "systemd-container", "ip": "iproute2"}
PREFIX = "vfsbx"  # every name the sandbox creates (netns, links, cgroups, mounts) starts with it
GPU_LAYOUT_PATH = "etc/vllm-fleet-sim/gpus.json"
LOGIN_SUDOERS = "vllm-fleet-login"  # /etc/sudoers.d/ file granting the login user password-less sudo
STOP_TIMEOUT_S = 20.0
READY_TIMEOUT_S = 120.0


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
        bus_ids = [g["pci_bus_id"] for g in host.gpus or () if "pci_bus_id" in g]
        if bus_ids != sorted(bus_ids):
            raise SandboxError(f"{host.name}: sandbox_gpus must be listed in ascending pci_bus_id order")


# --- the machine ------------------------------------------------------------------------------


def require_root() -> None:
    """Namespaces, mounts, cgroups and nspawn all need root."""
    if os.geteuid() != 0:
        raise SandboxError("not root: run the sandbox as root (it creates namespaces, mounts and cgroups)")


def check_machine(install: bool = True) -> None:
    """Root and the Debian packages the sandbox needs; installs missing ones with apt-get."""
    require_root()
    missing = sorted({pkg for cmd, pkg in MACHINE_PACKAGES.items() if not shutil.which(cmd)})
    if missing and install and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        _run("apt-get", "update", "-q", env=env, check=False)
        _run("apt-get", "install", "-y", "-q", *missing, env=env, check=False)
        missing = sorted({pkg for cmd, pkg in MACHINE_PACKAGES.items() if not shutil.which(cmd)})
    if missing:
        raise SandboxError(f"missing on this machine: apt-get install {' '.join(missing)}")


def debian_mirror() -> str:
    """The Debian mirror apt uses on this machine (often the only one reachable)."""
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for source in sources:
        text = source.read_text() if source.is_file() else ""
        # deb822 ("URIs: http://...") and one-line ("deb http://... bookworm main") styles.
        for uri in re.findall(r"^(?:URIs:|deb)\s+(?:\[[^\]]*\]\s+)?(\S+)", text, flags=re.M):
            if uri.rstrip("/").endswith("/debian"):
                return uri
    return "http://deb.debian.org/debian"


def base_dir() -> Path:
    """Where the base for the current package list lives; the hash changes when the list does."""
    return cache_dir() / "sandbox" / f"base-{SUITE}-{_short_hash(' '.join(BASE_PACKAGES), 12)}"


def ensure_base(log=print) -> Path:
    """The cached base rootfs, built first if absent. Built aside, renamed when complete."""
    base = base_dir()
    if base.is_dir():
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{base.name}.", dir=base.parent))
    mirror = debian_mirror()
    log(f"building the {SUITE} base from {mirror} (once; cached in {base}) ...")
    try:
        proc = _run(
            "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            SUITE, str(tmp), mirror, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-15:])
            raise SandboxError(f"debootstrap failed; is {mirror} reachable?\n{tail}")
        _finish_base(tmp)
        try:
            tmp.rename(base)
        except OSError:
            if not base.is_dir():  # else another run finished the same base first: use that one
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return base


def _finish_base(root: Path) -> None:
    """What all hosts share: no host keys or machine id of their own, sshd by key only, no DNS."""
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()  # each host gets its own, generated by the harness so known_hosts is known first
    (root / "etc/ssh/sshd_config.d/vllm-fleet-sandbox.conf").write_text(
        "HostKey /etc/ssh/ssh_host_ed25519_key\nPasswordAuthentication no\nUseDNS no\n"
    )
    # The machine's resolver would make getfqdn() hang (no route out): resolve nothing instead.
    resolv = root / "etc/resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.write_text("nameserver 127.0.0.1\n")
    (root / "etc/machine-id").write_text("")
    (root / "etc/fstab").write_text("")
    for deb in (root / "var/cache/apt/archives").glob("*.deb"):
        deb.unlink()


# --- keys -------------------------------------------------------------------------------------


def _keygen(path: Path, comment: str) -> None:
    """An ed25519 keypair at path (0600) unless one is there."""
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path))
    path.chmod(0o600)


def host_key_path(host: SandboxHost) -> Path:
    return host.known_hosts.parent / "hostkeys" / host.name / "ssh_host_ed25519_key"


def ensure_keys(sandbox: Sandbox) -> None:
    """Client key, one host key per host, and the known_hosts file listing them (strict checking).

    Entries of other sandboxes sharing the known_hosts file are kept; this sandbox's are replaced.
    """
    entries: dict[Path, list[str]] = {}
    for host in sandbox.hosts:
        _keygen(host.ssh_key, "vllm-fleet-sandbox")
        _keygen(host_key_path(host), f"root@{host.name}")
        pub = Path(f"{host_key_path(host)}.pub").read_text().split()
        entries.setdefault(host.known_hosts, []).append(f"{host.address},{host.name} {pub[0]} {pub[1]}")
    ours = {n for h in sandbox.hosts for n in (h.name, h.address)}
    for path, lines in entries.items():
        old = path.read_text().splitlines() if path.exists() else []
        kept = [line for line in old if line.strip() and not set(line.split()[0].split(",")) & ours]
        path.write_text("\n".join(kept + lines) + "\n")
        path.chmod(0o600)


# --- one host ---------------------------------------------------------------------------------


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


def _write_file(root: Path, upper: Path, rel: str, content: str | bytes, mode: int = 0o644) -> None:
    """Write rel into the overlay's upper dir; new parent dirs copy the base's owner and mode
    (an upper dir's attributes replace the base's: /root must stay 0700)."""
    target = upper / rel
    for parent in reversed(Path(rel).parents[:-1]):
        up, low = upper / parent, root / parent
        if not up.exists():
            up.mkdir()
            if low.is_dir():
                st = low.stat()
                os.chown(up, st.st_uid, st.st_gid)
                up.chmod(st.st_mode & 0o7777)
    if isinstance(content, str):
        content = content.encode()
    target.write_bytes(content)
    target.chmod(mode)


def _prepare_upper(sandbox: Sandbox, host: SandboxHost, base: Path, upper: Path) -> None:
    """The files that make a host itself: name, machine id, hosts, SSH keys, simulated GPUs."""
    files = {
        "etc/hostname": (f"{host.name}\n", 0o644),
        "etc/machine-id": (hashlib.md5(f"{sandbox.id}/{host.name}".encode()).hexdigest() + "\n", 0o444),
        "etc/hosts": (
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            + "".join(f"{h.address}\t{h.name}\n" for h in sandbox.hosts),
            0o644,
        ),
        "etc/ssh/ssh_host_ed25519_key": (host_key_path(host).read_text(), 0o600),
        "etc/ssh/ssh_host_ed25519_key.pub": (Path(f"{host_key_path(host)}.pub").read_text(), 0o644),
        "root/.ssh/authorized_keys": (Path(f"{host.ssh_key}.pub").read_text(), 0o600),
        "etc/apt/sources.list": (package_mirror.sources_list(SUITE), 0o644),
    }
    if host.gpus:
        files["usr/local/bin/nvidia-smi"] = (Path(nvidia_smi.__file__).read_text(), 0o755)
        files[GPU_LAYOUT_PATH] = (json.dumps(list(host.gpus), indent=2) + "\n", 0o644)
    for rel, (content, mode) in files.items():
        _write_file(base, upper, rel, content, mode)
    (upper / "root/.ssh").chmod(0o700)


def _ensure_bridge(sandbox: Sandbox) -> None:
    if _run("ip", "link", "show", sandbox.bridge, check=False).returncode == 0:
        return
    _run("ip", "link", "add", sandbox.bridge, "type", "bridge")
    _run("ip", "addr", "add", f"{sandbox.gateway}/{sandbox.network.prefixlen}", "dev", sandbox.bridge)
    _run("ip", "link", "set", sandbox.bridge, "up")


def _setup_network(sandbox: Sandbox, host: SandboxHost) -> None:
    """Own netns with eth0 on the bridge at the host's address; deliberately no default route."""
    _run("ip", "netns", "add", host.netns)
    _run("ip", "link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p")
    _run("ip", "link", "set", f"{host.veth}p", "netns", host.netns)
    _run("ip", "link", "set", host.veth, "master", sandbox.bridge, "up")
    ns = ("ip", "-n", host.netns)
    _run(*ns, "link", "set", f"{host.veth}p", "name", "eth0")
    _run(*ns, "addr", "add", f"{host.address}/{sandbox.network.prefixlen}", "dev", "eth0")
    _run(*ns, "link", "set", "eth0", "up")
    _run(*ns, "link", "set", "lo", "up")


def _join_cgroups(dirs: list[Path]):
    """preexec_fn: move the about-to-exec nspawn into the host's own cgroups ("0" = this process)."""

    def join() -> None:
        for d in dirs:
            (d / "cgroup.procs").write_text("0")

    return join


def boot_host(sandbox: Sandbox, host: SandboxHost, base: Path, mirror: Path) -> int:
    """Mount the overlay, wire the network, start systemd-nspawn in its own cgroups; returns its PID.

    The package mirror is bind-mounted read-only: the host's only apt source (it has no route out)."""
    hdir = _host_dir(sandbox, host)
    upper, work, root = hdir / "upper", hdir / "work", hdir / "root"
    for d in (upper, work, root):
        d.mkdir(parents=True)
    upper.chmod(0o755)
    _prepare_upper(sandbox, host, base, upper)
    # nspawn cannot overlay "/" itself: mount it here; the source name makes it findable in /proc/mounts.
    _run(
        "mount", "-t", "overlay", f"{PREFIX}-{host.name}", "-o",
        f"lowerdir={base},upperdir={upper},workdir={work}", str(root),
    )  # fmt: skip
    _setup_network(sandbox, host)
    cgroups = _cgroup_dirs(host)
    for d in cgroups:
        d.mkdir(parents=True, exist_ok=True)
    log = open(hdir / "nspawn.log", "wb")
    proc = subprocess.Popen(
        [
            "systemd-nspawn", "--boot", "--quiet", "--register=no", "--keep-unit", "--console=passive",
            f"--network-namespace-path=/run/netns/{host.netns}", f"--directory={root}",
            f"--machine={host.name}", "--resolv-conf=off", "--timezone=off", "--link-journal=no",
            f"--bind-ro={mirror}:{package_mirror.MOUNT_POINT}",
        ],  # fmt: skip
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_join_cgroups(cgroups),
    )  # fmt: skip
    log.close()
    (hdir / "nspawn.pid").write_text(f"{proc.pid}\n")
    return proc.pid


def _is_nspawn(pid: int) -> bool:
    """True while pid is a live systemd-nspawn (guards against a recycled PID from a stale file)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return "(systemd-nspawn)" in stat and stat.rsplit(")", 1)[1].split()[0] != "Z"


def _reap(pid: int) -> None:
    """Collect the exit status if we are nspawn's parent (else a zombie lingers until we exit)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _nspawn_pids(host: SandboxHost) -> list[int]:
    """systemd-nspawn processes booting this host's machine name (finds ones a crash left behind)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _is_nspawn(int(proc.name)):
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"--machine={host.name}".encode() in argv:
                pids.append(int(proc.name))
    return pids


def _pid_of(sandbox: Sandbox, host: SandboxHost) -> int | None:
    """The recorded nspawn PID of a host, if that process still runs."""
    try:
        pid = int((_host_dir(sandbox, host) / "nspawn.pid").read_text())
    except (OSError, ValueError):
        return None
    return pid if _is_nspawn(pid) else None


def _signal(pid: int, sig: int) -> None:
    """Signal a process that may have exited meanwhile."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _stop_pids(pids: list[int], timeout: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM (nspawn asks the host's systemd for an orderly halt), SIGKILL what outlives timeout."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            _reap(pid)
        alive = [pid for pid in pids if _is_nspawn(pid)]
        if not alive:
            _wait_reaped(pids)
            return
        if time.monotonic() > deadline:
            for pid in alive:
                _signal(pid, signal.SIGKILL)
            time.sleep(0.5)
            for pid in alive:
                _reap(pid)
            _wait_reaped(pids)
            return
        time.sleep(0.1)


def _wait_reaped(pids: list[int], timeout: float = 5.0) -> None:
    """Wait until exited nspawns are reaped: when `up` ran in another process, PID 1 (their parent
    now) collects them, and until then they still show in `pgrep systemd-nspawn` as zombies."""
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{pid}").exists() for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _remove_cgroup(path: Path) -> None:
    """rmdir a cgroup tree bottom-up (systemd inside may leave empty child groups behind)."""
    if not path.is_dir():
        return
    for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        child.rmdir()
    path.rmdir()


def _kill_leftovers(host: SandboxHost, timeout: float = 10.0) -> None:
    """SIGKILL every process still in the host's cgroups, until none is left. A systemd-nspawn killed
    after its halt timed out leaves the container's init behind (reparented to PID 1) with all it
    runs (a vLLM that was restarting): those are this host's processes, found by its own cgroup."""
    deadline = time.monotonic() + timeout
    while True:
        pids: set[int] = set()
        for top in _cgroup_dirs(host):
            for procs in (top.rglob("cgroup.procs") if top.is_dir() else ()):
                try:
                    pids.update(int(p) for p in procs.read_text().split())
                except (OSError, ValueError):
                    continue
        if not pids or time.monotonic() > deadline:
            return
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        time.sleep(0.1)


def _remove_host(sandbox: Sandbox, host: SandboxHost) -> None:
    """Everything of a stopped host, by name: what is left of its processes, overlay mount, netns
    (takes its veth), cgroups, state."""
    _kill_leftovers(host)
    root = _host_dir(sandbox, host) / "root"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    if str(root) in mounts:
        _run("umount", str(root))
    if _run("ip", "netns", "pids", host.netns, check=False).returncode == 0:
        _run("ip", "netns", "del", host.netns)
    # Deleting the netns destroys the veth pair, but asynchronously: delete it if it is still there.
    _run("ip", "link", "del", host.veth, check=False)
    for cgroup in _cgroup_dirs(host):
        _remove_cgroup(cgroup)
    # rm (C) is about twice as fast as shutil.rmtree on an environment's tree. Neither may go through
    # a mount left behind (it would delete what the mount shows): such a host is reported instead.
    where = str(_host_dir(sandbox, host))
    mounted = [m for m in (line.split()[1] for line in Path("/proc/mounts").read_text().splitlines())
               if m == where or m.startswith(where + "/")]
    if mounted:
        raise SandboxError(f"still mounted, not removed: {', '.join(mounted)}")
    _run("rm", "-rf", "--one-file-system", "--", where, check=False)
    shutil.rmtree(where, ignore_errors=True)


def _remove_bridge(sandbox: Sandbox) -> None:
    if _run("ip", "link", "show", sandbox.bridge, check=False).returncode == 0:
        _run("ip", "link", "del", sandbox.bridge)


def _remove_parent_cgroups() -> None:
    """The shared vfsbx cgroup parents, once no host of any sandbox uses them."""
    for line in Path("/proc/mounts").read_text().splitlines():
        mountpoint, fstype = line.split()[1:3]
        parent = Path(mountpoint) / PREFIX
        if fstype in ("cgroup", "cgroup2") and parent.is_dir():
            if not any(p.is_dir() for p in parent.iterdir()):
                parent.rmdir()


# --- probing ----------------------------------------------------------------------------------

# One SSH round trip answers everything a status line shows; sections split by marker lines.
_PROBE = (
    "systemctl is-system-running {wait}; echo @@failed; systemctl --failed --plain --no-legend; "
    "echo @@gpus; if command -v nvidia-smi >/dev/null; then nvidia-smi -L; fi"
)


def probe(sandbox: Sandbox, host: SandboxHost, wait: bool = False) -> HostStatus:
    """Ask a host over SSH for its systemd state, failed units and (simulated) GPUs."""
    status = HostStatus(host.name, host.address, list(host.groups), False, "", pid=_pid_of(sandbox, host))
    if status.pid is None:
        status.state = "not running"
        return status
    try:
        proc = sandbox.run(host, _PROBE.format(wait="--wait" if wait else ""), timeout=READY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        status.state = "ssh timed out"
        return status
    if proc.returncode == 255 or "@@gpus" not in proc.stdout:
        status.state = f"ssh failed: {proc.stderr.strip() or proc.returncode}"
        return status
    state, rest = proc.stdout.split("@@failed\n", 1)
    failed, gpus = rest.split("@@gpus\n", 1)
    status.running = True
    status.state = state.strip().splitlines()[-1] if state.strip() else "unknown"
    status.failed_units = [line.split()[0] for line in failed.splitlines() if line.strip()]
    status.gpus = [line for line in gpus.splitlines() if line.strip()]
    return status


def _wait_ssh(sandbox: Sandbox, host: SandboxHost, deadline: float) -> None:
    """Poll until sshd takes the key (connection refused until it listens)."""
    while True:
        proc = sandbox.run(host, "true", timeout=10)
        if proc.returncode == 0:
            return
        if time.monotonic() > deadline:
            log = (_host_dir(sandbox, host) / "nspawn.log").read_text(errors="replace")[-2000:]
            raise SandboxError(
                f"{host.name}: no SSH after {READY_TIMEOUT_S:.0f} s: {proc.stderr.strip()}\nnspawn log:\n{log}"
            )
        time.sleep(0.2)


def login_user_command(user: str, sudo: bool = True) -> str:
    """Create the inventory's login user as production has one: its own home and SSH key, and
    password-less sudo (or, with sudo=False, none: what a host whose admin forgot looks like)."""
    sudoers = f"/etc/sudoers.d/{LOGIN_SUDOERS}"
    grant = (f"printf '%s\\n' {shlex.quote(f'{user} ALL=(ALL:ALL) NOPASSWD: ALL')} > {sudoers} && "
             f"chmod 0440 {sudoers} && visudo -cqf {sudoers}") if sudo else f"rm -f {sudoers}"
    home = f"/home/{user}"
    return (f"id -u {user} >/dev/null 2>&1 || useradd -m -s /bin/bash {user}; "
            f"install -d -m 0700 -o {user} -g {user} {home}/.ssh && "
            f"install -m 0600 -o {user} -g {user} /root/.ssh/authorized_keys {home}/.ssh/authorized_keys && "
            f"{grant}")


def _create_login_user(sandbox: Sandbox, host: SandboxHost) -> None:
    if host.login_user == "root":
        return
    proc = sandbox.run(host, login_user_command(host.login_user), timeout=60)
    if proc.returncode != 0:
        raise SandboxError(f"{host.name}: could not create the login user {host.login_user}: "
                           f"{proc.stderr.strip()}")


# --- the sandbox --------------------------------------------------------------------------------


def prepare_machine(log=print) -> tuple[Path, Path]:
    """What booting needs and the cache keeps: this machine's packages, the base rootfs and the hosts'
    apt mirror, built when missing. Boots nothing, so it can run while other work does."""
    check_machine()
    base = ensure_base(log)
    return base, package_mirror.ensure_mirror(cache_dir(), base, SUITE, debian_mirror(), _run, log)


def up(sandbox: Sandbox, log=print) -> list[HostStatus]:
    """Clean up leftovers, build the base if needed, boot every host, wait until SSH answers."""
    check_machine()
    down(sandbox)  # a crashed run leaves hosts, netns, mounts behind: start from nothing
    base, mirror = prepare_machine(log)
    ensure_keys(sandbox)
    _ensure_bridge(sandbox)
    try:
        for host in sandbox.hosts:
            boot_host(sandbox, host, base, mirror)
        deadline = time.monotonic() + READY_TIMEOUT_S
        with ThreadPoolExecutor(len(sandbox.hosts)) as pool:
            list(pool.map(lambda h: _wait_ssh(sandbox, h, deadline), sandbox.hosts))
            list(pool.map(lambda h: _create_login_user(sandbox, h), sandbox.hosts))
            return list(pool.map(lambda h: probe(sandbox, h, wait=True), sandbox.hosts))
    except BaseException:
        down(sandbox)  # never leave half a sandbox running (also on KeyboardInterrupt)
        raise


def status(sandbox: Sandbox) -> list[HostStatus]:
    """Each host's state, changing nothing."""
    with ThreadPoolExecutor(len(sandbox.hosts)) as pool:
        return list(pool.map(lambda h: probe(sandbox, h), sandbox.hosts))


def down(sandbox: Sandbox) -> None:
    """Stop every host (orderly halt, SIGKILL after a timeout) and remove all the sandbox made."""
    pids = set()
    for host in sandbox.hosts:
        pid = _pid_of(sandbox, host)
        pids.update([pid] if pid else [])
        pids.update(_nspawn_pids(host))
    _stop_pids(sorted(pids))
    # At once: removing a host's files (its environments: tens of thousands of files each) is most
    # of the time down() takes, and the hosts' trees are apart. One host that cannot be removed does
    # not keep the others (or the bridge) behind; it is reported once everything else is gone.
    def remove(host: SandboxHost) -> str | None:
        try:
            _remove_host(sandbox, host)
        except (OSError, SandboxError) as exc:
            return f"{host.name}: {exc}"
        return None

    with ThreadPoolExecutor(max_workers=max(1, len(sandbox.hosts))) as pool:
        failed = [why for why in pool.map(remove, sandbox.hosts) if why]
    _remove_bridge(sandbox)
    _remove_parent_cgroups()
    if failed:
        raise SandboxError("could not remove every sandbox host: " + "; ".join(failed))
    shutil.rmtree(sandbox.state_dir, ignore_errors=True)


def host_pss_kib(sandbox: Sandbox, host: SandboxHost) -> int:
    """Memory of a host: PSS summed over every process in its cgroup (the container has no memory
    controller of its own on cgroup-v1 hybrids, so MemoryCurrent is not available)."""
    systemd_dirs = [d for d in _cgroup_dirs(host) if d.parts[-3] == "systemd"] or _cgroup_dirs(host)[:1]
    pids: set[int] = set()
    for procs in systemd_dirs[0].rglob("cgroup.procs"):
        pids.update(int(p) for p in procs.read_text().split())
    total = 0
    for pid in pids:
        try:
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        except OSError:
            continue  # exited meanwhile
        total += sum(int(line.split()[1]) for line in rollup.splitlines() if line.startswith("Pss:"))
    return total
