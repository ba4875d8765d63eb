"""Shared pytest wiring: the sandbox fixture and its --no-sandbox option live in sandbox_fixture.py;
the figures tests report (figures.py) are printed in the terminal summary."""

from sandbox_fixture import pytest_addoption, pytest_collection_modifyitems, sandbox  # noqa: F401
from fleet_helpers import deploy_env  # noqa: F401,E402
import figures  # noqa: E402


def pytest_terminal_summary(terminalreporter):
    if figures.LINES:
        terminalreporter.section("vllm-fleet figures")
        for line in figures.LINES:
            terminalreporter.write_line(line)
