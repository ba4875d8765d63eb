"""The sandbox hosts' package source: a partial Debian mirror, as an air-gapped site keeps one.

Sandbox hosts have no route out, like many production GPU servers, so `apt-get install` on them
needs a source they can reach. This builds one on the machine, once, and each host mounts it
read-only at MOUNT_POINT with `deb file:... bookworm main` as its only apt source:

- `dists/bookworm/InRelease` and the indexes (INDEX_FILES) are Debian's own, as downloaded:
  apt on the host checks Debian's signature with the keys the base already trusts (no
  `[trusted=yes]`), and every .deb against the Packages hashes;
- `pool/...` holds the .debs that installing every package vllm-fleet may ask for
  (host_packages.every_debian_package) needs on top of the base, at their mirror paths.

The download resolves against the base's own dpkg status (apt's Dir::State::status), so it holds
exactly what a base host lacks. Built aside and renamed when complete; rebuilt when the base or
the package list changes.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import tempfile
import urllib.request
from pathlib import Path

from vllm_fleet.rules import host_packages

MOUNT_POINT = "/srv/vllm-fleet-apt"  # where each sandbox host sees the mirror (read-only)
PYTHON_VERSION = "3.11"  # bookworm's python3; the sandbox inventory's vllm_python_version
ARCH = "amd64"
# The indexes apt on a host asks for (in the first compression InRelease lists), each checked.
INDEX_FILES = (f"main/binary-{ARCH}/Packages.xz", "main/i18n/Translation-en.xz")


def packages() -> tuple[str, ...]:
    return host_packages.every_debian_package(PYTHON_VERSION)


def sources_list(suite: str) -> str:
    """The hosts' /etc/apt/sources.list: the mirror, and nothing they cannot reach."""
    return (f"# The sandbox's partial Debian mirror (vllm_fleet/sandbox/package_mirror.py), mounted read-only.\n"
            f"deb file:{MOUNT_POINT} {suite} main\n")


def mirror_dir(cache: Path, base: Path, suite: str) -> Path:
    key = hashlib.sha256(f"{base.name} {' '.join(packages())}".encode()).hexdigest()[:12]
    return cache / "sandbox" / f"apt-{suite}-{key}"


def _apt_argv(tmp: Path, base: Path, *args: str) -> list[str]:
    """apt-get on this machine, but with its own lists and cache and the base's dpkg status."""
    options = {
        "Dir::State": tmp / "state", "Dir::State::status": base / "var/lib/dpkg/status",
        "Dir::Cache": tmp / "cache", "Dir::Etc::SourceList": tmp / "sources.list",
        "Dir::Etc::SourceParts": tmp / "empty", "Dir::Etc::TrustedParts": base / "etc/apt/trusted.gpg.d",
        "Dir::Etc::Preferences": tmp / "empty/none", "Dir::Etc::PreferencesParts": tmp / "empty",
        "APT::Architecture": ARCH, "APT::Architectures": ARCH, "Acquire::Languages": "none",
        "Debug::NoLocking": "1", "APT::Install-Recommends": "false",
        # Root's cache is 0700: apt's _apt sandbox user could not read the keys or write there.
        "APT::Sandbox::User": "root",
        # Keep the index as Debian signed it (a machine's apt.conf.d may recompress it, e.g. lz4).
        "Acquire::GzipIndexes": "false",
    }
    return ["apt-get", "-q", *(x for k, v in options.items() for x in ("-o", f"{k}={v}")), *args]


def ensure_mirror(cache: Path, base: Path, suite: str, mirror: str, run, log=print) -> Path:
    """The mirror directory for this base, built first if absent. `run` is the harness's _run."""
    out = mirror_dir(cache, base, suite)
    if (out / "dists").is_dir():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    log(f"building the sandbox hosts' package mirror ({', '.join(packages())}) from {mirror} (once) ...")
    try:
        for d in ("state/lists/partial", "cache/archives/partial", "empty", "repo"):
            (tmp / d).mkdir(parents=True)
        (tmp / "sources.list").write_text(f"deb {mirror} {suite} main\n")
        run(*_apt_argv(tmp, base, "update"))
        run(*_apt_argv(tmp, base, "install", "--download-only", "-y", *packages()))
        _lay_out(tmp, suite, mirror)
        (tmp / "repo").rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _copy_index(mirror: str, suite: str, signed: str, rel: str, dist: Path) -> None:
    """One index file as the mirror serves it, checked against the signed InRelease (apt checks it
    again on the host), at its path and its by-hash path (apt asks for either)."""
    wanted = re.search(rf"^ ([0-9a-f]{{64}}) +\d+ {re.escape(rel)}$", signed, flags=re.M).group(1)
    with urllib.request.urlopen(f"{mirror.rstrip('/')}/dists/{suite}/{rel}", timeout=120) as response:
        data = response.read()
    if hashlib.sha256(data).hexdigest() != wanted:
        raise RuntimeError(f"{mirror}: {rel} does not match its InRelease (a mirror mid-update?): run again")
    target = dist / rel
    (target.parent / "by-hash/SHA256").mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    (target.parent / "by-hash/SHA256" / wanted).write_bytes(data)


def _lay_out(tmp: Path, suite: str, mirror: str) -> None:
    """Debian's signed index and the downloaded .debs, at the paths the index names."""
    lists = tmp / "state/lists"
    (inrelease,) = lists.glob(f"*_dists_{suite}_InRelease")
    (index,) = lists.glob(f"*_dists_{suite}_main_binary-{ARCH}_Packages")
    repo = tmp / "repo"
    dist = repo / "dists" / suite
    dist.mkdir(parents=True)
    shutil.copyfile(inrelease, dist / "InRelease")
    signed = inrelease.read_text().split("SHA256:", 1)[1]
    for rel in INDEX_FILES:
        _copy_index(mirror, suite, signed, rel, dist)
    # apt names a download <package>_<epoch>%3a<version>_<arch>.deb; the pool file has no epoch.
    pool_paths = {Path(p).name: p for p in re.findall(r"^Filename: (\S+)$", index.read_text(), flags=re.M)}
    for deb in (tmp / "cache/archives").glob("*.deb"):
        path = pool_paths[re.sub(r"_\d+%3a", "_", deb.name)]
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.move(deb, repo / path)
    for p in [repo, *repo.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)  # apt reads file: sources as _apt
