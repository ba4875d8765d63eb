"""pyinfra facts vllm-fleet reads from a host: one command each, parsed in `process`.

A deploy reads them in two batches (`prefetch`: one remote command runs many facts) and through
`get`, which answers a fact once per run per host: pyinfra 3.10 runs a fact's command again on
every `host.get_fact`, and an operation's body runs twice (to plan, then to execute), so without
the memo a no-op deploy cost dozens of commands per host. See `prefetch` and `get`.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from pyinfra.api import FactBase

from vllm_fleet.host import gpu_topology, host_packages
from vllm_fleet.config import GpuSpec

MANAGED_MARKER = "# Managed by vllm-fleet"  # the first line of every file the deploy writes
# Unit files vllm-fleet wrote (a unit without the marker is the user's own and is left alone).
MANAGED_UNIT_FILES = f"grep -l '^{MANAGED_MARKER}' /etc/systemd/system/vllm-*.service 2>/dev/null"

GPU_QUERY = ("index,pci.bus_id,name,memory.total,memory.used,uuid,compute_cap,driver_version,"
             "mig.mode.current")


def parse_gpu_csv(lines: list[str]) -> list[GpuSpec]:
    """Parse `nvidia-smi --query-gpu=GPU_QUERY --format=csv[,noheader],nounits` into PCI order.

    Never raises: a value nvidia-smi could not read ("[N/A]", "[Unknown Error]", ...) is kept in
    the GpuSpec's `unreadable`, and `gpu_support.preflight` turns it into an error that names the
    host, the GPU and the field. Rows without the trailing fields (older callers) leave the driver
    and MIG mode unknown."""
    from vllm_fleet.gpu_support import gpus_from_rows, parse_csv_rows
    return gpus_from_rows(parse_csv_rows(lines, GPU_QUERY.split(",")))


class NvidiaGpus(FactBase):
    """GPUs from nvidia-smi, in PCI bus order; None when the host has no nvidia-smi.

    Each GpuSpec carries the driver version and MIG mode, and the fields nvidia-smi could not read
    (see parse_gpu_csv); `gpu_support.preflight` judges them before any host change."""

    #: What every driver answers (R470 has no compute_cap field: huggingface/candle#733).
    FALLBACK_QUERY = "index,pci.bus_id,name,memory.total,memory.used,uuid,driver_version"

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        # Drivers without compute_cap refuse the whole query: then ask for what every
        # driver answers, with a header (parse_gpu_csv maps columns by it), so the driver version
        # still reaches preflight and is refused with the version needed.
        return (f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>/dev/null || "
                f"nvidia-smi --query-gpu={self.FALLBACK_QUERY} --format=csv,nounits")

    def default(self):
        return None

    def process(self, output):
        return parse_gpu_csv(list(output))


TOPOLOGY_SOURCE = (Path(__file__).parent / "gpu_topology.py").read_text()


def topology_command(python: str) -> str:
    """Run gpu_topology.py with the vLLM environment's `python`; without it (no environment yet),
    or if the probe crashes, print an 'unavailable' result instead. Always exits 0."""
    py = shlex.quote(python)

    def unavailable(reason: str) -> str:
        return "echo " + shlex.quote(gpu_topology.RESULT_PREFIX + json.dumps(gpu_topology.unavailable(reason)))

    return (f"if [ -x {py} ]; then {py} -c {shlex.quote(TOPOLOGY_SOURCE)} || "
            f"{unavailable(f'the GPU topology probe failed under {python}')}; "
            f"else {unavailable(f'no vLLM environment yet ({python} is missing)')}; fi")


class GpuTopology(FactBase):
    """The GPUs as NVML sees them, with the vLLM environment's pynvml: P2P and NVLink between GPU
    pairs, and each GPU's compute processes (gpu_topology.py documents the result).
    {"available": False, "reason": ...} without the environment, pynvml or the NVIDIA driver."""

    def command(self, python: str) -> str:
        return topology_command(python)

    def default(self):
        return gpu_topology.unavailable("the GPU topology probe could not run")

    def process(self, output):
        return gpu_topology.parse_output(output)


class PathsPresent(FactBase):
    """Which of the given paths exist on the host: {path: bool}."""

    def command(self, paths: tuple[str, ...]) -> str:
        checks = " ".join(shlex.quote(p) for p in paths)
        return f"for p in {checks}; do if [ -e \"$p\" ]; then echo \"1 $p\"; else echo \"0 $p\"; fi; done"

    def default(self):
        return {}

    def process(self, output):
        out = {}
        for line in output:
            flag, _, path = line.partition(" ")
            out[path] = flag == "1"
        return out


class InterfaceAddresses(FactBase):
    """The addresses (IPv4 and IPv6, without prefix length) of one network interface; None when the
    host has no interface of that name. A multi-node instance's node checks its own address on the
    nodes' network (vllm_private_interface) against the one the group uses for it."""

    def command(self, interface: str) -> str:
        quoted = shlex.quote(interface)
        return f"if ip -o addr show dev {quoted} >/dev/null 2>&1; then ip -o addr show dev {quoted}; else echo none; fi"

    def default(self):
        return None

    def process(self, output):
        lines = [line for line in output if line.strip()]
        if lines == ["none"]:
            return None
        found = []
        for line in lines:  # "2: eth0    inet 10.0.0.5/24 brd ... scope global eth0"
            words = line.split()
            for family in ("inet", "inet6"):
                if family in words and words.index(family) + 1 < len(words):
                    found.append(words[words.index(family) + 1].split("/")[0])
        return found


class ModelConfig(FactBase):
    """A local model directory's config.json (None if absent) and the size of its weights."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (f"if [ -f {quoted}/config.json ]; then cat {quoted}/config.json | tr -d '\\n'; echo; "
                f"du -cb {quoted}/*.safetensors {quoted}/*.bin {quoted}/*.gguf 2>/dev/null | tail -n1; "
                f"else echo none; fi")

    def process(self, output):
        lines = list(output)
        if not lines or lines[0] == "none":
            return None
        try:
            config = json.loads(lines[0])
        except ValueError:
            return None
        size = int(lines[1].split()[0]) if len(lines) > 1 and lines[1].split() else 0
        return {"config": config, "weights_bytes": size}


class ManagedUnits(FactBase):
    """Names of vllm-*.service units that vllm-fleet wrote (they carry its marker line)."""

    def command(self) -> str:
        return f"{MANAGED_UNIT_FILES} | xargs -r -n1 basename || true"

    def default(self):
        return []

    def process(self, output):
        return sorted(line.strip() for line in output if line.strip())


class LinkTarget(FactBase):
    """Where a symlink points (None if it is not a link)."""

    def command(self, path: str) -> str:
        return f"readlink {shlex.quote(path)} || true"

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return lines[0] if lines else None


class InstalledEnvironment(FactBase):
    """The environment `current` points to and its spec (vLLM version), from its marker file."""

    def command(self, current: str, marker: str) -> str:
        link, mark = shlex.quote(current), shlex.quote(marker)
        return f"if [ -f {link}/{mark} ]; then readlink {link}; cat {link}/{mark}; fi"

    def process(self, output):
        lines = list(output)
        if len(lines) < 2:
            return None
        try:
            return {"name": lines[0].strip(), **json.loads(lines[1])}
        except ValueError:
            return None


class HubModelCached(FactBase):
    """Whether the deploy finished downloading a Hugging Face repo into HF_HOME (hub.complete_marker)."""

    def command(self, hf_home: str, model: str) -> str:
        from vllm_fleet.host.hub import complete_marker

        return f"test -f {shlex.quote(complete_marker(hf_home, model))} && echo complete || true"

    def process(self, output):
        return any(line.strip() == "complete" for line in output)

    def default(self):
        return False


class HostRuntime(FactBase):
    """What the runtime needs from the OS and which package manager the host has, in one command:
    ({need key: present}, "debian" | "rhel" | None). See host_packages.probe_command."""

    def command(self, python_version: str) -> str:
        return host_packages.probe_command(python_version)

    def default(self):
        return {}, None

    def process(self, output):
        return host_packages.parse_probe(list(output))


# --- The state of what the deploy manages -----------------------------------------------------------
# These facts define their shell code once as a `prelude` (shell functions) and a short `call`, so a
# batch (`prefetch`) of hundreds of them stays small: the functions are sent once.

RUNNING_SUBSTATES = ("running", "waiting", "exited", "listening", "mounted")  # pyinfra's SystemdStatus
ENABLED_FILE_STATES = ("enabled", "static")  # pyinfra's SystemdEnabled


def _mode(text: str) -> int | None:
    try:
        return int(text, 8)
    except ValueError:
        return None


class _Prelude(FactBase):
    """A fact whose command is `prelude` (shell functions) followed by `call(...)`."""

    prelude = ""

    def call(self, **kwargs) -> str:
        raise NotImplementedError

    def command(self, **kwargs) -> str:
        return f"{self.prelude}\n{self.call(**kwargs)}"


class FileState(_Prelude):
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


class DirectoryState(_Prelude):
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


class ServiceAccount(_Prelude):
    """A user and a group, from the host's name service (getent):
    {"user": {"name", "uid", "gid", "home", "shell", "group" (primary group's name)} or None,
     "group": {"name", "gid"} or None}."""

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
                               "home": fields[5], "shell": fields[6]}
            elif kind == "primary":
                primary = rest.strip()
            elif kind == "group" and len(fields) >= 3 and fields[2].isdigit():
                out["group"] = {"name": fields[0], "gid": int(fields[2])}
        if out["user"] is not None:
            out["user"]["group"] = primary
        return out


class UnitState(_Prelude):
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


class NewestMtime(_Prelude):
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


# --- Many facts in one command, and a memo per run -------------------------------------------------

@dataclass(frozen=True)
class Query:
    """One fact and its arguments, as `prefetch` and `get` key them."""

    fact: type
    args: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, fact: type, **kwargs) -> "Query":
        return cls(fact, tuple(sorted((k, _frozen(v)) for k, v in kwargs.items())))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)

    def __repr__(self) -> str:  # pyinfra logs a fact's arguments: keep FactBatch's short
        return f"{self.fact.__name__}({', '.join(f'{k}={v!r}' for k, v in self.args)})"


def query(fact: type, **kwargs) -> Query:
    return Query.of(fact, **kwargs)


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


BATCH_START = "##vllm-fleet-fact "
BATCH_END = "##vllm-fleet-fact-end "
MISSING_COMMAND = "##PYINFRA_NOCMD##"  # what pyinfra's own guard prints (pyinfra.api.facts)
# Characters of one batch once quoted: it travels as one argument (sh -c '...'), which Linux caps at
# 128 KiB (MAX_ARG_STRLEN), and `_su_user` quotes it a second time.
BATCH_LIMIT = 56_000


def _part(q: Query) -> tuple[str, str]:
    """(prelude, command) of one query, with pyinfra's "binary absent" guard where the fact has one."""
    fact = q.fact()
    if isinstance(fact, _Prelude):
        prelude, command = fact.prelude, fact.call(**q.kwargs)
    else:
        prelude, command = "", fact.command(**q.kwargs)
    command = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
    required = fact.requires_command(**q.kwargs)
    if required:
        command = (f"if command -v {required} >/dev/null 2>&1; then (\n{command}\n); "
                   f"else echo '{MISSING_COMMAND}'; fi")
    return prelude, command


def batch_command(queries: Iterable[Query]) -> str:
    """One shell command that runs each query's command in a subshell of its own (no input), between
    marker lines that carry its index and exit status; it always exits 0 (see parse_batch)."""
    preludes: list[str] = []
    body: list[str] = []
    for i, q in enumerate(queries):
        prelude, command = _part(q)
        if prelude and prelude not in preludes:
            preludes.append(prelude)
        body.append(f"echo '{BATCH_START}{i}'\n(\n{command}\n) </dev/null\necho \"{BATCH_END}{i} $?\"")
    return "\n".join(preludes + body + ["true"])


def parse_batch(lines: Iterable[str]) -> dict[int, tuple[int, list[str]]]:
    """{index: (exit status, stdout lines)} of each query that ran to its end marker."""
    out: dict[int, tuple[int, list[str]]] = {}
    current: int | None = None
    buffer: list[str] = []
    for line in lines:
        if current is None:
            if line.startswith(BATCH_START) and line[len(BATCH_START):].strip().isdigit():
                current, buffer = int(line[len(BATCH_START):]), []
            continue
        at = line.find(BATCH_END)
        if at < 0:
            buffer.append(line)
            continue
        if at > 0:  # the command's last line had no newline
            buffer.append(line[:at])
        fields = line[at + len(BATCH_END):].split()
        if len(fields) == 2 and fields[0] == str(current) and fields[1].isdigit():
            out[current] = (int(fields[1]), buffer)
        current = None
    return out


class FactBatch(FactBase):
    """Several facts in one remote command: {index: (exit status, stdout lines)}; `prefetch` hands each
    query's lines to its own fact's `process`."""

    def command(self, queries: tuple[Query, ...]) -> str:
        return batch_command(queries)

    def default(self):
        return None

    def process(self, output):
        return parse_batch(list(output))


def _answer(q: Query, lines: list[str]) -> Any:
    """What pyinfra's get_fact returns for these stdout lines of the fact's command (exit status 0)."""
    fact = q.fact()
    if not lines or lines == [MISSING_COMMAND]:
        return fact.default()
    return fact.process(lines)


def _memo(host) -> dict[Query, Any]:
    """This host's facts of this run (a new pyinfra State starts afresh)."""
    state = getattr(host, "state", None)
    held = getattr(host, "_vllm_fleet_facts", None)
    if held is None or held[0] is not state:
        held = (state, {})
        setattr(host, "_vllm_fleet_facts", held)
    return held[1]


def _quoted_size(text: str) -> int:
    return len(shlex.quote(text))


def _chunks(queries: list[Query]) -> Iterable[list[Query]]:
    """The queries in batches whose command stays within BATCH_LIMIT (each prelude counted once)."""
    chunk: list[Query] = []
    preludes: set[str] = set()
    size = 0
    for q in queries:
        prelude, command = _part(q)
        cost = _quoted_size(command) + 2 * len(BATCH_END) + 40
        extra = _quoted_size(prelude) if prelude and prelude not in preludes else 0
        if chunk and size + cost + extra > BATCH_LIMIT:
            yield chunk
            chunk, preludes, size = [], set(), 0
            extra = _quoted_size(prelude) if prelude else 0
        chunk.append(q)
        preludes.add(prelude)
        size += cost + extra
    if chunk:
        yield chunk


def prefetch(host, queries: Iterable[Query]) -> None:
    """Read every fact of `queries` that this run has not read yet on this host in ONE remote
    command (another one only past BATCH_LIMIT characters); `get` then answers them without one.

    A query whose command failed there is not kept: `get` runs it alone, so pyinfra reports its
    failure as it does for any fact. A host that answers nothing (a stand-in in tests) keeps nothing.
    """
    memo = _memo(host)
    todo = [q for q in dict.fromkeys(queries) if q not in memo]
    for chunk in _chunks(todo):
        raw = host.get_fact(FactBatch, queries=tuple(chunk))
        if not isinstance(raw, dict):
            continue
        for i, q in enumerate(chunk):
            if i in raw and raw[i][0] == 0:
                memo[q] = _answer(q, raw[i][1])


def get(host, fact: type, **kwargs) -> Any:
    """`host.get_fact(fact, **kwargs)`, read once per run: from `prefetch`'s batch, or by the fact's
    own command the first time. pyinfra runs an operation's body to plan it and again to execute
    it; both see what the host was when the run planned it. That holds because the deploy lock is
    taken before the first fact is read (deploy/access.py take_lock: no other deploy changes the host in
    between) and no two of vllm-fleet's operations manage the same path or unit (deploy/prepare.py
    refuses a plan where two would)."""
    memo = _memo(host)
    q = Query.of(fact, **kwargs)
    if q not in memo:
        memo[q] = host.get_fact(fact, **kwargs)
    return memo[q]


class FactUnreadable(Exception):
    """A fact's command failed on the host (RemoteFacts): the message names the host and the fact."""


class RemoteFacts:
    """A connected host's facts outside a deploy (`vllm-fleet status`): the deploy's own fact commands,
    batch (`prefetch`) and processing, sent with vllm_fleet.host.remote.run (the host's _sudo/_su_user/...
    applied). It stands in for pyinfra's host in `prefetch` and `get`, so status reads and plans
    from exactly what the deploy reads (discovery.discover), in one remote command."""

    def __init__(self, host, timeout: int = 120):
        self.host, self.timeout = host, timeout
        self.name = host.name
        self.print_prefix = getattr(host, "print_prefix", f"[{host.name}] ")
        self.state = object()  # this reader's facts are its own (facts._memo keys a run by its state)

    def get_fact(self, fact: type, **kwargs) -> Any:
        from vllm_fleet.host import remote

        queries = kwargs["queries"] if fact is FactBatch else (Query.of(fact, **kwargs),)
        ok, out, err = remote.run(self.host, batch_command(queries), timeout=self.timeout)
        answers = parse_batch(out.splitlines()) if ok else {}
        if fact is FactBatch:
            return answers
        status, lines = answers.get(0, (None, []))
        if status != 0:
            said = " ".join(err.split())[-300:] or (f"exit status {status}" if status is not None else "no answer")
            raise FactUnreadable(f"host {self.name}: could not read {fact.__name__}: {said}")
        return _answer(queries[0], lines)
