"""The workstation's secret and certificate files, read so that a wrong file cannot slip in: a key
file, a TLS file, the fleet CA and the seed of the hosts' keys.

What a knob names is opened without following a last symbolic link (O_NOFOLLOW: a link to
~/.ssh/id_ed25519 or a cloud credentials file is refused, not read and pushed to every host), must
be a regular file (no /dev/zero, FIFO, socket or directory: each would hang the run or exhaust its
memory), is read up to a bound it is checked against first (no multi-MB read for a key), must
belong to the user running vllm-fleet (or root), and must be writable by no one else: whoever can
write a key file picks the key the fronts accept, whoever can write a certificate or CA file picks
what the gateway trusts. A file that holds a secret (a key file, a TLS private key, the fleet CA's
key, the seed) must also not be readable by every user of the workstation (its group may read it:
a team can share the directory by a group). The same rules as OpenSSH's for its own keys, less its
refusal of group reading.

A path is shown in a message only when something is there: a value that names nothing may be a key
pasted where its file's path belongs.

This is workstation I/O, not part of the pure core.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

from vllm_fleet import kinds

#: The longest key nginx can hold is 4081 characters (gateway.key_length_problem): a key file
#: is that, a line break, and room to spare; a larger file is not a key file.
KEY_FILE_MAX_BYTES = 8 * 1024
#: A certificate chain, its key or a CA file: a few KiB each (an RSA-4096 chain of three ~6 KiB). A
#: system bundle of every public CA (~200 KiB) is no fleet CA: the gateway would trust any of them.
PEM_MAX_BYTES = 64 * 1024
#: The seed of the hosts' keys: 64 hex digits and a line break.
SEED_MAX_BYTES = 1024


class UnsafeFile(Exception):
    """A file refused or unreadable: `problem` (words that follow the file's name) and `fix`. Never
    holds the file's contents."""

    def __init__(self, problem: str, fix: str):
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def shown(path: str | Path) -> str:
    """`path` as a message may show it: as written when something is there (a file, a link, a
    directory) and it is printable, quoted and escaped when it holds what a terminal acts on, and not
    at all when nothing is there: such a value may be the secret itself, written where its file's
    path belongs."""
    text = str(path)
    try:
        os.lstat(Path(text).expanduser())
    except (OSError, ValueError):
        return "(path not shown: nothing is there, and it may be the secret itself)"
    return text if kinds.printable(text) else repr(text)


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _kind(mode: int) -> str | None:
    """What a file that is not a regular one is, in words; None for a regular file."""
    for test, words in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe): reading it would "
                                                                          "wait for a writer"),
                        (stat.S_ISCHR, "a character device (/dev/zero or the like: reading it never ends)"),
                        (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return None if stat.S_ISREG(mode) else "not a regular file"


def read_file(path: str | Path, *, limit: int, private: bool) -> bytes:
    """The contents of the regular file `path` (~ expanded), at most `limit` bytes. `private`: it
    holds a secret, so it may not be readable by every user either. UnsafeFile otherwise, with
    what is wrong and the fix; the file's contents are never part of it."""
    path = Path(path).expanduser()
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UnsafeFile("does not exist", "create it" + (", readable by you alone (mode 0600)" if private else "")
                         + ", or point the knob at the file that holds it") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile("is a symbolic link: vllm-fleet reads only the file itself, so that a link to another "
                             "file (an SSH key, a cloud credentials file) is never read and pushed to the hosts",
                             "point the knob at the file itself (`readlink -f` shows where the link leads), "
                             "or copy what belongs there into a file of its own, mode 0600") from None
        if exc.errno == errno.ENXIO:
            raise UnsafeFile("is a socket or a device with nothing behind it, not a regular file",
                             "point the knob at a regular file") from None
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise UnsafeFile(f"cannot be read by {_user(os.geteuid())}",
                             "run vllm-fleet as the user who owns it, or give it to that user (chown)") from None
        raise UnsafeFile(f"cannot be opened ({exc.strerror})", "point the knob at a readable regular file") from None
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind:
            raise UnsafeFile(f"is {kind}", "point the knob at a regular file")
        if st.st_uid not in (os.geteuid(), 0):
            raise UnsafeFile(f"belongs to {_user(st.st_uid)}, not to {_user(os.geteuid())} who runs vllm-fleet: "
                             "its owner can change it", "use a file of your own (or chown it to yourself)")
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o022:
            raise UnsafeFile(f"is writable by {_writers(mode)} (mode {mode:04o}): whoever can write it picks "
                             "what the fleet trusts", f"chmod go-w {shown(path)}")
        if private and mode & 0o007:
            raise UnsafeFile(f"holds a secret yet every user of this workstation may access it (mode {mode:04o})",
                             f"chmod o-rwx {shown(path)} (0600 or 0640)")
        if st.st_size > limit:
            raise UnsafeFile(f"is {st.st_size} bytes, more than the {limit} such a file can hold: it is not the "
                             "file meant", "point the knob at the right file")
        chunks, size = [], 0
        while size <= limit:  # a file can grow while it is read: never more than limit + 1 bytes
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise UnsafeFile(f"grew past {limit} bytes while it was read", "point the knob at the right file")
        return b"".join(chunks)
    finally:
        os.close(fd)


def directory_problem(path: Path) -> tuple[str, str] | None:
    """(problem, fix) when the existing directory `path` cannot hold the workstation's keys: not a
    directory, not the user's, or writable by anyone else (who could then replace the seed or the
    fleet CA, and with them every host's key and what every client trusts). None when it serves, or
    does not exist yet."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror})", "make it a directory of your own, mode 0700"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory", "point vllm_workstation_dir at a directory of your own (mode 0700)"
    if st.st_uid != os.geteuid():
        return (f"belongs to {_user(st.st_uid)}, not to {_user(os.geteuid())} who runs vllm-fleet: its owner "
                "could replace the fleet CA or the seed of the hosts' keys",
                "run vllm-fleet as its owner, or chown it (and what it holds) to yourself")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        return (f"is writable by {_writers(mode)} (mode {mode:04o}): they could replace the fleet CA or the seed "
                "of the hosts' keys", f"chmod go-w {shown(path)}")
    return None


def _writers(mode: int) -> str:
    return " and ".join(who for bit, who in ((0o020, "its group"), (0o002, "every user")) if mode & bit)


def ensure_directory(path: Path) -> None:
    """`path` made (0700, parents as needed) when missing; UnsafeFile when it exists and cannot hold
    the workstation's keys (directory_problem)."""
    problem = directory_problem(path)
    if problem:
        raise UnsafeFile(*problem)
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
