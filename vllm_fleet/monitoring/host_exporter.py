"""The host exporter: a GPU host's GPUs and its front (nginx) in Prometheus' text format (0.0.4).

Runs ON each monitored host, as a systemd service of the service user (standard library only,
Python 3.9+, one file: the deploy installs this text as it is):

    python3 host_exporter.py --listen 127.0.0.1:9411 [--front-status http://127.0.0.1:9412/stub_status]
        [--storage PATH]... [--tls-cert PATH] [--vllm-env PREFIX] [--nvidia-smi /usr/bin/nvidia-smi]

It listens only where --listen says (the deploy gives it 127.0.0.1) and checks no credentials: nginx
on the host passes /metrics/gpu and /metrics/front to it after checking the metrics token. Routes:
`GET /gpu` and `GET /front` (HEAD too); anything else is 404. Every scrape reads the values afresh;
every subprocess and HTTP read it makes shares one deadline (SCRAPE_TIMEOUT_S), and a source that
fails gives its `_up 0` series, never an error page. NVML's calls and statvfs have no timeout of
their own: a filesystem that does not answer within STATVFS_TIMEOUT_S is left out (and not asked
again while its call hangs), and a route whose earlier scrape is still running (an NVML call stuck
in the driver) answers 503 at once, so stuck scrapes never pile up. Errors go to stderr, each
distinct one once.

/gpu. Every GPU series carries gpu="<index in PCI bus order>" (what CUDA_DEVICE_ORDER=PCI_BUS_ID
numbers), gpu_name and simulated="true"|"false". A GPU is simulated when its UUID starts with
"GPU-sim-": the sandbox's simulated nvidia-smi (vllm_fleet/sandbox/nvidia_smi.py) names its GPUs so,
and real UUIDs are hex. A metric the driver does not report (NVML_ERROR_NOT_SUPPORTED, or [N/A] /
[Not Supported] from nvidia-smi) is left out rather than given as 0.

  Source 1, NVML, through the bindings vLLM vendors (vllm/third_party/pynvml.py, NVIDIA's official
  nvidia-ml-py copied into vLLM): the file under `<--vllm-env>/lib/python3.*/site-packages/` is loaded
  by path, since importing the `vllm` package would import torch; without --vllm-env, the file of the
  `vllm` package this python finds; else a `pynvml` module. This is vllm_fleet/host/gpu_topology.py's
  loader, copied so that this file stays self-contained, and the module is put in sys.modules before
  it runs (pynvml looks itself up there while it loads). NVML starts once and stays up (a later
  scrape retries if it could not), and a background thread counts Xid critical-error events on an
  NVML event set.
  Source 2, when NVML cannot start: `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`
  (NVIDIA_SMI_FIELDS), `--query-compute-apps=...` for the processes, and `-q -d TEMPERATURE` for the
  slowdown temperature, which --query-gpu does not have: `temperature.gpu.tlimit` is the margin in
  degrees below T.Limit (NVML's margin temperature), not the slowdown threshold. Older drivers print
  "GPU Slowdown Temp : 89 C"; R535+ drivers print the thresholds relative to T.Limit ("GPU T.Limit
  Temp : 54 C" = margin, "GPU Slowdown T.Limit Temp : -2 C"), so slowdown = current + margin - that.

ECC counts are NVML's volatile counters (nvidia-smi's ecc.errors.*.volatile.total): errors since the
driver loaded. Aggregate counts live in the board's InfoROM for its whole life: a board that had
errors before it came to this host would look faulty forever, while a volatile counter resets at
a reboot, which Prometheus' rate() and increase() treat as a counter reset. Retired pages are the
older boards' mechanism (newer ones remap rows instead); where the driver reports none (NOT_SUPPORTED,
[N/A]) the series is absent.

/front: nginx's stub_status counters (vllm_fleet_front_up 0 when it does not answer), the free and
total bytes of each --storage path that exists (os.statvfs), and the notAfter of the --tls-cert file
(read with the standard library's own decoder, ssl._ssl._test_decode_cert; absent if unreadable).
"""

import argparse
import glob
import importlib.util
import math
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: The most one scrape waits for all its subprocesses and HTTP reads together.
SCRAPE_TIMEOUT_S = 5.0
STATVFS_TIMEOUT_S = 2.0  # per path: a filesystem that takes longer is reported as absent
#: A subprocess still gets this long when the deadline is nearly spent (a fast one answers in time).
MIN_STEP_TIMEOUT_S = 0.5
MIB = 1024 * 1024
MHZ = 1_000_000
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SIMULATED_UUID_PREFIX = "GPU-sim-"

NVIDIA_SMI_FIELDS = ("index", "pci.bus_id", "name", "uuid", "driver_version", "utilization.gpu",
                     "memory.used", "memory.total", "temperature.gpu", "power.draw",
                     "enforced.power.limit", "clocks.current.sm", "clocks.current.memory",
                     "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
                     "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count")
NVIDIA_SMI_APP_FIELDS = ("gpu_bus_id", "pid", "process_name", "used_memory")

# NVML's constants (nvml.h), used when a binding lacks one.
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_TIMEOUT = 10

# HELP of each family, in the order they are written.
HELP = {
    "vllm_fleet_gpu_up": ("gauge", "1 when the GPUs could be read (NVML or nvidia-smi), else 0."),
    "vllm_fleet_gpu_info": ("gauge", "1 per GPU; what it is and which source read it."),
    "vllm_fleet_gpu_utilization_ratio": ("gauge", "Fraction of the last sample period the GPU was busy."),
    "vllm_fleet_gpu_memory_used_bytes": ("gauge", "GPU memory in use, in bytes."),
    "vllm_fleet_gpu_memory_total_bytes": ("gauge", "GPU memory, in bytes."),
    "vllm_fleet_gpu_process_memory_used_bytes": (
        "gauge", "GPU memory a process holds, in bytes; unit is the systemd service whose cgroup holds "
                 "the process (empty if none)."),
    "vllm_fleet_gpu_temperature_celsius": ("gauge", "GPU core temperature."),
    "vllm_fleet_gpu_slowdown_temperature_celsius": (
        "gauge", "Temperature at which the GPU slows its clocks down."),
    "vllm_fleet_gpu_power_watts": ("gauge", "Power drawn by the board."),
    "vllm_fleet_gpu_power_limit_watts": ("gauge", "Power limit the driver enforces."),
    "vllm_fleet_gpu_sm_clock_hertz": ("gauge", "Current SM clock."),
    "vllm_fleet_gpu_memory_clock_hertz": ("gauge", "Current memory clock."),
    "vllm_fleet_gpu_ecc_errors_total": (
        "counter", "ECC errors since the driver loaded (NVML volatile counts; reset at reboot)."),
    "vllm_fleet_gpu_retired_pages_total": (
        "counter", "GPU memory pages retired, by cause (page retirement, on boards that have it)."),
    "vllm_fleet_gpu_xid_errors_total": (
        "counter", "Xid critical errors NVML reported since the exporter started."),
    "vllm_fleet_front_up": ("gauge", "1 when the front's nginx stub_status answered, else 0."),
    "vllm_fleet_front_connections": ("gauge", "The front's client connections, by state."),
    "vllm_fleet_front_connections_accepted_total": ("counter", "Client connections the front accepted."),
    "vllm_fleet_front_connections_handled_total": ("counter", "Client connections the front handled."),
    "vllm_fleet_front_http_requests_total": ("counter", "Client requests the front received."),
    "vllm_fleet_storage_avail_bytes": (
        "gauge", "Bytes available to unprivileged users on the path's filesystem."),
    "vllm_fleet_storage_size_bytes": ("gauge", "Size of the path's filesystem, in bytes."),
    "vllm_fleet_tls_cert_not_after_timestamp_seconds": (
        "gauge", "When the front's TLS certificate expires (its notAfter), in Unix seconds."),
}


# --- errors, once each ------------------------------------------------------------------------

_logged = set()
_log_lock = threading.Lock()


def log_once(message):
    """Write `message` to stderr the first time it occurs (scrapes repeat the same failure)."""
    with _log_lock:
        if message in _logged:
            return
        _logged.add(message)
    print(f"host_exporter: {message}", file=sys.stderr, flush=True)


# --- the exposition format --------------------------------------------------------------------

def escape_label(value):
    """A label value as the text format needs it: backslash, double quote and newline escaped."""
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def escape_help(text):
    """A HELP text: backslash and newline escaped (quotes stay as they are)."""
    return str(text).replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    value = float(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 2 ** 53 else repr(value)


class Exposition:
    """Samples grouped by family, written with a HELP and a TYPE line per family."""

    def __init__(self):
        self.families = {}  # name -> (help text, [(labels, value)])

    def declare(self, name):
        """The family's HELP and TYPE, even with no sample (as Prometheus' client libraries write a
        metric that has none yet): what this exporter can report is always named."""
        self.families.setdefault(name, [HELP[name][1], []])

    def add(self, name, value, labels=None, help_text=None):
        family = self.families.setdefault(name, [HELP[name][1], []])
        if help_text is not None:
            family[0] = help_text
        family[1].append((labels or {}, value))

    def text(self):
        out = []
        for name, (help_text, samples) in self.families.items():
            out.append(f"# HELP {name} {escape_help(help_text)}")
            out.append(f"# TYPE {name} {HELP[name][0]}")
            for labels, value in samples:
                label_text = ",".join(f'{key}="{escape_label(val)}"' for key, val in labels.items())
                out.append(f"{name}{{{label_text}}} {format_value(value)}" if label_text
                           else f"{name} {format_value(value)}")
        return "\n".join(out) + "\n"


# --- helpers shared by both GPU sources -------------------------------------------------------

def _text(value):
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id):
    """'0000:01:00.0', '00000000:01:00.0' -> '00000000:01:00.0' (NVML and nvidia-smi differ)."""
    text = _text(bus_id).strip().lower()
    m = re.fullmatch(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)", text)
    if not m:
        return text
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def unit_from_cgroup(text):
    """The systemd service of a process from its /proc/PID/cgroup text (None if not in one)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        services = [part for part in path.split("/") if part.endswith(".service")]
        if services:
            return services[-1]
    return None


def process_labels(pid, fallback_name=None):
    """pid, process (its /proc comm, else `fallback_name`) and unit of a GPU process."""
    name = _read(f"/proc/{pid}/comm").rstrip("\n") or fallback_name or ""
    return {"pid": str(pid), "process": name,
            "unit": unit_from_cgroup(_read(f"/proc/{pid}/cgroup")) or ""}


def gpu_labels(gpu):
    return {"gpu": str(gpu["index"]), "gpu_name": gpu["name"],
            "simulated": "true" if gpu["uuid"].startswith(SIMULATED_UUID_PREFIX) else "false"}


def write_gpus(out, gpus, source):
    """The series of every GPU (dicts as read_nvml and read_nvidia_smi return them, in PCI order).
    Every GPU family is declared, those without a sample too (no process on a GPU, no Xid counter
    through nvidia-smi, a value the driver does not report)."""
    out.add("vllm_fleet_gpu_up", 1)
    for name in HELP:
        if name.startswith("vllm_fleet_gpu_"):
            out.declare(name)
    for gpu in gpus:
        labels = gpu_labels(gpu)
        out.add("vllm_fleet_gpu_info", 1, {**labels, "uuid": gpu["uuid"], "pci_bus_id": gpu["bus_id"],
                                            "driver": gpu.get("driver") or "", "source": source})
    simple = [("vllm_fleet_gpu_utilization_ratio", "utilization"),
              ("vllm_fleet_gpu_memory_used_bytes", "memory_used"),
              ("vllm_fleet_gpu_memory_total_bytes", "memory_total"),
              ("vllm_fleet_gpu_temperature_celsius", "temperature"),
              ("vllm_fleet_gpu_slowdown_temperature_celsius", "slowdown_temperature"),
              ("vllm_fleet_gpu_power_watts", "power"),
              ("vllm_fleet_gpu_power_limit_watts", "power_limit"),
              ("vllm_fleet_gpu_sm_clock_hertz", "sm_clock"),
              ("vllm_fleet_gpu_memory_clock_hertz", "memory_clock")]
    for family, key in simple:
        for gpu in gpus:
            if gpu.get(key) is not None:
                out.add(family, gpu[key], gpu_labels(gpu))
    for gpu in gpus:
        for proc in gpu.get("processes", []):
            out.add("vllm_fleet_gpu_process_memory_used_bytes", proc["used_bytes"],
                    {**gpu_labels(gpu), **proc["labels"]})
    for family, key, label in [("vllm_fleet_gpu_ecc_errors_total", "ecc", "type"),
                               ("vllm_fleet_gpu_retired_pages_total", "retired_pages", "cause")]:
        for gpu in gpus:
            for kind, value in gpu.get(key, {}).items():
                out.add(family, value, {**gpu_labels(gpu), label: kind})
    for gpu in gpus:
        if gpu.get("xid_errors") is not None:
            out.add("vllm_fleet_gpu_xid_errors_total", gpu["xid_errors"], gpu_labels(gpu))


# --- source 1: NVML ---------------------------------------------------------------------------

def _const(nvml, name, default):
    """An NVML constant. nvidia-ml-py defines some with a stray trailing comma (a tuple); ctypes
    cannot pass a tuple, so unwrap it."""
    value = getattr(nvml, name, default)
    if isinstance(value, tuple):
        value = value[0] if value else default
    return value


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
    return getattr(exc, "value", None) == _const(nvml, "NVML_ERROR_NOT_SUPPORTED", NVML_ERROR_NOT_SUPPORTED)


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
        xid_type = _const(nvml, "nvmlEventTypeXidCriticalError", 0x8)
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
                counts[_text(nvml.nvmlDeviceGetUUID(handle))] = 0
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
        timeout = _const(nvml, "NVML_ERROR_TIMEOUT", NVML_ERROR_TIMEOUT)
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
                uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
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
        uuid = _text(nvml.nvmlDeviceGetUUID(h))
        gpu = {"nvml_index": i, "bus_id": normalize_bus_id(nvml.nvmlDeviceGetPciInfo(h).busId),
               "name": _text(nvml.nvmlDeviceGetName(h)), "uuid": uuid,
               "driver": _text(driver) if driver is not None else None}
        util = _optional(nvml, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        gpu["utilization"] = util.gpu / 100 if util is not None else None
        memory = _optional(nvml, "memory info", nvml.nvmlDeviceGetMemoryInfo, h)
        if memory is not None:  # NOT_SUPPORTED on unified-memory boards
            gpu["memory_used"], gpu["memory_total"] = int(memory.used), int(memory.total)
        gpu["temperature"] = _optional(nvml, "temperature", nvml.nvmlDeviceGetTemperature, h,
                                       _const(nvml, "NVML_TEMPERATURE_GPU", 0))
        gpu["slowdown_temperature"] = _optional(
            nvml, "slowdown temperature", nvml.nvmlDeviceGetTemperatureThreshold, h,
            _const(nvml, "NVML_TEMPERATURE_THRESHOLD_SLOWDOWN", 1))
        power = _optional(nvml, "power usage", nvml.nvmlDeviceGetPowerUsage, h)
        gpu["power"] = power / 1000 if power is not None else None  # mW
        limit = _optional(nvml, "enforced power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, h)
        gpu["power_limit"] = limit / 1000 if limit is not None else None  # mW
        for key, clock, default in (("sm_clock", "NVML_CLOCK_SM", 1), ("memory_clock", "NVML_CLOCK_MEM", 2)):
            mhz = _optional(nvml, key, nvml.nvmlDeviceGetClockInfo, h, _const(nvml, clock, default))
            gpu[key] = mhz * MHZ if mhz is not None else None
        gpu["ecc"] = {}
        for kind, error_type in (("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                                 ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            count = _optional(nvml, f"{kind} ECC errors", nvml.nvmlDeviceGetTotalEccErrors, h,
                              _const(nvml, error_type, 0 if kind == "corrected" else 1),
                              _const(nvml, "NVML_VOLATILE_ECC", 0))
            if count is not None:
                gpu["ecc"][kind] = int(count)
        gpu["retired_pages"] = {}
        for cause, constant, default in (
                ("single_bit", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0),
                ("double_bit", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1)):
            pages = _optional(nvml, f"{cause} retired pages", nvml.nvmlDeviceGetRetiredPages, h,
                              _const(nvml, constant, default))
            if pages is not None:
                gpu["retired_pages"][cause] = len(pages)
        gpu["processes"] = _nvml_processes(nvml, h)
        gpu["xid_errors"] = state.xid_count(uuid)
        gpus.append(gpu)
    gpus.sort(key=lambda g: (g["bus_id"], g["nvml_index"]))
    for position, gpu in enumerate(gpus):
        gpu["index"] = position
    return gpus


# --- source 2: nvidia-smi ---------------------------------------------------------------------

def unreadable(value):
    """nvidia-smi's ways of saying it has no value: [N/A], [Not Supported], [Unknown Error], N/A."""
    value = value.strip()
    return not value or value.startswith("[") or value in ("N/A", "Not Supported")


def _number(value, scale=1.0):
    if unreadable(value):
        return None
    try:
        number = float(value) * scale
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


def run_nvidia_smi(binary, args, deadline):
    """nvidia-smi's stdout; raises RuntimeError on a failure or when the deadline passes."""
    timeout = max(MIN_STEP_TIMEOUT_S, deadline - time.monotonic())
    try:
        # Its own process group: on a timeout the whole group goes, so that no child of it keeps
        # the pipes open (reading them to the end would wait for that child).
        proc = subprocess.Popen([binary, *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        raise RuntimeError(f"{binary}: {exc}") from None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.communicate()
        raise RuntimeError(f"{binary} {args[0]} did not answer within {timeout:.1f} s") from None
    if proc.returncode != 0:
        message = stderr.decode(errors="replace").strip() or stdout.decode(errors="replace").strip()
        raise RuntimeError(f"{binary} {args[0]} exited {proc.returncode}: {message[:300]}")
    return stdout.decode(errors="replace")


def _csv_rows(text, fields, joined):
    """Rows of `--format=csv,noheader,nounits`, as dicts. A GPU name or a process name may hold
    ", " (nvidia-smi quotes nothing): `joined`, the one such column of a query, takes what is left
    over."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(", ")]
        extra = len(cells) - len(fields)
        if extra > 0:
            at = fields.index(joined)
            cells[at:at + extra + 1] = [", ".join(cells[at:at + extra + 1])]
        if len(cells) != len(fields):
            raise RuntimeError(f"nvidia-smi printed {len(cells)} columns, not {len(fields)}: {line!r}")
        rows.append(dict(zip(fields, cells)))
    return rows


def slowdown_temperatures(text):
    """{bus id: slowdown temperature} from `nvidia-smi -q -d TEMPERATURE`: the absolute
    "GPU Slowdown Temp" of older drivers, else current + "GPU T.Limit Temp" (the margin) -
    "GPU Slowdown T.Limit Temp" (the threshold relative to T.Limit) of R535+ drivers."""
    out, bus_id, seen = {}, None, {}

    def close():
        if bus_id is None:
            return
        if seen.get("GPU Slowdown Temp") is not None:
            out[bus_id] = seen["GPU Slowdown Temp"]
        elif all(seen.get(k) is not None for k in ("GPU Current Temp", "GPU T.Limit Temp",
                                                   "GPU Slowdown T.Limit Temp")):
            out[bus_id] = (seen["GPU Current Temp"] + seen["GPU T.Limit Temp"]
                           - seen["GPU Slowdown T.Limit Temp"])

    for line in text.splitlines():
        head = re.fullmatch(r"GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]+)\s*", line)
        if head:
            close()
            bus_id, seen = normalize_bus_id(head.group(1)), {}
            continue
        m = re.fullmatch(r"\s+([^:]+?)\s*:\s*(-?\d+(?:\.\d+)?) C\s*", line)
        if m and bus_id is not None:
            seen[m.group(1)] = _number(m.group(2))
    close()
    return out


def read_nvidia_smi(binary, deadline):
    """Every GPU through nvidia-smi, in PCI bus order. The GPU query must work; the processes and
    the slowdown temperature are left out when their queries fail."""
    text = run_nvidia_smi(binary, [f"--query-gpu={','.join(NVIDIA_SMI_FIELDS)}",
                                   "--format=csv,noheader,nounits"], deadline)
    gpus = []
    for row in _csv_rows(text, NVIDIA_SMI_FIELDS, "name"):
        utilization = _number(row["utilization.gpu"])
        gpu = {"nvidia_smi_index": _number(row["index"]), "bus_id": normalize_bus_id(row["pci.bus_id"]),
               "name": row["name"], "uuid": row["uuid"],
               "driver": None if unreadable(row["driver_version"]) else row["driver_version"],
               "utilization": utilization / 100 if utilization is not None else None,
               "memory_used": _number(row["memory.used"], MIB),
               "memory_total": _number(row["memory.total"], MIB),
               "temperature": _number(row["temperature.gpu"]),
               "power": _number(row["power.draw"]),
               "power_limit": _number(row["enforced.power.limit"]),
               "sm_clock": _number(row["clocks.current.sm"], MHZ),
               "memory_clock": _number(row["clocks.current.memory"], MHZ),
               "processes": []}
        gpu["ecc"] = {kind: value for kind, value in (
            ("corrected", _number(row["ecc.errors.corrected.volatile.total"])),
            ("uncorrected", _number(row["ecc.errors.uncorrected.volatile.total"]))) if value is not None}
        gpu["retired_pages"] = {cause: value for cause, value in (
            ("single_bit", _number(row["retired_pages.single_bit_ecc.count"])),
            ("double_bit", _number(row["retired_pages.double_bit.count"]))) if value is not None}
        gpus.append(gpu)
    gpus.sort(key=lambda g: (g["bus_id"], g["nvidia_smi_index"] or 0))
    for position, gpu in enumerate(gpus):
        gpu["index"] = position
    by_bus = {gpu["bus_id"]: gpu for gpu in gpus}
    try:
        apps = run_nvidia_smi(binary, [f"--query-compute-apps={','.join(NVIDIA_SMI_APP_FIELDS)}",
                                       "--format=csv,noheader,nounits"], deadline)
        for row in _csv_rows(apps, NVIDIA_SMI_APP_FIELDS, "process_name"):
            gpu = by_bus.get(normalize_bus_id(row["gpu_bus_id"]))
            used, pid = _number(row["used_memory"], MIB), _number(row["pid"])
            if gpu is not None and used is not None and pid is not None:
                gpu["processes"].append({"used_bytes": used,
                                         "labels": process_labels(pid, row["process_name"])})
    except RuntimeError as exc:
        log_once(f"GPU processes: {exc}")
    try:
        slowdown = slowdown_temperatures(run_nvidia_smi(binary, ["-q", "-d", "TEMPERATURE"], deadline))
        for bus_id, value in slowdown.items():
            if bus_id in by_bus:
                by_bus[bus_id]["slowdown_temperature"] = value
    except RuntimeError as exc:
        log_once(f"slowdown temperature: {exc}")
    return gpus


def find_nvidia_smi(configured):
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("nvidia-smi") or (
        "/usr/bin/nvidia-smi" if os.access("/usr/bin/nvidia-smi", os.X_OK) else None)


def scrape_gpu(config, nvml_state):
    out = Exposition()
    deadline = time.monotonic() + SCRAPE_TIMEOUT_S
    nvml = nvml_state.start()
    if nvml is not None:
        try:
            write_gpus(out, read_nvml(nvml_state), "nvml")
            return out.text()
        except Exception as exc:
            log_once(f"NVML query failed: {type(exc).__name__}: {exc}")
            return _gpu_down(out).text()
    binary = find_nvidia_smi(config.nvidia_smi)
    if binary is None:
        log_once(f"no NVIDIA GPU: {nvml_state.error}; no nvidia-smi "
                 f"({config.nvidia_smi or 'none on PATH'})")
        return _gpu_down(out, "0: no NVIDIA GPU on this host (no NVML: "
                              f"{nvml_state.error}; and no nvidia-smi).").text()
    try:
        gpus = read_nvidia_smi(binary, deadline)
    except Exception as exc:
        log_once(f"nvidia-smi query failed ({nvml_state.error}): {type(exc).__name__}: {exc}")
        return _gpu_down(out).text()
    write_gpus(out, gpus, "nvidia-smi")
    return out.text()


def _gpu_down(out, why=None):
    out.families.clear()
    help_text = HELP["vllm_fleet_gpu_up"][1] + (f" Here {why}" if why else "")
    out.add("vllm_fleet_gpu_up", 0, help_text=help_text)
    return out


# --- /front -----------------------------------------------------------------------------------

STUB_STATUS = re.compile(r"Active connections:\s*(\d+)\s+server accepts handled requests"
                         r"\s+(\d+)\s+(\d+)\s+(\d+)"
                         r"\s+Reading:\s*(\d+)\s+Writing:\s*(\d+)\s+Waiting:\s*(\d+)")

# Loopback only: a proxy from the environment must not carry the request elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_stub_status(text):
    """nginx's stub_status page -> {active, accepted, handled, requests, reading, writing, waiting}."""
    m = STUB_STATUS.search(text)
    if not m:
        raise ValueError(f"not an nginx stub_status page: {text[:200]!r}")
    keys = ("active", "accepted", "handled", "requests", "reading", "writing", "waiting")
    return dict(zip(keys, (int(v) for v in m.groups())))


def read_front(url, timeout):
    with _OPENER.open(url, timeout=timeout) as response:
        return parse_stub_status(response.read(65536).decode(errors="replace"))


def cert_not_after(path):
    """The certificate's notAfter in Unix seconds, or None when it cannot be read."""
    try:
        decoded = ssl._ssl._test_decode_cert(path)  # the standard library's own PEM decoder
        return ssl.cert_time_to_seconds(decoded["notAfter"])
    except Exception as exc:
        log_once(f"TLS certificate {path}: {type(exc).__name__}: {exc}")
        return None


def scrape_front(config):
    out = Exposition()
    if config.front_status:
        try:
            status = read_front(config.front_status, SCRAPE_TIMEOUT_S)
        except Exception as exc:
            log_once(f"front stub_status {config.front_status}: {type(exc).__name__}: {exc}")
            out.add("vllm_fleet_front_up", 0)
        else:
            out.add("vllm_fleet_front_up", 1)
            for state in ("active", "reading", "writing", "waiting"):
                out.add("vllm_fleet_front_connections", status[state], {"state": state})
            out.add("vllm_fleet_front_connections_accepted_total", status["accepted"])
            out.add("vllm_fleet_front_connections_handled_total", status["handled"])
            out.add("vllm_fleet_front_http_requests_total", status["requests"])
    for path in config.storage:
        fs = statvfs_within(path, STATVFS_TIMEOUT_S)
        if fs is None:
            continue  # not there (yet), or not answering: no series
        out.add("vllm_fleet_storage_avail_bytes", fs.f_bavail * fs.f_frsize, {"path": path})
        out.add("vllm_fleet_storage_size_bytes", fs.f_blocks * fs.f_frsize, {"path": path})
    if config.tls_cert:
        not_after = cert_not_after(config.tls_cert)
        if not_after is not None:
            out.add("vllm_fleet_tls_cert_not_after_timestamp_seconds", not_after, {"path": config.tls_cert})
    return out.text()


_statvfs_pending = set()
_statvfs_lock = threading.Lock()


def statvfs_within(path, timeout):
    """os.statvfs(path), or None when the path is missing or its filesystem does not answer within
    `timeout` (a hung NFS mount blocks statvfs for good). A call still hanging from an earlier
    scrape is not joined by another: the path is skipped until it returns."""
    with _statvfs_lock:
        if path in _statvfs_pending:
            return None
        _statvfs_pending.add(path)
    found = {}

    def run():
        try:
            found["fs"] = os.statvfs(path)
        except OSError:
            pass
        finally:
            with _statvfs_lock:
                _statvfs_pending.discard(path)

    worker = threading.Thread(target=run, name=f"statvfs {path}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        log_once(f"storage {path}: its filesystem did not answer within {timeout} s")
    return found.get("fs")


# --- the server -------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    server_version = "vllm-fleet-host-exporter"
    timeout = 10  # a client that sends no request in this long is dropped

    def _answer(self, with_body):
        route = self.path.split("?", 1)[0]
        if route == "/gpu":
            make = lambda: scrape_gpu(self.server.config, self.server.nvml)  # noqa: E731
        elif route == "/front":
            make = lambda: scrape_front(self.server.config)  # noqa: E731
        else:
            self.send_error(404, "only /gpu and /front")
            return
        # One scrape of a route at a time: an NVML call has no timeout of its own, so one stuck in
        # the driver must not be joined by another at every scrape interval.
        busy = self.server.busy[route]
        if not busy.acquire(blocking=False):
            self.send_error(503, f"an earlier scrape of {route} is still running")
            return
        try:
            body = make().encode()
        except Exception as exc:  # a bug, not a failing source: say so, keep serving
            log_once(f"{route}: {type(exc).__name__}: {exc}")
            self.send_error(500)
            return
        finally:
            busy.release()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self):
        self._answer(True)

    def do_HEAD(self):
        self._answer(False)

    def log_message(self, format, *args):  # no line per request
        pass


def parse_listen(text):
    """'127.0.0.1:9411' or '[::1]:9411' -> (family, host, port)."""
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]:(\d+)|([^:\[\]]+):(\d+)", text)
    if not m:
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT or [IPv6]:PORT, not {text!r}")
    if m.group(1):
        return socket.AF_INET6, m.group(1), int(m.group(2))
    return socket.AF_INET, m.group(3), int(m.group(4))


def parse_args(argv):
    parser = argparse.ArgumentParser(description="vllm-fleet's host exporter (GPUs and the front).")
    parser.add_argument("--listen", required=True, type=parse_listen, help="HOST:PORT, e.g. 127.0.0.1:9411")
    parser.add_argument("--front-status",
                        help="nginx's stub_status URL, e.g. http://127.0.0.1:9412/stub_status")
    parser.add_argument("--storage", action="append", default=[], help="a path whose filesystem to report")
    parser.add_argument("--tls-cert", help="the front's certificate (PEM), for its notAfter")
    parser.add_argument("--vllm-env", help="the vLLM environment's prefix, whose vendored pynvml to load")
    parser.add_argument("--nvidia-smi", help="nvidia-smi to use without NVML (default: on PATH)")
    return parser.parse_args(argv)


def make_server(config):
    family, host, port = config.listen

    class Server(ThreadingHTTPServer):
        address_family = family
        daemon_threads = True

    server = Server((host, port), Handler)
    server.config = config
    server.nvml = Nvml(config.vllm_env)
    server.busy = {"/gpu": threading.Lock(), "/front": threading.Lock()}
    return server


def main(argv=None):
    config = parse_args(sys.argv[1:] if argv is None else argv)
    server = make_server(config)
    server.nvml.start()  # start NVML and its Xid counter now, not at the first scrape
    if server.nvml.error:
        log_once(server.nvml.error)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
