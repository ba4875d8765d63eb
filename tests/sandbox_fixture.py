"""The session-wide `sandbox` fixture: the hosts of inventory/sandbox.py, booted once, always torn down.

Tests that use it are marked `sandbox` (automatically when they request the fixture). They need root
and systemd-nspawn; without them the fixture FAILS, loudly. To leave them out on purpose, pass
`--no-sandbox` or set VLLM_FLEET_NO_SANDBOX=1 (they are then deselected, and reported as such).
"""

from __future__ import annotations

import atexit
import os
from pathlib import Path

import pytest

from vllm_fleet.sandbox import harness

REPO = Path(__file__).resolve().parent.parent
INVENTORY = REPO / "inventory" / "sandbox.py"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-sandbox",
        action="store_true",
        default=os.environ.get("VLLM_FLEET_NO_SANDBOX") == "1",
        help="deselect tests that need the sandbox hosts (also: VLLM_FLEET_NO_SANDBOX=1)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test using the fixture `sandbox`; deselect the marked ones under --no-sandbox."""
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sandbox)
    if not config.getoption("--no-sandbox"):
        return
    deselected = [item for item in items if item.get_closest_marker("sandbox")]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if not item.get_closest_marker("sandbox")]


@pytest.fixture(scope="session")
def sandbox() -> harness.Sandbox:
    """The booted sandbox (harness.Sandbox): .hosts, .host(name), .groups, .run(host, cmd)."""
    from fleet_helpers import prepare_assets_in_background

    try:
        # Loaded first: it imports pyinfra's CLI, whose gevent patching of the threading module
        # must not run while the assets' thread is importing (a "cannot release un-acquired lock").
        sbx = harness.load(INVENTORY)
        prepare_assets_in_background()  # the wheelhouses download while the hosts boot
        # Teardown on every exit path: the finalizer below, and atexit should pytest die before it.
        atexit.register(harness.down, sbx)
        harness.up(sbx, log=print)  # up tears down itself if it fails or is interrupted
    except harness.SandboxError as e:
        pytest.fail(f"sandbox could not start: {e}\n(use --no-sandbox to deselect sandbox tests)")
    try:
        yield sbx
    finally:
        harness.down(sbx)
        atexit.unregister(harness.down)
