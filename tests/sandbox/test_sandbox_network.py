"""The sandbox's network on this machine: its bridge is the only way to its hosts' /24.

A sandbox killed before its teardown (of another inventory file or cache) leaves its bridge, which
holds the same subnet; its route is older, so every host of the next sandbox was unreachable ("No
route to host" for 120 s). These tests create links on this machine (root) in a /24 no sandbox
uses, and remove them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fleet.sandbox import boot, hosts, teardown

pytestmark = pytest.mark.sandbox  # root and iproute2: deselected with --no-sandbox

NETWORK = "10.213.250"
LEFTOVER = f"{hosts.PREFIX}left0ver"  # what a killed sandbox's bridge is called: the prefix and a hash
PORT = f"{hosts.PREFIX}port0"


def _sandbox(tmp_path: Path) -> hosts.Sandbox:
    host = hosts.SandboxHost(name="sbx-net1", address=f"{NETWORK}.11", groups=("cpu_hosts",), ssh_user="root",
                             login_user="root", ssh_key=tmp_path / "key", known_hosts=tmp_path / "known_hosts",
                             gpus=None)
    return hosts.Sandbox(inventory=tmp_path / "inventory.py", hosts=[host])


def _ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], capture_output=True, text=True, check=check)


def _exists(link: str) -> bool:
    return _ip("link", "show", link, check=False).returncode == 0


@pytest.fixture
def links(tmp_path: Path):
    """The test's sandbox; every link the test or the code made is removed afterwards."""
    sandbox = _sandbox(tmp_path)
    try:
        yield sandbox
    finally:
        for link in (PORT, LEFTOVER, "vftestlink0", sandbox.bridge):
            if _exists(link):
                _ip("link", "del", link)


def _leftover_bridge(name: str = LEFTOVER) -> None:
    _ip("link", "add", name, "type", "bridge")
    _ip("addr", "add", f"{NETWORK}.1/24", "dev", name)
    _ip("link", "set", name, "up")


def test_a_killed_sandboxs_bridge_on_the_same_network_is_removed_and_the_hosts_route_through_this_one(
        links: hosts.Sandbox) -> None:
    _leftover_bridge()
    assert LEFTOVER in _ip("-o", "route", "get", f"{NETWORK}.11").stdout  # the hosts' traffic goes there
    said: list[str] = []

    boot._ensure_bridge(links, log=said.append)

    assert not _exists(LEFTOVER)
    assert f"dev {links.bridge} " in _ip("-o", "route", "get", f"{NETWORK}.11").stdout
    assert len(said) == 1 and LEFTOVER in said[0] and f"{NETWORK}.0/24" in said[0], said


def test_a_bridge_with_a_host_on_it_is_refused_and_left_alone(links: hosts.Sandbox) -> None:
    _leftover_bridge()
    _ip("link", "add", PORT, "type", "veth", "peer", "name", f"{PORT}p")  # a host's veth, as boot makes it
    _ip("link", "set", PORT, "master", LEFTOVER)

    with pytest.raises(hosts.SandboxError) as refused:
        boot._ensure_bridge(links, log=print)

    message = str(refused.value)
    assert LEFTOVER in message and "1 host(s)" in message and "another /24" in message, message
    assert _exists(LEFTOVER) and _exists(PORT)
    assert not _exists(links.bridge)


def test_a_link_that_is_not_a_sandboxs_is_refused_and_left_alone(links: hosts.Sandbox) -> None:
    _ip("link", "add", "vftestlink0", "type", "bridge")  # someone else's, by its name
    _ip("addr", "add", f"{NETWORK}.7/24", "dev", "vftestlink0")

    with pytest.raises(hosts.SandboxError, match="already on vftestlink0 \\(a link\\)"):
        boot._ensure_bridge(links, log=print)

    assert _exists("vftestlink0") and not _exists(links.bridge)


def test_the_sandboxs_own_bridge_is_kept(links: hosts.Sandbox) -> None:
    boot._ensure_bridge(links, log=print)
    index = _ip("-o", "link", "show", links.bridge).stdout.split(":")[0]

    boot._ensure_bridge(links, log=print)

    assert _ip("-o", "link", "show", links.bridge).stdout.split(":")[0] == index
    teardown._remove_bridge(links)
    assert not _exists(links.bridge)


def test_a_teardown_left_to_atexit_still_runs_every_host(tmp_path: Path) -> None:
    """The sandbox fixture registers harness.down with atexit for a pytest that dies: by then Python
    takes no new pool threads, and the teardown must still reach every host."""
    script = (
        "import atexit\n"
        "from vllm_fleet.sandbox import harness\n"
        "atexit.register(lambda: print(harness._each(lambda host: host * 2, [1, 2, 3])))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "[2, 4, 6]", proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
