"""GPU facts the planner needs beyond what nvidia-smi reports: each GPU model's compute capability
and whether it is a consumer card, and the memory the CUDA runtime reports (what vLLM budgets from)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from vllm_fleet.model_shape import GIB, MIB

@dataclass(frozen=True)
class GpuModelFacts:
    """What the planner needs to know about a GPU model beyond what nvidia-smi reports.

    GPUs below the pinned vLLM build's minimum compute capability (vllm_fleet/gpu_support.py's
    RUNTIMES table: 7.5 for vLLM 0.33's torch 2.14 CUDA 13.0 build) are listed so that they are
    recognised and refused by name: V100/TITAN V (7.0), P100 (6.0), P40/GTX 10x0 (6.1) are NOT
    plannable with vLLM 0.33 (`plannable` below, `gpu_support.preflight`).
    """

    compute_capability: float
    #: GeForce/consumer cards: no NVLink, and P2P over PCIe hangs NCCL in TP (vllm#14449).
    consumer: bool

    def plannable(self, min_compute_capability: float) -> bool:
        return self.compute_capability >= min_compute_capability


# Matched as substrings of the nvidia-smi name, most specific first.
_GPU_FACTS: list[tuple[str, GpuModelFacts]] = [
    ("H200", GpuModelFacts(9.0, False)),
    ("H100", GpuModelFacts(9.0, False)),
    ("H800", GpuModelFacts(9.0, False)),
    ("A100", GpuModelFacts(8.0, False)),
    ("A800", GpuModelFacts(8.0, False)),
    ("A10", GpuModelFacts(8.6, False)),
    ("A40", GpuModelFacts(8.6, False)),
    ("L40", GpuModelFacts(8.9, False)),
    ("L4", GpuModelFacts(8.9, False)),
    ("RTX 5090", GpuModelFacts(12.0, True)),
    ("RTX 4090", GpuModelFacts(8.9, True)),
    ("RTX 3090", GpuModelFacts(8.6, True)),
    ("RTX A6000", GpuModelFacts(8.6, False)),
    ("RTX 6000 Ada", GpuModelFacts(8.9, False)),
    ("T4", GpuModelFacts(7.5, False)),
    ("RTX 2080", GpuModelFacts(7.5, True)),
    # Pre-Turing: below CUDA 13's minimum (see GpuModelFacts), refused by gpu_support.preflight.
    ("V100", GpuModelFacts(7.0, False)),
    ("TITAN V", GpuModelFacts(7.0, True)),
    ("P100", GpuModelFacts(6.0, False)),
    ("P40", GpuModelFacts(6.1, False)),
    ("GTX 1080", GpuModelFacts(6.1, True)),
]


def gpu_model_facts(name: str) -> GpuModelFacts | None:
    upper = name.upper()
    for needle, facts in _GPU_FACTS:
        if needle.upper() in upper:
            return facts
    if "GEFORCE" in upper:
        return GpuModelFacts(8.0, True)
    return None


# --- the memory vLLM budgets from ------------------------------------------------------------------
#
# vLLM budgets `gpu_memory_utilization` x the total the CUDA runtime reports (torch.cuda.mem_get_info,
# which is cudaDeviceProp.totalGlobalMem), not nvidia-smi's memory.total: the driver keeps a share of
# the card for itself that CUDA never shows. Per GPU model, what that share is, with where it was seen.

@dataclass(frozen=True)
class DriverReserve:
    """What the driver keeps of one GPU model's memory: nvidia-smi's total less CUDA's, in bytes."""

    needle: str  # matched in the nvidia-smi name, as _GPU_FACTS
    memory_mib: int  # nvidia-smi's memory.total of the board it was seen on
    reserve_bytes: int
    source: str


#: Seen on real GPUs. A logged "total_gpu_memory (23.55GiB)" has two decimals (+-5 MiB): the
#: smallest total seen is taken and the reserve rounded up, so a plan never counts on memory the
#: card may not have.
DRIVER_RESERVES: tuple[DriverReserve, ...] = (
    DriverReserve("H200", 143771, 150754820096 - 150109880320,
                  "recorded on an H200 with driver 580.159.04 (tests/fixtures/device/h200-580.159.04: "
                  "CUDA's total 150109880320 B against NVML's 150754820096 B; nvidia-smi's memory.reserved "
                  "616 MiB)"),
    DriverReserve("RTX 4090", 24564, (24564 - 24115) * MIB,
                  "vLLM's own logs on RTX 4090s: total_gpu_memory 23.55 GiB (vllm-project/vllm#11550) and "
                  "23.58 GiB (vllm-project/vllm#14447) against nvidia-smi's 24564 MiB (vllm-project/vllm"
                  "#7553); the RTX 4090 D has the same 24564 MiB board"),
    DriverReserve("RTX 3090", 24576, (24576 - 24125) * MIB,
                  "vLLM's log on RTX 3090s: 'Free memory on device (22.93/23.56 GiB)' "
                  "(wtdcode/vllm-backport#34) against nvidia-smi's 24576 MiB"),
)

#: GPU models not in the table, when nothing read on the host says better: the larger of 640 MiB
#: and 0.5 % of the card. Above every reserve recorded (615 MiB on a 141 GB H200, about 450 MiB on
#: 24 GB cards), so such a plan counts fewer KV blocks than vLLM finds, never more.
FALLBACK_RESERVE_MIB = 640
FALLBACK_RESERVE_SHARE = 0.005


@dataclass(frozen=True)
class CudaTotal:
    """The memory vLLM multiplies by gpu_memory_utilization, and where the number comes from."""

    total_bytes: int
    source: str  # "host", "nvidia-smi reserved", "table" or "rule"
    detail: str  # said in the plan

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


def driver_reserve(name: str, memory_mib: int) -> DriverReserve | None:
    """The table's row for this GPU model and board size (None: not recorded)."""
    upper = name.upper()
    for row in DRIVER_RESERVES:
        if row.needle.upper() in upper and row.memory_mib == memory_mib:
            return row
    return None


@lru_cache(maxsize=256)
def cuda_total(name: str, memory_mib: int, host_total_bytes: int | None = None,
               reserved_mib: int | None = None) -> CudaTotal:
    """What CUDA reports as the card's total, best source first: read on the host (the CUDA probe),
    nvidia-smi's memory.reserved (read with the GPU list), the recorded table, the stated rule."""
    smi_bytes = memory_mib * MIB
    smi_gib = f"{smi_bytes / GIB:.2f} GiB"
    if host_total_bytes:
        return CudaTotal(host_total_bytes, "host",
                         f"CUDA total {host_total_bytes / GIB:.2f} GiB (read on the host; nvidia-smi: {smi_gib})")
    if reserved_mib is not None and 0 <= reserved_mib < memory_mib:
        total = (memory_mib - reserved_mib) * MIB
        return CudaTotal(total, "nvidia-smi reserved",
                         f"CUDA total {total / GIB:.2f} GiB (nvidia-smi's total {smi_gib} less its "
                         f"memory.reserved {reserved_mib} MiB)")
    row = driver_reserve(name, memory_mib)
    if row is not None:
        total = smi_bytes - row.reserve_bytes
        return CudaTotal(total, "table",
                         f"CUDA total {total / GIB:.2f} GiB ({row.needle} table: nvidia-smi's {smi_gib} "
                         f"less the driver's {row.reserve_bytes / MIB:.0f} MiB)")
    # A toy board (a test's few MiB) keeps most of itself.
    reserve_mib = min(max(FALLBACK_RESERVE_MIB, math.ceil(memory_mib * FALLBACK_RESERVE_SHARE)), memory_mib // 10)
    total = smi_bytes - reserve_mib * MIB
    return CudaTotal(total, "rule",
                     f"CUDA total {total / GIB:.2f} GiB (nvidia-smi's total {smi_gib} less a conservative "
                     f"{reserve_mib} MiB for the driver: no recorded reserve for this GPU model)")
