"""Step 1's access check and lock, released in step 11: this host's commands run as root, and its
deploy lock is held from before the first fact is read until the run ends. A refused host fails
alone; the others go on."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api.exceptions import PyinfraError
from pyinfra.operations import python

from vllm_fleet.connect import lock as host_lock
from vllm_fleet.connect import remote
from vllm_fleet.connect import ssh_lost

from .state import DeployError, Deployment, record_failure


def _login_user() -> str:
    return str(remote.login_user(host) or "the login user")


def access_problem() -> str | None:
    """1. Can this host's commands run as root (with its `_sudo`/`_su_user`/`_doas` arguments)?

    One command, before any fact or change, and only where the deploy lock cannot answer it (the
    lock's own command reports its uid: take_lock), or to say why the lock's command failed.
    A problem is this host's alone: the other hosts go on.
    """
    wrapping = {k: v for k, v in remote.connection_arguments(host).items()
                if k in ("_sudo", "_su_user", "_doas", "_dzdo") and v}
    ok, out = remote.privilege_check(host, "id -u")
    said = " ".join(out.split())[-300:]
    uid = out.strip().splitlines()[-1] if out.strip() else ""
    if not ok and wrapping:
        how = "/".join(k.lstrip("_") for k in wrapping)
        return (f"host {host.name}: {_login_user()} cannot run commands as root through {how} "
                f"({how} said: {said or 'nothing'}). Grant it password-less sudo, e.g. "
                f"'{_login_user()} ALL=(root) NOPASSWD: ALL' in /etc/sudoers.d/vllm-fleet (README: "
                "'The login user'), or set _sudo_password; nothing was changed on this host")
    if not ok:
        return f"host {host.name}: `id -u` failed ({said or 'no output'}); nothing was changed on this host"
    if uid != "0":
        return (f"host {host.name}: commands run as uid {uid} ({_login_user()}), not root, and the "
                "deploy writes /etc and systemd units. Set `_sudo = True` for this host (with password-less "
                "sudo for that user), or log in as root; nothing was changed on this host")
    return None


def refuse_host(problem: str) -> None:
    """Fail this host with `problem` before anything runs on it (a dry run too: it exits non-zero);
    the other hosts go on. When it is the last host, the run stops with the problem as its error."""
    logger.error(f"{host.print_prefix}{problem}")
    record_failure(host, problem)
    try:
        host.state.fail_hosts({host})
    except PyinfraError:  # "No hosts remaining!": say why instead
        raise DeployError(problem) from None


def take_lock(dry: bool, command: str) -> bool:
    """Check that this host's commands run as root and hold its deploy lock from before the first
    fact is read until the run ends. False when the host is refused (nothing was changed on it): no
    root through its _sudo/_su_user/..., or another deploy holds the lock. `command`: what started
    the run (RunOptions.command), recorded beside the lock for whoever it refuses.

    The lock's own command answers both in one round trip: it runs wrapped like any fact and reports
    its uid (vllm_fleet/connect/lock.py). Only when it fails is the host asked why (access_problem), so a
    refused sudo gets its full diagnosis. Without a lock (a dry run, a connector without SSH) the
    access check runs alone.

    Taken while planning, not when the first change executes: what the steps decide comes from the
    facts read in prepare() (facts.get), so those facts must be read under the lock, or a deploy
    that ran between the reading and the lock would be undone by decisions made before it. A dry
    run executes nothing: it takes no lock and never waits for one.
    """
    owner = host_lock.this_owner(command)
    if dry or not host_lock.lockable(host):
        problem = access_problem()
        if problem:
            refuse_host(problem)
            return False
        if not dry:
            logger.info(f"{host.print_prefix}{host_lock.acquire(host, owner)}")  # it says there is no lock
        return True
    try:
        logger.info(f"{host.print_prefix}{host_lock.acquire(host, owner)}")
    except host_lock.LockBusy as exc:
        refuse_host(str(exc))
        return False
    except host_lock.LockFailed as exc:
        if ssh_lost.transport_gone(host.connector):  # nothing to ask the host: say what happened
            refuse_host(f"{exc}; the SSH connection to {host.name} was lost: run the deploy again once "
                        "the host is reachable; nothing was changed on this host")
        else:
            refuse_host(access_problem() or f"{exc}; nothing was changed on this host")
        return False
    return True


def _release_lock(state, host) -> None:  # at execution
    host_lock.release(host)


def release_lock(deployment: Deployment) -> None:
    """11. Release it early; a run that stops before this step releases it when its SSH session ends."""
    python.call(name="Release the deploy lock", function=_release_lock)
