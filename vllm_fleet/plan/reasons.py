"""The planner's explanations: the reasons and warnings of a chosen layout, and why nothing fit.

The settings a reason explains (VLLM_PP_LAYER_PARTITION, NCCL_P2P_DISABLE,
--disable-custom-all-reduce) are set where the reason is written, so a plan never states a reason
for a setting it lacks, nor has a setting without its reason."""

from __future__ import annotations

import itertools
from vllm_fleet.catalog import KV_BLOCK_SIZE, ModelInfo
from vllm_fleet.config import GpuSpec, InstanceConfig
from vllm_fleet.plan.memory import MemoryModel, SchedulerDefaults, even_partition, gpu_budget_gib, kv_blocks
from vllm_fleet.plan.rules import tp_problems
from vllm_fleet.plan.types import (InstancePlan, Interconnect, ParallelLayout, ParallelLayoutCandidate, count_gpu_models,
                                   gpu_model_and_memory, logged_concurrency)


def two_decimals_rounded_down(value: float) -> str:
    """Two decimals, rounded down, for a comparison with a whole number: 0.999 must not read as a
    whole request, nor 3.999 as enough for vllm_min_kv_sequences 4. (What vLLM logs rounds to the
    nearest: logged_concurrency.)"""
    return f"{int(value * 100) / 100:.2f}"


def vllm_kv_log(mem: MemoryModel, layout: ParallelLayout) -> str:
    """The line vLLM logs for this layout's KV cache (update_kv_cache_capacity,
    v1/core/kv_cache_utils.py:1136-1154), with its thousands separators and rounding."""
    return (f"GPU KV cache size: {mem.kv_cache_size(layout):,} tokens, Maximum concurrency for "
            f"{mem.max_model_len:,} tokens per request: {logged_concurrency(mem.concurrency(layout))}x")


def memory_detail(layout: ParallelLayout) -> str:
    """The tightest GPU of a layout: its weights against its budget."""
    worst = max(layout.per_gpu, key=lambda use: use.weights_gib / use.budget_gib)
    node = f" of {worst.host}" if worst.host else ""
    return (f"GPU {worst.index}{node} ({worst.name}) would hold {worst.weights_gib:.1f} GiB of weights "
            f"of a {worst.budget_gib:.1f} GiB budget")


def in_flight_text(mem: MemoryModel, layout: ParallelLayout) -> str:
    """How vLLM's max_in_flight_tokens comes about, for the reasons."""
    scheduler = mem.scheduler or SchedulerDefaults()
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


def no_fit_error(inst: InstanceConfig, info: ModelInfo, gpus: list[GpuSpec], alternatives: list[str],
                 max_len: int) -> tuple[str, str, str]:
    """(key, message, fix) when no layout of `inst` (whose model's shape is `info`) fits these GPUs;
    `alternatives` says why each was rejected."""
    budget = sum(gpu_budget_gib(g, inst.gpu_memory_utilization) for g in gpus)
    on = ", ".join(f"{count}x{name}" for name, count in count_gpu_models(gpus))
    layouts = [tried for tried in alternatives if tried.startswith("TP=")]
    key = "model"
    if layouts and all("attention heads" in tried or "KV heads" in tried or "GPU models" in tried
                       for tried in layouts):
        key = "tensor_parallel_size"
        valid = ", ".join(str(tp) for tp in range(1, len(gpus) + 1) if not tp_problems(info, tp))
        own = inst.tensor_parallel_size
        return (key, (f"tensor_parallel_size {own} (the instance's) does not work" if own is not None
                      else "no tensor_parallel_size works") + f" for {inst.model} on {on}:\n    "
                + "\n    ".join(alternatives),
                f"use a tensor_parallel_size vLLM accepts for this model ({valid})"
                + (" or leave it out (the planner picks one)" if own is not None else "")
                + " and keep each TP group on one GPU model (join different models with "
                "pipeline_parallel_size)")
    return (key,
            f"{inst.model} ({info.weights_gib:.1f} GiB of weights, max_model_len {max_len}) "
            f"cannot be served on {on} ({budget:.1f} GiB usable at gpu_memory_utilization "
            f"{inst.gpu_memory_utilization}). Layouts tried:\n    " + "\n    ".join(alternatives),
            "use more or larger GPUs, a quantized model, a smaller max_model_len, or a higher "
            "gpu_memory_utilization; or spread it over servers with 'nodes' (pipeline parallel "
            "across them, on Ray)")


def budget_reason(layout: ParallelLayout, util: float) -> str:
    """Where each GPU's budget (CUDA's total x gpu_memory_utilization) comes from: read on the host,
    nvidia-smi's memory.reserved, the recorded table or the conservative rule."""
    by_source: dict[tuple[str, str], list[GpuSpec]] = {}
    for gpu in layout.gpus:
        total = gpu.cuda_total
        by_source.setdefault((gpu.short_name, total.detail), []).append(gpu)
    parts = []
    for (name, detail), gpus in by_source.items():
        indices = ",".join(str(g.index) for g in gpus)
        budget = gpu_budget_gib(gpus[0], util)
        parts.append(f"GPU{'s' if len(gpus) > 1 else ''} {indices} ({name}): {detail} x "
                     f"gpu_memory_utilization {util} = {budget:.2f} GiB")
    return "memory budget (vLLM's: CUDA's total, not nvidia-smi's, x gpu_memory_utilization): " + "; ".join(parts)


def apply_layout(plan: InstancePlan, mem: MemoryModel, chosen: ParallelLayoutCandidate, gpus: list[GpuSpec],
                 min_kv_sequences: int, interconnect: Interconnect | None) -> None:
    """The chosen layout's reasons and warnings on the plan, with the environment and flags they
    explain: the KV arithmetic, the PP layer split on mixed GPUs, NCCL on consumer cards and
    where the driver (`interconnect`, when known) reports no P2P."""
    layout, inst = chosen.built, plan.config
    conc = mem.concurrency(layout)
    blocks, per_request = kv_blocks(layout), mem.blocks_per_request(layout)
    plan.kv_cache_blocks, plan.kv_blocks_per_request = blocks, per_request
    plan.max_concurrency, plan.kv_cache_tokens = conc, mem.kv_cache_size(layout)
    plan.reasons.append(budget_reason(layout, mem.util))
    plan.reasons.append(f"{layout.label}: {blocks} KV-cache blocks of {KV_BLOCK_SIZE} tokens per "
                        f"replica; a {plan.max_model_len}-token request takes {per_request} blocks over "
                        f"all KV cache groups, so vLLM logs '{vllm_kv_log(mem, layout)}' (max "
                        f"concurrency = {blocks} / {per_request} blocks; the size = max concurrency x "
                        f"{plan.max_model_len}, the fraction dropped)")
    groups = mem.groups
    if groups is not None and groups.hybrid:
        full, sliding = mem.info.attention_layers()
        plan.reasons.append(
            f"hybrid KV cache (vLLM's hybrid KV cache manager): {full} full-attention and "
            f"{sliding} sliding-window layers (window {groups.sliding_window}) in "
            f"{groups.full_groups} + {groups.sliding_groups} groups of {groups.group_size}; a "
            f"sliding-window layer keeps only window - 1 + the tokens in flight per request: "
            f"{in_flight_text(mem, layout)}")
    if conc < min_kv_sequences:
        plan.warnings.append(f"the KV cache holds {two_decimals_rounded_down(conc)} requests of "
                             f"max_model_len {plan.max_model_len} at once (< vllm_min_kv_sequences "
                             f"{min_kv_sequences}): long requests will queue; a smaller "
                             "max_model_len gives more room")
    models = {gpu_model_and_memory(g) for g in gpus}
    if layout.pp > 1:
        plan.pp_layer_partition = layout.partition
        assert chosen.even is not None  # a candidate with a layout has its even split
        even_size = mem.kv_cache_size(chosen.even)
        plan.kv_cache_tokens_even_split = even_size
        if len(models) > 1:
            plan.env["VLLM_PP_LAYER_PARTITION"] = ",".join(str(layers) for layers in layout.partition)
            order = " -> ".join(f"GPU {stage[0].index} {stage[0].short_name}" for stage in
                                [layout.gpus[i * layout.tp:(i + 1) * layout.tp] for i in range(layout.pp)])
            plan.reasons.append(
                f"mixed GPU models are joined by pipeline parallelism only; stage order {order} and "
                f"layer split {list(layout.partition)} weighted by free memory give a KV cache "
                f"size of {plan.kv_cache_tokens:,} tokens vs {even_size:,} for the even split "
                f"{list(even_partition(mem.info.num_hidden_layers, layout.pp))} "
                f"(the first and last stages also hold the embedding and lm_head)")
            plan.warnings.append("vLLM assumes identical devices; the weakest GPU bounds the KV "
                                 "cache and gpu_memory_utilization applies to every GPU")
    apply_tp_links(plan, layout, interconnect)
    if inst.gguf:
        plan.reasons.append("GGUF weights: installs vllm-gguf-plugin and passes --tokenizer "
                            "(the base model's tokenizer)")


POOLING_ENDPOINTS = {"embed": "/v1/embeddings (and /v1/score, /v1/rerank)",
                     "classify": "/classify (and /v1/score, /v1/rerank for a single-label model)",
                     "pooling": "/pooling"}


def apply_runner(plan: InstancePlan) -> None:
    """The runner and convert vLLM gets (rendered as --runner/--convert for a pooling instance, or where
    the instance sets them), with why."""
    resolved = plan.config.resolved_runner
    plan.runner, plan.convert = resolved.runner, resolved.convert
    plan.pooling_task = resolved.task
    if resolved.pooling:
        convert = f", --convert {resolved.convert}" if resolved.convert != "none" else ""
        plan.reasons.append(f"--runner pooling{convert}: {resolved.why}; it serves "
                            f"{POOLING_ENDPOINTS[resolved.task or 'pooling']}, no completions or chat")


def apply_pooling_layout(plan: InstancePlan, mem: MemoryModel, chosen: ParallelLayoutCandidate,
                         interconnect: Interconnect | None) -> None:
    """A pooling instance's layout: its memory is weights and activations; a request ends with its
    prefill, so there is no KV cache to size and no concurrency figure."""
    layout = chosen.built
    worst = max(layout.per_gpu, key=lambda use: (use.weights_gib + (use.activations_gib or 0)) / use.budget_gib)
    used = worst.weights_gib + (worst.activations_gib or 0)
    plan.reasons.append(
        f"{layout.label}: pooling model, per GPU {worst.weights_gib:.2f} GiB of weights + "
        f"{worst.activations_gib or 0:.2f} GiB of activations (vllm_activation_reserve_gib"
        f"{'' if plan.config.enforce_eager else ' + vllm_cuda_graph_reserve_gib'}) of a {worst.budget_gib:.1f} GiB "
        f"budget ({used / worst.budget_gib:.0%}); no KV cache is planned: a pooling request ends with its "
        "prefill, so the rest of the budget is headroom, not concurrency")
    apply_tp_links(plan, layout, interconnect)


def apply_tp_links(plan: InstancePlan, layout: ParallelLayout, interconnect: Interconnect | None) -> None:
    """NCCL and vLLM's custom all-reduce for a TP group: off on consumer cards, and where the driver
    (`interconnect`, when known) reports no P2P."""
    if layout.tp > 1 and any(g.consumer for g in layout.gpus):
        plan.env["NCCL_P2P_DISABLE"] = "1"
        plan.engine_args["disable-custom-all-reduce"] = True
        plan.reasons.append("tensor parallelism on consumer GPUs without NVLink: NCCL P2P over "
                            "PCIe hangs (vllm#14449), so NCCL_P2P_DISABLE=1 and "
                            "--disable-custom-all-reduce")
    if layout.tp > 1 and interconnect is not None:
        apply_p2p_report(plan, layout, interconnect)


def apply_p2p_report(plan: InstancePlan, layout: ParallelLayout, interconnect: Interconnect) -> None:
    """Live P2P facts for the TP groups (the driver's report, via NVML).

    A TP group whose GPUs cannot reach each other peer to peer gets NCCL_P2P_DISABLE=1 (NCCL
    then goes through host shared memory) and --disable-custom-all-reduce (vLLM's custom
    all-reduce needs P2P; without it vLLM disables it itself, with a warning, after a test).
    When every pair has P2P nothing is relaxed: a "yes" from the driver proves little, and
    vLLM does not trust it either (all_reduce_utils.can_actually_p2p runs a real copy between
    the GPUs, because "sometimes the driver might be broken"); only a "no" is acted on.
    """
    tp_groups = [layout.gpus[start:start + layout.tp] for start in range(0, len(layout.gpus), layout.tp)]
    pairs = sorted({(a, b) for group in tp_groups for a, b in itertools.combinations(group, 2)},
                   key=lambda pair: (pair[0].index, pair[1].index))
    missing = [(a, b) for a, b in pairs if interconnect.p2p(a.index, b.index) is False]
    unknown = [(a, b) for a, b in pairs if interconnect.p2p(a.index, b.index) is None]
    nvlink = [f"{a.index}-{b.index}" for a, b in pairs if interconnect.has_nvlink(a.index, b.index)]
    if missing:
        plan.env["NCCL_P2P_DISABLE"] = "1"
        plan.engine_args["disable-custom-all-reduce"] = True
        which = ", ".join(f"GPU {a.index} {a.short_name} <-> GPU {b.index} {b.short_name} "
                          f"({interconnect.why_not(a.index, b.index)})" for a, b in missing)
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


# --- multi-node instances -------------------------------------------------------------------------

NODE_GROUP_NO_FIT_FIX = ("add nodes, use larger GPUs, a quantized model, a smaller max_model_len or a "
                         "higher gpu_memory_utilization")


def node_group_reasons(head: str, ray_version: str, order: tuple[str, ...],
                       per_node: dict[str, list[GpuSpec]], tp: int) -> list[str]:
    """Why a multi-node instance has its layout and runs on Ray (`order`: the stage order)."""
    stages = ", ".join(f"stage {i}: {node} ({len(per_node[node])}x{per_node[node][0].short_name}, GPUs "
                       f"{','.join(str(g.index) for g in per_node[node])})" for i, node in enumerate(order))
    return [f"multi-node over {len(order)} servers: TP={tp} = the GPUs of each node, PP={len(order)} = "
            f"one stage per node, in vLLM's Ray rank order (the head first, then by address): {stages}",
            f"--distributed-executor-backend ray: `vllm serve` runs on the head {head} "
            f"only, its workers are Ray actors on every node (Ray {ray_version} "
            "in each node's environment)"]


def node_group_no_fit(inst: InstanceConfig, mem: MemoryModel, candidate: ParallelLayoutCandidate,
                      order: tuple[str, ...], per_node: dict[str, list[GpuSpec]], max_len: int) -> str:
    """Why a multi-node instance does not fit its nodes, with the numbers."""
    info = mem.info
    budget = sum(gpu_budget_gib(g, inst.gpu_memory_utilization) for node in order
                 for g in per_node[node])
    on = ", ".join(f"{node} ({len(per_node[node])}x{per_node[node][0].short_name})" for node in order)
    detail = (candidate.problem if candidate.problem else
              f"KV cache holds {two_decimals_rounded_down(mem.concurrency(candidate.built))} requests of "
              f"max_model_len ({max_len}), less than one: {memory_detail(candidate.built)}")
    return (f"{inst.model} ({info.weights_gib:.1f} GiB of weights, max_model_len {max_len}) cannot be "
            f"served on the nodes {on} ({budget:.1f} GiB usable at gpu_memory_utilization "
            f"{inst.gpu_memory_utilization}): TP={len(per_node[order[0]])} PP={len(order)}: {detail}")
