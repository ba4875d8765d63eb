"""The sandbox harness's own rules, without booting a host: the waves hosts boot in, and the error a
host that never answers SSH gives (what the sandbox modules rely on at any size)."""

from __future__ import annotations

import os
import subprocess
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
    assert harness.boot_waves(fifty[:5]) == [fifty[:5]]  # the test sandbox: one wave, as before


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
    assert message.startswith("sbx-silent: no SSH after 120 s: ssh: connect to host 10.213.254.11 port 22")
    assert "nspawn log:\nFailed to mount overlay: No space left on device" in message
    assert "Traceback" not in message
