"""The sandbox harness's own rules, without booting a host: the waves hosts boot in, the inotify limit
they need, and the error a host that never answers SSH gives (what the sandbox relies on at any size)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from vllm_fleet.sandbox import harness, hosts


def test_hosts_boot_in_waves_of_a_few_per_core_in_inventory_order(monkeypatch) -> None:
    fifty = [hosts.SandboxHost(f"sbx-b{i:02d}", f"10.213.9.{10 + i}", ("cpu_hosts",), "root", "deploy",
                               Path("/k"), Path("/kh"), None) for i in range(1, 51)]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    waves = harness.boot_waves(fifty, per_core=8)
    assert [len(w) for w in waves] == [16, 16, 16, 2]
    assert [h for w in waves for h in w] == fifty
    assert harness.boot_waves(fifty[:5]) == [fifty[:5]]  # the test sandbox's 5 hosts boot together


def test_a_host_whose_ssh_never_answers_is_named_with_its_nspawn_log(tmp_path: Path, monkeypatch) -> None:
    from vllm_fleet.sandbox import boot

    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path / "cache"))
    host = hosts.SandboxHost("sbx-silent", "10.213.254.11", ("cpu_hosts",), "root", "deploy", Path("/k"),
                             Path("/kh"), None)
    silent = hosts.Sandbox(tmp_path / "silent.py", [host])
    log_dir = silent.state_dir / host.name
    log_dir.mkdir(parents=True)
    (log_dir / "nspawn.log").write_text("Failed to mount overlay: No space left on device\n")

    class Refused(hosts.Sandbox):
        def run(self, host, command, timeout=120, check=False):
            return subprocess.CompletedProcess([], 255, "", "ssh: connect to host 10.213.254.11 port 22: "
                                               "Connection refused")

    with pytest.raises(hosts.SandboxError) as failed:
        boot._wait_ssh(Refused(silent.inventory, [host]), host, deadline=time.monotonic())
    message = str(failed.value)
    stopped = threading.Event()
    stopped.set()  # Ctrl-C, or another host's failure: the wait ends long before its deadline
    with pytest.raises(hosts.SandboxError, match="sbx-silent: no longer waited for"):
        boot._wait_ssh(Refused(silent.inventory, [host]), host, deadline=time.monotonic() + 3600, stop=stopped)
    assert message.startswith("sbx-silent: no SSH after 120 s: ssh: connect to host 10.213.254.11 port 22")
    assert "nspawn log:\nFailed to mount overlay: No space left on device" in message
    assert "Traceback" not in message


def test_the_inotify_limit_is_raised_for_the_hosts_and_restored_when_they_go_down(tmp_path, monkeypatch):
    """At the kernel's default of 128 inotify instances the 20th systemd host never starts its
    sshd: the limit is raised to what the hosts need beside what is in use, then lowered again,
    never below what is in use then (another sandbox may run, from any cache), and left alone when
    someone else changed it meanwhile."""
    from vllm_fleet.sandbox import boot

    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path / "cache"))
    limit = tmp_path / "max_user_instances"
    limit.write_text("128\n")
    in_use = [40]
    monkeypatch.setattr(boot, "INOTIFY_LIMIT", limit)
    monkeypatch.setattr(boot, "_inotify_instances_in_use", lambda: in_use[0])
    fifty = hosts.Sandbox(tmp_path / "fifty.py", [
        hosts.SandboxHost(f"sbx-b{i:02d}", f"10.213.9.{10 + i}", (), "root", "deploy", Path("/k"), Path("/kh"), None)
        for i in range(1, 51)])
    said = []
    boot.ensure_inotify_instances(fifty, said.append)
    raised = 40 + 50 * boot.INOTIFY_INSTANCES_PER_HOST + boot.INOTIFY_MARGIN
    assert limit.read_text() == f"{raised}\n"
    assert said == [f"raised fs.inotify.max_user_instances from 128 to {raised} for 50 hosts "
                    "(each host's systemd holds about 7); restored when they go down"]
    boot.restore_inotify_instances(fifty)
    assert limit.read_text() == "128\n"

    boot.ensure_inotify_instances(fifty, said.append)
    in_use[0] = 300  # another sandbox's hosts still hold theirs
    boot.restore_inotify_instances(fifty)
    assert limit.read_text() == f"{300 + boot.INOTIFY_MARGIN}\n"

    limit.write_text("128\n")
    in_use[0] = 40
    boot.ensure_inotify_instances(fifty, said.append)
    limit.write_text("100000\n")  # set by someone else since
    boot.restore_inotify_instances(fifty)
    assert limit.read_text() == "100000\n"

    three = hosts.Sandbox(tmp_path / "three.py", fifty.hosts[:3])
    limit.write_text("128\n")
    boot.ensure_inotify_instances(three, said.append)  # 40 + 24 + 32 fit: left alone
    assert limit.read_text() == "128\n" and len(said) == 3
