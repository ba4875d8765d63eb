"""Wheelhouses: everything a host needs to install vLLM with no network, built on the workstation.

Air-gapped servers (and the sandbox hosts) cannot reach a package index. The workstation resolves the
environment for the hosts' platform with uv, downloads every wheel once into a cache, and the deploy
pushes that folder and installs from it with `--no-index` (see vllm_fleet.operations.envbuild).
`vllm-fleet bundle` (vllm_fleet.commands.bundle) builds one by hand; the deploy and the sandbox ask
here for theirs.

A wheelhouse lives in ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/wheelhouse/<target>-<version>-<hash>/,
where the hash covers every input (requirements, overrides, python, platform, find-links). It holds the
wheels, requirements.in, resolved.txt, overrides.txt and, written last, MANIFEST_NAME (files + sha256):
a folder without a manifest is incomplete and never used. It is built aside and renamed into place.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.package_sources import PYPI_SIMPLE, PackageSources, failure_advice, workstation_sources
from vllm_fleet.config import ConfigError
from vllm_fleet.environment import OVERRIDE_FILE_NAME, EnvSpec, default_vllm_version, override_text

# The hosts: Debian 12 (glibc 2.36) with its python3.11. manylinux_2_28 would be too old a target:
# llguidance only ships manylinux_2_31 wheels.
HOST_PYTHON = "3.11"
HOST_GLIBC = (2, 36)
HOST_ARCH = "x86_64"
MANIFEST_NAME = "vllm-fleet-wheelhouse.json"
# Bump when the layout or the recipe changes, so old cache entries are not mistaken for new ones.
BUNDLE_FORMAT = 1


@dataclass(frozen=True)
class Wheelhouse:
    """A complete wheelhouse: push `path` to a host and install from it with `--no-index`."""

    path: Path
    requirements_file: Path  # the top-level requirements (what to install on the host)
    override_file: Path | None  # the uv --override file (cpu target), pass it on the host too
    pins: dict[str, str] = field(default_factory=dict)  # every resolved package -> version
    python: str | None = None  # the hosts' Python it was resolved for (None: the manifest names none)

    @property
    def name(self) -> str:
        """The folder name: unique per input set, used as the destination name on the hosts."""
        return self.path.name


def cache_root() -> Path:
    """${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}."""
    return Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet")


def requirements(target: str, vllm_version: str, extras: tuple[str, ...] = ()) -> list[str]:
    """Top-level requirements: what the host env installs, plus uv (to bootstrap the installer there)."""
    spec = EnvSpec(target=target, vllm_version=vllm_version, extras=extras, python=HOST_PYTHON)
    return [*spec.packages(), "uv"]


def host_platform_tags() -> list[str]:
    """Every manylinux tag the hosts accept, newest first (pip does not expand manylinux_2_X itself)."""
    major, minor = HOST_GLIBC
    tags = [f"manylinux_{major}_{m}_{HOST_ARCH}" for m in range(minor, 4, -1)]
    return tags + [f"manylinux{alias}_{HOST_ARCH}" for alias in ("2014", "2010", "1")]


def input_hash(reqs: list[str], overrides: str | None, find_links: list[str],
               indexes: list[str] | None = None) -> str:
    """A short digest of everything that decides the wheelhouse's content."""
    inputs = [BUNDLE_FORMAT, reqs, overrides, HOST_PYTHON, HOST_GLIBC, HOST_ARCH, find_links]
    if indexes:  # none (PyPI alone): the digest of the other inputs alone
        inputs.append(indexes)
    key = json.dumps(inputs)
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def log(msg: str) -> None:
    """Progress goes to stderr, so `--json` output on stdout stays parseable."""
    print(f"[bundle] {msg}", file=sys.stderr, flush=True)


class BundleError(Exception):
    """A resolve or download that failed: the message names the indexes, the cause and the fix."""


def _run(cmd: list[str], sources: PackageSources, what: str, cwd: Path | None = None,
         env: dict[str, str] | None = None) -> None:
    """Run a step, its output streamed to stderr (the progress of long downloads); a failure is a
    BundleError whose message says which indexes were tried and which setting to change."""
    log("$ " + shlex.join(cmd))
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=sys.stderr, stderr=subprocess.PIPE, text=True, cwd=cwd,
                          env=env) as proc:  # fmt: skip
        assert proc.stderr is not None
        for line in proc.stderr:
            sys.stderr.write(line)
            tail = (tail + [line.rstrip()])[-40:]
    if proc.returncode:
        raise BundleError(failure_advice("\n".join(tail), sources, f"{what} ({Path(cmd[0]).name} exited "
                                         f"{proc.returncode})"))


def uv_bin() -> str:
    """The uv executable on this workstation (a dependency of vllm-fleet)."""
    import uv  # type: ignore[import-not-found]

    return uv.find_uv_bin()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_pins(resolved_file: Path) -> dict[str, str]:
    """`name==version` lines of a uv-compiled requirements file, as a dict."""
    pins = {}
    for line in resolved_file.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9._-]+)==(\S+)", line)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def load(path: Path) -> Wheelhouse | None:
    """The wheelhouse at path if it is complete (manifest present, every file there with its size)."""
    try:
        manifest = json.loads((path / MANIFEST_NAME).read_text())
        for name, entry in manifest["files"].items():
            if (path / name).stat().st_size != entry["size"]:
                return None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    override = path / OVERRIDE_FILE_NAME
    return Wheelhouse(
        path=path,
        requirements_file=path / "requirements.in",
        override_file=override if override.exists() else None,
        pins=dict(manifest["pins"]),
        python=manifest.get("python"),
    )


def _requirement(text: str) -> tuple[str, str | None]:
    """(normalised name, exact version or None) of a requirement such as `vllm-router==0.1.17`."""
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(?:===?\s*([^\s,;]+))?", text)
    if not m:
        return text.strip().lower(), None
    return re.sub(r"[-_.]+", "-", m.group(1)).lower(), m.group(2)


def missing_from(wheelhouse: Wheelhouse, spec: EnvSpec) -> list[str]:
    """The requirements of spec (an environment a host installs) that wheelhouse cannot satisfy:
    a package it does not hold, or holds at another version. Empty: it serves that host."""
    held = {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in wheelhouse.pins.items()}
    missing = []
    for req in spec.packages():
        name, version = _requirement(req)
        if name not in held:
            missing.append(req)
        elif version is not None and held[name] != version:
            missing.append(f"{req} (it holds {name}=={held[name]})")
    return missing


def wheelhouse_problem(host: str, wheelhouse_dir: str | None, spec: EnvSpec) -> ConfigError | None:
    """Why the wheelhouse at wheelhouse_dir cannot serve host's environment spec, as an error naming
    the host, the key and the fix (the bundle line that builds one that does); None when it can, or
    when it is not a complete wheelhouse (discovery reports that)."""
    wheelhouse = load(Path(wheelhouse_dir).expanduser()) if wheelhouse_dir else None
    if wheelhouse is None:
        return None
    missing = missing_from(wheelhouse, spec)
    problems, fixes = [], []
    if missing:
        problems.append(f"lacks {', '.join(missing)}")
        fixes.append(f"build one that holds them: {bundle_command(spec)} (then set vllm_wheelhouse to "
                     "the path it prints)")
    if wheelhouse.python and wheelhouse.python != spec.python:
        problems.append(f"was built for Python {wheelhouse.python}, the host's environment uses {spec.python}")
        fixes.append(f"bundles are built for the hosts' Python {wheelhouse.python}: set vllm_python_version = "
                     f"'{wheelhouse.python}'")
    if not problems:
        return None
    return ConfigError(f"vllm_wheelhouse {wheelhouse.path} cannot serve this host's environment "
                       f"({', '.join(spec.packages())}): it {' and '.join(problems)}", host=host,
                       key="vllm_wheelhouse", fix="; ".join(fixes))


def bundle_command(spec: EnvSpec) -> str:
    """The `vllm-fleet bundle` line that builds a wheelhouse serving spec."""
    line = f"vllm-fleet bundle --target {spec.target} --vllm-version {spec.vllm_version}"
    for extra in spec.extras:
        line += f" --extra {shlex.quote(extra)}"
    return line


def _resolve(work: Path, find_links: list[str], override: Path | None, sources: PackageSources) -> Path:
    """uv pip compile for the hosts' python and platform -> work/resolved.txt.

    Run inside work with relative names, so the `# via` comments do not carry the temp folder's path
    and the same inputs give the same file.
    """
    cmd = [uv_bin(), "pip", "compile", "--quiet", "--no-header",
           "--python-version", HOST_PYTHON,
           "--python-platform", f"{HOST_ARCH}-manylinux_{HOST_GLIBC[0]}_{HOST_GLIBC[1]}",
           "-o", "resolved.txt", *sources.uv_args(find_links=False)]  # fmt: skip
    for link in find_links:
        cmd += ["--find-links", link]
    if override:
        cmd += ["--override", override.name]
    _run([*cmd, "requirements.in"], sources, "resolving the wheelhouse", cwd=work,
         env=sources.uv_environment())
    return work / "resolved.txt"


def _download(work: Path, pins: dict[str, str], find_links: list[str], sources: PackageSources) -> None:
    """pip download every pinned wheel for the hosts' platform (no deps: the resolve already has them).

    Pins are written `===` (exact string match): with `==`, a local `+cpu` torch build in pip's own
    find-links (`torch==2.14.0` is satisfied by `2.14.0+cpu`: `==` ignores local labels) would be
    taken for the CUDA target, and pip prefers it.
    """
    exact = work / "download.txt"
    exact.write_text("".join(f"{name}==={version}\n" for name, version in sorted(pins.items())))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--progress-bar", "off",
           "--python-version", HOST_PYTHON, "--implementation", "cp",
           "--abi", "cp" + HOST_PYTHON.replace(".", ""),
           "-d", str(work), "-r", str(exact), *sources.pip_args()]  # fmt: skip
    for tag in host_platform_tags():
        cmd += ["--platform", tag]
    for link in find_links:
        cmd += ["--find-links", link]
    _run(cmd, sources, "downloading the wheelhouse's wheels")
    exact.unlink()


def _write_manifest(work: Path, meta: dict, pins: dict[str, str]) -> None:
    """Hash every file, then write the manifest last: its presence marks the wheelhouse complete."""
    files = {}
    for p in sorted(work.iterdir()):
        if p.is_file() and p.name != MANIFEST_NAME:
            files[p.name] = {"size": p.stat().st_size, "sha256": _sha256(p)}
    manifest = {**meta, "pins": pins, "files": files}
    (work / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


@contextlib.contextmanager
def built_aside(final: Path):
    """A wheelhouse is built in a folder of its own beside `final` (`.building-<name>-<pid>`) and
    renamed into place only when the block ends without an error: a crash or Ctrl-C never leaves
    a half-built wheelhouse where `load` would find it. Yields the folder to fill."""
    final.parent.mkdir(parents=True, exist_ok=True)
    work = final.parent / f".building-{final.name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        yield work
        shutil.rmtree(final, ignore_errors=True)  # an incomplete leftover of an earlier crash
        work.rename(final)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_wheelhouse(
    out_dir: Path | None = None,
    target: str = "cpu",
    vllm_version: str | None = None,
    extras: tuple[str, ...] | list[str] = (),
    find_links: list[str] | None = None,
    sources: PackageSources | None = None,
) -> Wheelhouse:
    """Build (or reuse) the wheelhouse for (target, vllm_version, extras); return it.

    out_dir is the parent folder (default: cache_root()/wheelhouse); the wheelhouse itself is
    out_dir/<target>-<vllm_version>-<input hash>; vllm_version defaults to the hosts' default for
    the target (environment.default_vllm_version, from config's HOST_DEFAULTS). sources are the
    workstation's pip and uv settings (package_sources.workstation_sources()). find_links defaults to
    the configured ones for the cpu target (torch+cpu is local) and to none for cuda (a local
    torch+cpu must not satisfy vllm's pin). Raises BundleError when a resolve or download fails.
    """
    extras = tuple(extras)
    vllm_version = vllm_version or default_vllm_version(target)
    sources = sources or workstation_sources()
    reqs = requirements(target, vllm_version, extras)
    overrides = override_text(target)
    if find_links is None:
        find_links = default_find_links(target, sources)
    final = wheelhouse_path(target, vllm_version, extras, sources, out_dir, find_links)
    parent = final.parent
    existing = load(final)
    if existing:
        log(f"reusing {final}")
        return existing

    for line in sources.describe():
        log(line)
    with built_aside(final) as work:
        (work / "requirements.in").write_text("\n".join(reqs) + "\n")
        override_file = None
        if overrides is not None:
            override_file = work / OVERRIDE_FILE_NAME
            override_file.write_text(overrides)
        t0 = time.monotonic()
        resolved = _resolve(work, find_links, override_file, sources)
        pins = read_pins(resolved)
        log(f"resolved {len(pins)} packages in {time.monotonic() - t0:.1f}s; downloading wheels")
        t1 = time.monotonic()
        # Complete wheelhouses built here before hold most of these wheels (another set of extras,
        # the same vLLM): pip copies a wheel from them rather than downloading it again. Not part
        # of the input hash: a wheel is the same file wherever it comes from.
        built = sorted(str(p) for p in parent.iterdir() if p.is_dir() and load(p) is not None) if parent.is_dir() else []
        _download(work, pins, find_links + built, sources)
        log(f"downloaded in {time.monotonic() - t1:.1f}s; hashing")
        meta = {"format": BUNDLE_FORMAT, "target": target, "vllm_version": vllm_version,
                "extras": list(extras), "requirements": reqs, "python": HOST_PYTHON,
                "platform": host_platform_tags()[0], "find_links": find_links,
                "indexes": sources.indexes()}  # fmt: skip
        _write_manifest(work, meta, pins)
    wheelhouse = load(final)
    assert wheelhouse, f"{final} incomplete right after building it"
    log(f"ready: {final} ({_size_mb(final):.0f} MB, {time.monotonic() - t0:.0f}s)")
    return wheelhouse


def default_find_links(target: str, sources: PackageSources) -> list[str]:
    """The configured find-links for the cpu target (torch+cpu is local), none for cuda (a local
    torch+cpu must not satisfy vllm's pin)."""
    return list(sources.find_links) if target == "cpu" else []


def wheelhouse_path(target: str, vllm_version: str, extras: tuple[str, ...] = (),
                    sources: PackageSources | None = None, out_dir: Path | None = None,
                    find_links: list[str] | None = None) -> Path:
    """Where build_wheelhouse puts (or finds) the wheelhouse of these inputs, built or not."""
    sources = sources or workstation_sources()
    if find_links is None:
        find_links = default_find_links(target, sources)
    reqs = requirements(target, vllm_version, tuple(extras))
    digest = input_hash(reqs, override_text(target), find_links, hashed_indexes(sources))
    return (Path(out_dir) if out_dir else cache_root() / "wheelhouse") / f"{target}-{vllm_version}-{digest}"


def hashed_indexes(sources: PackageSources) -> list[str]:
    """The indexes that enter the input hash: none for PyPI alone (so a PyPI-only wheelhouse keeps
    its name), what uv's own configuration says where it rules."""
    if sources.uv_configured:
        return ["uv:" + sources.uv_digest]
    indexes = sources.indexes()
    return [] if indexes == [PYPI_SIMPLE] else indexes


def _size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file()) / 1e6
