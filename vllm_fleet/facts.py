"""pyinfra facts vllm-fleet reads from a host: one command each, parsed in `process`."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from pyinfra.api import FactBase

from vllm_fleet import gpu_topology, host_packages
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


class FileSha256(FactBase):
    """sha256 of a file, or None. Used for secret files, whose contents must never be read back."""

    def command(self, path: str) -> str:
        return f"sha256sum {shlex.quote(path)} 2>/dev/null | cut -d' ' -f1 || true"

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return lines[0] if lines else None


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
        from vllm_fleet.hub import complete_marker

        return f"test -f {shlex.quote(complete_marker(hf_home, model))} && echo complete || true"

    def process(self, output):
        return any(line.strip() == "complete" for line in output)

    def default(self):
        return False


class ServiceFreshness(FactBase):
    """Is a unit's running process older than its files, and does systemd need a daemon-reload?

    A deploy interrupted between writing an instance's files and restarting it leaves the old process
    serving while the files already match the plan: a re-run sees no file change, so this fact is
    what makes it restart (and reload) anyway. Returns {"main_pid", "started", "newest_file",
    "stale", "need_daemon_reload"}; times are epoch seconds; links count by their own mtime (the
    environment's `current` link changes when the environment is switched).
    """

    def command(self, unit: str, paths: tuple[str, ...]) -> str:
        u = shlex.quote(unit)
        files = " ".join(shlex.quote(p) for p in paths)
        return (f"pid=$(systemctl show -p MainPID --value {u}); "
                f"ts=$(systemctl show -p ExecMainStartTimestamp --value {u}); "
                f"if [ -n \"$ts\" ] && [ \"$pid\" != 0 ]; then start=$(date -d \"$ts\" +%s); else start=0; fi; "
                f"newest=$( (stat -c %Y {files} 2>/dev/null || true) | sort -n | tail -n 1); "
                f"echo \"${{pid:-0}} $start ${{newest:-0}} $(systemctl show -p NeedDaemonReload --value {u})\"")

    def default(self):
        return {"main_pid": 0, "started": 0, "newest_file": 0, "stale": False, "need_daemon_reload": False}

    def process(self, output):
        parts = (list(output) or [""])[0].split()
        if len(parts) < 3 or not all(p.isdigit() for p in parts[:3]):
            return self.default()
        pid, started, newest = (int(p) for p in parts[:3])
        return {"main_pid": pid, "started": started, "newest_file": newest,
                "stale": pid != 0 and started < newest,
                "need_daemon_reload": len(parts) > 3 and parts[3] == "yes"}


class HostRuntime(FactBase):
    """What the runtime needs from the OS and which package manager the host has, in one command:
    ({need key: present}, "debian" | "rhel" | None). See host_packages.probe_command."""

    def command(self, python_version: str) -> str:
        return host_packages.probe_command(python_version)

    def default(self):
        return {}, None

    def process(self, output):
        return host_packages.parse_probe(list(output))
