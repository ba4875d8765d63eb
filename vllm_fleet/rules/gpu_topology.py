"""The GPU topology probe's result, on the workstation: read from the probe's output, matched against
nvidia-smi's GPUs, the other users' processes on them warned of, and summed up in one line.

The probe itself runs on the host: vllm_fleet/payloads/gpu_topology (its docstring says what it
prints); vllm_fleet.facts.gpus sends it.
"""

import json

from vllm_fleet.payloads.gpu_topology.probe import RESULT_PREFIX
from vllm_fleet.payloads.nvidia import normalize_bus_id


#: A process of another user holding at least this much of a GPU is worth a warning: vLLM needs
#: gpu_memory_utilization x total memory free when it starts.
FOREIGN_PROCESS_MIB = 512


def unavailable(reason):
    return {"available": False, "reason": reason}


def parse_output(lines):
    """The probe's result from its output lines (an 'unavailable' result if it printed none)."""
    for line in reversed(list(lines)):
        if line.startswith(RESULT_PREFIX):
            try:
                result = json.loads(line[len(RESULT_PREFIX):])
            except ValueError as exc:
                return unavailable(f"the GPU topology probe printed unreadable JSON: {exc}")
            if isinstance(result, dict) and "available" in result:
                return result
            return unavailable("the GPU topology probe printed an unexpected result")
    return unavailable("the GPU topology probe printed no result")


def mismatch(topology, gpus):
    """Why NVML's GPUs differ from nvidia-smi's `gpus` (GpuSpec-like: index, name, pci_bus_id),
    or None when both list the same bus ids in the same PCI order."""
    smi = [normalize_bus_id(g.pci_bus_id or "") for g in gpus]
    nvml = [g["bus_id"] for g in topology["gpus"]]
    if smi == nvml:
        return None
    left = ", ".join(f"{g.index}: {g.pci_bus_id} {g.name}" for g in gpus) or "none"
    right = ", ".join(f"{g['index']}: {g['bus_id']} {g['name']}" for g in topology["gpus"]) or "none"
    return (f"nvidia-smi and NVML ({topology.get('nvml_module') or 'pynvml'} in the vLLM environment) "
            f"list different GPUs "
            f"({len(gpus)} vs {len(topology['gpus'])}):\n    nvidia-smi: {left}\n    NVML:       {right}")


def foreign_processes(topology, own_units, min_mib=FOREIGN_PROCESS_MIB):
    """Processes on the GPUs that no vllm-fleet unit owns and that hold >= min_mib:
    [{"gpu": index, "gpu_name", "pid", "used_mib", "name", "unit"}]."""
    own = set(own_units)
    out = []
    for gpu in topology.get("gpus", []):
        for proc in gpu.get("processes") or []:
            if proc.get("unit") in own or proc.get("used_mib") is None or proc["used_mib"] < min_mib:
                continue
            out.append({"gpu": gpu["index"], "gpu_name": gpu["name"], **proc})
    return out


def foreign_warnings(host_name, topology, own_units, instances=None, min_mib=FOREIGN_PROCESS_MIB):
    """One warning per foreign process (see foreign_processes); `instances` maps instance names
    to the GPU indices they are planned on, to say whose memory it takes."""
    out = []
    for proc in foreign_processes(topology, own_units, min_mib):
        users = [name for name, gpus in (instances or {}).items() if proc["gpu"] in gpus]
        text = (f"host {host_name}: GPU {proc['gpu']} ({proc['gpu_name']}) has {proc['used_mib']} MiB "
                f"held by pid {proc['pid']} ({proc.get('name') or '?'}, unit {proc.get('unit') or 'none'}), "
                "not a vllm-fleet unit")
        if users:
            text += (f"; instance {', '.join(users)} needs gpu_memory_utilization x total free on it "
                     "when it starts")
        out.append(text)
    return out


def summary(topology):
    """One line for people: NVLink and missing P2P per GPU pair, or why the probe is unavailable."""
    if not topology.get("available"):
        return f"unavailable ({topology.get('reason')})"
    via = topology.get("nvml_module")
    gpus = topology["gpus"]
    nvlink, no_p2p = [], []
    for i in range(len(gpus)):
        for j in range(i + 1, len(gpus)):
            if topology["p2p"]["nvlink"][i][j] == "ok":
                nvlink.append(f"{i}-{j}")
            elif topology["p2p"]["read"][i][j] != "ok":
                no_p2p.append(f"{i}-{j} ({topology['p2p']['read'][i][j]})")
    parts = [f"{len(gpus)} GPU(s)", "NVLink " + (", ".join(nvlink) or "none")]
    if via:
        parts.append(f"via {via}")
    if no_p2p:
        parts.append("no P2P " + ", ".join(no_p2p))
    elif len(gpus) > 1:
        parts.append("P2P between all pairs")
    return "; ".join(parts)
