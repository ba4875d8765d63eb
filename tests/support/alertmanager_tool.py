"""amtool and Alertmanager for the tests: the ones on PATH, else those in Debian's
`prometheus-alertmanager` package, extracted into ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/alertmanager/
and never installed (tests/support/debian_tool.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from support.debian_tool import ToolUnavailable, programs

PACKAGE = "prometheus-alertmanager"
#: What the tests keep from the package.
MEMBERS = {"amtool": "usr/bin/amtool", "prometheus-alertmanager": "usr/bin/prometheus-alertmanager",
           "default.tmpl": "usr/share/prometheus/alertmanager/default.tmpl",
           "email.tmpl": "usr/share/prometheus/alertmanager/email.tmpl"}
#: Debian's build reads its message templates from here, whatever the config says.
TEMPLATES = Path("/usr/share/prometheus/alertmanager")

AlertmanagerUnavailable = ToolUnavailable


def _program(name: str) -> Path:
    found = shutil.which(name)
    if found:
        return Path(found)
    return programs(PACKAGE, MEMBERS, "alertmanager")[name]


def amtool() -> Path:
    return _program("amtool")


def alertmanager() -> Path:
    """Alertmanager itself (the tests start it on the loopback, with a rendered config)."""
    return _program("prometheus-alertmanager")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """amtool ARGS, its output captured (the caller checks returncode and shows stdout/stderr)."""
    return subprocess.run([str(amtool()), *map(str, args)], capture_output=True, text=True, timeout=60)


def start(args: list[str], scratch: Path) -> subprocess.Popen:
    """Alertmanager ARGS, started. Where Debian's templates are not installed (the package is never
    installed here), it runs in a mount namespace of its own that shows them at their path, over a
    read-only overlay of /usr/share (root only: as CI and the sandbox's tests run); `scratch`: a
    directory of the test's own."""
    binary = alertmanager()
    if (TEMPLATES / "default.tmpl").is_file():
        return subprocess.Popen([str(binary), *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise ToolUnavailable(f"{TEMPLATES}/default.tmpl is not installed, and showing it needs root and unshare")
    shown = scratch / "share" / TEMPLATES.relative_to("/usr/share")
    shown.mkdir(parents=True)
    extracted = programs(PACKAGE, MEMBERS, "alertmanager")
    for name in ("default.tmpl", "email.tmpl"):
        shutil.copy(extracted[name], shown / name)
    script = ('mount -t overlay overlay -o "lowerdir=$1:/usr/share" /usr/share && shift && exec "$@"')
    return subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                             str(scratch / "share"), str(binary), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
