"""The probe: NVML's GPUs in PCI bus order, the P2P and NVLink status of every pair, each GPU's
compute processes; one result line."""

import json
import sys

from vllm_fleet.payloads.nvidia import as_text, normalize_bus_id, nvml_constant, unit_from_cgroup


RESULT_PREFIX = "VLLM_FLEET_TOPOLOGY "


# nvmlGpuP2PStatus_t, in NVML's own words.
P2P_STATUS = {0: "ok", 1: "chipset not supported", 2: "GPU not supported",
              3: "IOH topology not supported", 4: "disabled by regkey", 5: "not supported",
              6: "unknown"}


MIB = 1024 * 1024


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
    enabled = nvml_constant(nvml, "NVML_FEATURE_ENABLED", 1)
    count = 0
    for link in range(nvml_constant(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
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
               "name": as_text(nvml.nvmlDeviceGetName(handle)), "uuid": as_text(nvml.nvmlDeviceGetUUID(handle)),
               "memory_total_mib": total, "memory_used_mib": used,
               "nvlink_active": _nvlink_active(nvml, handle), "processes": procs}
        if memory_error:
            gpu["memory_error"] = memory_error
        if procs_error:
            gpu["processes_error"] = procs_error
        gpus.append((gpu, handle))
    gpus.sort(key=lambda gh: (gh[0]["bus_id"], gh[0]["nvml_index"]))
    kinds = {"read": nvml_constant(nvml, "NVML_P2P_CAPS_INDEX_READ", 0),
             "nvlink": nvml_constant(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)}
    p2p = {kind: [["self" if a is b else _p2p(nvml, a, b, index) for _g, b in gpus] for _g, a in gpus]
           for kind, index in kinds.items()}
    try:
        driver = as_text(nvml.nvmlSystemGetDriverVersion())
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


if __name__ == "__main__":
    main()
