"""The host's GPUs as host data declares them (`gpus`), or as nvidia-smi reports them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vllm_fleet.catalog import CudaTotal, cuda_total, gpu_model_facts
from vllm_fleet.config.errors import Checker


#: How the sandbox's simulated nvidia-smi marks its GPUs' UUIDs (real ones are GPU-<hex>-...).
SIMULATED_UUID_PREFIX = "GPU-sim-"


@dataclass(frozen=True)
class GpuSpec:
    """One GPU, by its index in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID numbers)."""

    index: int
    name: str
    memory_mib: int
    compute_capability: float | None = None
    pci_bus_id: str | None = None
    #: From nvidia-smi (or declared): the NVIDIA driver, e.g. "580.126.09"; None when not known.
    driver_version: str | None = None
    #: nvidia-smi's mig.mode.current: "Enabled", "Disabled"; None when the GPU has no MIG.
    mig_mode: str | None = None
    #: (field, what nvidia-smi printed) for values it could not read ("[N/A]", "[Unknown Error]").
    unreadable: tuple[tuple[str, str], ...] = ()
    #: nvidia-smi's memory.reserved (MiB the driver keeps), when the GPU list read it.
    reserved_mib: int | None = None
    #: The total CUDA reports, read on the host by the CUDA memory probe (payloads/cuda_memory).
    cuda_total_bytes: int | None = None
    #: nvidia-smi's uuid, when the GPU list read it ("GPU-sim-..." from the sandbox's simulated tool).
    uuid: str | None = None

    @property
    def simulated(self) -> bool:
        """Whether nvidia-smi is the sandbox's SIMULATED stand-in (vllm_fleet/sandbox/nvidia_smi.py)."""
        return bool(self.uuid and self.uuid.startswith(SIMULATED_UUID_PREFIX))

    @property
    def cuda_total(self) -> CudaTotal:
        """The memory vLLM budgets from (x gpu_memory_utilization) and where the number comes from."""
        return cuda_total(self.name, self.memory_mib, self.cuda_total_bytes, self.reserved_mib)

    @property
    def capability(self) -> float | None:
        if self.compute_capability is not None:
            return self.compute_capability
        facts = gpu_model_facts(self.name)
        return facts.compute_capability if facts else None

    @property
    def consumer(self) -> bool:
        facts = gpu_model_facts(self.name)
        return bool(facts and facts.consumer)

    @property
    def short_name(self) -> str:
        return self.name.removeprefix("NVIDIA ").removeprefix("GeForce ")


def parse_gpus(check: Checker, raw: Any, *, key: str = "gpus") -> tuple[GpuSpec, ...] | None:
    if not isinstance(raw, (list, tuple)):
        return None  # none declared, or not a list (Settings reports it)
    out = []
    for index, entry in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(entry, dict):
            check.error(f"expected a dict, got {entry!r}", key=where,
                        fix='{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}')
            continue
        check.unknown_keys(entry, ("name", "memory_mib", "compute_capability", "pci_bus_id",
                                   "driver_version", "mig_mode"),
                           instance=None, prefix=f"{where}.")
        name, memory = entry.get("name"), entry.get("memory_mib")
        if not isinstance(name, str) or not name.strip():
            check.error("a GPU needs a non-empty 'name'", key=f"{where}.name",
                        fix='"name": "NVIDIA A100-SXM4-40GB"')
            continue
        if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
            check.error(f"memory_mib must be a positive integer, got {memory!r}",
                        key=f"{where}.memory_mib", fix='"memory_mib": 40960')
            continue
        cc = entry.get("compute_capability")
        if cc is not None:
            # A number (8.6) or nvidia-smi's own text ("8.6", from --query-gpu=compute_cap).
            parsed = None
            if isinstance(cc, (int, float)) and not isinstance(cc, bool):
                parsed = float(cc)
            elif isinstance(cc, str) and re.fullmatch(r"\s*\d{1,2}\.\d\s*", cc):
                parsed = float(cc)
            if parsed is None:
                facts = gpu_model_facts(name)
                right = (f'"compute_capability": {facts.compute_capability} (what a {name.strip()} '
                         "has)") if facts else ('"compute_capability": "X.Y" as `nvidia-smi '
                                                '--query-gpu=compute_cap --format=csv` prints it')
                check.error(f"compute_capability must be a number like 8.6 or nvidia-smi's text "
                            f"like \"8.6\", got {cc!r}", key=f"{where}.compute_capability", fix=right)
            cc = parsed
        driver = entry.get("driver_version")
        if driver is not None and (not isinstance(driver, str)
                                   or not re.fullmatch(r"\d{1,6}(\.\d{1,6}){0,3}", driver.strip())):
            check.error(f"driver_version must be the NVIDIA driver as nvidia-smi prints it, got "
                        f"{driver!r}", key=f"{where}.driver_version",
                        fix='"driver_version": "580.126.09" (nvidia-smi --query-gpu=driver_version)')
            driver = None
        mig = entry.get("mig_mode")
        if mig is not None and mig not in ("Enabled", "Disabled"):
            check.error(f"mig_mode must be 'Enabled' or 'Disabled', got {mig!r}",
                        key=f"{where}.mig_mode", fix='"mig_mode": "Disabled"')
            mig = None
        out.append(GpuSpec(index=index, name=name.strip(), memory_mib=memory,
                           compute_capability=cc, pci_bus_id=entry.get("pci_bus_id"),
                           driver_version=driver.strip() if driver else None, mig_mode=mig))
    return tuple(out)
