"""promtool for the tests: the one on PATH, else the one in Debian's `prometheus` package, extracted
(never installed: installing it would start a Prometheus service on the machine running the tests).

The package is fetched with `apt-get download` into ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/promtool/
and only usr/bin/promtool is kept from it. CI runs as root on a fresh Debian 12 machine whose package
lists may not be there yet: a failed download runs `apt-get update -q` once and tries again.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

PACKAGE = "prometheus"


class PromtoolUnavailable(RuntimeError):
    """Neither PATH nor the package manager could give a promtool."""


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet") / "promtool"


def promtool() -> Path:
    """The path of a working promtool, fetching it on first use."""
    found = shutil.which("promtool")
    if found:
        return Path(found)
    base = cache_dir()
    tool = base / "promtool"
    if os.access(tool, os.X_OK):
        return tool
    base.mkdir(parents=True, exist_ok=True)
    # Tests running side by side (pytest-xdist, two checkouts sharing a cache) fetch it once.
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.access(tool, os.X_OK):
            _extract(_download(base), tool)
    return tool


def _download(base: Path) -> Path:
    """The package's .deb in a fresh folder under `base` (apt-get download writes to the cwd)."""
    work = Path(tempfile.mkdtemp(prefix="download-", dir=base))
    # apt's download sandbox user (_apt) must be able to write there when we run as root.
    work.chmod(0o755)
    attempt = _apt_download(work)
    if attempt.returncode != 0:
        # Most often: no package lists yet on a fresh machine ("Unable to locate package").
        update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
        if update.returncode != 0:
            raise PromtoolUnavailable(
                f"promtool is not on PATH and `apt-get download {PACKAGE}` failed:\n{attempt.stderr}"
                f"`apt-get update -q` failed too (root is needed):\n{update.stderr}"
                f"Put promtool on PATH (Debian: the `{PACKAGE}` package's /usr/bin/promtool).")
        attempt = _apt_download(work)
    debs = sorted(work.glob(f"{PACKAGE}_*.deb"))
    if attempt.returncode != 0 or not debs:
        raise PromtoolUnavailable(f"`apt-get download {PACKAGE}` failed:\n{attempt.stderr}")
    return debs[-1]


def _apt_download(work: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "download", "-q", PACKAGE], cwd=work, capture_output=True, text=True)


def _extract(deb: Path, tool: Path) -> None:
    """usr/bin/promtool of `deb` to `tool` (by rename, so a half-written file is never used)."""
    root = deb.parent / "root"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
    extracted = root / "usr" / "bin" / "promtool"
    if not extracted.is_file():
        raise PromtoolUnavailable(f"{deb.name} holds no usr/bin/promtool")
    staged = tool.with_name(tool.name + ".new")
    shutil.copy2(extracted, staged)
    staged.chmod(0o755)
    staged.replace(tool)
    shutil.rmtree(deb.parent)


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """promtool ARGS, its output captured (the caller checks returncode and shows stdout/stderr)."""
    return subprocess.run([str(promtool()), *map(str, args)], cwd=cwd, capture_output=True, text=True)
