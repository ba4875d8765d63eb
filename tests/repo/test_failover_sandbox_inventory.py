"""The gateway failover sandbox's inventory (inventory/failover.py) as the harness and the planner read
it, without booting it: two gateways behind a floating address that is no host's, two backends, and
the one host with a disk of its own; and the harness refusing a disk size it cannot make."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fleet.sandbox import hosts

REPO = Path(__file__).resolve().parents[2]


def _host(name: str, address: str, disk_gib) -> hosts.SandboxHost:
    return hosts.SandboxHost(name, address, ("failover",), "root", "deploy", Path("/k"), Path("/kh"), None,
                             disk_gib=disk_gib)


@pytest.mark.parametrize("disk_gib", [0, 65, -1, 10**12, "8", 8.0, True])
def test_a_disk_size_the_harness_cannot_make_is_refused_naming_the_host(disk_gib):
    sandbox = hosts.Sandbox(Path("/inv.py"), [_host("sbx-be2", "10.213.11.22", disk_gib)])
    with pytest.raises(hosts.SandboxError, match="sbx-be2: sandbox_disk_gib must be a whole number of GiB from 1 to 64"):
        hosts._validate(sandbox)


@pytest.mark.parametrize("disk_gib", [None, 1, 8, 64])
def test_a_disk_size_in_bounds_or_none_is_taken(disk_gib):
    hosts._validate(hosts.Sandbox(Path("/inv.py"), [_host("sbx-be2", "10.213.11.22", disk_gib)]))


def test_the_plan_puts_both_gateways_behind_one_address_that_is_no_hosts():
    out = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "plan", "inventory/failover.py", "--json"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    plan = json.loads(out.stdout)
    gateways = plan["gateways"]
    assert [g["host"] for g in gateways] == ["sbx-gw1", "sbx-gw2"]
    floating = [g["floating"] for g in gateways]
    assert {f["address"] for f in floating} == {"10.213.11.100"}
    assert [f["priority"] for f in floating] == [200, 190]
    assert all(f["interface"] == "eth0" for f in floating)
    own = {m["address"] for m in floating[0]["gateways"]}
    assert own == {"10.213.11.11", "10.213.11.12"} and "10.213.11.100" not in own
    assert all(g["url"] == "http://10.213.11.100:9000/v1" for g in gateways)
    backends = {b["host"] for b in gateways[0]["backends"]}
    assert backends == {"sbx-be1", "sbx-be2"}
