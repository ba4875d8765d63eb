"""One deploy at a time per host: a lock held on the host for as long as the deploy's SSH connection.

The deploy opens one extra SSH channel on its own connection and runs `hold_command` in it, wrapped
with the host's _sudo/_su_user/... as pyinfra wraps a fact: the shell takes `flock` on LOCK_FILE,
writes who holds it to OWNER_FILE, prints `LOCKED uid=<its uid>` and then blocks reading the channel.
That answer is also the deploy's check that its commands run as root (one round trip for both): a
uid other than 0, or no answer at all (sudo refused), is a LockFailed that the deploy diagnoses.
The lock lives exactly as long as that channel:

- the deploy ends (or `release` runs): the channel closes, `cat` sees end of input, the lock goes;
- the deploy is killed (Ctrl-C, SIGKILL, a crashed workstation): its TCP connection closes, sshd ends
  the session, same thing. No lease to expire and no clean-up step that a killed deploy would skip.

A second deploy that finds the lock held refuses that host before its first change, and says who
holds it. A lock whose holder is a process of THIS workstation that no longer exists (an SSH session
the host has not noticed is dead, e.g. after the network dropped) is broken and taken over; one held
from another workstation is never broken automatically: `vllm-fleet unlock` does it on purpose.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import socket
import time
from typing import Any

from paramiko import SSHException

from vllm_fleet.connect import remote

LOCK_DIR = "/run/vllm-fleet"  # tmpfs: a reboot also ends every deploy
LOCK_FILE = f"{LOCK_DIR}/deploy.lock"
OWNER_FILE = f"{LOCK_DIR}/deploy.owner"
ACQUIRE_TIMEOUT_S = 30  # for the host to answer LOCKED/BUSY, not for the lock to become free


def _process_start(pid: int) -> str | None:
    """The kernel's start time of pid (field 22 of /proc/PID/stat): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def this_owner(command: str) -> dict[str, Any]:
    """Who is deploying: written on the host beside the lock, shown to anyone the lock refuses.
    `command`: what started the deploy (its caller's words, without secrets: `redacted`)."""
    pid = os.getpid()
    return {"workstation": socket.gethostname(), "user": getpass.getuser(), "pid": pid,
            "pid_start": _process_start(pid), "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": command[:300]}


_SECRET_OPTION = re.compile(r"password|secret|token|key-password|^--data$|^-d$", re.I)


def redacted(argv: list[str]) -> list[str]:
    """The command line without what may be a secret (`--ssh-password X`, `--data _sudo_password=X`,
    `--sudo-password=X`): it is written on the host and shown to whoever the lock refuses."""
    out, hide_next = [], False
    for arg in argv:
        name, eq, _value = arg.partition("=")
        if hide_next:
            out.append("<hidden>")
            hide_next = False
        elif arg.startswith("-") and _SECRET_OPTION.search(name):
            out.append(f"{name}=<hidden>" if eq else arg)
            hide_next = not eq
        elif eq and _SECRET_OPTION.search(name):
            out.append(f"{name}=<hidden>")
        else:
            out.append(arg)
    return out


def owner_is_gone(owner: dict[str, Any]) -> bool:
    """True only when the holder was started on this workstation and that process no longer runs."""
    if owner.get("workstation") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    if owner["pid"] == os.getpid():
        return False
    start = _process_start(owner["pid"])
    return start is None or (owner.get("pid_start") is not None and start != owner["pid_start"])


def hold_command(owner: dict[str, Any], lock_dir: str = LOCK_DIR) -> str:
    """Shell run in the lock's own channel. Run as any user but root it prints `NOTROOT uid=N` and
    exits 5, touching nothing. As root it prints `LOCKED uid=0` then blocks until the channel closes,
    or prints BUSY and the holder's OWNER_FILE and exits 3. The holder's process group is recorded
    so a stale lock can be broken (`break_command`)."""
    q = shlex.quote
    lock_file, owner_file = q(f"{lock_dir}/deploy.lock"), q(f"{lock_dir}/deploy.owner")
    # Who it runs as is checked first: a user other than root that may write lock_dir must not
    # take (or create) the lock a real deploy then finds held.
    return (f"uid=$(id -u); if [ \"$uid\" != 0 ]; then echo \"NOTROOT uid=$uid\"; exit 5; fi; "
            f"umask 077; mkdir -p {q(lock_dir)} && exec 9>>{lock_file} || exit 4; "
            f"if flock -n 9; then "
            f"pgid=$(ps -o pgid= -p $$ | tr -d ' '); "
            f"printf '%s\\n' {q(json.dumps(owner))} \"$pgid\" > {owner_file}.tmp && "
            f"mv -f {owner_file}.tmp {owner_file}; echo \"LOCKED uid=$uid\"; cat >/dev/null; "
            f"rm -f {owner_file}; "
            f"else echo BUSY; cat {owner_file} 2>/dev/null; exit 3; fi")


def break_command(lock_dir: str = LOCK_DIR) -> str:
    """End the holder's session processes (its recorded process group), then wait for the lock."""
    q = shlex.quote
    lock_file, owner_file = q(f"{lock_dir}/deploy.lock"), q(f"{lock_dir}/deploy.owner")
    # Kill only while the lock is held: then the recorded group is the live holder's, never a reused id.
    return (f"mkdir -p {q(lock_dir)} && exec 9>>{lock_file} || exit 4; "
            f"if ! flock -n 9; then pgid=$(sed -n 2p {owner_file} 2>/dev/null); "
            f"if [ -n \"$pgid\" ] && [ \"$pgid\" -gt 1 ]; then kill -TERM -\"$pgid\" 2>/dev/null; fi; "
            f"flock -w 10 9 || exit 5; fi; rm -f {owner_file}; echo FREE")


def parse_busy(lines: list[str]) -> dict[str, Any]:
    """The holder from a BUSY answer: OWNER_FILE's JSON line (empty when unknown)."""
    for line in lines:
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                break
    return {}


def describe(owner: dict[str, Any]) -> str:
    if not owner:
        return "another deploy (holder unknown)"
    return (f"{owner.get('user', '?')}@{owner.get('workstation', '?')} pid {owner.get('pid', '?')} "
            f"since {owner.get('since', '?')} ({owner.get('command', '?')})")


class LockBusy(Exception):
    """The host is being deployed by someone else: nothing was changed on it."""


class LockFailed(Exception):
    """The lock's command did not take the lock (sudo refused it, it ran as another user than root,
    the connection failed): nothing was changed on the host; the caller says why (deploy.py asks
    the host's sudo/su/doas for the reason, as its access check)."""


def lockable(host) -> bool:
    """A host reached over SSH has a session to tie the lock to; @local, @docker, @fake have not."""
    client = getattr(host.connector, "client", None)
    return client is not None and client.get_transport() is not None


# host name -> the open channel that holds that host's lock (module state: one per pyinfra run)
_HELD: dict[str, Any] = {}


ANSWERS = ("LOCKED", "BUSY", "NOTROOT")


def answer_of(lines: list[str]) -> list[str]:
    """The lock command's answer line, split (`LOCKED uid=0`, `BUSY`, `NOTROOT uid=1000`); what a
    login shell printed before it (a banner, a message of the day) is skipped. [] when none came."""
    return next((line.split() for line in lines if line.split()[:1] and line.split()[0] in ANSWERS), [])


def _read_answer(channel, timeout: float) -> list[str]:
    channel.settimeout(timeout)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = channel.recv(4096)
        except socket.timeout:
            break
        if not chunk:
            break
        data += chunk
        complete = data.decode(errors="replace").split("\n")[:-1]  # lines ended by a newline
        answer = answer_of(complete)[:1]
        if answer == ["LOCKED"] or (answer in (["BUSY"], ["NOTROOT"]) and channel.exit_status_ready()):
            break
    return data.decode(errors="replace").splitlines()


def _said(channel) -> str:
    """What the lock's command wrote on stderr (sudo's refusal, a shell error), for the message."""
    try:
        return channel.recv_stderr(4096).decode(errors="replace").strip() if channel.recv_stderr_ready() else ""
    except (OSError, EOFError):
        return ""


def acquire(host, owner: dict[str, Any]) -> str:
    """Take the deploy lock of a connected pyinfra host; raises LockBusy naming the holder, and
    LockFailed when the lock's command could not take it as root (see the module's docstring).

    Returns a line for the log. Hosts reached through a connector without an SSH client (@local,
    @docker) are not locked: there is no channel to tie the lock to.
    """
    if not lockable(host):
        return f"no deploy lock (connector {type(host.connector).__name__} has no SSH session)"
    release(host)  # a channel left from an earlier run in this process (its connection is gone)
    broken = ""
    for attempt in (1, 2):
        try:
            transport = host.connector.client.get_transport()
            if transport is None:
                raise EOFError("the SSH connection is closed")
            channel = transport.open_session()
            # With the host's _sudo/_su_user/...: the lock lives under /run, which only root may write.
            channel.exec_command(remote.wrapped_command(host, hold_command(owner)))
            lines = _read_answer(channel, ACQUIRE_TIMEOUT_S)
        except (SSHException, EOFError, OSError) as exc:  # the connection failed under the channel
            raise LockFailed(f"host {host.name}: could not open the deploy lock's SSH channel: {exc}") from exc
        answer = answer_of(lines)
        if answer[:1] == ["NOTROOT"]:
            channel.close()
            raise LockFailed(f"host {host.name}: the deploy lock's command ran as {' '.join(answer[1:])}, not root")
        if answer[:1] == ["LOCKED"]:
            if answer[1:] != ["uid=0"]:
                channel.close()  # it holds a lock it must not: let it go at once
                raise LockFailed(f"host {host.name}: the deploy lock's command ran as "
                                 f"{' '.join(answer[1:]) or 'an unknown user'}, not root")
            _HELD[host.name] = channel
            return f"deploy lock {LOCK_FILE} taken{broken}"
        said = _said(channel)
        channel.close()
        holder = parse_busy(lines)
        if answer[:1] != ["BUSY"]:
            raise LockFailed(f"host {host.name}: could not take the deploy lock {LOCK_FILE}: "
                             f"{' '.join(lines + [said]).strip()[-300:] or 'no answer'}")
        if attempt == 1 and owner_is_gone(holder):
            ok, _out, _err = remote.run(host, break_command(), timeout=30)
            if ok:
                broken = (f" (after breaking a stale lock of {describe(holder)}: that process of this "
                          "workstation is gone)")
                continue
        raise LockBusy(
            f"host {host.name} is being deployed by {describe(holder)}; this deploy changed nothing "
            f"on it. Wait for that deploy to end and run again; if it is gone (its workstation "
            f"crashed or lost the network), break the lock: vllm-fleet unlock INVENTORY --limit "
            f"{host.name}")
    raise AssertionError("unreachable")


def release(host) -> None:
    """Close the lock's channel: the host's `cat` sees end of input and the lock is released."""
    channel = _HELD.pop(host.name, None)
    if channel is not None:
        try:
            channel.shutdown_write()
        except (OSError, EOFError):  # paramiko: the connection is already gone, and the lock with it
            pass
        channel.close()
