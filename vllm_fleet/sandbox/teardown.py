"""Stopping sandbox hosts and removing all they left: nspawn processes (by PID file and by machine
name, so a crash's leftovers are found), what still runs in a host's cgroups, its overlay mount,
network namespace, veth, cgroups and state; then the bridge and the shared cgroup parents.

A SIGKILLed process does not leave its cgroups at once: the kernel first tears it down (unmaps its
memory, closes its files) and only then unlinks it from its cgroups (cgroup_exit). Until then
rmdir fails with EBUSY. That teardown is work like any other: on a loaded machine it runs only in
its share of the cores, for seconds. So a host's cgroups are removed only once every thread in them
is gone (kill_and_wait), within EXIT_WAIT_S, and rmdir is retried on EBUSY within the same deadline
(kernels since 6.19 unlink an exited task only after its last context switch, a moment after it
stops being listed anywhere).
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import time
from pathlib import Path

from vllm_fleet.sandbox.hosts import PREFIX, Sandbox, SandboxError, SandboxHost, _cgroup_dirs, _host_dir, _run

# How long a stopped sandbox's processes get to leave their cgroups (all hosts together) before what
# is still there is reported as left behind. Measured on 2 cores: the demo's vLLM worker leaves 1.5 s
# after its SIGKILL with two CPU hogs running; a 6 GB, 17-thread process 13 s with 32 (each hog in a
# session of its own, as other users' jobs are scheduled). The bound is ten times the slowest: a
# process still there after it is stuck (uninterruptible sleep), not slow, and is named with its state.
EXIT_WAIT_S = 120.0
POLL_S = 0.05


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
    ran inside is reparented and killed by its cgroup (kill_and_wait)."""
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


def _threads(top: Path) -> set[int]:
    """Every thread in a cgroup and its children (IDs in this PID namespace): cgroup v1's `tasks`,
    v2's `cgroup.threads`. Not cgroup.procs: v2 leaves out a process whose main thread has exited
    while its other threads are still being torn down, and those keep the cgroup busy."""
    found: set[int] = set()
    for directory, _dirs, files in os.walk(top):  # a child removed meanwhile is skipped
        for name in ("tasks", "cgroup.threads"):
            if name in files:
                try:
                    found.update(int(tid) for tid in (Path(directory) / name).read_text().split())
                except (OSError, ValueError):
                    continue
    return found


def _populated(top: Path) -> bool:
    """The kernel's own word on a v2 cgroup: a task in it or below, listed or not (v1 has none)."""
    try:
        return "populated 1" in (top / "cgroup.events").read_text().splitlines()
    except OSError:
        return False


def _describe(tids: set[int]) -> str:
    """Threads as `ps` would name them: ID, command and state (D: uninterruptible sleep)."""
    named = []
    for tid in sorted(tids)[:10]:
        try:
            stat = Path(f"/proc/{tid}/stat").read_text()
            named.append(f"{tid} {stat[stat.index('(') + 1:stat.rindex(')')]} ({stat.rsplit(')', 1)[1].split()[0]})")
        except (OSError, ValueError):
            named.append(f"{tid} (exited)")
    return ", ".join(named) + (f" and {len(tids) - 10} more" if len(tids) > 10 else "")


def kill_and_wait(host: SandboxHost, deadline: float) -> set[int]:
    """SIGKILL everything in the host's cgroups, again until none of its threads is left and no
    cgroup says it is populated, or until the deadline; returns the threads still there (empty once
    rmdir can succeed). A killed systemd-nspawn leaves the container's init behind (reparented to
    PID 1) with all it runs: those are this host's processes, found by its own cgroups. Where cgroup
    v2 has `cgroup.kill`, it also catches what forks between a listing and the kill."""
    while True:
        tops = [top for top in _cgroup_dirs(host) if top.is_dir()]
        tids = set().union(*(_threads(top) for top in tops))
        if not tids and not any(_populated(top) for top in tops):
            return set()
        if time.monotonic() > deadline:
            return tids
        for top in tops:
            if (top / "cgroup.kill").exists():
                try:
                    (top / "cgroup.kill").write_text("1")
                except OSError:
                    pass  # removed meanwhile
        for tid in tids:
            _signal(tid, signal.SIGKILL)  # a thread's ID signals its whole process
        time.sleep(POLL_S)


def _remove_cgroup(path: Path, deadline: float) -> None:
    """rmdir a cgroup tree bottom-up (systemd inside may leave empty child groups behind), each retried
    on EBUSY until the deadline, then reported with what is still in it."""
    if not path.is_dir():
        return
    for child in sorted((Path(d) for d, _dirs, _files in os.walk(path)), key=lambda p: -len(p.parts)):
        while True:
            try:
                child.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                if time.monotonic() > deadline:
                    left = _threads(child)
                    raise SandboxError(
                        f"cgroup {child} still busy {EXIT_WAIT_S:.0f} s after its processes were killed"
                        + (f": {_describe(left)}" if left else " (no thread listed in it)")) from None
                time.sleep(POLL_S)


def unmount_host(sandbox: Sandbox, host: SandboxHost) -> None:
    """The host's overlay, then its own disk under it (sandbox_disk_gib; loop-mounted, its loop
    device freed with it)."""
    hdir = _host_dir(sandbox, host)
    for mount in (hdir / "root", hdir / "disk"):
        if str(mount) in [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]:
            _run("umount", str(mount))


def _remove_host(sandbox: Sandbox, host: SandboxHost, deadline: float) -> None:
    """Everything of a stopped host, by name: what is left of its processes (waited for until the
    deadline), overlay mount, netns (takes its veth), cgroups, state."""
    kill_and_wait(host, deadline)
    unmount_host(sandbox, host)
    if _run("ip", "netns", "pids", host.netns, check=False).returncode == 0:
        _run("ip", "netns", "del", host.netns)
    # Deleting the netns destroys the veth pair, but asynchronously: delete it if it is still there.
    _run("ip", "link", "del", host.veth, check=False)
    for cgroup in _cgroup_dirs(host):
        _remove_cgroup(cgroup, deadline)
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
                tids = _threads(cgroup)
                found.append(f"{host.name}: cgroup {cgroup}" + (f" with threads {_describe(tids)}" if tids else ""))
    found += [f"{'overlay ' if source.startswith(f'{PREFIX}-') else ''}mount {where}" for source, where in mounts
              if where.startswith(state + "/")]
    found += [f"bridge {sandbox.bridge}"] if sandbox.bridge in link_names else []
    found += [f"state directory {state}"] if sandbox.state_dir.exists() else []
    return found
