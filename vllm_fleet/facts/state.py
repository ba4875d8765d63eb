"""pyinfra facts that read the state of what the deploy manages: files, directories, the service
account, units, and the newest mtime among an instance's files (one command each, parsed in
`process`)."""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FactBase

# These facts define their shell code once as a `prelude` (shell functions) and a short `call`, so a
# batch (`prefetch`) of hundreds of them stays small: the functions are sent once.

RUNNING_SUBSTATES = ("running", "waiting", "exited", "listening", "mounted")  # pyinfra's SystemdStatus
ENABLED_FILE_STATES = ("enabled", "static")  # pyinfra's SystemdEnabled


def _mode(text: str) -> int | None:
    try:
        return int(text, 8)
    except ValueError:
        return None


class PreludeFact(FactBase):
    """A fact whose command is `prelude` (shell functions) followed by `call(...)`; a batch
    (facts.batch_command) sends each prelude once."""

    prelude = ""

    def call(self, **kwargs) -> str:
        raise NotImplementedError

    def command(self, **kwargs) -> str:
        return f"{self.prelude}\n{self.call(**kwargs)}"


class FileState(PreludeFact):
    """A file's mode, owner, group and sha256, without reading its contents back (secret files):
    {"kind": "file", "mode": 0o640, "user": "root", "group": "vllm", "sha256": "<hex>"};
    {"kind": "absent"}; {"kind": "other"} (a directory, a symlink, a device: never written through)."""

    prelude = ('vf_file() { if [ -L "$1" ]; then echo other; elif [ -f "$1" ]; then '
               's=$(stat -c \'%a %U %G\' -- "$1") && h=$(sha256sum < "$1") && echo "file $s ${h%% *}"; '
               'elif [ -e "$1" ]; then echo other; else echo absent; fi; }')

    def call(self, path: str) -> str:
        return f"vf_file {shlex.quote(path)}"

    def command(self, path: str) -> str:
        return f"{self.prelude}\n{self.call(path)}"

    def default(self):
        return None

    def process(self, output):
        parts = (list(output) or [""])[0].split()
        if parts[:1] == ["file"] and len(parts) == 5 and _mode(parts[1]) is not None:
            return {"kind": "file", "mode": _mode(parts[1]), "user": parts[2], "group": parts[3],
                    "sha256": parts[4]}
        if parts[:1] == ["absent"]:
            return {"kind": "absent"}
        return {"kind": "other"}


class DirectoryState(PreludeFact):
    """A directory's mode, owner and group: {"kind": "dir", "mode": 0o750, "user": "root", "group":
    "vllm"}; {"kind": "absent"}; {"kind": "other"} (a file, a symlink, ...)."""

    prelude = ('vf_dir() { if [ -L "$1" ]; then echo other; elif [ -d "$1" ]; then '
               's=$(stat -c \'%a %U %G\' -- "$1") && echo "dir $s"; '
               'elif [ -e "$1" ]; then echo other; else echo absent; fi; }')

    def call(self, path: str) -> str:
        return f"vf_dir {shlex.quote(path)}"

    def command(self, path: str) -> str:
        return f"{self.prelude}\n{self.call(path)}"

    def default(self):
        return None

    def process(self, output):
        parts = (list(output) or [""])[0].split()
        if parts[:1] == ["dir"] and len(parts) == 4 and _mode(parts[1]) is not None:
            return {"kind": "dir", "mode": _mode(parts[1]), "user": parts[2], "group": parts[3]}
        if parts[:1] == ["absent"]:
            return {"kind": "absent"}
        return {"kind": "other"}


class ServiceAccount(PreludeFact):
    """A user and a group, from the host's name service (getent):
    {"user": {"name", "uid", "gid", "comment", "home", "shell", "group" (primary group's name)} or None,
     "group": {"name", "gid", "members" (the names listed in the group entry)} or None}."""

    prelude = ('vf_account() { p=$(getent passwd "$1") && echo "passwd $p" && echo "primary $(id -gn "$1")"; '
               'g=$(getent group "$2") && echo "group $g"; return 0; }')

    def call(self, user: str, group: str) -> str:
        return f"vf_account {shlex.quote(user)} {shlex.quote(group)}"

    def command(self, user: str, group: str) -> str:
        return f"{self.prelude}\n{self.call(user, group)}"

    def default(self):
        return {"user": None, "group": None}

    def process(self, output):
        out: dict[str, Any] = {"user": None, "group": None}
        primary = None
        for line in output:
            kind, _, rest = line.partition(" ")
            fields = rest.split(":")
            if kind == "passwd" and len(fields) >= 7 and fields[2].isdigit() and fields[3].isdigit():
                out["user"] = {"name": fields[0], "uid": int(fields[2]), "gid": int(fields[3]),
                               "comment": fields[4], "home": fields[5], "shell": fields[6]}
            elif kind == "primary":
                primary = rest.strip()
            elif kind == "group" and len(fields) >= 3 and fields[2].isdigit():
                members = fields[3].strip() if len(fields) >= 4 else ""
                out["group"] = {"name": fields[0], "gid": int(fields[2]),
                                "members": [m for m in members.split(",") if m]}
        if out["user"] is not None:
            out["user"]["group"] = primary
        return out


class UnitState(PreludeFact):
    """What systemd says of a unit: {"load_state", "active_state", "sub_state", "unit_file_state",
    "running" (SubState as pyinfra's SystemdStatus counts it), "enabled" (enabled or static, as
    SystemdEnabled), "need_daemon_reload", "main_pid", "started" (epoch seconds of the main process's
    start, 0 without one, None when it could not be read)}. A unit systemd does not know reads as not running, not enabled."""

    # TZ=UTC for both: `date -d` then parses what systemctl prints whatever the host's zone is called.
    prelude = ('vf_unit() { systemctl show -p LoadState -p ActiveState -p SubState -p UnitFileState '
               '-p NeedDaemonReload -p MainPID "$1" 2>/dev/null; '
               'ts=$(TZ=UTC systemctl show -p ExecMainStartTimestamp --value "$1" 2>/dev/null); '
               'if [ -n "$ts" ]; then echo "StartEpoch=$(TZ=UTC date -d "$ts" +%s 2>/dev/null)"; fi; return 0; }')

    def call(self, unit: str) -> str:
        return f"vf_unit {shlex.quote(unit)}"

    def command(self, unit: str) -> str:
        return f"{self.prelude}\n{self.call(unit)}"

    def default(self):
        return self.process([])

    def process(self, output):
        props = dict(line.split("=", 1) for line in output if "=" in line)
        pid = int(props["MainPID"]) if props.get("MainPID", "").isdigit() else 0
        start = props.get("StartEpoch", "")
        return {"load_state": props.get("LoadState") or None, "active_state": props.get("ActiveState") or None,
                "sub_state": props.get("SubState") or None, "unit_file_state": props.get("UnitFileState") or None,
                "running": props.get("SubState") in RUNNING_SUBSTATES,
                "enabled": props.get("UnitFileState") in ENABLED_FILE_STATES,
                "need_daemon_reload": props.get("NeedDaemonReload") == "yes",
                # None: a process whose start time could not be read (unknown, never "stale").
                "main_pid": pid, "started": (int(start) if start.isdigit() else None) if pid else 0}


class NewestMtime(PreludeFact):
    """The newest mtime (epoch seconds) among paths, 0 when none exists. A symlink counts by its own
    mtime (the environment's `current` link changes when the environment is switched).

    With UnitState it tells a process older than its files: a deploy interrupted between writing an
    instance's files and restarting it leaves the old process serving while the files already match
    the plan, so the next run sees no file change and must restart it anyway."""

    prelude = ('vf_newest() { for p in "$@"; do stat -c %Y -- "$p" 2>/dev/null; done | sort -n | tail -n 1; '
               'return 0; }')

    def call(self, paths: tuple[str, ...]) -> str:
        return "vf_newest " + " ".join(shlex.quote(p) for p in paths)

    def command(self, paths: tuple[str, ...]) -> str:
        return f"{self.prelude}\n{self.call(paths)}"

    def default(self):
        return 0

    def process(self, output):
        values = [line.strip() for line in output if line.strip().isdigit()]
        return int(values[-1]) if values else 0


class PathOwners(PreludeFact):
    """Who owns each managed directory and every directory above it, as a process there would meet
    them (symbolic links followed): {path: {"mode": 0o755, "user": "root", "empty": bool}} for every
    one of them that exists (a path absent from the answer does not exist). `empty`: it holds no
    entry (read for the managed directories themselves)."""

    prelude = ('vf_owners() { for d in "$@"; do p=$d; while :; do '
               'if [ -e "$p" ]; then s=$(stat -L -c \'%a %U\' -- "$p") && '
               'if [ "$p" = "$d" ] && [ -d "$p" ] && [ -z "$(find "$p" -mindepth 1 -maxdepth 1 -print -quit 2>/dev/null)" ]; '
               'then echo "$s empty $p"; else echo "$s - $p"; fi; fi; '
               '[ "$p" = / ] && break; p=$(dirname -- "$p"); done; done; }')

    def call(self, paths: tuple[str, ...]) -> str:
        return "vf_owners " + " ".join(shlex.quote(p) for p in paths)

    def command(self, paths: tuple[str, ...]) -> str:
        return f"{self.prelude}\n{self.call(paths)}"

    def default(self):
        return {}

    def process(self, output):
        out: dict[str, dict[str, Any]] = {}
        for line in output:
            parts = line.split(" ", 3)
            if len(parts) == 4 and _mode(parts[0]) is not None:
                seen = out.setdefault(parts[3], {"mode": _mode(parts[0]), "user": parts[1], "empty": False})
                seen["empty"] = seen["empty"] or parts[2] == "empty"
        return out
