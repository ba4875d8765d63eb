"""Booting one sandbox host: its own files in an overlay over the base, its network namespace
wired by a veth into the sandbox's bridge, systemd-nspawn in cgroups of its own; then waiting for
its SSH and creating the inventory's login user.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shlex
import subprocess
import threading
import time
from pathlib import Path

from vllm_fleet.sandbox import nvidia_smi, package_mirror
from vllm_fleet.sandbox.hosts import PREFIX, Sandbox, SandboxError, SandboxHost, _cgroup_dirs, _host_dir, _run
from vllm_fleet.sandbox.image import SUITE, host_key_path
from vllm_fleet.sandbox.teardown import _pid_of

GPU_LAYOUT_PATH = "etc/vllm-fleet-sim/gpus.json"
LOGIN_SUDOERS = "vllm-fleet-login"  # /etc/sudoers.d/ file granting the login user password-less sudo
READY_TIMEOUT_S = 120.0


# Each booted host's systemd (PID 1, journald, logind, udev...) holds inotify instances, all counted
# against root's fs.inotify.max_user_instances: at the kernel's default (128) the 20th host's path
# units fail and its sshd never starts.
INOTIFY_INSTANCES_MEASURED = 7  # a booted host's, counted on 50 stand-in hosts
INOTIFY_INSTANCES_PER_HOST = INOTIFY_INSTANCES_MEASURED + 1  # what the limit is raised by: room to spare
INOTIFY_MARGIN = 32  # beyond the hosts and what is in use: the workstation's own new watchers
INOTIFY_LIMIT = Path("/proc/sys/fs/inotify/max_user_instances")
RAISED_LIMIT_FILE = "inotify-max-user-instances"  # in the sandbox's state dir: "<before> <raised to>"


def _inotify_instances_in_use() -> int:
    """inotify instances open on this machine (every process's, the hosts' included)."""
    count = 0
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            count += sum(1 for fd in fd_dir.iterdir() if os.readlink(fd) == "anon_inode:inotify")
        except OSError:
            continue  # exited meanwhile, or not ours to read
    return count


def ensure_inotify_instances(sandbox: Sandbox, log=print) -> None:
    """Raise fs.inotify.max_user_instances to what the sandbox's hosts need on top of what this
    machine uses (never lowered); the previous value is kept in the state dir and restored by
    restore_inotify_instances when the sandbox goes down."""
    limit = int(INOTIFY_LIMIT.read_text())
    needed = _inotify_instances_in_use() + INOTIFY_INSTANCES_PER_HOST * len(sandbox.hosts) + INOTIFY_MARGIN
    if needed <= limit:
        return
    sandbox.state_dir.mkdir(parents=True, exist_ok=True)
    (sandbox.state_dir / RAISED_LIMIT_FILE).write_text(f"{limit} {needed}\n")
    INOTIFY_LIMIT.write_text(f"{needed}\n")
    log(f"raised fs.inotify.max_user_instances from {limit} to {needed} for {len(sandbox.hosts)} hosts "
        f"(each host's systemd holds about {INOTIFY_INSTANCES_MEASURED}); restored when they go down")


def restore_inotify_instances(sandbox: Sandbox) -> None:
    """Lower the limit ensure_inotify_instances raised back toward its old value, once this
    sandbox's hosts are gone: never below what is in use then (another sandbox, of any cache, may
    still run), and not at all when someone else changed it since."""
    saved = sandbox.state_dir / RAISED_LIMIT_FILE
    if not saved.exists():
        return
    before, raised_to = (int(v) for v in saved.read_text().split())
    if int(INOTIFY_LIMIT.read_text()) == raised_to:
        INOTIFY_LIMIT.write_text(f"{max(before, _inotify_instances_in_use() + INOTIFY_MARGIN)}\n")
    saved.unlink()


# --- one host ---------------------------------------------------------------------------------


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


def _links_on_network(sandbox: Sandbox) -> list[str]:
    """The machine's links, other than this sandbox's bridge, holding an address in its network."""
    addrs = json.loads(_run("ip", "-j", "-4", "addr", "show").stdout or "[]")
    return [link["ifname"] for link in addrs if link["ifname"] != sandbox.bridge
            and any(ipaddress.ip_address(a["local"]) in sandbox.network for a in link.get("addr_info", ()))]


def _clear_network(sandbox: Sandbox, log=print) -> None:
    """Make this sandbox's bridge the only way to its network. Another link there would take the
    hosts' traffic (the older route wins), and every SSH wait would end in "No route to host": a
    sandbox of another inventory file or cache on the same /24 leaves its bridge behind when it is
    killed. Such a bridge with no host on it is removed; anything else is the user's to stop."""
    for link in _links_on_network(sandbox):
        ports = json.loads(_run("ip", "-j", "link", "show", "master", link, check=False).stdout or "[]")
        if link.startswith(PREFIX) and not ports:
            _run("ip", "link", "del", link)
            log(f"removed {link}, the bridge of a sandbox that was not taken down (no host on it): "
                f"it held {sandbox.network}, the network of {sandbox.inventory}'s hosts")
            continue
        users = f"a sandbox's bridge with {len(ports)} host(s) on it" if link.startswith(PREFIX) else "a link"
        raise SandboxError(
            f"{sandbox.network}, the network of {sandbox.inventory}'s hosts, is already on {link} ({users}): "
            f"this sandbox's hosts would be unreachable. Stop what uses it (another sandbox: `vllm-fleet "
            f"sandbox down` with its inventory and VLLM_FLEET_CACHE), or give these hosts another /24"
        )


def _ensure_bridge(sandbox: Sandbox, log=print) -> None:
    _clear_network(sandbox, log)
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
            # Root inside may change its own network namespace, as a server's root can: keepalived adds
            # and removes the gateways' floating address. nspawn keeps CAP_NET_ADMIN only with a network
            # it makes itself (--private-network), not with a namespace given by path.
            "--capability=CAP_NET_ADMIN",
        ],  # fmt: skip
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True, preexec_fn=_join_cgroups(cgroups),
    )  # fmt: skip
    log.close()
    (hdir / "nspawn.pid").write_text(f"{proc.pid}\n")
    return proc.pid


# --- ready for the deploy -----------------------------------------------------------------------


def _wait_ssh(sandbox: Sandbox, host: SandboxHost, deadline: float, stop: threading.Event | None = None) -> None:
    """Poll until sshd takes the key (connection refused until it listens), or `stop` is set (the
    boot was interrupted, or another host failed)."""
    while True:
        proc = sandbox.run(host, "true", timeout=10)
        if proc.returncode == 0:
            return
        if stop is not None and stop.is_set():
            raise SandboxError(f"{host.name}: no longer waited for (the sandbox's start was stopped)")
        if time.monotonic() > deadline:
            log = (_host_dir(sandbox, host) / "nspawn.log").read_text(errors="replace")[-2000:]
            route = _run("ip", "-o", "route", "get", host.address, check=False)
            raise SandboxError(
                f"{host.name}: no SSH after {READY_TIMEOUT_S:.0f} s: {proc.stderr.strip()}\n"
                f"its systemd-nspawn: {'running' if _pid_of(sandbox, host) else 'not running'}; "
                f"the route to {host.address}: {(route.stdout or route.stderr).strip()} "
                f"(this sandbox's bridge is {sandbox.bridge})\nnspawn log:\n{log}"
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
