"""The sandbox hosts are real: systemd running, sshd with checked host keys, a network between them,
simulated GPUs only where declared, and `down` leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_fleet.sandbox import harness, hosts, teardown

pytestmark = pytest.mark.sandbox

QUERY = "index,pci.bus_id,name,memory.total,memory.used,uuid,compute_cap"


def test_at_least_three_hosts_run_systemd(sandbox: hosts.Sandbox) -> None:
    assert len(sandbox.hosts) >= 3
    for host in sandbox.hosts:
        proc = sandbox.run(host, "systemctl is-system-running --wait")
        state = proc.stdout.strip()
        failed = sandbox.run(host, "systemctl --failed --no-pager").stdout
        assert state == "running", f"{host.name}: {state!r} {proc.stderr}\nfailed units:\n{failed}"


def test_ssh_checks_host_keys(sandbox: hosts.Sandbox, tmp_path: Path) -> None:
    """With strict checking and a known_hosts file that does not know the host, ssh refuses."""
    host = sandbox.hosts[0]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = host.ssh_argv("true")
    argv[argv.index(f"UserKnownHostsFile={host.known_hosts}")] = f"UserKnownHostsFile={empty}"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 255 and "Host key verification failed" in proc.stderr, proc.stderr


def test_mixed_host_lists_three_gpus_in_pci_order(sandbox: hosts.Sandbox) -> None:
    host = sandbox.host("sbx-mixed")
    proc = sandbox.run(host, f"nvidia-smi --query-gpu={QUERY} --format=csv,noheader,nounits", check=True)
    rows = [line.split(", ") for line in proc.stdout.splitlines()]
    assert [(r[0], r[2], r[3], r[4], r[6]) for r in rows] == [
        ("0", "NVIDIA GeForce RTX 4090 D", "24564", "0", "8.9"),
        ("1", "NVIDIA A100-SXM4-40GB", "40960", "0", "8.0"),
        ("2", "NVIDIA A100-SXM4-40GB", "40960", "0", "8.0"),
    ]
    bus_ids = [r[1] for r in rows]
    assert bus_ids == sorted(bus_ids) and len(set(bus_ids)) == 3
    assert all(r[5].startswith("GPU-sim-") for r in rows), "simulated GPUs are labelled in their UUID"
    assert "SIMULATED" in proc.stderr


def test_gpu_hosts_report_their_declared_layout(sandbox: hosts.Sandbox) -> None:
    for name in sandbox.groups["gpu_sim_hosts"]:
        host = sandbox.host(name)
        lines = sandbox.run(host, "nvidia-smi -L", check=True).stdout.splitlines()
        assert [line.split(": ", 1)[1].split(" (UUID")[0] for line in lines] == [g["name"] for g in host.gpus]
        assert all(line.endswith("(simulated)") for line in lines)
        apps = sandbox.run(host, "nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits")
        assert apps.returncode == 0 and apps.stdout == ""
        assert "SIMULATED" in sandbox.run(host, "nvidia-smi topo -m", check=True).stdout


def test_cpu_hosts_have_no_nvidia_smi(sandbox: hosts.Sandbox) -> None:
    assert len(sandbox.groups["cpu_hosts"]) >= 3
    for name in sandbox.groups["cpu_hosts"]:
        proc = sandbox.run(name, "command -v nvidia-smi")
        assert proc.returncode != 0, f"{name}: nvidia-smi at {proc.stdout.strip()}"


def test_hosts_reach_each_other_by_address(sandbox: hosts.Sandbox) -> None:
    """Each host reads the next one's SSH banner over the sandbox network."""
    for host, other in zip(sandbox.hosts, sandbox.hosts[1:] + sandbox.hosts[:1], strict=True):
        cmd = f"timeout 5 bash -c 'exec 3<>/dev/tcp/{other.address}/22; head -c 8 <&3'"
        proc = sandbox.run(host, cmd)
        assert proc.stdout.startswith("SSH-2.0"), f"{host.name} -> {other.name}: {proc.stderr}"


def test_hosts_are_offline_with_local_resolver(sandbox: hosts.Sandbox) -> None:
    """No default route and nameserver 127.0.0.1: traffic stays in the sandbox, getfqdn() is quick."""
    host = sandbox.hosts[0]
    assert "default" not in sandbox.run(host, "ip route", check=True).stdout
    assert sandbox.run(host, "cat /etc/resolv.conf", check=True).stdout.strip() == "nameserver 127.0.0.1"
    names = sandbox.run(host, "getent hosts " + " ".join(h.name for h in sandbox.hosts), check=True).stdout
    assert {line.split()[1] for line in names.splitlines()} == {h.name for h in sandbox.hosts}


def test_pyinfra_reaches_every_host(sandbox: hosts.Sandbox) -> None:
    """The same inventory file drives pyinfra over SSH (strict host key checking from its host data)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pyinfra", "-y", str(sandbox.inventory), "exec", "--", "hostname"],
        capture_output=True, text=True, timeout=120, cwd=sandbox.inventory.parent.parent,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for host in sandbox.hosts:
        assert f"[{host.name}]" in proc.stdout + proc.stderr


def _one_host_sandbox(tmp_path: Path, sandbox: hosts.Sandbox, name: str, address: str,
                      inventory_file: str) -> hosts.Sandbox:
    """A sandbox of one host of its own (its own bridge and /24), reached with the session's keys."""
    keys = sandbox.hosts[0]
    inventory = tmp_path / "inventory" / inventory_file
    inventory.parent.mkdir()
    inventory.write_text(
        f"hosts = [({name!r}, {{'ssh_hostname': {address!r}, 'ssh_user': 'root', "
        f"'ssh_key': {str(keys.ssh_key)!r}, 'ssh_known_hosts_file': {str(keys.known_hosts)!r}, "
        f"'ssh_strict_host_key_checking': 'yes'}})]\n"
    )
    return hosts.load(inventory)


def test_down_leaves_nothing_behind(tmp_path: Path, sandbox: hosts.Sandbox) -> None:
    """A separate one-host sandbox on its own bridge and /24: up, then down, then nothing of it remains.
    (Its own cycle, so the session's hosts stay up for the tests after this one.)"""
    small = _one_host_sandbox(tmp_path, sandbox, "sbx-downtest", "10.213.251.11", "downtest.py")
    try:
        [status] = harness.up(small, log=print)
        assert status.state == "running"
        pid = status.pid
    finally:
        harness.down(small)
    host = small.hosts[0]
    assert teardown.leftovers(small) == []
    assert host.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not Path(f"/proc/{pid}").exists(), "systemd-nspawn still there (running or unreaped)"
    assert not teardown._nspawn_pids(host)
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert small.bridge not in links and host.veth not in links
    mounts = Path("/proc/mounts").read_text()
    assert f"{hosts.PREFIX}-{host.name}" not in mounts and str(small.state_dir) not in mounts
    assert not any(d.exists() for d in hosts._cgroup_dirs(host))
    assert not small.state_dir.exists()
    # The session's hosts were not disturbed.
    assert sandbox.run(sandbox.hosts[0], "true").returncode == 0


def _running(pid: int) -> bool:
    """pid is a process that has not exited (a zombie waiting for PID 1 to reap it has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _host_processes(host) -> set[int]:
    return {int(p) for d in hosts._cgroup_dirs(host) if d.is_dir()
            for procs in d.rglob("cgroup.procs") for p in procs.read_text().split()}


def test_down_kills_what_a_killed_nspawn_left_running(tmp_path: Path, sandbox: hosts.Sandbox) -> None:
    """A systemd-nspawn SIGKILLed before down() (a crash of the harness, or a kill by hand) leaves the
    container's init and everything it runs alive, reparented to PID 1. down() kills them by the
    host's own cgroup and removes the rest; nothing of the host is left."""
    small = _one_host_sandbox(tmp_path, sandbox, "sbx-orphan", "10.213.252.11", "orphantest.py")
    host = small.hosts[0]
    try:
        [status] = harness.up(small, log=print)
        os.kill(status.pid, signal.SIGKILL)
        time.sleep(1)
        left = _host_processes(host) - {status.pid}
        assert left, "the container's processes died with their nspawn: nothing for down() to prove"
    finally:
        harness.down(small)
    assert not [pid for pid in left if _running(pid)]
    assert not any(d.exists() for d in hosts._cgroup_dirs(host))
    assert host.netns not in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert small.bridge not in links and host.veth not in links and not small.state_dir.exists()


def test_a_sigint_while_hosts_boot_leaves_nothing_behind(tmp_path: Path, sandbox: hosts.Sandbox) -> None:
    """`vllm-fleet sandbox up` interrupted (Ctrl-C) once its first host's nspawn runs: it stops what
    it started and exits; teardown.leftovers finds no process, namespace, veth, mount, cgroup,
    bridge or state of it."""
    small = _one_host_sandbox(tmp_path, sandbox, "sbx-sigint", "10.213.253.11", "siginttest.py")
    pid_file = small.state_dir / "sbx-sigint" / "nspawn.pid"
    proc = subprocess.Popen([sys.executable, "-m", "vllm_fleet.sandbox.cli", "up", str(small.inventory),
                             "--no-assets"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while not pid_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pid_file.exists(), f"the host never started booting: {proc.communicate()[0][-2000:]}"
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        left = teardown.leftovers(small)
        harness.down(small)
    assert proc.returncode != 0, output[-2000:]
    assert left == [], left

