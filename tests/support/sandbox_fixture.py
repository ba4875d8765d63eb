"""The session-wide `sandbox` fixture: the hosts of inventory/sandbox.py, booted once, always torn down.

Tests that use it are marked `sandbox` (automatically when they request the fixture). They need root
and systemd-nspawn; without them the fixture FAILS, loudly. To leave them out on purpose, pass
`--no-sandbox` or set VLLM_FLEET_NO_SANDBOX=1 (they are then deselected, and reported as such).
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from vllm_fleet.sandbox import harness, hosts

REPO = Path(__file__).resolve().parents[2]
INVENTORY = REPO / "inventory" / "sandbox.py"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-sandbox",
        action="store_true",
        default=os.environ.get("VLLM_FLEET_NO_SANDBOX") == "1",
        help="deselect tests that need the sandbox hosts (also: VLLM_FLEET_NO_SANDBOX=1)",
    )
    parser.addoption(
        "--drills",
        action="store_true",
        default=os.environ.get("VLLM_FLEET_DRILLS") == "1",
        help="also run the fault drills on a sandbox of their own (about 15 minutes; also: VLLM_FLEET_DRILLS=1)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test using the fixture `sandbox`; deselect the marked ones under --no-sandbox, and
    the fault drills (marked `drills`) unless --drills asks for them: they boot a sandbox of their
    own and take a quarter of an hour, half what the rest of the suite takes on two cores."""
    for item in items:
        if "sandbox" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.sandbox)
    no_sandbox, drills = config.getoption("--no-sandbox"), config.getoption("--drills")
    deselected = [item for item in items if (no_sandbox and item.get_closest_marker("sandbox"))
                  or (not drills and item.get_closest_marker("drills"))]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        dropped = set(map(id, deselected))
        items[:] = [item for item in items if id(item) not in dropped]


class CacheWarmer:
    """`vllm-fleet sandbox warm` in a process of its own, started once the session is known to need
    the sandbox: on a cold cache the Debian base, the hosts' apt mirror and the wheelhouses are built
    while the tests that need no host run first (conftest orders them so), instead of one after the
    other. A process, not a thread: pyinfra's CLI, imported by those tests, patches threading.

    Every sandbox test waits for it before it starts (pytest_runtest_setup), so it and a test never
    build the same cache entry at once; what it failed to build, the tests build (or fail on) as
    they would have without it. Stopped by its PID (and its process group) if the session ends first."""

    process: subprocess.Popen | None = None
    log_path: Path | None = None

    @classmethod
    def start(cls) -> None:
        if cls.process is not None or os.geteuid() != 0:
            return
        fd, name = tempfile.mkstemp(prefix="vllm-fleet-warm.", suffix=".log")
        cls.log_path = Path(name)
        with os.fdopen(fd, "w") as log:
            cls.process = subprocess.Popen(
                [sys.executable, "-m", "vllm_fleet.sandbox.cli", "warm", str(INVENTORY), "--ray"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=REPO,
                start_new_session=True)

    @classmethod
    def wait(cls) -> None:
        if cls.process is None:
            return
        code = cls.process.wait()
        if code != 0:  # the fixture's own build says what is wrong; this says the warmer saw it first
            print(f"sandbox cache warm-up exited {code}:\n{cls.log_path.read_text()[-3000:]}")

    @classmethod
    def stop(cls) -> None:
        if cls.process is None:
            return
        if cls.process.poll() is None:
            try:
                os.killpg(cls.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                cls.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(cls.process.pid, signal.SIGKILL)
                cls.process.wait()
        if cls.log_path is not None:
            cls.log_path.unlink(missing_ok=True)
        cls.process = None


def pytest_collection_finish(session: pytest.Session) -> None:
    if any(item.get_closest_marker("sandbox") for item in session.items):
        CacheWarmer.start()


def after_warm_up(item: pytest.Item) -> bool:
    """The tests that start only once the cache warm-up is done: those on sandbox hosts, and those
    that use the cache it builds (marked sandbox_assets)."""
    return bool(item.get_closest_marker("sandbox") or item.get_closest_marker("sandbox_assets"))


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Every sandbox test, including the modules that boot hosts of their own, starts after it."""
    if after_warm_up(item):
        CacheWarmer.wait()


def pytest_unconfigure(config: pytest.Config) -> None:
    CacheWarmer.stop()


@pytest.fixture(scope="session")
def sandbox() -> hosts.Sandbox:
    """The booted sandbox (hosts.Sandbox): .hosts, .host(name), .groups, .run(host, cmd)."""
    from support.fleet_helpers import prepare_assets_in_background

    try:
        # Loaded first: it imports pyinfra's CLI, whose gevent patching of the threading module
        # must not run while the assets' thread is importing (a "cannot release un-acquired lock").
        sbx = hosts.load(INVENTORY)
        prepare_assets_in_background()  # the wheelhouses download while the hosts boot
        # Teardown on every exit path: the finalizer below, and atexit should pytest die before it.
        atexit.register(harness.down, sbx)
        harness.up(sbx, log=print)  # up tears down itself if it fails or is interrupted
    except hosts.SandboxError as e:
        pytest.fail(f"sandbox could not start: {e}\n(use --no-sandbox to deselect sandbox tests)")
    try:
        yield sbx
    finally:
        harness.down(sbx)
        atexit.unregister(harness.down)
