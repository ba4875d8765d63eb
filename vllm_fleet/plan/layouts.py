"""Layouts of GPUs into DP replicas x PP stages x TP groups: on one host (every stage order worth
comparing, the layer split that suits it) and over the nodes of a multi-node instance."""

from __future__ import annotations

import itertools
from dataclasses import replace

from vllm_fleet.config import GpuSpec
from vllm_fleet.plan.memory import (MemoryModel, balanced_partition, evaluate_layout, even_partition,
                                    stage_free_gib)
from vllm_fleet.plan.reasons import memory_detail
from vllm_fleet.plan.types import ParallelLayout, ParallelLayoutCandidate, count_gpu_models, gpu_model_and_memory


def _stage_orders(stages: list[list[GpuSpec]]) -> list[list[list[GpuSpec]]]:
    """Stage orders worth comparing. Only the first and last stages differ (they also hold the
    embedding and lm_head), so try each distinct GPU kind in those two places, middles in PCI order.
    """
    if len({gpu_model_and_memory(stage[0]) for stage in stages}) < 2:
        return [stages]
    orders, seen = [stages], {tuple(gpu_model_and_memory(stage[0]) for stage in stages)}
    for first, last in itertools.permutations(range(len(stages)), 2):
        middle = [stage for i, stage in enumerate(stages) if i not in (first, last)]
        order = [stages[first], *middle, stages[last]]
        key = tuple(gpu_model_and_memory(stage[0]) for stage in order)
        if key not in seen:
            seen.add(key)
            orders.append(order)
    return orders


def arrange_layout(mem: MemoryModel, gpus: list[GpuSpec], tp: int, pp: int, dp: int) -> ParallelLayoutCandidate:
    """Arrange GPUs into DP replicas x PP stages x TP groups, or say why that is impossible."""
    info = mem.info
    if pp > info.num_hidden_layers:
        return ParallelLayoutCandidate(None, None, f"PP={pp} exceeds the model's {info.num_hidden_layers} layers")
    by_model: dict[tuple[str, int], list[GpuSpec]] = {}
    for g in gpus:
        by_model.setdefault(gpu_model_and_memory(g), []).append(g)
    if dp > 1 and len(by_model) > 1:
        return ParallelLayoutCandidate(None, None, "data-parallel replicas must be identical; mixed GPU models "
                                           "are joined only by pipeline parallelism (or use placement "
                                           "'split')")
    if any(len(members) % tp for members in by_model.values()):
        counts = ", ".join(f"{count}x{name}" for name, count in count_gpu_models(gpus))
        return ParallelLayoutCandidate(None, None, f"TP={tp} would put different GPU models in one TP group ({counts})")
    tp_groups = [members[i:i + tp] for members in by_model.values() for i in range(0, len(members), tp)]
    replica_groups = tp_groups[:pp]  # DP replicas are identical (checked above): plan one
    best: tuple[int, ParallelLayout] | None = None
    for order in _stage_orders(replica_groups):
        free = [stage_free_gib(mem, stage[0], tp, i == 0, i == pp - 1, pp) for i, stage in enumerate(order)]
        partition = (balanced_partition(free, info.num_hidden_layers, mem, tp)
                     if len(by_model) > 1 else even_partition(info.num_hidden_layers, pp))
        if partition is None:
            continue
        layout = evaluate_layout(mem, order, partition, tp, dp)
        if best is None or layout.kv_tokens > best[0]:
            best = (layout.kv_tokens, layout)
    even = (best[1] if best is not None and len(by_model) == 1  # identical GPUs: the even split
            else evaluate_layout(mem, replica_groups, even_partition(info.num_hidden_layers, pp), tp, dp))
    if best is None or best[1].kv_tokens <= 0:
        return ParallelLayoutCandidate(even, even, "weights do not fit: " + memory_detail(even))
    layout = best[1]
    if dp > 1:
        all_gpus = tuple(g for group in tp_groups[: pp * dp] for g in group)
        per_gpu = tuple(replace(use, index=g.index, name=g.name)
                        for g, use in zip(all_gpus, list(layout.per_gpu) * dp, strict=True))
        layout = replace(layout, gpus=all_gpus, per_gpu=per_gpu)
    return ParallelLayoutCandidate(layout, even, None)


def node_group_layout(mem: MemoryModel, stages: list[list[GpuSpec]], tp: int,
                      nodes: tuple[str, ...]) -> ParallelLayoutCandidate:
    """One stage per node, in rank order (`nodes`; fixed by vLLM, not chosen here). Nodes of one GPU
    kind get vLLM's even split; nodes that differ get the layer split weighted by free memory
    (balanced_partition, as for mixed GPU models on one host), set as VLLM_PP_LAYER_PARTITION."""
    layers, pp = mem.info.num_hidden_layers, len(stages)

    def on_nodes(partition: tuple[int, ...]) -> ParallelLayout:
        layout = evaluate_layout(mem, stages, partition, tp, 1)
        # Rows name their node: the GPU indices repeat across nodes.
        return replace(layout, per_gpu=tuple(replace(use, host=nodes[use.stage]) for use in layout.per_gpu))

    even = on_nodes(even_partition(layers, pp))
    if len({gpu_model_and_memory(stage[0]) for stage in stages}) == 1:
        partition: tuple[int, ...] | None = even.partition
    else:
        free = [stage_free_gib(mem, stage[0], tp, i == 0, i == pp - 1, pp) for i, stage in enumerate(stages)]
        partition = balanced_partition(free, layers, mem, tp)
    layout = on_nodes(partition) if partition else even
    if partition is None or layout.kv_tokens <= 0:
        return ParallelLayoutCandidate(even, even, "weights do not fit: " + memory_detail(even))
    return ParallelLayoutCandidate(layout, even, None)
