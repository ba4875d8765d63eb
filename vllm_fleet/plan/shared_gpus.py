"""GPUs two or more instances list in their `gpus`: whether their gpu_memory_utilization fractions fit
on the GPU together, as vLLM checks each start.

vLLM's rule (vllm/v1/worker/utils.py: request_memory; gpu_worker.py: init_device): each engine
requests ceil(total x gpu_memory_utilization) bytes, `total` being CUDA's total of the GPU
(torch's mem_get_info, which leaves out what the driver reserves), and refuses to start ("Free memory
on device ... is less than desired GPU memory utilization") unless that much is free at its
snapshot, taken once its own CUDA context and distributed environment are up. Its budget is that
fraction: weights, activations and KV cache are what it measures from the snapshot on
(utils/mem_utils.py memory_profiling), so the context it brought up before is held beside the
fraction, by every engine on the GPU for as long as it runs. The last instance to start on a shared
GPU finds total less the others' fractions and contexts free, less its own context; the fractions
of N instances fit when

    sum(gpu_memory_utilization) x total + N x CONTEXT_HEADROOM_MIB <= total.

The numbers: CUDA's total is the one the plan budgets from (GpuSpec.cuda_total: read on the host,
nvidia-smi's memory.reserved, the recorded table or the stated rule; 615.06 MiB below nvidia-smi's
total on the recorded H200, tests/fixtures/device/h200-580.159.04/). A process's CUDA context took
527 MiB there (cuda-memory.json: mem_get_info total - free with torch's one context,
552402944 bytes); vLLM's engine also brings up its distributed environment (NCCL) before the snapshot,
so vllm-fleet leaves CONTEXT_HEADROOM_MIB = 1024 MiB per start, about twice the bare context.

Only explicit `gpus` lists share a GPU: `gpus: 'auto'` takes GPUs no other instance lists
(placement.py). The deploy starts the instances of a shared GPU one after the other (the unit of a
later one is ordered after the earlier one's, whose start ends when it is healthy: its memory is
then taken), and each start's ExecStartPre checks the GPU's free memory first (render.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vllm_fleet.catalog import MIB
from vllm_fleet.config import ConfigError, GpuSpec, HostConfig, InstanceConfig

#: Room each instance holds beside its budget: its CUDA context and distributed environment, up
#: before vLLM's memory snapshot (527 MiB measured for a bare context; see above).
CONTEXT_HEADROOM_MIB = 1024


@dataclass(frozen=True)
class SharedGpu:
    """One GPU several instances list, in their declared order, with their fractions."""

    gpu: GpuSpec
    instances: tuple[InstanceConfig, ...]

    @property
    def total(self) -> float:
        return sum(inst.gpu_memory_utilization for inst in self.instances)

    @property
    def limit(self) -> float:
        """The most the fractions may add up to on this GPU (see the module)."""
        return max_shared_fraction(self.gpu, len(self.instances))


def cuda_total_mib(gpu: GpuSpec) -> float:
    """CUDA's total of the GPU, the one its plan budgets from: vLLM's fractions are of it."""
    return max(gpu.cuda_total.total_bytes / MIB, 1.0)


def max_shared_fraction(gpu: GpuSpec, instances: int) -> float:
    """The largest sum of gpu_memory_utilization fractions of that many instances on the GPU: each
    holds its context's room beside its fraction."""
    return 1 - instances * CONTEXT_HEADROOM_MIB / cuda_total_mib(gpu)


def needed_free_mib(gpu: GpuSpec, utilization: float) -> int:
    """What a start needs free on the GPU (nvidia-smi's memory.free, which leaves out what the driver
    keeps, as CUDA's free does): its fraction of CUDA's total, and its context's headroom."""
    return math.ceil(cuda_total_mib(gpu) * utilization) + CONTEXT_HEADROOM_MIB


def shared_gpus(instances: list[tuple[InstanceConfig, list[GpuSpec]]]) -> list[SharedGpu]:
    """The GPUs two or more of these instances (with the GPUs each lists) list."""
    by_index: dict[int, tuple[GpuSpec, list[InstanceConfig]]] = {}
    for inst, gpus in instances:
        for gpu in gpus:
            by_index.setdefault(gpu.index, (gpu, []))[1].append(inst)
    return [SharedGpu(gpu, tuple(insts)) for gpu, insts in by_index.values() if len(insts) > 1]


def shared_gpu_errors(host_config: HostConfig, shared: list[SharedGpu]) -> list[ConfigError]:
    """A GPU whose instances' fractions do not fit, named with the instances, the fractions, the sum
    and the limit (reported on the last instance that lists it)."""
    errors = []
    for share in shared:
        if share.total <= share.limit + 1e-12:
            continue
        names = " + ".join(f"{inst.name} {inst.gpu_memory_utilization:g}" for inst in share.instances)
        room = share.limit - sum(inst.gpu_memory_utilization for inst in share.instances[:-1])
        errors.append(ConfigError(
            f"GPU {share.gpu.index} ({share.gpu.short_name}, {share.gpu.memory_mib} MiB) is listed by instances "
            f"{', '.join(inst.name for inst in share.instances)}, whose gpu_memory_utilization fractions add up "
            f"to {names} = {share.total:.4g}, above the {share.limit:.4f} that fit: vLLM budgets each as a "
            f"fraction of the GPU's total, and each instance holds {CONTEXT_HEADROOM_MIB} MiB beside its budget "
            "(its CUDA context), so the last to start would find too little free and refuse ('Free memory on device "
            "... is less than desired GPU memory utilization')",
            host=host_config.name, instance=share.instances[-1].name, key="gpus",
            fix=f"lower the fractions so they add up to at most {share.limit:.4f} (e.g. gpu_memory_utilization "
                f"= {math.floor(max(room, 0) * 100) / 100:g} on {share.instances[-1].name}), or give "
                f"{share.instances[-1].name} a GPU of its own"))
    return errors


def shared_reason(share: SharedGpu, inst: InstanceConfig) -> str:
    """Why the instance's budget on a shared GPU is what it is."""
    others = ", ".join(f"{other.name} ({other.gpu_memory_utilization:g})" for other in share.instances
                       if other is not inst)
    earlier = share.instances[:share.instances.index(inst)]
    return (f"GPU {share.gpu.index} is shared with {others}: this instance's budget is its own "
            f"gpu_memory_utilization {inst.gpu_memory_utilization:g} of the GPU; the fractions add up to "
            f"{share.total:.4g} of at most {share.limit:.4f} (each instance holds {CONTEXT_HEADROOM_MIB} MiB for "
            f"its CUDA context beside its budget); "
            + (f"it starts once {', '.join(e.name for e in earlier)} (listed before it) "
               f"{'is' if len(earlier) == 1 else 'are'} healthy, and " if earlier else "")
            + f"it checks that {needed_free_mib(share.gpu, inst.gpu_memory_utilization)} MiB are free "
              "before it starts")
