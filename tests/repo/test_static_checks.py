"""The linter and the type checker, as pyproject.toml configures them: ruff over the whole repository,
mypy over the pure core ([tool.mypy] files). Run here so that the test command (bin/test, .ci/run)
runs them too; each failure shows the tool's own report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_tool(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing():
    # No cache: a run as root (CI) leaves nothing in the checkout that a later run could not write.
    done = run_tool("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing_in_the_pure_core(tmp_path):
    # A cache of this run only: nothing written into the checkout, nothing stale read back.
    done = run_tool("mypy", "--cache-dir", str(tmp_path / "mypy-cache"))
    assert done.returncode == 0, done.stdout + done.stderr
