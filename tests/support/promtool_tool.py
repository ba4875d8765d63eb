"""promtool and prometheus for the tests: the ones on PATH, else those in Debian's `prometheus` package,
extracted into ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/promtool/ and never installed (tests/support/debian_tool.py).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from support.debian_tool import ToolUnavailable, cache_root, programs

PACKAGE = "prometheus"
#: What the tests keep from the package.
MEMBERS = {"promtool": "usr/bin/promtool", "prometheus": "usr/bin/prometheus"}

PromtoolUnavailable = ToolUnavailable


def cache_dir() -> Path:
    return cache_root() / "promtool"


def _program(name: str) -> Path:
    found = shutil.which(name)
    if found:
        return Path(found)
    return programs(PACKAGE, MEMBERS, "promtool")[name]


def promtool() -> Path:
    """The path of a working promtool, fetching it on first use."""
    return _program("promtool")


def prometheus() -> Path:
    """The path of Prometheus itself (its flags are checked, it is never started), fetched on first use."""
    return _program("prometheus")


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """promtool ARGS, its output captured (the caller checks returncode and shows stdout/stderr)."""
    return subprocess.run([str(promtool()), *map(str, args)], cwd=cwd, capture_output=True, text=True)
