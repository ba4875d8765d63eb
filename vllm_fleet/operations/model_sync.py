"""Model sync that costs nothing when nothing changed, and that only ever writes into, and deletes
from, a directory that is vllm-fleet's own.

`files.sync` stats and `sha1sum`s every file on the host (two remote commands per file) and hashes
every local file, on every run: a no-op deploy of a 140 GB model re-read 140 GB on both sides. Here:

- Workstation: `model_source.local_manifest(src)` lists the model directory and hashes only what
  is new or changed since the last run (model_source: the cache, which symlinks are followed).
- Host: the fact `facts.model_sync.ModelSyncState(dest=...)` reads dest's manifest and listing in ONE
  remote command (vllm_fleet.rules.model_sync: what is read, and when dest is vllm-fleet's to write into and delete from).
- `model_sync(...)` compares the three (rules.model_sync.plan_sync) and yields only what differs.
  Files are uploaded to `<dest>/<rel>.vllm-fleet-partial`, then one privileged command checks the
  size and sha256 of that partial file and renames it into place, so an interrupted or short
  transfer never becomes the real file (a leftover partial is deleted by the next run). A host file
  of the right size that the manifest does not vouch for (a sync interrupted after some renames,
  the first one included; a file touched on the host) is hashed ON THE HOST by a second fact
  (`ModelSyncHashes`), once, and adopted when it matches instead of being sent again.
"""

from __future__ import annotations

import hashlib
import io
import shlex
import time
from typing import Callable

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, operation

from vllm_fleet.facts import batch as facts
from vllm_fleet.facts.model_sync import ModelSyncHashes, ModelSyncState
from vllm_fleet.model_source import PARTIAL_SUFFIX, LocalManifest, human_size, local_manifest
from vllm_fleet.rules.model_sync import (MANIFEST_NAME, SyncPlan, manifest_text,
                                         ownership_fix, ownership_problem, plan_sync)
from vllm_fleet.connect.remote import AS_LOGIN_USER, login_owner, login_user

PROGRESS_EVERY_S = 10.0  # an in-flight progress line per file at most this often
_MAX_ARGS_CHARS = 32_000  # one shell argument (sh -c '...') must stay far below Linux's 128 KiB

# Uploads go over SFTP as the login user (remote.AS_LOGIN_USER) straight to the partial path, made
# the login user's file first, instead of pyinfra's sudo path (upload to /tmp, then `cp` with sudo),
# which would write a 10 GB shard twice, on a /tmp that may be too small.


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
        self.log(f"{self.prefix}model sync {self.dest}: sending {reader.rel} ({human_size(reader.size)}), "
                 f"file {self.done_files + 1} of {self.files}")

    def file_progress(self, reader: ProgressReader, sent: int, elapsed: float) -> None:
        pct = 100 * sent / reader.size if reader.size else 100
        self.log(f"{self.prefix}model sync {self.dest}: {reader.rel}: {human_size(sent)} of "
                 f"{human_size(reader.size)} ({pct:.0f}%), {_rate(sent, elapsed)}")

    def file_done(self, reader: ProgressReader, elapsed: float) -> None:
        self.done_files += 1
        self.done_bytes += reader._read
        overall = time.monotonic() - (self.started or time.monotonic())
        self.log(f"{self.prefix}model sync {self.dest}: sent {reader.rel} ({human_size(reader._read)}) in "
                 f"{elapsed:.1f} s, {_rate(reader._read, elapsed)}; total {self.done_files}/{self.files} "
                 f"files, {human_size(self.done_bytes)} of {human_size(self.total)}, {_rate(self.done_bytes, overall)}")


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
                f"so nothing was sent or removed; fix: {ownership_fix(state, dest, 'a directory of its own under vllm_models_dir')}")
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
                        f"does not vouch for: hashing them on the host ({human_size(size)}) instead of sending them")
            got = host.get_fact(ModelSyncHashes, dest=dest, paths=tuple(ask)) or {}
            for rel, sha in got.items():
                if rel in files:
                    _HOST_HASHES[(hkey, rel, files[rel]["size"], files[rel]["mtime"])] = sha
            known.update(got)
        plan = plan_sync(local, state, dest, delete, mode, dir_mode, host_hashes=known)

    if plan.empty:
        host.noop(f"model {dest} is up to date ({len(local.files)} files, {human_size(local.total_bytes)}; "
                  f"manifest and sizes/mtimes match)")
        return
    send_bytes = sum(local.files[r].size for r in plan.send)
    reasons: dict[str, int] = {}
    for reason in plan.send.values():
        reasons[reason.split(" (")[0]] = reasons.get(reason.split(" (")[0], 0) + 1
    logger.info(f"{prefix}model sync {dest}: send {len(plan.send)} of {len(local.files)} files "
                f"({human_size(send_bytes)}{': ' + ', '.join(f'{n} {r}' for r, n in sorted(reasons.items())) if reasons else ''}); "
                f"{len(plan.unchanged)} unchanged, {len(plan.adopted)} verified on the host, "
                f"{len(plan.delete)} to remove")
    for rel, reason in sorted(plan.send.items()):
        logger.debug(f"{prefix}model sync {dest}: {rel}: {reason}")
    yield from sync_commands(local, plan, dest, mode, dir_mode, login_user(host), host.name, prefix)
