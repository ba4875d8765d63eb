"""Stopping sandbox hosts and removing all they left: nspawn processes (by PID file and by machine
name, so a crash's leftovers are found), what still runs in a host's cgroups, its overlay mount,
network namespace, veth, cgroups and state; then the bridge and the shared cgroup parents.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

from vllm_fleet.sandbox.hosts import PREFIX, Sandbox, SandboxError, SandboxHost, _cgroup_dirs, _host_dir, _run


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


def _nspawn_pids(*hosts: SandboxHost) -> list[int]:
    """systemd-nspawn processes booting these hosts' machine names (finds ones a crash left behind);
    /proc is read once for all of them."""
    machines = {f"--machine={host.name}".encode() for host in hosts}
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and _is_nspawn(int(proc.name)):
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if machines.intersection(argv):
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


def _stop_pids(pids: list[int]) -> None:
    """SIGKILL the hosts' nspawns, no orderly halt: their disks are deleted next, and a halt would
    only wait out each unit's stop timeout (a vLLM draining its requests: up to 20 s a down). What
    ran inside is reparented and killed by its cgroup (_kill_leftovers)."""
    for pid in pids:
        _signal(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while any(_is_nspawn(pid) for pid in pids) and time.monotonic() < deadline:
        for pid in pids:
            _reap(pid)
        time.sleep(0.05)
    for pid in pids:
        _reap(pid)
    _wait_reaped(pids)


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
    """SIGKILL every process still in the host's cgroups, until none is left. A killed systemd-nspawn
    leaves the container's init behind (reparented to PID 1) with all it runs (a vLLM that was
    restarting): those are this host's processes, found by its own cgroup."""
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


def leftovers(sandbox: Sandbox) -> list[str]:
    """What of the sandbox is still on this machine, each named (empty after a complete `down`):
    nspawn processes of its hosts, processes in their cgroups, their network namespaces, veths,
    overlay mounts and cgroups, its bridge and its state directory."""
    found = [f"systemd-nspawn process {pid}" for pid in _nspawn_pids(*sandbox.hosts)]
    netns = set(_run("ip", "netns", "list", check=False).stdout.split())
    links = _run("ip", "-o", "link", "show", check=False).stdout
    link_names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines() if ":" in line}
    mounts = [line.split()[:2] for line in Path("/proc/mounts").read_text().splitlines()]
    state = str(sandbox.state_dir)
    for host in sandbox.hosts:
        found += [f"{host.name}: network namespace {host.netns}"] if host.netns in netns else []
        found += [f"{host.name}: veth {host.veth}"] if host.veth in link_names else []
        for cgroup in _cgroup_dirs(host):
            if cgroup.is_dir():
                procs = [p for f in cgroup.rglob("cgroup.procs") for p in f.read_text().split()]
                found.append(f"{host.name}: cgroup {cgroup}" + (f" with processes {', '.join(procs)}" if procs else ""))
    found += [f"{'overlay ' if source.startswith(f'{PREFIX}-') else ''}mount {where}" for source, where in mounts
              if where.startswith(state + "/")]
    found += [f"bridge {sandbox.bridge}"] if sandbox.bridge in link_names else []
    found += [f"state directory {state}"] if sandbox.state_dir.exists() else []
    return found
