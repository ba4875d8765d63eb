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

Modules: types (what a plan is), memory (the memory and KV model, layer splits), rules (what vLLM
enforces on any GPUs), layouts (DP x PP x TP arrangements), reasons (the explanations),
placement (one host's GPUs to its instances; CPU hosts), multinode (Ray node groups),
engine_args (the engine arguments and environment every instance gets), fleet (plan_host,
plan_fleet).
"""

from vllm_fleet.plan.engine_args import BACKEND_HOST
from vllm_fleet.plan.fleet import plan_fleet, plan_host
from vllm_fleet.plan.memory import COMM_RESERVE_GIB, api_server_batched_tokens, balanced_partition, even_partition
from vllm_fleet.plan.multinode import node_addresses, plan_node_group, stage_order
from vllm_fleet.plan.types import (FleetPlan, GpuUse, HostPlan, InstancePlan, Interconnect, NodeGroupPlan,
                                   ParallelLayout, RayNode)

__all__ = [
    "BACKEND_HOST", "COMM_RESERVE_GIB", "FleetPlan", "GpuUse", "HostPlan", "InstancePlan", "Interconnect",
    "NodeGroupPlan", "ParallelLayout", "RayNode", "api_server_batched_tokens", "balanced_partition",
    "even_partition", "node_addresses", "plan_fleet", "plan_host", "plan_node_group", "stage_order",
]
