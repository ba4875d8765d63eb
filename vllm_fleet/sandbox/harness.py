"""Sandbox hosts: real systemd + sshd Debian hosts booted with systemd-nspawn on this machine.

Each host of an inventory file boots from a shared, cached, read-only Debian bookworm base under an
overlay of its own, in its own cgroup and network namespace, wired by a veth into a bridge that holds
the subnet's .1 on the machine side. Only simulated GPUs (`sandbox_gpus` host data -> a fake
`nvidia-smi`) are not real. A test harness, not a security boundary: root inside is root outside.

Layout on disk (CACHE = ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}):
  CACHE/sandbox/base-bookworm-<hash>/      the base rootfs (built in a temp dir, renamed when complete)
  CACHE/sandbox/ssh/                        id_ed25519 (client key), hostkeys/<host>/, known_hosts
  CACHE/sandbox/state/<sandbox id>/<host>/  upper, work, root (overlay mount), nspawn.pid, nspawn.log
  CACHE/sandbox/state/<sandbox id>/inotify-max-user-instances  the limit before `up` raised it

This module runs the sandbox (prepare_machine, up, status, down) from its parts: `hosts` (the
inventory's hosts, the names and state paths), `image` (this machine's packages, the base rootfs,
the SSH keys), `boot` (one host's files, network and nspawn; its SSH and login user) and `teardown`
(stopping hosts and removing what they left).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

from vllm_fleet.sandbox import package_mirror, session_lock
from vllm_fleet.sandbox.boot import (READY_TIMEOUT_S, _create_login_user, _ensure_bridge, _wait_ssh, boot_host,
                                     ensure_inotify_instances, restore_inotify_instances)
from vllm_fleet.sandbox.hosts import (HostStatus, Sandbox, SandboxError, SandboxHost, _cgroup_dirs, _run,
                                     cache_dir)
from vllm_fleet.sandbox.image import SUITE, check_machine, debian_mirror, ensure_base, ensure_keys
from vllm_fleet.sandbox.teardown import (EXIT_WAIT_S, _nspawn_pids, _pid_of, _remove_bridge, _remove_host,
                                         _remove_cgroup, _remove_parent_cgroups, _stop_pids, kill_and_wait,
                                         unmount_host)


# Hosts booted at once per CPU core (boot_waves): a wave's boots share the cores within one
# READY_TIMEOUT_S whatever the sandbox's size. Measured on 2 cores, 50 hosts are ready in 24 s in
# waves of 16, as fast as all at once: waves cost nothing at that size.
BOOT_WAVE_PER_CORE = 8

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

# --- the sandbox --------------------------------------------------------------------------------


def prepare_machine(log=print) -> tuple[Path, Path]:
    """What booting needs and the cache keeps: this machine's packages, the base rootfs and the hosts'
    apt mirror, built when missing. Boots nothing, so it can run while other work does."""
    check_machine()
    base = ensure_base(log)
    return base, package_mirror.ensure_mirror(cache_dir(), base, SUITE, debian_mirror(), _run, log)


def boot_waves(hosts: list[SandboxHost], per_core: int = BOOT_WAVE_PER_CORE) -> list[list[SandboxHost]]:
    """The hosts in the groups `up` boots one after the other: `per_core` hosts per CPU core at once,
    each wave given READY_TIMEOUT_S from its own start, so the deadline covers one wave's boots
    sharing the cores, whatever the sandbox's size."""
    size = max(1, per_core * (os.cpu_count() or 1))
    return [hosts[i:i + size] for i in range(0, len(hosts), size)]


def up(sandbox: Sandbox, log=print) -> list[HostStatus]:
    """Clean up leftovers, build the base if needed, boot the hosts in waves (boot_waves), each
    wave's SSH answering before the next starts; then the login users."""
    check_machine()
    session_lock.take([host.name for host in sandbox.hosts], log)  # until down(): hosts of these names
    stop = threading.Event()  # set on Ctrl-C or a failure: the other hosts' SSH waits end at once
    try:
        _tear_down(sandbox)  # a crashed run leaves hosts, netns, mounts behind: start from nothing
        base, mirror = prepare_machine(log)
        ensure_keys(sandbox)
        ensure_inotify_instances(sandbox, log)
        _ensure_bridge(sandbox, log)
        with ThreadPoolExecutor(len(sandbox.hosts)) as pool:
            try:
                waves = boot_waves(sandbox.hosts)
                for number, wave in enumerate(waves, start=1):
                    if len(waves) > 1:
                        log(f"booting hosts {wave[0].name}..{wave[-1].name} (wave {number} of {len(waves)})")
                    for host in wave:
                        boot_host(sandbox, host, base, mirror)
                    deadline = time.monotonic() + READY_TIMEOUT_S
                    list(pool.map(partial(_wait_ssh, sandbox, deadline=deadline, stop=stop), wave))
                list(pool.map(lambda h: _create_login_user(sandbox, h), sandbox.hosts))
                return list(pool.map(lambda h: probe(sandbox, h, wait=True), sandbox.hosts))
            except BaseException:
                stop.set()
                raise
    except BaseException:
        down(sandbox)  # never leave half a sandbox running (also on KeyboardInterrupt)
        raise


def status(sandbox: Sandbox) -> list[HostStatus]:
    """Each host's state, changing nothing."""
    with ThreadPoolExecutor(len(sandbox.hosts)) as pool:
        return list(pool.map(lambda h: probe(sandbox, h), sandbox.hosts))


def _each(function, hosts: list[SandboxHost]) -> list:
    """function(host) for every host at once; one after the other once the interpreter is exiting
    (down() registered with atexit runs after Python stopped starting new pool threads)."""
    try:
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            return list(pool.map(function, hosts))
    except RuntimeError as exc:
        if "interpreter shutdown" not in str(exc):
            raise
        return [function(host) for host in hosts]


def down(sandbox: Sandbox) -> None:
    """Stop every host (killed: teardown._stop_pids) and remove all the sandbox made; then give up
    the session lock up() took. Refused while another process's session holds it."""
    names = [host.name for host in sandbox.hosts]
    if not session_lock.held(names):  # (held: the release below is that up()'s)
        session_lock.take(names, wait=False)  # raises, naming that session, when another holds one
    try:
        _tear_down(sandbox)
    finally:
        session_lock.release(names)


def _tear_down(sandbox: Sandbox) -> None:
    pids = set(_nspawn_pids(*sandbox.hosts))
    for host in sandbox.hosts:
        pid = _pid_of(sandbox, host)
        pids.update([pid] if pid else [])
    _stop_pids(sorted(pids))
    # Every host's processes are killed and waited for (teardown.kill_and_wait: they die side by
    # side, within one EXIT_WAIT_S) before any host's files go: a removal's disk traffic would slow
    # the kernel's teardown of another host's processes. Then the hosts at once: removing a host's
    # files (its environments: tens of thousands of files each) is most of the time down() takes,
    # and the hosts' trees are apart. One host that cannot be removed does not keep the others (or
    # the bridge) behind; it is reported once everything else is gone.
    deadline = time.monotonic() + EXIT_WAIT_S

    def remove(host: SandboxHost) -> str | None:
        try:
            _remove_host(sandbox, host, deadline)
        except (OSError, SandboxError) as exc:
            return f"{host.name}: {exc}"
        return None

    _each(lambda host: kill_and_wait(host, deadline), sandbox.hosts)
    failed = [why for why in _each(remove, sandbox.hosts) if why]
    _remove_bridge(sandbox)
    _remove_parent_cgroups()
    restore_inotify_instances(sandbox)
    if failed:
        raise SandboxError("could not remove every sandbox host: " + "; ".join(failed))
    shutil.rmtree(sandbox.state_dir, ignore_errors=True)


def power_off(sandbox: Sandbox, host: SandboxHost) -> float:
    """Pull one host's plug: its nspawn and everything in its cgroups killed at once (no orderly
    halt: nothing inside gets to say goodbye, keepalived included), its network gone with its
    namespace (a dead machine's addresses answer nothing: no ARP, no RST). Its disk (the overlay's
    upper dir) stays, as a server's does: power_on boots it again from there. Returns the moment
    (time.monotonic()) its link was gone: what a drill counts the requests in flight at."""
    # The cable first: killed with their network still there, the host's processes would have
    # their kernel close every connection (FIN, RST) as a crash does; a machine losing power tells
    # its peers nothing.
    _run("ip", "link", "del", host.veth, check=False)
    cut_at = time.monotonic()
    pids = set(_nspawn_pids(host))
    pid = _pid_of(sandbox, host)
    pids.update([pid] if pid else [])
    _stop_pids(sorted(pids))
    deadline = time.monotonic() + EXIT_WAIT_S
    left = kill_and_wait(host, deadline)
    if left:
        raise SandboxError(f"{host.name}: processes still running {EXIT_WAIT_S:.0f} s after its power-off")
    if _run("ip", "netns", "pids", host.netns, check=False).returncode == 0:
        _run("ip", "netns", "del", host.netns)
    unmount_host(sandbox, host)
    for cgroup in _cgroup_dirs(host):
        _remove_cgroup(cgroup, deadline)
    return cut_at


def power_on(sandbox: Sandbox, host: SandboxHost, log=print) -> HostStatus:
    """Boot a host power_off stopped, from its own disk, and wait for its SSH: its units start as
    they would on a server switched back on (what is enabled comes up, nothing else is done)."""
    if _pid_of(sandbox, host) is not None:
        raise SandboxError(f"{host.name} is running: power it off first")
    base, mirror = prepare_machine(log)
    boot_host(sandbox, host, base, mirror)
    _wait_ssh(sandbox, host, deadline=time.monotonic() + READY_TIMEOUT_S)
    return probe(sandbox, host)


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
