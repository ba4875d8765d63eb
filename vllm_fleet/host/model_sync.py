"""Model sync that costs nothing when nothing changed, and that only ever writes into, and deletes
from, a directory that is vllm-fleet's own.

`files.sync` stats and `sha1sum`s every file on the host (two remote commands per file) and hashes
every local file, on every run: a no-op deploy of a 140 GB model re-read 140 GB on both sides. Here:

- Workstation: `local_manifest(src)` lists the model directory (relative path, size, mtime_ns,
  sha256). A file's sha256 is computed only when it is new or its (size, mtime_ns, inode) changed; the
  rest come from a cache file, ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/model-manifests/<hash>.json,
  so a no-op run opens no file. Symlinks are followed only where they stay inside src or, when src
  is a Hugging Face snapshot directory (<repo>/snapshots/<revision>, made of links into
  <repo>/blobs/), inside that repo's blobs/: a synced file is readable by every user of the host, so
  a `tokenizer.json -> ../../.ssh/id_ed25519` must not travel. Such a link, a dangling or looping
  one, or a special file, is refused with the path and a fix. Names starting with "." (files and
  directories, at any depth) are skipped, on both sides.
- Host: `<dest>/.vllm-fleet-manifest.json` (0644) records what was synced: per file its size,
  sha256 and its mtime on the host (set to the workstation file's mtime, to the nanosecond, just
  before the file is renamed into place). The fact `ModelSyncState(dest=...)` prints that manifest
  and a `find` listing of everything under dest (size, mtime, mode) in ONE remote command; without
  a manifest, only dest's top-level entries (hidden ones too): enough to tell whether it is empty,
  and cheap even for `model: /`. A host file whose size and mtime equal its manifest entry is taken
  to hold the manifest's sha256.
- Ownership: the sync deletes what src lacks, so it only touches a dest that holds the manifest,
  or that does not exist or is empty (entries named *.vllm-fleet-partial aside: only vllm-fleet
  names files so). Anything else (`model: /etc`, a directory holding other models, a home
  directory with only dotfiles) is refused from the fact, before anything is sent or removed
  (`ownership_problem`; the deploy asks it while planning). A first sync writes an empty manifest
  (one that vouches for no file) before it sends or creates anything else: a first sync cut short
  still leaves a directory the next run recognises as its own, and that run adopts what arrived.
- `model_sync(...)` compares the three and yields only what differs. Files are uploaded to
  `<dest>/<rel>.vllm-fleet-partial`, then one privileged command checks the size and sha256 of that
  partial file and renames it into place, so an interrupted or short transfer never becomes the
  real file (a leftover partial is deleted by the next run). A host file of the right size that the
  manifest does not vouch for (a sync interrupted after some renames, the first one included; a
  file touched on the host) is hashed ON THE HOST by a second fact (`ModelSyncHashes`), once, and
  adopted when it matches instead of being sent again.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import stat
import tempfile
import time
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Callable

from pyinfra import host, logger
from pyinfra.api import FactBase, FileUploadCommand, operation

from vllm_fleet.host import facts
from vllm_fleet.host.remote import AS_LOGIN_USER, login_owner, login_user

MANIFEST_NAME = ".vllm-fleet-manifest.json"
PARTIAL_SUFFIX = ".vllm-fleet-partial"
MANIFEST_VERSION = 1
CACHE_VERSION = 1
HASH_BLOCK = 8 * 1024 * 1024
PROGRESS_EVERY_S = 10.0  # an in-flight progress line per file at most this often
_MAX_ARGS_CHARS = 32_000  # one shell argument (sh -c '...') must stay far below Linux's 128 KiB

# Uploads go over SFTP as the login user (remote.AS_LOGIN_USER) straight to the partial path, made
# the login user's file first, instead of pyinfra's sudo path (upload to /tmp, then `cp` with sudo),
# which would write a 10 GB shard twice, on a /tmp that may be too small.


class ModelSyncError(ValueError):
    """A model directory cannot be synced as it is: the workstation's (model_source) or the host's
    (model); the message says why."""


# --- Workstation side: the manifest and its cache ---------------------------------------------------

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
                log(f"hashing {rel} ({_human(st.st_size)}), new or changed since the last run")
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
        log(f"hashed {hashed_files} file(s), {_human(hashed_bytes)} in {elapsed:.1f} s; "
            f"{len(files) - hashed_files} from the cache {cache_path}")
    return LocalManifest(str(root), files, dirs, hashed_files, hashed_bytes)


# --- Host side: facts -------------------------------------------------------------------------------

def state_command(dest: str) -> str:
    """One command: the host manifest (one line of JSON) and a listing of everything under dest;
    without a manifest, of dest's top-level entries only, hidden ones included ('h'): what
    ownership_problem needs, at the cost of one line per entry, whatever lies below them.
    `find -H`: a dest that is a symlink is listed through (it is what the sync would write into);
    `real` is dest with every link resolved, for ownership_problem to refuse a dest reached through one."""
    d = shlex.quote(dest.rstrip("/") or "/")
    m = shlex.quote(MANIFEST_NAME)
    listing = ("-type f -printf 'f\\t%s\\t%T@\\t%m\\t%P\\n' -o -type d -printf 'd\\t-\\t-\\t%m\\t%P\\n' "
               "-o -printf 'o\\t-\\t-\\t-\\t%P\\n'")
    return (f"printf 'real\\t%s\\n' \"$(readlink -m {d})\"; "
            f"if [ -d {d} ]; then find -H {d} -maxdepth 0 -printf 'exists\\t%m\\n'; "
            f"if [ -f {d}/{m} ]; then printf 'manifest\\t'; tr -d '\\n' < {d}/{m}; echo; "
            f"find -H {d} -mindepth 1 -name '.*' -prune -o {listing}; "
            f"else find -H {d} -mindepth 1 -maxdepth 1 -name '.*' -printf 'h\\t-\\t-\\t-\\t%P\\n' -o {listing}; fi; "
            f"printf 'end\\t%s\\n' $?; else echo absent; fi")


def parse_host_manifest(text: str) -> dict[str, dict] | None:
    try:
        data = json.loads(text)
        files = data["files"]
        return {str(rel): {"size": int(e["size"]), "sha256": str(e["sha256"]), "mtime": str(e["mtime"])}
                for rel, e in files.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def parse_state(lines: list[str]) -> dict[str, Any]:
    state: dict[str, Any] = {"exists": False, "dir_mode": None, "manifest": None, "manifest_found": False,
                             "files": {}, "dirs": {}, "other": [], "hidden": [], "listing_ok": False}
    for line in lines:
        kind, _, rest = line.partition("\t")
        if kind == "real":
            state["real"] = rest.strip() or None
        elif kind == "exists":
            state["exists"] = True
            try:
                state["dir_mode"] = int(rest, 8)
            except ValueError:
                state["dir_mode"] = None
        elif kind == "manifest":
            state["manifest_found"] = True
            state["manifest"] = parse_host_manifest(rest)
        elif kind in ("f", "d", "o", "h"):
            parts = rest.split("\t", 3)
            if len(parts) != 4 or not parts[3]:
                continue
            size, mtime, mode, rel = parts
            try:
                if kind == "f":
                    state["files"][rel] = {"size": int(size), "mtime": mtime, "mode": int(mode, 8)}
                elif kind == "d":
                    state["dirs"][rel] = {"mode": int(mode, 8)}
                elif kind == "h":
                    state["hidden"].append(rel)
                else:
                    state["other"].append(rel)
            except ValueError:
                continue
        elif kind == "end":
            state["listing_ok"] = rest.strip() == "0"
    return state


class ModelSyncState(FactBase):
    """What is under a synced model directory, in one command:
    {"exists": bool, "manifest": {rel: {"size", "sha256", "mtime"}} or None (none, or unreadable),
     "manifest_found": bool (the file is there, readable or not),
     "files": {rel: {"size": int, "mtime": "<find %T@>", "mode": int}}, "dirs": {rel: {"mode": int}},
     "other": [rel of symlinks, FIFOs, ...], "hidden": [top-level names starting with "."],
     "listing_ok": bool (find exited 0), "dir_mode": int (dest's own mode) or None}.
    With a manifest, everything below dest is listed and names starting with "." are left out;
    without one, only dest's top-level entries, hidden ones in "hidden". Needs GNU find."""

    def command(self, dest: str) -> str:
        return state_command(dest)

    def default(self):
        return None

    def process(self, output):
        return parse_state(list(output))


def state_query(dest: str) -> "facts.Query":
    """The ModelSyncState query model_sync makes for dest (for the deploy's batch: facts.prefetch)."""
    return facts.query(ModelSyncState, dest=dest.rstrip("/") or "/")


def hashes_command(dest: str, paths: list[str]) -> str:
    d = shlex.quote(dest.rstrip("/") or "/")
    names = " ".join(shlex.quote(p) for p in paths)
    return (f"cd {d} && for p in {names}; do if [ -f \"$p\" ]; then "
            f"printf '%s\\t%s\\n' \"$(sha256sum < \"$p\" | cut -d' ' -f1)\" \"$p\"; fi; done")


class ModelSyncHashes(FactBase):
    """sha256 of some files under dest, computed on the host: {rel: sha256}. Only asked for files of
    the right size that the host manifest does not vouch for (they are read in full on the host)."""

    def command(self, dest: str, paths: tuple[str, ...]) -> str:
        return hashes_command(dest, list(paths))

    def default(self):
        return {}

    def process(self, output):
        out = {}
        for line in output:
            sha, _, rel = line.partition("\t")
            if len(sha) == 64 and rel:
                out[rel] = sha
        return out


# --- Decisions --------------------------------------------------------------------------------------

def same_mtime(a: Any, b: Any) -> bool:
    try:
        return Decimal(str(a)) == Decimal(str(b))
    except (InvalidOperation, ValueError):
        return False


def has_manifest(state: dict[str, Any]) -> bool:
    """dest holds vllm-fleet's manifest (a readable one, or one it cannot parse: still its file)."""
    return state.get("manifest") is not None or bool(state.get("manifest_found"))


def ownership_problem(state: dict[str, Any], dest: str) -> str | None:
    """None when the sync may write into and delete from dest: dest holds vllm-fleet's manifest, or
    does not exist, or holds nothing but partial uploads (*.vllm-fleet-partial: only vllm-fleet
    names files so). Otherwise what dest holds, for the refusal: an /etc, a directory of other
    models, a home directory with only dotfiles would lose their files to `delete`. Pure: from the
    ModelSyncState fact.

    A first sync marks dest before anything else (claim_command: a manifest that vouches for no
    file), so a rerun after a first sync cut short finds the manifest and goes on: the rule needs
    no guess about which files an earlier run left."""
    dest = dest.rstrip("/") or "/"
    real = state.get("real")
    if real and real != dest:
        # The sync writes as root: a link on the way (one the service user could have made in its
        # own state directory, say) would carry its files and deletions anywhere, e.g. into /etc.
        return (f"{dest} is reached through a symlink (it resolves to {real}); the sync, which writes as "
                "root, follows none")
    if not state.get("exists") or has_manifest(state):
        return None
    names = {rel.split("/", 1)[0] for kind in ("files", "dirs") for rel in state.get(kind) or {}}
    names.update(rel.split("/", 1)[0] for kind in ("other", "hidden") for rel in state.get(kind) or [])
    foreign = sorted(name for name in names if not name.endswith(PARTIAL_SUFFIX))
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        return (f"{dest} holds {len(foreign)} {'entry' if len(foreign) == 1 else 'entries'} vllm-fleet did "
                f"not put there (it has no {MANIFEST_NAME}), e.g. {shown}")
    if not state.get("listing_ok"):
        return (f"{dest} has no {MANIFEST_NAME} and could not be listed (find failed), so whether it holds "
                "files vllm-fleet did not put there cannot be told")
    return None


@dataclass
class SyncPlan:
    send: dict[str, str] = field(default_factory=dict)  # rel -> reason
    unchanged: list[str] = field(default_factory=list)
    adopted: list[str] = field(default_factory=list)  # right content already there (hashed on the host)
    to_hash: list[str] = field(default_factory=list)  # ask ModelSyncHashes about these first
    delete: list[str] = field(default_factory=list)  # rm -rf (extra files and dirs, leftover partials)
    mkdirs: list[str] = field(default_factory=list)  # absolute, parents first
    chmod_dirs: list[str] = field(default_factory=list)
    chmod_files: list[str] = field(default_factory=list)
    manifest: dict[str, dict] = field(default_factory=dict)
    write_manifest: bool = False
    claim: bool = False  # make dest and mark it vllm-fleet's before anything else (first sync)

    @property
    def empty(self) -> bool:
        return not (self.claim or self.send or self.delete or self.mkdirs or self.chmod_dirs
                    or self.chmod_files or self.write_manifest)


def plan_sync(local: LocalManifest, state: dict[str, Any], dest: str, delete: bool = True,
              mode: str = "0644", dir_mode: str = "0755",
              host_hashes: dict[str, str] | None = None) -> SyncPlan:
    """What to do so that dest holds `local`, given the ModelSyncState fact (and, once asked for in
    plan.to_hash, the ModelSyncHashes fact). Pure: tests feed it dicts. Raises ModelSyncError when
    dest is not vllm-fleet's to sync into (ownership_problem), before anything is planned."""
    dest = dest.rstrip("/") or "/"
    problem = ownership_problem(state, dest)
    if problem:
        raise ModelSyncError(problem)
    plan = SyncPlan(claim=not has_manifest(state))
    manifest = state.get("manifest") or {}
    host_files: dict[str, dict] = state.get("files", {})
    host_dirs: dict[str, dict] = state.get("dirs", {})
    other = set(state.get("other", []))
    want_files, want_dirs = local.files, set(local.dirs)
    file_mode, wanted_dir_mode = int(mode, 8), int(dir_mode, 8)

    # Paths that must go before anything is placed: leftover partial uploads (ours, always), what
    # sits where a file or directory must be, and (delete=True) everything not in the model.
    removals = []
    for rel in host_files:
        if rel.endswith(PARTIAL_SUFFIX) or rel in want_dirs or (delete and rel not in want_files):
            removals.append(rel)
    for rel in host_dirs:
        if rel in want_files or (delete and rel not in want_dirs):
            removals.append(rel)
    for rel in other:
        if rel in want_dirs or (delete and rel not in want_files):
            removals.append(rel)
    # Only the topmost of removed paths (rm -rf takes what is below).
    removed: set[str] = set()
    for rel in sorted(removals):
        if not any(rel.startswith(r + "/") for r in removed):
            removed.add(rel)
    plan.delete = sorted(removed)

    def gone(rel: str) -> bool:
        return rel in removed or any(rel.startswith(r + "/") for r in removed)

    if not plan.claim and state.get("dir_mode") is not None and state["dir_mode"] != wanted_dir_mode:
        plan.chmod_dirs.append(dest)  # (claim_command makes dest with its mode)
    for rel in local.dirs:
        if rel not in host_dirs or gone(rel):
            plan.mkdirs.append(f"{dest}/{rel}")
        elif host_dirs[rel]["mode"] != wanted_dir_mode:
            plan.chmod_dirs.append(f"{dest}/{rel}")

    for rel, lf in want_files.items():
        h = None if gone(rel) else host_files.get(rel)
        m = manifest.get(rel)
        vouched = (h is not None and m is not None and h["size"] == m["size"]
                   and same_mtime(h["mtime"], m["mtime"]))
        if vouched and m["sha256"] == lf.sha256 and m["size"] == lf.size:
            plan.unchanged.append(rel)
            plan.manifest[rel] = dict(m)
        elif vouched:
            plan.send[rel] = "changed on the workstation"
        elif h is None:
            plan.send[rel] = "new" if rel not in manifest else "missing on the host"
        elif h["size"] != lf.size:
            plan.send[rel] = (f"{'truncated' if h['size'] < lf.size else 'longer'} on the host "
                              f"({h['size']} of {lf.size} bytes)")
        elif host_hashes is None:
            plan.to_hash.append(rel)  # the right size, but nothing vouches for its content
            continue
        elif host_hashes.get(rel) == lf.sha256:
            plan.adopted.append(rel)
            plan.manifest[rel] = {"size": lf.size, "sha256": lf.sha256, "mtime": h["mtime"]}
        else:
            plan.send[rel] = ("changed on the host" if m is not None else "differs on the host") + \
                " (same size, another sha256)"
        if rel in plan.send:
            plan.manifest[rel] = {"size": lf.size, "sha256": lf.sha256, "mtime": lf.host_mtime}
        elif h is not None and h["mode"] != file_mode:
            plan.chmod_files.append(f"{dest}/{rel}")

    if plan.to_hash:
        return plan  # incomplete: ask the host for those hashes, then plan again
    old = {rel: {"size": e["size"], "sha256": e["sha256"], "mtime": str(e["mtime"])}
           for rel, e in manifest.items()} if state.get("manifest") is not None else None
    plan.write_manifest = plan.manifest != old or bool(plan.send)
    return plan


def manifest_text(entries: dict[str, dict]) -> str:
    return json.dumps({"version": MANIFEST_VERSION, "tool": "vllm-fleet", "files": dict(sorted(entries.items()))},
                      sort_keys=False, separators=(",", ":")) + "\n"


# --- Commands ---------------------------------------------------------------------------------------

def _chunks(paths: list[str], budget: int = _MAX_ARGS_CHARS):
    chunk: list[str] = []
    size = 0
    for p in paths:
        q = shlex.quote(p)
        if chunk and size + len(q) + 1 > budget:
            yield chunk
            chunk, size = [], 0
        chunk.append(q)
        size += len(q) + 1
    if chunk:
        yield chunk


def claim_command(dest: str, dir_mode: str) -> str:
    """Make dest and mark it vllm-fleet's with a manifest that vouches for no file, before any
    file is sent or directory made: whatever a first sync cut short leaves, the next run finds
    the manifest and recognises the directory as its own (ownership_problem)."""
    d = shlex.quote(dest)
    final = shlex.quote(f"{dest.rstrip('/')}/{MANIFEST_NAME}")
    partial = shlex.quote(f"{dest.rstrip('/')}/{MANIFEST_NAME}{PARTIAL_SUFFIX}")
    return (f"mkdir -p -- {d} && chmod {dir_mode} -- {d} && rm -f -- {partial} && "
            f"printf '%s' {shlex.quote(manifest_text({}))} > {partial} && chmod 0644 -- {partial} && "
            f"mv -fT -- {partial} {final}")


def prepare_partial_command(partial: str, login_user: str | None) -> str:
    """An empty 0600 file of the login user's at the partial path: SFTP (as that user) writes into
    it even where the directory is root's. Run with the host's privileges."""
    p = shlex.quote(partial)
    return f"rm -f -- {p} && : > {p} && chmod 0600 -- {p} && chown {login_owner(login_user)} -- {p}"


def finalize_command(partial: str, final: str, size: int, sha256: str, mode: str, mtime: str | None,
                     what: str) -> str:
    """Take the partial file over (privileged owner first, so the uploader can no longer write it),
    check its size and sha256, then set mode and mtime and rename it into place. A short or wrong
    partial file is removed and the command fails, leaving the real file as it was."""
    p, f = shlex.quote(partial), shlex.quote(final)
    fail = ("rm -f -- {p}; echo {msg} >&2; exit 1").format
    short = shlex.quote(f"{what}: the upload is incomplete (") + '"$n"' + shlex.quote(
        f" of {size} bytes arrived); the partial file was removed, the file in place was left as it was; "
        "re-run the deploy")
    wrong = shlex.quote(f"{what}: the uploaded file's sha256 is ") + '"$h"' + shlex.quote(
        f", expected {sha256} (the workstation file changed during the upload, or the transfer was "
        "corrupted); the partial file was removed; re-run the deploy")
    touch = f" && touch -m -d @{mtime} -- {p}" if mtime is not None else ""
    return (f"chown \"$(id -u):$(id -g)\" -- {p} && chmod 0600 -- {p} && "
            f"n=$(stat -c %s -- {p}) && if [ \"$n\" != {size} ]; then {fail(p=p, msg=short)}; fi && "
            f"h=$(sha256sum < {p} | cut -d' ' -f1) && if [ \"$h\" != {sha256} ]; then "
            f"{fail(p=p, msg=wrong)}; fi && chmod {mode} -- {p}{touch} && mv -fT -- {p} {f}")


class ProgressReader:
    """A file object for FileUploadCommand that logs progress as the connector reads it.

    pyinfra 3.10's put_file offers no progress callback (paramiko's putfo has one, pyinfra passes
    none), but it accepts any object with read() and seek(): the bytes read are the bytes sent
    (paramiko reads 32 KiB at a time; the local connector reads all at once)."""

    def __init__(self, path: str, rel: str, size: int, transfer: "Transfer"):
        self.path, self.rel, self.size, self.transfer = path, rel, size, transfer
        self._f = None
        self._done = False
        self._read = 0
        self._started = 0.0
        self._last_log = 0.0

    def __repr__(self) -> str:
        return f"ProgressReader({self.path})"

    def seek(self, offset: int, whence: int = 0) -> int:
        if self._f is None:
            self._f = open(self.path, "rb")
        if offset == 0 and whence == 0:
            self._read = 0
            self._done = False
            self._started = self._last_log = time.monotonic()
            self.transfer.file_started(self)
        return self._f.seek(offset, whence)

    def read(self, n: int = -1) -> bytes:
        if self._f is None:
            if self._done:
                return b""
            self.seek(0)
        data = self._f.read(n)
        self._read += len(data)
        now = time.monotonic()
        if not data or self._read >= self.size:
            if not self._done:
                self._done = True
                self.transfer.file_done(self, now - self._started)
            self._f.close()
            self._f = None
        elif now - self._last_log >= PROGRESS_EVERY_S:
            self._last_log = now
            self.transfer.file_progress(self, self._read, now - self._started)
        return data

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None


class Transfer:
    """Totals across the files one model_sync sends to one host; lines go to pyinfra's logger."""

    def __init__(self, prefix: str, dest: str, files: int, total: int):
        self.prefix, self.dest, self.files, self.total = prefix, dest, files, total
        self.done_files = self.done_bytes = 0
        self.started: float | None = None
        self.log: Callable[[str], None] = logger.info

    def file_started(self, reader: ProgressReader) -> None:
        if self.started is None:
            self.started = time.monotonic()
        self.log(f"{self.prefix}model sync {self.dest}: sending {reader.rel} ({_human(reader.size)}), "
                 f"file {self.done_files + 1} of {self.files}")

    def file_progress(self, reader: ProgressReader, sent: int, elapsed: float) -> None:
        pct = 100 * sent / reader.size if reader.size else 100
        self.log(f"{self.prefix}model sync {self.dest}: {reader.rel}: {_human(sent)} of "
                 f"{_human(reader.size)} ({pct:.0f}%), {_rate(sent, elapsed)}")

    def file_done(self, reader: ProgressReader, elapsed: float) -> None:
        self.done_files += 1
        self.done_bytes += reader._read
        overall = time.monotonic() - (self.started or time.monotonic())
        self.log(f"{self.prefix}model sync {self.dest}: sent {reader.rel} ({_human(reader._read)}) in "
                 f"{elapsed:.1f} s, {_rate(reader._read, elapsed)}; total {self.done_files}/{self.files} "
                 f"files, {_human(self.done_bytes)} of {_human(self.total)}, {_rate(self.done_bytes, overall)}")


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _rate(n: int, seconds: float) -> str:
    return f"{n / 1e6 / seconds:.1f} MB/s" if seconds > 0 else "- MB/s"


def sync_commands(local: LocalManifest, plan: SyncPlan, dest: str, mode: str, dir_mode: str,
                  login_user: str | None, host_name: str, prefix: str = ""):
    """The commands (shell strings and FileUploadCommands) that carry out `plan`, in order: on a
    first sync the claim (dest made and marked vllm-fleet's), removals (first: frees space),
    directories, per file prepare/upload/verify+rename, mode fixes, and last the host manifest
    (written aside, then renamed)."""
    dest = dest.rstrip("/") or "/"
    if plan.claim:
        yield claim_command(dest, dir_mode)
    for chunk in _chunks([f"{dest}/{rel}" for rel in plan.delete]):
        yield "rm -rf -- " + " ".join(chunk)
    for chunk in _chunks(plan.mkdirs):
        yield f"mkdir -p -- {' '.join(chunk)} && chmod {dir_mode} -- {' '.join(chunk)}"
    for chunk in _chunks(plan.chmod_dirs):
        yield f"chmod {dir_mode} -- {' '.join(chunk)}"
    transfer = Transfer(prefix, dest, len(plan.send), sum(local.files[r].size for r in plan.send))
    for rel in sorted(plan.send):
        lf = local.files[rel]
        final = f"{dest}/{rel}"
        partial = final + PARTIAL_SUFFIX
        yield prepare_partial_command(partial, login_user)
        yield FileUploadCommand(ProgressReader(lf.source, rel, lf.size, transfer), partial,
                                remote_temp_filename=partial, **AS_LOGIN_USER)
        yield finalize_command(partial, final, lf.size, lf.sha256, mode, lf.host_mtime,
                               f"host {host_name}: {final}")
    for chunk in _chunks(plan.chmod_files):
        yield f"chmod {mode} -- {' '.join(chunk)}"
    if plan.write_manifest:
        text = manifest_text(plan.manifest).encode()
        final = f"{dest}/{MANIFEST_NAME}"
        partial = final + PARTIAL_SUFFIX
        yield prepare_partial_command(partial, login_user)
        yield FileUploadCommand(io.BytesIO(text), partial, remote_temp_filename=partial, **AS_LOGIN_USER)
        yield finalize_command(partial, final, len(text), hashlib.sha256(text).hexdigest(), "0644", None,
                               f"host {host_name}: {final}")


# --- The operation ----------------------------------------------------------------------------------

# Host-side hashes by (host, dest, rel, size, mtime): asked once per run, not again at execution.
_HOST_HASHES: dict[tuple, str] = {}


@operation()
def model_sync(src: str, dest: str, mode: str = "0644", dir_mode: str = "0755", delete: bool = True):
    """
    Sync a model directory from the workstation to the host; a run where nothing changed reads no
    file on either side and sends one remote command (the ModelSyncState fact; none when the deploy
    read it already in its batch: facts.prefetch).

    + src: the model directory on the workstation (symlinks followed where they stay inside it, or in
      a Hugging Face snapshot directory inside its repository's blobs/; names starting with "." skipped)
    + dest: the directory on the host (its `.vllm-fleet-manifest.json` records what was synced); one
      without that manifest must be empty or absent, or the operation fails and changes nothing
    + mode: mode of the files
    + dir_mode: mode of the directories
    + delete: remove files and directories under dest that src does not have (hidden ones are kept)

    **Example:**

    .. code:: python

        model_sync(name="Sync model", src="~/models/gemma-3-12b", dest="/srv/models/gemma-3-12b")
    """
    dest = dest.rstrip("/") or "/"
    prefix = host.print_prefix
    local = local_manifest(src, log=lambda line: logger.info(f"{prefix}model sync {src}: {line}"))
    # Read once a run (facts.get): in a deploy its batch read it already, with everything else it
    # manages (state_query, facts.prefetch). pyinfra may run this body twice (to see whether it
    # changes anything, then to run it; `pyinfra -y` skips the first): both decide from that one
    # read, as every step of the deploy does (no other step writes below dest).
    state = facts.get(host, ModelSyncState, dest=dest)
    if state is None:
        yield (f"echo {shlex.quote(f'host {host.name}: could not read the state of {dest} (the fact command failed)')} "
               ">&2; exit 1")
        return
    problem = ownership_problem(state, dest)
    if problem:  # the deploy refuses this while planning (deploy/prepare.py _check_synced_model_dirs); other callers
        text = (f"host {host.name}: model sync {src} -> {dest}: {problem}; the sync deletes what {src} lacks, "
                f"so nothing was sent or removed; fix: sync into an empty or new directory, or remove {dest}'s "
                "contents yourself")
        yield f"echo {shlex.quote(text)} >&2; exit 1"
        return
    if state["exists"] and not state["listing_ok"]:
        logger.warning(f"{prefix}model sync {dest}: find reported errors; files it could not list are sent again")
    plan = plan_sync(local, state, dest, delete, mode, dir_mode)
    if plan.to_hash:
        hkey = (host.name, dest)
        files = state["files"]
        known = {rel: _HOST_HASHES[(hkey, rel, files[rel]["size"], files[rel]["mtime"])]
                 for rel in plan.to_hash if (hkey, rel, files[rel]["size"], files[rel]["mtime"]) in _HOST_HASHES}
        ask = [rel for rel in plan.to_hash if rel not in known]
        if ask:
            size = sum(files[rel]["size"] for rel in ask)
            logger.info(f"{prefix}model sync {dest}: {len(ask)} file(s) of the right size that the host manifest "
                        f"does not vouch for: hashing them on the host ({_human(size)}) instead of sending them")
            got = host.get_fact(ModelSyncHashes, dest=dest, paths=tuple(ask)) or {}
            for rel, sha in got.items():
                if rel in files:
                    _HOST_HASHES[(hkey, rel, files[rel]["size"], files[rel]["mtime"])] = sha
            known.update(got)
        plan = plan_sync(local, state, dest, delete, mode, dir_mode, host_hashes=known)

    if plan.empty:
        host.noop(f"model {dest} is up to date ({len(local.files)} files, {_human(local.total_bytes)}; "
                  f"manifest and sizes/mtimes match)")
        return
    send_bytes = sum(local.files[r].size for r in plan.send)
    reasons: dict[str, int] = {}
    for reason in plan.send.values():
        reasons[reason.split(" (")[0]] = reasons.get(reason.split(" (")[0], 0) + 1
    logger.info(f"{prefix}model sync {dest}: send {len(plan.send)} of {len(local.files)} files "
                f"({_human(send_bytes)}{': ' + ', '.join(f'{n} {r}' for r, n in sorted(reasons.items())) if reasons else ''}); "
                f"{len(plan.unchanged)} unchanged, {len(plan.adopted)} verified on the host, "
                f"{len(plan.delete)} to remove")
    for rel, reason in sorted(plan.send.items()):
        logger.debug(f"{prefix}model sync {dest}: {rel}: {reason}")
    yield from sync_commands(local, plan, dest, mode, dir_mode, login_user(host), host.name, prefix)
