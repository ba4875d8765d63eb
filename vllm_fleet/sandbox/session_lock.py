"""One sandbox session at a time on a machine.

Two sandboxes of one inventory name the same hosts, and `up` stops any host of those names it finds
(a crashed run's leftovers): a second test run, or a `vllm-fleet sandbox up`, started while a first
one's hosts serve would kill them under it, and both fail with lost SSH connections. So `up` takes a
machine-wide lock per host name first (in /run/vllm-fleet-sandbox, root's alone) and keeps them
until its `down`: a second session of those names waits for the first to end (saying whose it is),
and a `down` from another process refuses while a session holds them. Sandboxes of other names (a test's one-host sandbox) boot beside it.

An flock: the kernel drops it when its holder exits, however it exits, so a killed run leaves no
stale lock. The descriptor is not inherited (os.open's default), so the hosts' nspawn processes,
which outlive the call that started them, never hold it. Within one process each lock is counted:
a `down` of names this process holds gives up the hold of the `up` that took them.
"""

from __future__ import annotations

import fcntl
import os
import stat
import time
from pathlib import Path

from vllm_fleet.sandbox.hosts import SandboxError

#: Where the locks live: a directory of root's alone (not /run/lock, which every user may write: a
#: link planted there would have root write through it), or where VLLM_FLEET_SANDBOX_LOCK_DIR says.
LOCK_DIR = Path(os.environ.get("VLLM_FLEET_SANDBOX_LOCK_DIR") or "/run/vllm-fleet-sandbox")
#: How long a second session waits for the first before it gives up (a CI run takes under one hour).
WAIT_LIMIT_S = 3600.0
_POLL_S = 1.0

_held: dict[str, tuple[int, int]] = {}  # host name -> (descriptor, holds)


def lock_path(name: str) -> Path:
    return LOCK_DIR / f"vllm-fleet-sandbox-{name}.lock"


def holder(name: str) -> str:
    """Who holds a host name's lock, as its holder wrote it ("pid N: command line"), or ""."""
    try:
        text = lock_path(name).read_text()[:400]
    except OSError:
        return ""
    return "".join(c if c.isprintable() else " " for c in text).strip()


def take(names, log=print, *, wait: bool = True, limit_s: float = WAIT_LIMIT_S) -> None:
    """Hold the lock of every host name (once more where this process holds it already), in sorted
    order so two sessions never wait on each other. Another process holding one: wait up to
    `limit_s` (saying so once), or with wait=False raise SandboxError naming it. All or none."""
    taken: list[str] = []
    try:
        for name in sorted(set(names)):
            _take_one(name, log, wait, limit_s)
            taken.append(name)
    except BaseException:
        release(taken)
        raise


def _take_one(name: str, log, wait: bool, limit_s: float) -> None:
    if name in _held:
        fd, holds = _held[name]
        _held[name] = (fd, holds + 1)
        return
    path = lock_path(name)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = os.lstat(path.parent)
    if (not stat.S_ISDIR(folder.st_mode) or folder.st_uid != os.geteuid()
            or folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise SandboxError(f"{path.parent} is not a directory of this user's that no one else may write: "
                           f"remove it (the sandbox makes it again), then run again")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)  # a link: ELOOP, nothing written
    try:
        shown = os.fstat(fd)
        if not stat.S_ISREG(shown.st_mode) or shown.st_nlink != 1 or shown.st_uid != os.geteuid():
            raise SandboxError(f"{path} is not a file of this user's alone (a hard link, or another "
                               f"user's): remove it, then run again")
        deadline = time.monotonic() + limit_s
        said = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                other = holder(name) or "a process that did not say"
                if not wait:
                    raise SandboxError(f"another sandbox session has a host named {name} ({other}): that "
                                       f"host is its own; let it end (or stop that process) first") from None
                if time.monotonic() > deadline:
                    raise SandboxError(f"another sandbox session with a host named {name} ({other}) still "
                                       f"ran after {limit_s:.0f} s of waiting for it; stop that process, or "
                                       f"let it end, and run again") from None
                if not said:
                    log(f"another sandbox session has a host named {name} ({other}): waiting for it to "
                        f"end, at most {limit_s:.0f} s")
                    said = True
                time.sleep(_POLL_S)
        command = Path(f"/proc/{os.getpid()}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {command.strip()[:300]}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    _held[name] = (fd, 1)


def release(names) -> None:
    """Give up one hold of each name this process holds; a lock goes with its last hold."""
    for name in set(names):
        if name not in _held:
            continue
        fd, holds = _held.pop(name)
        if holds > 1:
            _held[name] = (fd, holds - 1)
            continue
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def held(names) -> bool:
    """Whether this process holds every one of these names' locks."""
    return all(name in _held for name in names)
