"""What the GPU payloads (the exporter, the GPU topology and CUDA memory probes) read the same way:
PCI bus ids in one spelling, the systemd unit of a process, NVML's constants and its byte strings."""

import re


def as_text(value):
    """NVML's strings: bytes from older bindings, str from newer ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def normalize_bus_id(bus_id):
    """'0000:01:00.0', '00000000:01:00.0' -> '00000000:01:00.0' (NVML and nvidia-smi differ)."""
    text = as_text(bus_id).strip().lower()
    m = re.fullmatch(r"([0-9a-f]+):([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)", text)
    if not m:
        return text
    domain, bus, device, function = m.groups()
    return f"{int(domain, 16):08x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"


def unit_from_cgroup(text):
    """The systemd service of a process from its /proc/PID/cgroup text (None if not in one)."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        services = [part for part in path.split("/") if part.endswith(".service")]
        if services:
            return services[-1]
    return None


def nvml_constant(nvml, name, default):
    """An NVML constant. nvidia-ml-py defines some with a stray trailing comma, a tuple
    (`NVML_P2P_CAPS_INDEX_READ = 0,` in 12.x/13.x); ctypes cannot pass a tuple, so unwrap it."""
    value = getattr(nvml, name, default)
    if isinstance(value, tuple):
        value = value[0] if value else default
    return value
