"""Source 2 of /gpu, when NVML cannot start: nvidia-smi's CSV queries and its temperature page,
each run within the scrape's deadline."""

import os
import re
import shutil
import signal
import subprocess
import time

from vllm_fleet.payloads.exporter.exposition import MHZ, MIB, MIN_STEP_TIMEOUT_S, log_once
from vllm_fleet.payloads.exporter.gpus import process_labels
from vllm_fleet.payloads.nvidia import normalize_bus_id


NVIDIA_SMI_FIELDS = ("index", "pci.bus_id", "name", "uuid", "driver_version", "utilization.gpu",
                     "memory.used", "memory.total", "temperature.gpu", "power.draw",
                     "enforced.power.limit", "clocks.current.sm", "clocks.current.memory",
                     "ecc.errors.corrected.volatile.total", "ecc.errors.uncorrected.volatile.total",
                     "retired_pages.single_bit_ecc.count", "retired_pages.double_bit.count")


NVIDIA_SMI_APP_FIELDS = ("gpu_bus_id", "pid", "process_name", "used_memory")


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
