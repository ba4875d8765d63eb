"""Who may own what the deploy manages on a host (pure: judged from facts read in the deploy's batch).

The deploy creates a user for each service and directories for them; it never takes over what
belongs to someone else. A service user is one the deploy made (account_problem); a directory it
manages is new, or already its own, below directories only root can change (directory_problem):
otherwise a person's account, another daemon's files or a path another user controls would be handed
to a service, or root's files to a path someone else can swap.
"""

from __future__ import annotations

import posixpath
from typing import Any

from vllm_fleet.kinds import printable

#: The comment (GECOS) of every user the deploy creates: how a later deploy knows the user is its own.
ACCOUNT_COMMENT = "vllm-fleet service user"
#: Debian's SYS_UID_MAX (/etc/login.defs): `useradd -r` gives a system user an id at most this.
SYSTEM_UID_MAX = 999


def account_problem(found: dict, user: str, group: str, *, legacy_home: str | None = None) -> str | None:
    """Why the host's account `user` (the ServiceAccount fact) may not become a vllm-fleet service
    user, or None. A service user is one the deploy created (its comment is ACCOUNT_COMMENT), or
    none exists yet: an account of a person, of another daemon or the OS (nobody) would hand that
    account's files, processes and logins to the service, and the service's secrets to it. A group
    of that name that exists without the user must have no members (who would read the service's
    files). `legacy_home`, for the vLLM user: also its own (and given the comment) is an uncommented
    system user with that home, no login shell and its own group, the form vllm-fleet 0.1 made it in."""
    existing, existing_group = found.get("user"), found.get("group")
    if existing is None:
        others = [m for m in (existing_group or {}).get("members", []) if m != user]
        if others:
            return (f"group {group} exists, with members {', '.join(map(repr, others[:3]))}, and user {user} does not: "
                    "they would read the service's files")
        return None
    if existing["comment"] == ACCOUNT_COMMENT:
        return None
    if (legacy_home is not None and existing["comment"] == "" and existing["uid"] <= SYSTEM_UID_MAX
            and existing["home"] == legacy_home and existing["shell"] == "/usr/sbin/nologin"
            and existing["group"] == group):
        return None
    comment = existing["comment"] if printable(existing["comment"]) else "(not shown)"
    return (f"user {user} exists (uid {existing['uid']}, home {existing['home']!r}, comment {comment!r}) and was "
            "not created by vllm-fleet: a person's, another daemon's or the OS's account would share its "
            "files, processes and secrets with the service")


def _writable_by_others(mode: int) -> bool:
    """Group- or world-writable, and not sticky (in a sticky directory, such as /tmp, no one but its
    owner or root may rename or delete an entry)."""
    return bool(mode & 0o022) and not mode & 0o1000


def directory_problem(owners: dict[str, dict[str, Any]], path: str, owner: str) -> str | None:
    """Why the deploy may not make or keep `path` as a directory of `owner` (the PathOwners fact
    `owners`), or None. Every directory above it that exists must be root's (or `owner`'s: the
    service user's directories inside its home) and writable by no one else: a user who could rename
    one could put a path of its own in its place, and root would write the service's files (or read
    its config, or run its python) there. The directory itself, if it exists, must be `owner`'s
    already, or an empty one of root's (a mount point made for it): the deploy would chown a directory
    of someone else's, and its files, to the service."""
    parent = posixpath.dirname(path)
    while True:
        found = owners.get(parent)
        if found is not None and (found["user"] not in ("root", owner) or _writable_by_others(found["mode"])):
            who = f"owned by {found['user']}" if found["user"] != "root" else f"mode {found['mode']:o}"
            return (f"{parent} above it is {who}: a user other than root could swap {path} for a directory of "
                    "its own")
        if parent == "/":
            break
        parent = posixpath.dirname(parent)
    found = owners.get(path)
    if found is None or found["user"] == owner or (found["user"] == "root" and found["empty"]):
        return None
    return (f"{path} exists, owned by {found['user']}, with files in it: the deploy would hand it (and them) to "
            f"{owner}")
