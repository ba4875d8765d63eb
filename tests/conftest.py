"""Shared pytest wiring: the sandbox fixture and its --no-sandbox option live in sandbox_fixture.py;
the figures tests report (figures.py) are printed in the terminal summary, with the run's wall time
when .ci/run started it (VLLM_FLEET_RUN_STARTED: set-up and cold caches included).

The tests that need no sandbox host run first, while sandbox_fixture.CacheWarmer builds the
sandbox's cold caches beside them. The tests whose deploys install the stand-in engine (the
`standin_env` fixture) run after every other test: the session's sandbox hosts then switch from the genuine vLLM to the stand-in once,
never back and forth (each switch back would be a genuine vLLM start on every host)."""

import os
import time

import pytest

import sandbox_fixture
from sandbox_fixture import (  # noqa: F401 (hooks and a fixture: pytest finds them by name)
    pytest_addoption, pytest_collection_finish, pytest_runtest_setup, pytest_unconfigure, sandbox)
from fleet_helpers import deploy_env, standin_env  # noqa: F401 (fixtures: pytest finds them by name)
import figures


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sandbox_fixture.pytest_collection_modifyitems(config, items)
    # Stable: the tests that need no host first (the sandbox's cache warms meanwhile), then the
    # sandbox's, the stand-in's last.
    items.sort(key=lambda item: (sandbox_fixture.after_warm_up(item),
                                 "standin_env" in getattr(item, "fixturenames", ())))


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
