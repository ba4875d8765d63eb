#!/usr/bin/python3
"""A SIMULATED `nvidia-smi` for sandbox hosts: answers the queries vllm-fleet makes from a JSON layout.

This file is self-contained (standard library only): the sandbox harness copies its text to
/usr/local/bin/nvidia-smi on hosts that declare `sandbox_gpus`, next to the layout in
/etc/vllm-fleet-sim/gpus.json (a list of {"name", "memory_mib", "compute_capability",
optional "pci_bus_id", "driver_version", "mig_mode", "ecc", "slowdown_temp", "memory_used_mib"}; or
{"driver_version": ..., "gpus": [...]}).
The simulated driver is the layout's `driver_version` (top level, or the first GPU entry that has
one; $VLLM_FLEET_SIM_DRIVER overrides both), by default a current R580 driver; MIG is off unless a
GPU entry says "mig_mode": "Enabled". CSV output is byte-for-byte shaped like the real tool so parsers are
exercised as in production; the simulation is labelled in the UUIDs (GPU-sim-...), on stderr, in
`-L` lines and in the table banner. Nothing here touches hardware.

A GPU's memory is all free unless its entry says "memory_used_mib": what a process outside the fleet
would hold there (simulated: nothing holds it), so a shared GPU's free-memory check before a start
can be seen refusing.

The host exporter's sensor fields are answered too, with idle values that are plausible, not measured:
35 C, 60 W drawn of a per-model power limit (SIM_BOARDS), per-model clocks, a slowdown temperature
of 87 C (or the entry's "slowdown_temp"), ECC and retired pages 0. GeForce boards have no ECC (unless
the entry says "ecc": true): their ECC and retired-page fields read [N/A], as the real tool prints.
`-q -d TEMPERATURE` prints the temperature block in the shape R535+ drivers use (T.Limit rows).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys

LAYOUT_PATH = os.environ.get("VLLM_FLEET_SIM_GPUS", "/etc/vllm-fleet-sim/gpus.json")
LABEL = "SIMULATED GPUs (vllm-fleet sandbox) - not real hardware"
# A real R580 driver version (NVIDIA GB10 boards print it: snowflakedb/ArcticTraining#345); the
# CUDA version shown is what R580 drivers report. Simulated, like everything here.
DEFAULT_DRIVER_VERSION = "580.126.09"
CUDA_VERSION = "13.0"

# Query field -> (header as real nvidia-smi prints it, unit suffix or "").
GPU_FIELDS = {
    "index": ("index", ""),
    "count": ("count", ""),
    "pci.bus_id": ("pci.bus_id", ""),
    "gpu_bus_id": ("pci.bus_id", ""),
    "name": ("name", ""),
    "gpu_name": ("name", ""),
    "uuid": ("uuid", ""),
    "gpu_uuid": ("uuid", ""),
    "memory.total": ("memory.total [MiB]", " MiB"),
    "memory.used": ("memory.used [MiB]", " MiB"),
    "memory.free": ("memory.free [MiB]", " MiB"),
    "memory.reserved": ("memory.reserved [MiB]", " MiB"),
    "compute_cap": ("compute_cap", ""),
    "utilization.gpu": ("utilization.gpu [%]", " %"),
    "driver_version": ("driver_version", ""),
    "mig.mode.current": ("mig.mode.current", ""),
    "mig.mode.pending": ("mig.mode.pending", ""),
    "temperature.gpu": ("temperature.gpu", ""),
    "temperature.gpu.tlimit": ("temperature.gpu.tlimit", ""),
    "power.draw": ("power.draw [W]", " W"),
    "power.limit": ("power.limit [W]", " W"),
    "enforced.power.limit": ("enforced.power.limit [W]", " W"),
    "power.default_limit": ("power.default_limit [W]", " W"),
    "clocks.current.sm": ("clocks.current.sm [MHz]", " MHz"),
    "clocks.sm": ("clocks.current.sm [MHz]", " MHz"),
    "clocks.current.memory": ("clocks.current.memory [MHz]", " MHz"),
    "clocks.mem": ("clocks.current.memory [MHz]", " MHz"),
    "ecc.mode.current": ("ecc.mode.current", ""),
    "ecc.errors.corrected.volatile.total": ("ecc.errors.corrected.volatile.total", ""),
    "ecc.errors.uncorrected.volatile.total": ("ecc.errors.uncorrected.volatile.total", ""),
    "ecc.errors.corrected.aggregate.total": ("ecc.errors.corrected.aggregate.total", ""),
    "ecc.errors.uncorrected.aggregate.total": ("ecc.errors.uncorrected.aggregate.total", ""),
    "retired_pages.single_bit_ecc.count": ("retired_pages.single_bit_ecc.count", ""),
    "retired_pages.double_bit.count": ("retired_pages.double_bit.count", ""),
}
# Simulated sensor values per board (first name fragment that matches): enforced power limit in W,
# SM and memory clocks in MHz. Plausible for the board, not measured.
SIM_BOARDS = [
    ("A100", {"power_limit_w": 400.0, "sm_mhz": 1410, "mem_mhz": 1215}),
    ("H100", {"power_limit_w": 700.0, "sm_mhz": 1980, "mem_mhz": 2619}),
    ("4090 D", {"power_limit_w": 425.0, "sm_mhz": 2280, "mem_mhz": 10501}),
    ("4090", {"power_limit_w": 450.0, "sm_mhz": 2520, "mem_mhz": 10501}),
]
SIM_DEFAULT_BOARD = {"power_limit_w": 300.0, "sm_mhz": 1500, "mem_mhz": 1500}
SIM_TEMPERATURE_C = 35
SIM_POWER_DRAW_W = 60.0
SIM_SLOWDOWN_C = 87
# The slowdown threshold relative to T.Limit, as R535+ drivers print it ("GPU Slowdown T.Limit Temp").
SIM_SLOWDOWN_TLIMIT_C = -2
NOT_AVAILABLE = "[N/A]"
APP_FIELDS = {
    "pid": ("pid", ""),
    "process_name": ("process_name", ""),
    "name": ("process_name", ""),
    "gpu_uuid": ("gpu_uuid", ""),
    "gpu_bus_id": ("gpu_bus_id", ""),
    "gpu_name": ("gpu_name", ""),
    "used_memory": ("used_gpu_memory [MiB]", " MiB"),
    "used_gpu_memory": ("used_gpu_memory [MiB]", " MiB"),
}


def load_layout() -> tuple[list[dict], str]:
    """The declared GPUs and the simulated driver version."""
    with open(LAYOUT_PATH) as f:
        layout = json.load(f)
    driver = None
    if isinstance(layout, dict):
        driver = layout.get("driver_version")
        layout = layout.get("gpus", [])
    driver = driver or next((g["driver_version"] for g in layout if g.get("driver_version")), None)
    return layout, os.environ.get("VLLM_FLEET_SIM_DRIVER") or driver or DEFAULT_DRIVER_VERSION


def load_gpus() -> list[dict]:
    """The declared layout, completed with index, PCI bus id and a deterministic simulated UUID."""
    layout, driver = load_layout()
    host = socket.gethostname()
    gpus = []
    for i, gpu in enumerate(layout):
        digest = hashlib.sha256(f"{host}/{i}/{gpu['name']}".encode()).hexdigest()
        gpus.append(
            {
                "index": i,
                "name": gpu["name"],
                "memory_mib": int(gpu["memory_mib"]),
                "compute_capability": str(gpu["compute_capability"]),
                "pci_bus_id": gpu.get("pci_bus_id") or f"00000000:{i + 1:02X}:00.0",
                # Real UUIDs are GPU-8-4-4-4-12 hex; "sim" marks these as simulated.
                "uuid": f"GPU-sim-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:28]}",
                "driver_version": driver,
                # Real nvidia-smi prints [N/A] for GPUs without MIG (consumer cards); simulated
                # GPUs are data-center-like only when they say so.
                "mig_mode": gpu.get("mig_mode") or "Disabled",
                "ecc": bool(gpu.get("ecc", "GeForce" not in gpu["name"])),
                "slowdown_temp": int(gpu.get("slowdown_temp", SIM_SLOWDOWN_C)),
                "memory_used_mib": min(max(int(gpu.get("memory_used_mib", 0)), 0), int(gpu["memory_mib"])),
                **next((board for fragment, board in SIM_BOARDS if fragment in gpu["name"]),
                       SIM_DEFAULT_BOARD),
            }
        )
    return gpus


def gpu_value(gpu: dict, field: str, count: int) -> str:
    """One query-gpu field of one GPU, without unit."""
    values = {
        "index": gpu["index"],
        "count": count,
        "pci.bus_id": gpu["pci_bus_id"],
        "gpu_bus_id": gpu["pci_bus_id"],
        "name": gpu["name"],
        "gpu_name": gpu["name"],
        "uuid": gpu["uuid"],
        "gpu_uuid": gpu["uuid"],
        "memory.total": gpu["memory_mib"],
        "memory.used": gpu["memory_used_mib"],  # what the layout declares (simulated): no process holds it
        "memory.free": gpu["memory_mib"] - gpu["memory_used_mib"],
        # What the driver keeps is a real card's: a simulated one has no number for it (the plan
        # then takes the recorded table or the rule, as on a host whose nvidia-smi cannot say).
        "memory.reserved": NOT_AVAILABLE,
        "compute_cap": gpu["compute_capability"],
        "utilization.gpu": 0,
        "driver_version": gpu["driver_version"],
        "mig.mode.current": gpu["mig_mode"],
        "mig.mode.pending": gpu["mig_mode"],
        "temperature.gpu": SIM_TEMPERATURE_C,
        "temperature.gpu.tlimit": tlimit_margin(gpu),
        "power.draw": f"{SIM_POWER_DRAW_W:.2f}",
        "power.limit": f"{gpu['power_limit_w']:.2f}",
        "enforced.power.limit": f"{gpu['power_limit_w']:.2f}",
        "power.default_limit": f"{gpu['power_limit_w']:.2f}",
        "clocks.current.sm": gpu["sm_mhz"],
        "clocks.sm": gpu["sm_mhz"],
        "clocks.current.memory": gpu["mem_mhz"],
        "clocks.mem": gpu["mem_mhz"],
        "ecc.mode.current": "Enabled" if gpu["ecc"] else NOT_AVAILABLE,
    }
    if field.startswith(("ecc.errors.", "retired_pages.")):
        return "0" if gpu["ecc"] else NOT_AVAILABLE
    return str(values[field])


def tlimit_margin(gpu: dict) -> int:
    """Degrees below T.Limit (`temperature.gpu.tlimit`): slowdown sits SIM_SLOWDOWN_TLIMIT_C
    from T.Limit, so T.Limit is slowdown + that offset."""
    return gpu["slowdown_temp"] + SIM_SLOWDOWN_TLIMIT_C - SIM_TEMPERATURE_C


def parse_format(spec: str) -> tuple[bool, bool]:
    """`--format=csv[,noheader][,nounits]` -> (header, units)."""
    parts = spec.split(",")
    if parts[0] != "csv":
        raise SystemExit(f'"{spec}" is not a valid format. Only "csv" is supported (simulated nvidia-smi).')
    return "noheader" not in parts, "nounits" not in parts


def csv_query(rows: list[dict], fields: list[str], known: dict, value, fmt: str) -> int:
    """Print a CSV query the way nvidia-smi does: ", " separated, header with units in brackets."""
    for field in fields:
        if field not in known:
            print(f'Field "{field}" is not a valid field to query.', file=sys.stderr)
            return 2
    header, units = parse_format(fmt)
    print(f"nvidia-smi: {LABEL}", file=sys.stderr)
    if header:
        print(", ".join(known[f][0] for f in fields))
    for row in rows:
        cells = (value(row, f) for f in fields)
        # An unreadable value prints bare ("[N/A]"), without the field's unit.
        print(", ".join(cell + (known[f][1] if units and not cell.startswith("[") else "")
                        for f, cell in zip(fields, cells, strict=True)))
    return 0


def temperature_report(gpus: list[dict]) -> int:
    """`nvidia-smi -q -d TEMPERATURE`: one Temperature block per GPU, in R535+ drivers' shape."""
    driver = gpus[0]["driver_version"] if gpus else load_layout()[1]
    print(f"nvidia-smi: {LABEL}", file=sys.stderr)
    print("\n==============NVSMI LOG==============\n")
    print(f"{'Driver Version':<42}: {driver}")
    print(f"{'CUDA Version':<42}: {CUDA_VERSION}\n")
    print(f"{'Attached GPUs':<42}: {len(gpus)}")
    for g in gpus:
        rows = [("GPU Current Temp", f"{SIM_TEMPERATURE_C} C"),
                ("GPU T.Limit Temp", f"{tlimit_margin(g)} C"),
                ("GPU Shutdown T.Limit Temp", "-7 C"),
                ("GPU Slowdown T.Limit Temp", f"{SIM_SLOWDOWN_TLIMIT_C} C"),
                ("GPU Max Operating T.Limit Temp", "0 C"),
                ("GPU Target Temperature", "N/A"),
                ("Memory Current Temp", "N/A"),
                ("Memory Max Operating T.Limit Temp", "N/A")]
        print(f"GPU {g['pci_bus_id']}\n    Temperature")
        for name, value in rows:
            print(f"        {name:<34}: {value}")
        print()
    return 0


def cpu_affinity() -> str:
    """CPUs this host may use, as nvidia-smi writes them (0-3,8)."""
    ranges: list[list[int]] = []
    for cpu in sorted(os.sched_getaffinity(0)):
        if ranges and cpu == ranges[-1][1] + 1:
            ranges[-1][1] = cpu
        else:
            ranges.append([cpu, cpu])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


def link(a: dict, b: dict) -> str:
    """Simulated interconnect: SXM boards of one model share NVLink (A100-SXM4: 12 links)."""
    if a is b:
        return "X"
    if a["name"] == b["name"] and "SXM" in a["name"]:
        return "NV12"
    return "PHB"


def topo(gpus: list[dict]) -> int:
    """`nvidia-smi topo -m`: the connection matrix and its legend."""
    cols = [f"GPU{g['index']}" for g in gpus]
    print("\t" + "\t".join(cols) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID")
    for g in gpus:
        cells = [link(g, other) for other in gpus]
        print(f"GPU{g['index']}\t " + "\t".join(cells) + f"\t{cpu_affinity()}\t0\t\tN/A")
    print(
        "\nLegend:\n\n"
        "  X    = Self\n"
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
        "  PIX  = Connection traversing at most a single PCIe bridge\n"
        "  NV#  = Connection traversing a bonded set of # NVLinks\n"
        f"\n{LABEL}"
    )
    return 0


def table(gpus: list[dict]) -> int:
    """Bare `nvidia-smi`: a summary table in the real tool's shape, under a SIMULATED banner."""
    rule = "+-----------------------------------------------------------------------------------------+"
    print(f"*** {LABEL} ***")
    print(rule)
    driver = gpus[0]["driver_version"] if gpus else load_layout()[1]
    print(f"| NVIDIA-SMI {driver}   (simulated)   Driver Version: {driver}   CUDA Version: {CUDA_VERSION}".ljust(90) + "|")
    print(rule)
    for g in gpus:
        print(f"| {g['index']:>3}  {g['name'][:34]:<34} {g['pci_bus_id']}   {g['memory_used_mib']}MiB / {g['memory_mib']}MiB".ljust(90) + "|")
    print(rule)
    print("| Processes: none".ljust(90) + "|")
    print(rule)
    return 0


def option(argv: list[str], name: str) -> str | None:
    """Value of `--name=value` or `--name value` (also `-i value`), None when absent."""
    for i, arg in enumerate(argv):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def main(argv: list[str]) -> int:
    """Dispatch the subset of nvidia-smi's command line that vllm-fleet uses."""
    gpus = load_gpus()
    ids = option(argv, "--id") or option(argv, "-i")
    if ids is not None:
        wanted = {int(i) for i in ids.split(",")}
        gpus = [g for g in gpus if g["index"] in wanted]
    fmt = option(argv, "--format") or "csv"
    query_gpu = option(argv, "--query-gpu")
    if query_gpu is not None:
        return csv_query(gpus, query_gpu.split(","), GPU_FIELDS, lambda g, f: gpu_value(g, f, len(gpus)), fmt)
    query_apps = option(argv, "--query-compute-apps")
    if query_apps is not None:
        # No process holds a simulated GPU: the real tool then prints only the header.
        return csv_query([], query_apps.split(","), APP_FIELDS, None, fmt)
    if "-q" in argv or "--query" in argv:
        display = option(argv, "-d") or option(argv, "--display")
        if display is not None and display.upper() == "TEMPERATURE":
            return temperature_report(gpus)
    if argv[:1] == ["topo"]:
        return topo(gpus)
    if "-L" in argv or "--list-gpus" in argv:
        for g in gpus:
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']}) (simulated)")
        return 0
    if not argv:
        return table(gpus)
    print(f"simulated nvidia-smi: unsupported arguments {argv!r} ({LABEL})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
