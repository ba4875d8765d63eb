"""What the planner produces (per GPU, layout, instance, host, fleet, Ray node) and the GPU
grouping every part of it uses: GPUs of one model and memory size are interchangeable."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vllm_fleet.config import GpuSpec, InstanceConfig, NodeGroup, instance_unit


def logged_concurrency(value: float) -> str:
    """Max concurrency as vLLM logs it ('%.2fx' in update_kv_cache_capacity,
    v1/core/kv_cache_utils.py:1136-1154), without the x: the plan's text and JSON both use it."""
    return "%.2f" % value


@dataclass(frozen=True)
class Interconnect:
    """What a host's driver reports between its GPUs (the GpuTopology fact, at deploy time).

    Keys are GPU index pairs (PCI bus order, lower index first); values are "ok" or NVML's reason
    ("chipset not supported", ...). `read` is NVML_P2P_CAPS_INDEX_READ (P2P over PCIe or NVLink),
    `nvlink` NVML_P2P_CAPS_INDEX_NVLINK. A pair missing from both is unknown.
    """

    read: dict[tuple[int, int], str] = field(default_factory=dict)
    nvlink: dict[tuple[int, int], str] = field(default_factory=dict)

    @classmethod
    def from_topology(cls, topology: dict[str, Any]) -> "Interconnect":
        """From the GPU topology probe's result ({"available": true, "gpus": [...], "p2p": {...}})."""
        gpu_count = len(topology["gpus"])
        pairs = [(i, j) for i in range(gpu_count) for j in range(i + 1, gpu_count)]
        return cls(**{kind: {(i, j): topology["p2p"][kind][i][j] for i, j in pairs}
                      for kind in ("read", "nvlink")})

    def p2p(self, a: int, b: int) -> bool | None:
        """Whether GPUs a and b can reach each other peer to peer (None: not known)."""
        key = (min(a, b), max(a, b))
        if key not in self.read and key not in self.nvlink:
            return None
        return self.read.get(key) == "ok" or self.nvlink.get(key) == "ok"

    def why_not(self, a: int, b: int) -> str:
        return self.read.get((min(a, b), max(a, b)), "unknown")

    def has_nvlink(self, a: int, b: int) -> bool:
        return self.nvlink.get((min(a, b), max(a, b))) == "ok"


def gpu_model_and_memory(gpu: GpuSpec) -> tuple[str, int]:
    """What makes GPUs interchangeable in a TP group or a DP replica: one model, one memory size."""
    return (gpu.name, gpu.memory_mib)


def count_gpu_models(gpus: tuple[GpuSpec, ...] | list[GpuSpec]) -> list[tuple[str, int]]:
    """(short name, how many) per GPU model, in the order met: what labels and messages show."""
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.short_name] = counts.get(gpu.short_name, 0) + 1
    return list(counts.items())


@dataclass(frozen=True)
class GpuUse:
    """What one GPU of an instance holds."""

    index: int
    name: str
    stage: int
    weights_gib: float
    kv_cache_gib: float
    budget_gib: float
    #: The node the GPU is in, for a multi-node instance (its GPU indices repeat across nodes);
    #: None on one host.
    host: str | None = None
    #: A pooling instance's activation peak (and CUDA graphs, communication buffers) on the GPU: what
    #: it plans instead of a KV cache. None for a generating instance (its reserve is in the KV arithmetic).
    activations_gib: float | None = None

    def as_dict(self) -> dict[str, Any]:
        out = {"index": self.index, "name": self.name, "stage": self.stage,
               "weights_gib": round(self.weights_gib, 2), "kv_cache_gib": round(self.kv_cache_gib, 2),
               "budget_gib": round(self.budget_gib, 2)}
        if self.activations_gib is not None:  # a pooling instance: activations, and no KV cache figure
            del out["kv_cache_gib"]
            out["activations_gib"] = round(self.activations_gib, 2)
        return {"host": self.host, **out} if self.host else out


@dataclass(frozen=True)
class ParallelLayout:
    """An instance's parallel layout (DP x PP x TP) on an ordered list of GPUs, with its memory
    arithmetic. (Where things are on a host is HostLayout's: vllm_fleet.host_layout.)"""

    gpus: tuple[GpuSpec, ...]  # in CUDA_VISIBLE_DEVICES order (rank order DP x PP x TP)
    tp: int
    pp: int
    dp: int
    partition: tuple[int, ...]  # layers per PP stage
    kv_tokens: int  # KV-cache tokens of one replica (the minimum over its stages)
    per_gpu: tuple[GpuUse, ...]

    @property
    def label(self) -> str:
        models = "+".join(f"{count}x{name}" for name, count in count_gpu_models(self.gpus))
        return f"TP={self.tp} PP={self.pp} DP={self.dp} on {models}"


@dataclass(frozen=True)
class ParallelLayoutCandidate:
    """A layout being weighed: the layout (None when it cannot be built), the same stages with an
    even layer split (to compare with the weighted one), and why it cannot work."""

    layout: ParallelLayout | None
    even: ParallelLayout | None
    problem: str | None

    @property
    def built(self) -> ParallelLayout:
        """The layout of a candidate without a problem (arrange_layout and node_group_layout build one
        for each)."""
        assert self.layout is not None, self.problem
        return self.layout


@dataclass
class InstancePlan:
    """One planned `vllm serve`: what the renderer turns into files."""

    config: InstanceConfig
    name: str
    layout: ParallelLayout | None  # None on CPU hosts
    dtype: str
    max_model_len: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    pp_layer_partition: tuple[int, ...] | None = None
    #: The KV cache of one replica as vLLM's log states it: "GPU KV cache size: {kv_cache_tokens}
    #: tokens, Maximum concurrency for {max_model_len} tokens per request: {max_concurrency}x"
    #: (MemoryModel.kv_cache_size, MemoryModel.concurrency), from its blocks of KV_BLOCK_SIZE
    #: tokens and the blocks one max_model_len request takes over all KV cache groups.
    kv_cache_tokens: int | None = None
    kv_cache_tokens_even_split: int | None = None
    kv_cache_blocks: int | None = None
    kv_blocks_per_request: int | None = None
    max_concurrency: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    packages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)
    port: int = 0  # where clients connect: the host's front listens here
    #: Where vLLM itself listens, on 127.0.0.1 only (set by add_engine_args_and_env).
    backend_port: int = 0
    #: A multi-node instance: its nodes (declared order, the head first: this plan is the head's)
    #: and the GPU indices it uses on each. Empty on one host.
    nodes: tuple[str, ...] = ()
    node_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: placement 'auto' on mixed GPU models: the objective, the layout chosen and the runner-up with
    #: their numbers (plan/objective.py: choice_record); None where nothing was weighed.
    placement_choice: dict[str, Any] | None = None
    #: vLLM's runner and convert for the instance (config/runner.py), and what a pooling one serves.
    runner: str = "generate"
    convert: str = "none"
    pooling_task: str | None = None
    #: A GPU shared with other instances (plan/shared_gpus.py): the MiB each of its GPUs must have
    #: free when it starts (GPU index -> MiB), and the instances listed before it there, which start first.
    gpu_free_checks: dict[int, int] = field(default_factory=dict)
    start_after: tuple[str, ...] = ()

    @property
    def unit_name(self) -> str:
        return instance_unit(self.name)

    @property
    def pooling(self) -> bool:
        return self.runner == "pooling"

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        """The GPUs of this host the instance uses (on the head only, for a multi-node one)."""
        if self.nodes:
            return self.node_gpus[self.nodes[0]]
        return tuple(g.index for g in self.layout.gpus) if self.layout else ()

    @property
    def cuda_visible_devices(self) -> str:
        return ",".join(str(i) for i in self.gpu_indices)

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit_name,
            "model": self.config.model,
            "runner": self.runner,
            "convert": self.convert,
            "served_model_name": self.config.served_model_name,
            # the names its LoRA adapters serve under (each a model to clients)
            "adapters": [adapter.name for adapter in self.config.adapters],
            "port": self.port,
            "backend_port": self.backend_port,
            "cuda_visible_devices": self.cuda_visible_devices,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "pp_layer_partition": list(self.pp_layer_partition) if self.pp_layer_partition else None,
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "nodes": list(self.nodes) or None,
            "kv_cache_tokens": self.kv_cache_tokens,
            "kv_cache_tokens_even_split": self.kv_cache_tokens_even_split,
            "kv_cache_blocks": self.kv_cache_blocks,
            "kv_blocks_per_request": self.kv_blocks_per_request,
            # The digits vLLM logs, the text's too (the exact ratio: the two numbers above).
            "max_concurrency": (float(logged_concurrency(self.max_concurrency))
                                if self.max_concurrency is not None else None),
            "per_gpu": [g.as_dict() for g in self.layout.per_gpu] if self.layout else [],
            "env": dict(self.env),
            # what the engine config gets, the planner's own (enable-lora, max-lora-rank, ...) included
            "engine_args": dict(self.engine_args),
            "packages": list(self.packages),
            "warnings": list(self.warnings),
            "reasons": list(self.reasons),
            "alternatives": list(self.alternatives),
            "placement_choice": self.placement_choice,
        }


@dataclass(frozen=True)
class RayNode:
    """One host's Ray node in a multi-node instance's cluster (HostPlan.ray): what render.py turns
    into vllm-fleet-ray.service (`ray start --head` on the head, `ray start --address` elsewhere)."""

    instance: str  # the multi-node instance; its vLLM unit runs on the head only
    nodes: tuple[str, ...]  # as declared, the head first
    host: str  # this node
    gpus: tuple[int, ...]  # this node's GPUs given to Ray (CUDA_VISIBLE_DEVICES, --num-gpus)
    addresses: dict[str, str]  # node -> its address on the nodes' network (see node_addresses)
    port: int  # the head's Ray (GCS) port: vllm_ray_port of the head
    packages: tuple[str, ...]  # what the node's environment needs for it (ray, pinned)

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def is_head(self) -> bool:
        return self.host == self.head

    @property
    def address(self) -> str:
        return self.addresses[self.host]

    @property
    def head_address(self) -> str:
        """What workers pass to `ray start --address` and the head's vLLM gets as RAY_ADDRESS."""
        host = self.addresses[self.head]
        return f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"

    def as_dict(self) -> dict[str, Any]:
        return {"role": "head" if self.is_head else "worker", "instance": self.instance,
                "nodes": list(self.nodes), "head": self.head, "head_address": self.head_address,
                "address": self.address, "gpus": list(self.gpus), "packages": list(self.packages)}


@dataclass
class NodeGroupPlan:
    """A planned multi-node instance: the head's InstancePlan (its layout spans every node's GPUs)
    and each node's Ray part."""

    group: NodeGroup
    plan: InstancePlan
    roles: dict[str, RayNode]

    def reserved(self, host_name: str) -> tuple[int, ...]:
        """The GPUs of that host the group uses: no other instance of that host may have them."""
        role = self.roles.get(host_name)
        return role.gpus if role else ()


@dataclass
class HostPlan:
    name: str
    gpus: tuple[GpuSpec, ...]
    gpu_source: str  # "declared", "live" or "none"
    target: str
    instances: list[InstancePlan]
    unused_gpus: tuple[int, ...] = ()
    warnings: list[str] = field(default_factory=list)
    #: This host's Ray node when it is in a multi-node instance's node group (head or worker).
    ray: RayNode | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "gpu_source": self.gpu_source,
            "gpus": [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib,
                      "compute_capability": g.capability,
                      # What vLLM budgets from (x gpu_memory_utilization) and which source gave it.
                      "cuda_total_bytes": g.cuda_total.total_bytes, "budget_source": g.cuda_total.source,
                      "budget_from": g.cuda_total.detail} for g in self.gpus],
            "unused_gpus": list(self.unused_gpus),
            "instances": [i.as_dict() for i in self.instances],
            "ray": self.ray.as_dict() if self.ray else None,
            "warnings": list(self.warnings),
        }


@dataclass
class FleetPlan:
    hosts: list[HostPlan]

    def as_dict(self) -> dict[str, Any]:
        return {"hosts": [h.as_dict() for h in self.hosts]}
