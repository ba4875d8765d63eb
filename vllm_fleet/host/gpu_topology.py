"""Runs ON a host with the vLLM environment's python: the GPUs as NVIDIA's library (NVML) sees them.

vllm-fleet sends this file's source over SSH (`<env>/bin/python -c SOURCE`); nothing is installed.
NVML comes from the module vLLM itself imports: vLLM vendors NVIDIA's official bindings as
`vllm.third_party.pynvml` (vllm-project/vllm vllm/utils/import_utils.py, import_pynvml():
"we decide to copy the official `pynvml` module to our codebase, and use it directly"), so the
probe loads that file first (by path: importing the `vllm` package itself would pull in torch),
then falls back to a `pynvml` module (nvidia-ml-py) if the environment has one. The result says
which one was used (`nvml_module`). NVML reads the driver's view without creating a CUDA context.

Prints one line `VLLM_FLEET_TOPOLOGY <json>` and always exits 0:

    {"available": true, "driver": "580.126.09", "nvml_module": "vllm.third_party.pynvml",
     "gpus": [{"index": 0, "nvml_index": 0, "bus_id": "00000000:01:00.0", "name": ..., "uuid": ...,
               "memory_total_mib": ..., "memory_used_mib": ..., "nvlink_active": 0,
               "processes": [{"pid": 1234, "used_mib": 812, "name": "python3",
                              "unit": "vllm-gemma.service"}]}, ...],
     "p2p": {"read": [[...]], "nvlink": [[...]]}}

`index` is the position in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID numbers, and the
nvidia-smi fact's order). `p2p[kind][i][j]` is "ok", "self" on the diagonal, or why not
("chipset not supported", ..., "error: <NVML's message>"), from nvmlDeviceGetP2PStatus with
NVML_P2P_CAPS_INDEX_READ ("read") or NVML_P2P_CAPS_INDEX_NVLINK ("nvlink"). A process's `unit` is
the systemd service whose cgroup holds it (None if none). Without pynvml, or when NVML cannot start
(no driver, no libnvidia-ml.so.1, as on the sandbox's simulated GPUs):

    {"available": false, "reason": "..."}

Below the probe: pure helpers the workstation uses on that result (stdlib only, so this file stays
one runnable script).
"""

import json
import re
import sys

RESULT_PREFIX = "VLLM_FLEET_TOPOLOGY "

# nvmlGpuP2PStatus_t, in NVML's own words.
P2P_STATUS = {0: "ok", 1: "chipset not supported", 2: "GPU not supported",
              3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}

MIB = 1024 * 1024


def _const(nvml, name, default):
    """An NVML constant. nvidia-ml-py defines `NVML_P2P_CAPS_INDEX_READ = 0,` (a tuple, by a stray
    comma, in 12.x/13.x); ctypes cannot pass a tuple, so unwrap it."""
    value = getattr(nvml, name, default)
    if isinstance(value, tuple):
        value = value[0] if value else default
    return value


def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def unit_from_cgroup(text):
    """The systemd service of a process from its /proc/PID/cgroup text (None if not in one)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        services = [part for part in path.split("/") if part.endswith(".service")]
        if services:
            return services[-1]
    return None


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _processes(nvml, handle):
    try:
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except nvml.NVMLError as exc:
        return None, str(exc)
    except Exception as exc:  # e.g. NVMLLibraryMismatchError on an old driver
        return None, f"{type(exc).__name__}: {exc}"
    out = []
    for proc in procs:
        used = getattr(proc, "usedGpuMemory", None)
        pid = int(proc.pid)
        out.append({"pid": pid, "used_mib": int(used) // MIB if used is not None else None,
                    "name": _read(f"/proc/{pid}/comm").strip() or None,
                    "unit": unit_from_cgroup(_read(f"/proc/{pid}/cgroup"))})
    return out, None


def _nvlink_active(nvml, handle):
    enabled = _const(nvml, "NVML_FEATURE_ENABLED", 1)
    count = 0
    for link in range(_const(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) == enabled:
                count += 1
        except nvml.NVMLError:  # NOT_SUPPORTED (no NVLink) or INVALID_ARGUMENT (no such link)
            continue
    return count


def _p2p(nvml, a, b, index):
    try:
        status = nvml.nvmlDeviceGetP2PStatus(a, b, index)
    except nvml.NVMLError as exc:
        return f"error: {exc}"
    return P2P_STATUS.get(status, f"status {status}")


def normalize_bus_id(bus_id):
    """'0000:01:00.0', '00000000:01:00.0' -> '00000000:01:00.0' (NVML and nvidia-smi differ)."""
    text = _text(bus_id).strip().lower()
    m = re.fullmatch(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)", text)
    if not m:
        return text
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"


def _probe(nvml):
    gpus = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        try:
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            total, used, memory_error = int(memory.total) // MIB, int(memory.used) // MIB, None
        except nvml.NVMLError as exc:  # NOT_SUPPORTED on unified-memory boards (DGX Spark GB10)
            total, used, memory_error = None, None, str(exc)
        procs, procs_error = _processes(nvml, handle)
        gpu = {"nvml_index": i, "bus_id": normalize_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId),
               "name": _text(nvml.nvmlDeviceGetName(handle)), "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
               "memory_total_mib": total, "memory_used_mib": used,
               "nvlink_active": _nvlink_active(nvml, handle), "processes": procs}
        if memory_error:
            gpu["memory_error"] = memory_error
        if procs_error:
            gpu["processes_error"] = procs_error
        gpus.append((gpu, handle))
    gpus.sort(key=lambda gh: (gh[0]["bus_id"], gh[0]["nvml_index"]))
    kinds = {"read": _const(nvml, "NVML_P2P_CAPS_INDEX_READ", 0),
             "nvlink": _const(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)}
    p2p = {kind: [["self" if a is b else _p2p(nvml, a, b, index) for _g, b in gpus] for _g, a in gpus]
           for kind, index in kinds.items()}
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception:
        driver = None
    out = []
    for position, (gpu, _handle) in enumerate(gpus):
        out.append({"index": position, **gpu})
    return {"available": True, "driver": driver, "gpus": out, "p2p": p2p}


def import_nvml():
    """(module, its name) for NVML: vLLM's vendored copy first, then `pynvml`. Raises ImportError
    naming both attempts when neither is there."""
    import importlib.util
    import os
    tried = []
    try:
        spec = importlib.util.find_spec("vllm")  # locates the package without running its __init__
        locations = list(spec.submodule_search_locations or []) if spec else []
    except Exception as exc:  # a broken vllm install
        locations, spec = [], None
        tried.append(f"vllm.third_party.pynvml: {type(exc).__name__}: {exc}")
    for location in locations:
        path = os.path.join(location, "third_party", "pynvml.py")
        if os.path.isfile(path):
            try:
                file_spec = importlib.util.spec_from_file_location("vllm_fleet_vendored_pynvml", path)
                module = importlib.util.module_from_spec(file_spec)
                # pynvml looks itself up in sys.modules while it loads (its NVMLError_* classes are
                # made with sys.modules[__name__]): unregistered, it fails with a KeyError.
                sys.modules[file_spec.name] = module
                try:
                    file_spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[file_spec.name]
                    raise
                return module, "vllm.third_party.pynvml"
            except Exception as exc:
                tried.append(f"vllm.third_party.pynvml ({path}): {type(exc).__name__}: {exc}")
                break
    else:
        if spec is None and not tried:
            tried.append("vllm.third_party.pynvml: no vllm package")
        elif not tried:
            tried.append("vllm.third_party.pynvml: not in this vllm")
    try:
        import pynvml as module
        return module, "pynvml"
    except Exception as exc:
        tried.append(f"pynvml: {exc}")
    raise ImportError("; ".join(tried))


def probe():
    try:
        nvml, module_name = import_nvml()
    except Exception as exc:
        return {"available": False,
                "reason": f"no NVML bindings can be imported by {sys.executable} (tried vLLM's "
                          f"vllm.third_party.pynvml, then pynvml from nvidia-ml-py): {exc}"}
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return {"available": False, "nvml_module": module_name,
                "reason": f"NVML did not start (no NVIDIA driver or no libnvidia-ml.so.1?), "
                          f"via {module_name}: {type(exc).__name__}: {exc}"}
    try:
        return {**_probe(nvml), "nvml_module": module_name}
    except Exception as exc:
        return {"available": False, "reason": f"NVML query failed: {type(exc).__name__}: {exc}"}
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def main():
    print(RESULT_PREFIX + json.dumps(probe(), sort_keys=True), flush=True)


# --- workstation side: pure helpers on the probe's result --------------------------------------

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


if __name__ == "__main__":
    main()
