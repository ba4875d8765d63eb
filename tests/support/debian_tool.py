"""A program from a Debian package, for the tests: the package is fetched with `apt-get download` into
${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/<folder>/ and only the programs asked for are kept from it
(never installed: installing nginx or prometheus would start a service on the machine running the
tests). CI runs as root on a fresh Debian 12 machine whose package lists may not be there yet: a
failed download runs `apt-get update -q` once and tries again.

A machine without apt-get or dpkg-deb cannot have them this way (ToolUnavailable says so, and the
tests that need them skip with that reason); on a machine with apt, a download that fails is an error.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path


class ToolUnavailable(RuntimeError):
    """The package manager could not give the program."""


def cache_root() -> Path:
    return Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet")


def apt_missing() -> str | None:
    """Why this machine cannot fetch a Debian package (None: it can)."""
    absent = [tool for tool in ("apt-get", "dpkg-deb") if shutil.which(tool) is None]
    return f"{' and '.join(absent)} not on PATH: not a Debian-like machine" if absent else None


def programs(package: str, members: dict[str, str], folder: str) -> dict[str, Path]:
    """{name: path} of each `members` entry (name -> its path inside the package, e.g. "usr/bin/promtool"),
    extracted from Debian's `package` into <cache>/<folder>/<name> on first use."""
    base = cache_root() / folder
    wanted = {name: base / name for name in members}
    if all(os.access(path, os.X_OK) for path in wanted.values()):
        return wanted
    missing = apt_missing()
    if missing:
        raise ToolUnavailable(f"cannot fetch Debian's {package} package: {missing}")
    base.mkdir(parents=True, exist_ok=True)
    # Tests running side by side (pytest-xdist, two checkouts sharing a cache) fetch it once.
    with open(base / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not all(os.access(path, os.X_OK) for path in wanted.values()):
            deb = _download(base, package)
            try:
                for name, member in members.items():
                    _extract(deb, member, wanted[name])
            finally:
                shutil.rmtree(deb.parent)
    return wanted


def _download(base: Path, package: str) -> Path:
    """The package's .deb in a fresh folder under `base` (apt-get download writes to the cwd)."""
    work = Path(tempfile.mkdtemp(prefix="download-", dir=base))
    # apt's download sandbox user (_apt) must be able to write there when we run as root.
    work.chmod(0o755)
    attempt = _apt_download(work, package)
    if attempt.returncode != 0:
        # Most often: no package lists yet on a fresh machine ("Unable to locate package").
        update = subprocess.run(["apt-get", "update", "-q"], capture_output=True, text=True)
        if update.returncode != 0:
            raise ToolUnavailable(f"`apt-get download {package}` failed:\n{attempt.stderr}"
                                  f"`apt-get update -q` failed too (root is needed):\n{update.stderr}")
        attempt = _apt_download(work, package)
    debs = sorted(work.glob(f"{package}_*.deb"))
    if attempt.returncode != 0 or not debs:
        raise ToolUnavailable(f"`apt-get download {package}` failed:\n{attempt.stderr}")
    return debs[-1]


def _apt_download(work: Path, package: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["apt-get", "download", "-q", package], cwd=work, capture_output=True, text=True)


def _extract(deb: Path, member: str, tool: Path) -> None:
    """`member` of `deb` to `tool` (by rename, so a half-written file is never used)."""
    root = deb.parent / "root"
    if not root.is_dir():
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True, capture_output=True)
    extracted = root / member
    if not extracted.is_file():
        raise ToolUnavailable(f"{deb.name} holds no {member}")
    staged = tool.with_name(tool.name + ".new")
    shutil.copy2(extracted, staged)
    staged.chmod(0o755)
    staged.replace(tool)
