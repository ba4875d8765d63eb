"""Source 1 of /gpu: NVML, through the bindings vLLM vendors, started once and kept up, with a
thread counting Xid critical errors."""

import glob
import importlib.util
import os
import sys
import threading
import time

from vllm_fleet.payloads.exporter.exposition import MHZ, log_once
from vllm_fleet.payloads.exporter.gpus import process_labels
from vllm_fleet.payloads.nvidia import as_text, normalize_bus_id, nvml_constant


# NVML's constants (nvml.h), used when a binding lacks one.
NVML_ERROR_NOT_SUPPORTED = 3


NVML_ERROR_TIMEOUT = 10


def vendored_pynvml_paths(vllm_env):
    """Where vLLM's vendored pynvml.py may be: under --vllm-env, else in the `vllm` package this
    python finds (located without running its __init__, which would import torch)."""
    if vllm_env:
        pattern = os.path.join(vllm_env, "lib", "python3.*", "site-packages", "vllm", "third_party",
                               "pynvml.py")
        return sorted(glob.glob(pattern))
    try:
        spec = importlib.util.find_spec("vllm")
    except Exception:  # a broken vllm install
        return []
    locations = list(spec.submodule_search_locations or []) if spec else []
    return [p for p in (os.path.join(loc, "third_party", "pynvml.py") for loc in locations)
            if os.path.isfile(p)]


def import_nvml(vllm_env):
    """(module, its name): vLLM's vendored pynvml by path, else `pynvml`. Raises ImportError naming
    every attempt when none loads."""
    tried = []
    paths = vendored_pynvml_paths(vllm_env)
    for path in paths:
        try:
            spec = importlib.util.spec_from_file_location("vllm_fleet_vendored_pynvml", path)
            module = importlib.util.module_from_spec(spec)
            # pynvml looks itself up in sys.modules while it loads (to define its NVMLError_*
            # classes): it must be there first.
            sys.modules[spec.name] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[spec.name]
                raise
            return module, "vllm.third_party.pynvml"
        except Exception as exc:
            tried.append(f"{path}: {type(exc).__name__}: {exc}")
    if not paths:
        where = f"under {vllm_env}" if vllm_env else f"for {sys.executable}"
        tried.append(f"no vllm/third_party/pynvml.py {where}")
    try:
        import pynvml as module
        return module, "pynvml"
    except Exception as exc:
        tried.append(f"pynvml: {exc}")
    raise ImportError("; ".join(tried))


def _not_supported(nvml, exc):
    return getattr(exc, "value", None) == nvml_constant(nvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED)


class Nvml:
    """NVML, started once and kept up, and the Xid counter that lives as long as it."""

    def __init__(self, vllm_env):
        self.vllm_env = vllm_env
        self.lock = threading.Lock()
        self.module = None  # the bindings, once NVML started
        self.imported = None  # (module, name) or the ImportError: the bindings load once
        self.error = None  # why NVML is not available (None once it started)
        self.xid_counts = None  # uuid -> Xid events, for the GPUs registered for them
        self.xid_lock = threading.Lock()

    def start(self):
        """The NVML module when NVML is up, else None (self.error says why)."""
        with self.lock:
            if self.module is not None:
                return self.module
            if self.imported is None:
                try:
                    self.imported = import_nvml(self.vllm_env)
                except ImportError as exc:
                    self.imported = exc
            if isinstance(self.imported, ImportError):
                self.error = f"no NVML bindings: {self.imported}"
                return None
            nvml, name = self.imported
            try:
                nvml.nvmlInit()
            except Exception as exc:
                self.error = f"NVML did not start via {name}: {type(exc).__name__}: {exc}"
                return None
            self.module, self.error = nvml, None
            self._start_xid_watch(nvml)
            return nvml

    def _start_xid_watch(self, nvml):
        xid_type = nvml_constant(nvml, "nvmlEventTypeXidCriticalError", 0x8)
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            log_once(f"no Xid counter: nvmlEventSetCreate failed: {type(exc).__name__}: {exc}")
            return
        counts = {}
        try:
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                try:
                    nvml.nvmlDeviceRegisterEvents(handle, xid_type, event_set)
                except Exception as exc:
                    if not _not_supported(nvml, exc):
                        log_once(f"no Xid counter for GPU {i}: {type(exc).__name__}: {exc}")
                    continue
                counts[as_text(nvml.nvmlDeviceGetUUID(handle))] = 0
        except Exception as exc:
            log_once(f"no Xid counter: {type(exc).__name__}: {exc}")
            counts = {}
        if not counts:
            try:
                nvml.nvmlEventSetFree(event_set)
            except Exception:
                pass
            return
        self.xid_counts = counts
        thread = threading.Thread(target=self._watch_xid, args=(nvml, event_set, xid_type),
                                  name="xid-events", daemon=True)
        thread.start()

    def _watch_xid(self, nvml, event_set, xid_type):
        timeout = nvml_constant(nvml, "NVML_ERROR_TIMEOUT", NVML_ERROR_TIMEOUT)
        while True:
            try:
                data = nvml.nvmlEventSetWait(event_set, 5000)
            except Exception as exc:
                if getattr(exc, "value", None) != timeout:
                    log_once(f"waiting for Xid events: {type(exc).__name__}: {exc}")
                    time.sleep(5)
                continue
            if not int(data.eventType) & xid_type:
                continue
            try:
                uuid = as_text(nvml.nvmlDeviceGetUUID(data.device))
            except Exception as exc:
                log_once(f"an Xid event's GPU is unknown: {type(exc).__name__}: {exc}")
                continue
            with self.xid_lock:
                if uuid in self.xid_counts:
                    self.xid_counts[uuid] += 1

    def xid_count(self, uuid):
        with self.xid_lock:
            return None if self.xid_counts is None else self.xid_counts.get(uuid)


def _optional(nvml, what, call, *args):
    """An NVML reading that may be missing: None when the driver does not report it (quietly when
    NOT_SUPPORTED, once on stderr for any other failure)."""
    try:
        return call(*args)
    except Exception as exc:
        if not _not_supported(nvml, exc):
            log_once(f"NVML {what}: {type(exc).__name__}: {exc}")
        return None


def _nvml_processes(nvml, handle):
    """[{"used_bytes", "labels"}] for the compute and graphics processes (one entry per pid)."""
    by_pid = {}
    for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        if not hasattr(nvml, fn):
            continue
        for proc in _optional(nvml, fn, getattr(nvml, fn), handle) or []:
            used = getattr(proc, "usedGpuMemory", None)
            if used is None:  # NVML could not say (e.g. no permission)
                continue
            pid = int(proc.pid)
            by_pid[pid] = max(int(used), by_pid.get(pid, 0))
    return [{"used_bytes": used, "labels": process_labels(pid)} for pid, used in sorted(by_pid.items())]


def read_nvml(state):
    """Every GPU through NVML, in PCI bus order."""
    nvml = state.module
    driver = _optional(nvml, "nvmlSystemGetDriverVersion", nvml.nvmlSystemGetDriverVersion)
    gpus = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = as_text(nvml.nvmlDeviceGetUUID(h))
        gpu = {"nvml_index": i, "bus_id": normalize_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId),
               "name": as_text(nvml.nvmlDeviceGetName(h)), "uuid": uuid,
               "driver": as_text(driver) if driver is not None else None}
        util = _optional(nvml, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        gpu["utilization"] = util.gpu / 100 if util is not None else None
        memory = _optional(nvml, "memory info", nvml.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:  # NOT_SUPPORTED on unified-memory boards
            gpu["memory_used"], gpu["memory_total"] = int(memory.used), int(memory.total)
        gpu["temperature"] = _optional(nvml, "temperature", nvml.nvmlDeviceGetTemperature, h,
                                       nvml_constant(nvml, "NVML_TEMPERATURE_GPU", 0))
        gpu["slowdown_temperature"] = _optional(
            nvml, "slowdown temperature", nvml.nvmlDeviceGetTemperatureThreshold, h,
            nvml_constant(nvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1))
        power = _optional(nvml, "power usage", nvml.nvmlDeviceGetPowerUsage, h)
        gpu["power"] = power / 1000 if power is not None else None  # mW
        limit = _optional(nvml, "enforced power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        gpu["power_limit"] = limit / 1000 if limit is not None else None  # mW
        for key, clock, default in (("sm_clock", "NVML_CLOCK_SM", 1), ("memory_clock", "NVML_CLOCK_MEM", 2)):
            mhz = _optional(nvml, key, nvml.nvmlDeviceGetClockInfo, h, nvml_constant(nvml, clock, default))
            gpu[key] = mhz * MHZ if mhz is not None else None
        gpu["ecc"] = {}
        for kind, error_type in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                                 ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            count = _optional(nvml, f"{kind} ECC errors", nvml.nvmlDeviceGetTotalEccErrors, h,
                              nvml_constant(nvml, error_type, 0 if kind == "corrected" else 1),
                              nvml_constant(nvml, "NVML_VOLATILE_ECC", 0))
            if count is not None:
                gpu["ecc"][kind] = int(count)
        gpu["retired_pages"] = {}
        for cause, constant, default in (
                ("single_bit", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                ("double_bit", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)):
            pages = _optional(nvml, f"{cause} retired pages", nvml.nvmlDeviceGetRetiredPages, h,
                              nvml_constant(nvml, constant, default))
            if pages is not None:
                gpu["retired_pages"][cause] = len(pages)
        gpu["processes"] = _nvml_processes(nvml, h)
        gpu["xid_errors"] = state.xid_count(uuid)
        gpus.append(gpu)
    gpus.sort(key=lambda g: (g["bus_id"], g["nvml_index"]))
    for position, gpu in enumerate(gpus):
        gpu["index"] = position
    return gpus
