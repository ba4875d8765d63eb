"""Shared pytest wiring: the sandbox fixture and its --no-sandbox option live in sandbox_fixture.py."""

from sandbox_fixture import pytest_addoption, pytest_collection_modifyitems, sandbox  # noqa: F401
from fleet_helpers import deploy_env  # noqa: F401,E402
