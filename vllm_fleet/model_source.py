"""The workstation side of the model sync: a model directory's manifest (relative path, size,
mtime_ns, sha256), read so that a run where nothing changed opens no file.

A file's sha256 is computed only when it is new or its (size, mtime_ns, inode) changed; the rest
come from a cache file, ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/model-manifests/<hash>.json.
Symlinks are followed only where they stay inside src or, when src is a Hugging Face snapshot
directory (<repo>/snapshots/<revision>, made of links into <repo>/blobs/), inside that repo's
blobs/: a synced file is readable by every user of the host, so a `tokenizer.json ->
../../.ssh/id_ed25519` must not travel. Such a link, a dangling or looping one, or a special file,
is refused with the path and a fix. Names starting with "." (files and directories, at any depth)
are skipped, on both sides (vllm_fleet.rules.model_sync lists the host the same way).
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

PARTIAL_SUFFIX = ".vllm-fleet-partial"  # an upload not yet renamed into place (on the host)
CACHE_VERSION = 1
HASH_BLOCK = 8 * 1024 * 1024


class ModelSyncError(ValueError):
    """A model directory cannot be synced as it is: the workstation's (model_source) or the host's
    (model); the message says why."""


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, "/"-separated
    size: int
    mtime_ns: int
    sha256: str
    source: str  # the file read for uploads (a symlink's target, resolved)

    @property
    def host_mtime(self) -> str:
        """The mtime the file gets on the host: the workstation's, to the nanosecond ("sec.nsec",
        what `touch -d @` takes). A filesystem that keeps less makes the next run hash the file
        on the host once and record what it keeps."""
        sec, nsec = divmod(self.mtime_ns, 1_000_000_000)
        return f"{sec}.{nsec:09d}"


@dataclass
class LocalManifest:
    root: str
    files: dict[str, LocalFile]
    dirs: list[str]  # relative directories (parents before children), "" (the root) not included
    hashed_files: int = 0  # files whose content this call read
    hashed_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def digest(self) -> str:
        text = json.dumps([[f.path, f.size, f.mtime_ns, f.sha256] for f in self.files.values()] + self.dirs)
        return hashlib.sha256(text.encode()).hexdigest()


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet") / "model-manifests"


def cache_file(src: str | Path) -> Path:
    absolute = str(Path(src).expanduser().absolute())
    return cache_dir() / f"{hashlib.sha256(absolute.encode()).hexdigest()[:32]}.json"


def sha256_file(path: str) -> str:
    """The one place workstation file content is read for hashing (tests count its calls)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _check_name(src: Path, rel: str) -> None:
    bad = [c for c in rel if ord(c) < 32 or c == "\x7f" or 0xDC80 <= ord(c) <= 0xDCFF]
    if bad or any(c in rel for c in '"\\'):
        raise ModelSyncError(f"model_source {src}: the name {rel!r} has a control character, a quote, a "
                             "backslash or bytes that are not UTF-8; fix: rename it")
    if rel.endswith(PARTIAL_SUFFIX):
        raise ModelSyncError(f"model_source {src}: {rel} ends in {PARTIAL_SUFFIX}, which marks an unfinished "
                             "upload on the host; fix: rename or remove it")


def link_roots(src: Path) -> tuple[str, ...]:
    """The directories model_source's symlinks may lead into (resolved): src itself and, when src
    is a Hugging Face snapshot directory (its parent is named `snapshots` and the grandparent
    holds `blobs/`), that repository's blobs/, where every file of a snapshot really is."""
    real = Path(os.path.realpath(src))
    roots = [str(real)]
    blobs = real.parent.parent / "blobs"
    if real.parent.name == "snapshots" and blobs.is_dir():
        roots.append(os.path.realpath(blobs))
    return tuple(roots)


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == root or path.startswith(root.rstrip(os.sep) + os.sep) for root in roots)


def _walk(src: Path) -> tuple[list[tuple[str, str, os.stat_result]], list[str]]:
    """(files as (rel, path to read, stat of the target)), dirs), following symlinks that stay
    inside link_roots(src), hidden skipped."""
    files: list[tuple[str, str, os.stat_result]] = []
    dirs: list[str] = []
    root = src.expanduser()
    if not root.is_dir():
        raise ModelSyncError(f"model_source {src} is not a directory on this workstation; fix: point "
                             "model_source at the model's directory")
    roots = link_roots(root)

    def visit(directory: str, prefix: str, ancestors: tuple[str, ...]) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as exc:
            raise ModelSyncError(f"model_source {src}: cannot list {directory}: {exc.strerror}; "
                                 "fix: make it readable") from exc
        for entry in entries:
            if entry.name.startswith("."):
                continue
            rel = prefix + entry.name
            _check_name(src, rel)
            try:
                st = os.stat(entry.path)  # follows symlinks
            except OSError as exc:
                if entry.is_symlink():
                    raise ModelSyncError(
                        f"model_source {src}: {rel} is a symlink to {os.readlink(entry.path)}, which "
                        f"{'loops' if 'loop' in str(exc.strerror).lower() else 'does not exist'}; fix: "
                        "restore its target or remove the link") from exc
                raise ModelSyncError(f"model_source {src}: cannot stat {rel}: {exc.strerror}") from exc
            if entry.is_symlink() and not _inside(real := os.path.realpath(entry.path), roots):
                target = os.readlink(entry.path)
                also = " and its Hugging Face repository's blobs/" if len(roots) > 1 else ""
                raise ModelSyncError(
                    f"model_source {src}: {rel} is a symlink to {target}{f' ({real})' if real != target else ''}, "
                    f"outside model_source{also}: what the sync sends is "
                    "readable by every user of the host, so it follows links only inside model_source (and, "
                    "in a Hugging Face snapshot directory, into its repository's blobs/); fix: put a copy of "
                    "the file the model needs in place of the link, or remove the link")
            if stat.S_ISDIR(st.st_mode):
                real = os.path.realpath(entry.path)
                if real in ancestors:
                    raise ModelSyncError(f"model_source {src}: {rel} is a symlink to {real}, one of its own "
                                         "parent directories (a loop); fix: remove the link")
                dirs.append(rel)
                visit(entry.path, rel + "/", ancestors + (real,))
            elif stat.S_ISREG(st.st_mode):
                files.append((rel, os.path.realpath(entry.path) if entry.is_symlink() else entry.path, st))
            else:
                raise ModelSyncError(f"model_source {src}: {rel} is not a regular file or directory "
                                     "(a socket, FIFO or device); fix: remove it from the model directory")

    visit(str(root), "", (os.path.realpath(root),))
    return files, dirs


def _read_cache(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("files"), dict):
        return {}
    return data["files"]


def _write_cache(path: Path, src: str, entries: dict[str, dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, prefix=path.name, suffix=".tmp",
                                     delete=False) as tmp:
        json.dump({"version": CACHE_VERSION, "src": src, "files": entries}, tmp, sort_keys=True)
    os.replace(tmp.name, path)


def local_manifest(src: str | Path, log: Callable[[str], None] | None = None) -> LocalManifest:
    """The manifest of a workstation model directory; reads only files that are new or changed
    since the last call (by size, mtime_ns and inode, kept in the cache file)."""
    root = Path(src).expanduser()
    found, dirs = _walk(root)
    cache_path = cache_file(root)
    cached = _read_cache(cache_path)
    entries: dict[str, dict] = {}
    files: dict[str, LocalFile] = {}
    hashed_files = hashed_bytes = 0
    started = time.monotonic()
    for rel, source, st in found:
        key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino, "source": source}
        old = cached.get(rel)
        if old and all(old.get(k) == v for k, v in key.items()) and isinstance(old.get("sha256"), str):
            sha = old["sha256"]
        else:
            if log and st.st_size >= 64 * 1024 * 1024:
                log(f"hashing {rel} ({human_size(st.st_size)}), new or changed since the last run")
            try:
                sha = sha256_file(source)
            except OSError as exc:
                raise ModelSyncError(f"model_source {root}: cannot read {rel}: {exc.strerror}; fix: make it "
                                     "readable") from exc
            hashed_files += 1
            hashed_bytes += st.st_size
        entries[rel] = {**key, "sha256": sha}
        files[rel] = LocalFile(rel, st.st_size, st.st_mtime_ns, sha, source)
    if entries != cached:
        _write_cache(cache_path, str(root.absolute()), entries)
    if log and hashed_files:
        elapsed = time.monotonic() - started
        log(f"hashed {hashed_files} file(s), {human_size(hashed_bytes)} in {elapsed:.1f} s; "
            f"{len(files) - hashed_files} from the cache {cache_path}")
    return LocalManifest(str(root), files, dirs, hashed_files, hashed_bytes)


def human_size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
