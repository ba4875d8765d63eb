"""The exporter's limits and units, and what it writes: Prometheus' text format (0.0.4), each family
with its HELP and TYPE; errors to stderr, each distinct one once."""

import math
import sys
import threading

#: The most one scrape waits for all its subprocesses and HTTP reads together.
SCRAPE_TIMEOUT_S = 5.0
STATVFS_TIMEOUT_S = 2.0  # per path: a filesystem that takes longer is reported as absent
#: A subprocess still gets this long when the deadline is nearly spent (a fast one answers in time).
MIN_STEP_TIMEOUT_S = 0.5
MIB = 1024 * 1024
MHZ = 1_000_000
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SIMULATED_UUID_PREFIX = "GPU-sim-"


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


_logged = set()


_log_lock = threading.Lock()


def log_once(message):
    """Write `message` to stderr the first time it occurs (scrapes repeat the same failure)."""
    with _log_lock:
        if message in _logged:
            return
        _logged.add(message)
    print(f"host_exporter: {message}", file=sys.stderr, flush=True)


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
