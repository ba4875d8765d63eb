"""Shared pytest wiring: the sandbox fixture and its --no-sandbox option live in sandbox_fixture.py;
the figures tests report (figures.py) are printed in the terminal summary, with the run's wall time
when .ci/run started it (VLLM_FLEET_RUN_STARTED: set-up and cold caches included).

The tests whose deploys install the stand-in engine (the `standin_env` fixture) run after every
other test: the session's sandbox hosts then switch from the genuine vLLM to the stand-in once,
never back and forth (each switch back would be a genuine vLLM start on every host)."""

import os
import time

import pytest

import sandbox_fixture
from sandbox_fixture import pytest_addoption, sandbox  # noqa: F401
from fleet_helpers import deploy_env, standin_env  # noqa: F401,E402
import figures  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    sandbox_fixture.pytest_collection_modifyitems(config, items)
    items.sort(key=lambda item: "standin_env" in getattr(item, "fixturenames", ()))  # stable


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
