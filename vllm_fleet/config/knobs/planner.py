"""The planner's defaults and reserves (vllm_fleet/plan/)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.config.knobs.common import GIB, POSITIVE
from vllm_fleet.config.schema import knob, section


@section("Planner")
@dataclass(frozen=True)
class PlannerKnobs:
    vllm_gpu_memory_utilization: float = knob(
        0.90, "default per instance: fraction of each GPU's TOTAL memory", above=0, high=1,
        must="a fraction in (0, 1]",
        notes="""
        The total is CUDA's, as vLLM reads it, below nvidia-smi's by what the driver keeps: read on
        the host at deploy time, else a recorded or conservative share per GPU model (docs/models.md,
        "The memory a plan budgets from"); the plan says which.
        """)
    vllm_min_kv_sequences: int = knob(
        4, '"good KV headroom": the KV cache holds this many max_model_len sequences', **POSITIVE)
    vllm_activation_reserve_gib: float = knob(
        2.0, "per GPU: activation peak + CUDA context, outside weights and KV", **GIB)
    vllm_cuda_graph_reserve_gib: float = knob(
        0.5, "per GPU: CUDA graphs (0 with engine_args enforce-eager)", **GIB)
