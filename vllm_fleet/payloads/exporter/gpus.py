"""What both GPU sources (NVML, nvidia-smi) share: a GPU process's labels, and every GPU's series
from the dicts they read."""

from vllm_fleet.payloads.exporter.exposition import HELP, SIMULATED_UUID_PREFIX
from vllm_fleet.payloads.nvidia import unit_from_cgroup


def _read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


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
