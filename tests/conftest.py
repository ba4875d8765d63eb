"""Shared pytest wiring: the sandbox fixture and its --no-sandbox option live in
support/sandbox_fixture.py; the figures tests report (support/figures.py) are printed in the terminal summary, with the run's wall time
when .ci/run started it (VLLM_FLEET_RUN_STARTED: set-up and cold caches included).

The tests that need no sandbox host run first, while sandbox_fixture.CacheWarmer builds the
sandbox's cold caches beside them. The tests whose deploys install the stand-in engine (the
`standin_env` fixture) run after every other test: the session's sandbox hosts then switch from the genuine vLLM to the stand-in once,
never back and forth (each switch back would be a genuine vLLM start on every host)."""

import os
import sys
import time

import pytest

import support

# Every directory of tests on the path (support.test_directories says why).
sys.path += [d for d in support.test_directories() if d not in sys.path]

from support import sandbox_fixture  # noqa: E402 (after the path)
from support.sandbox_fixture import (  # noqa: F401,E402 (hooks and a fixture: pytest finds them by name)
    pytest_addoption, pytest_collection_finish, pytest_runtest_setup, pytest_unconfigure, sandbox)
from support.fleet_helpers import deploy_env, standin_env  # noqa: F401,E402 (fixtures: pytest finds them by name)
from support import figures  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sandbox_fixture.pytest_collection_modifyitems(config, items)
    # Stable: the tests that need no host first (the sandbox's cache warms meanwhile), then the
    # sandbox's in FLEET_ORDER, the stand-in's last.
    items.sort(key=lambda item: (sandbox_fixture.after_warm_up(item),
                                 "standin_env" in getattr(item, "fixturenames", ()),
                                 _fleet_rank(item)))


def _fleet_rank(item: pytest.Item) -> int:
    """Where a test of the genuine vLLM's phase runs: its module's place in FLEET_ORDER."""
    if "standin_env" in getattr(item, "fixturenames", ()) or item.path.name not in FLEET_ORDER:
        return len(FLEET_ORDER)
    return FLEET_ORDER.index(item.path.name)


# The modules that deploy the genuine vLLM onto the shared CPU hosts, in the order that restarts it
# least: each module's fixture converges the hosts to the fleet it needs, and a genuine vLLM start
# costs tens of seconds on two cores, so a module whose fleet is the previous one's (or close to it)
# comes right after it. The security module wants inventory/sandbox.py as it is, which the deploy
# module leaves but for one removed instance (run later, it would restart all three to undo the
# rollout's changes); from the gateway module on, sbx-cpu1 keeps the inventory's instance (the
# gateway's second name is on sbx-cpu3, as are the adapters module's adapters, and host_packages and
# lifecycle restart it anyway), and the
# team modules keep the rollout's instances (multinode's hosts are their own); the team modules
# share one HTTPS fleet. Modules not named keep
# their place, after these, in file order.
FLEET_ORDER = ("test_deploy_sandbox.py", "test_security_sandbox.py", "test_faults_sandbox.py",
               "test_gateway_sandbox.py", "test_pooling_sandbox.py", "test_adapters_sandbox.py",
               "test_host_packages_sandbox.py", "test_lifecycle_sandbox.py",
               "test_multinode_sandbox.py", "test_rollout_sandbox.py", "test_sandbox_bad_input.py",
               "test_sandbox_hosts.py", "test_sandbox_teardown.py", "test_standin_engine.py",
               "test_team_monitoring_sandbox.py", "test_team_service_sandbox.py")


def pytest_terminal_summary(terminalreporter):
    if figures.LINES:
        terminalreporter.section("vllm-fleet figures")
        for line in figures.LINES:
            terminalreporter.write_line(line)
    started = os.environ.get("VLLM_FLEET_RUN_STARTED", "")
    if started.isdigit():
        seconds = time.time() - int(started)
        terminalreporter.section("wall time")
        terminalreporter.write_line(f"the whole run, from an empty vllm-fleet cache: {seconds:.0f} s "
                                    f"({seconds / 60:.1f} min), the environment's set-up included")
