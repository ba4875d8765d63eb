"""pyinfra facts that read a host's GPUs: nvidia-smi's list and the NVML topology probe (one
command each, parsed in `process`; facts.prefetch batches them with the others)."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from vllm_fleet import payloads
from vllm_fleet.rules import cuda_memory, gpu_topology
from vllm_fleet.config import GpuSpec

#: memory.reserved: what the driver keeps of memory.total, which CUDA (and so vLLM) never sees; last,
#: so a row without it still parses (it is then read from the recorded table or a rule).
GPU_QUERY = ("index,pci.bus_id,name,memory.total,memory.used,uuid,compute_cap,driver_version,"
             "mig.mode.current,memory.reserved")


def parse_gpu_csv(lines: list[str]) -> list[GpuSpec]:
    """Parse `nvidia-smi --query-gpu=GPU_QUERY --format=csv[,noheader],nounits` into PCI order.

    Never raises: a value nvidia-smi could not read ("[N/A]", "[Unknown Error]", ...) is kept in
    the GpuSpec's `unreadable`, and `gpu_support.preflight` turns it into an error that names the
    host, the GPU and the field. Rows without the trailing fields (older callers) leave the driver
    and MIG mode unknown."""
    from vllm_fleet.gpu_support import gpus_from_rows, parse_csv_rows
    return gpus_from_rows(parse_csv_rows(lines, GPU_QUERY.split(",")))


class NvidiaGpus(FactBase):
    """GPUs from nvidia-smi, in PCI bus order; None when the host has no nvidia-smi.

    Each GpuSpec carries the driver version and MIG mode, and the fields nvidia-smi could not read
    (see parse_gpu_csv); `gpu_support.preflight` judges them before any host change."""

    #: What every driver answers (R470 has no compute_cap field: huggingface/candle#733).
    FALLBACK_QUERY = "index,pci.bus_id,name,memory.total,memory.used,uuid,driver_version"

    def requires_command(self) -> str:
        return "nvidia-smi"

    def command(self) -> str:
        # Drivers without compute_cap refuse the whole query: then ask for what every
        # driver answers, with a header (parse_gpu_csv maps columns by it), so the driver version
        # still reaches preflight and is refused with the version needed.
        return (f"nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits 2>/dev/null || "
                f"nvidia-smi --query-gpu={self.FALLBACK_QUERY} --format=csv,nounits")

    def default(self):
        return None

    def process(self, output):
        return parse_gpu_csv(list(output))


TOPOLOGY_SOURCE = payloads.script(payloads.GPU_TOPOLOGY)


def topology_command(python: str) -> str:
    """Run the GPU topology probe with the vLLM environment's `python`; without it (no environment yet),
    or if the probe crashes, print an 'unavailable' result instead. Always exits 0."""
    py = shlex.quote(python)

    def unavailable(reason: str) -> str:
        return "echo " + shlex.quote(gpu_topology.RESULT_PREFIX + json.dumps(gpu_topology.unavailable(reason)))

    return (f"if [ -x {py} ]; then {py} -c {shlex.quote(TOPOLOGY_SOURCE)} || "
            f"{unavailable(f'the GPU topology probe failed under {python}')}; "
            f"else {unavailable(f'no vLLM environment yet ({python} is missing)')}; fi")


class GpuTopology(FactBase):
    """The GPUs as NVML sees them, with the vLLM environment's pynvml: P2P and NVLink between GPU
    pairs, and each GPU's compute processes (vllm_fleet/payloads/gpu_topology documents the result).
    {"available": False, "reason": ...} without the environment, pynvml or the NVIDIA driver."""

    def command(self, python: str) -> str:
        return topology_command(python)

    def default(self):
        return gpu_topology.unavailable("the GPU topology probe could not run")

    def process(self, output):
        return gpu_topology.parse_output(output)


CUDA_MEMORY_SOURCE = payloads.script(payloads.CUDA_MEMORY)


def cuda_memory_command() -> str:
    """Run the CUDA memory probe with the host's python3 (no vLLM environment needed); without
    python3, or if it crashes, print an 'unavailable' result instead. Always exits 0."""

    def unavailable(reason: str) -> str:
        return "echo " + shlex.quote(cuda_memory.CUDA_MEMORY_PREFIX + json.dumps(cuda_memory.unavailable(reason)))

    return (f"if command -v python3 >/dev/null 2>&1; then python3 -c {shlex.quote(CUDA_MEMORY_SOURCE)} || "
            f"{unavailable('the CUDA memory probe failed under python3')}; "
            f"else {unavailable('no python3 on the host')}; fi")


class CudaMemory(FactBase):
    """The total memory CUDA reports per GPU (what vLLM budgets from), read through the driver's
    libcuda.so.1 with the host's python3 (vllm_fleet/payloads/cuda_memory documents the result).
    {"available": False, "reason": ...} without a driver, python3 or a GPU."""

    def command(self) -> str:
        return cuda_memory_command()

    def default(self):
        return cuda_memory.unavailable("the CUDA memory probe could not run")

    def process(self, output):
        return cuda_memory.parse_output(output)
