"""What vLLM enforces on an instance whatever GPUs it gets, applied alike by the single-host and
the multi-node planner: max_model_len against the model's length, the dtype old GPUs can run, and
tensor parallel divisibility."""

from __future__ import annotations

from typing import Callable

from vllm_fleet.catalog import DTYPE_BYTES, ModelInfo
from vllm_fleet.config import GpuSpec, InstanceConfig

#: Records a problem of the instance being planned: (key, message, fix). Each planner passes its
#: own, which locates the ConfigError (host, instance) the way that planner does.
ReportProblem = Callable[[str, str, str], None]


def resolve_max_model_len(inst: InstanceConfig, info: ModelInfo | None, report: ReportProblem,
                          notes: list[str] | None = None, *, needed: bool = True) -> int | None:
    """The instance's max_model_len, for every planner (one host's GPUs, a node group, a CPU host):
    its own, checked against the model's max_position_embeddings (vLLM refuses a longer one), else
    the model's. Where the model's length is unknown offline (no model data, or none in it), its
    own unchecked (a note says so); with none either, an error when the planner `needed` a length
    (the GPU planners size the KV cache with it), else None: vLLM takes the model's at start. None
    too when it is refused (reported)."""
    known = info.max_position_embeddings if info is not None else None
    if known is None:
        if inst.max_model_len is None:
            if needed:
                report("max_model_len",
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
        return known
    if inst.max_model_len > known:
        report("max_model_len",
               f"max_model_len {inst.max_model_len} exceeds the model's "
               f"max_position_embeddings ({known}); vLLM refuses it",
               f"set max_model_len <= {known}")
        return None
    return inst.max_model_len


def choose_dtype(inst: InstanceConfig, info: ModelInfo, gpus: list[GpuSpec], warnings: list[str]) -> str:
    """The dtype to pass: the instance's, or float16 where bfloat16 would land on GPUs older than
    compute capability 8.0 (with a warning)."""
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


def tp_problems(info: ModelInfo, tp: int) -> list[str]:
    """vLLM's own divisibility rules for tensor parallelism, in its words."""
    problems = []
    if info.num_attention_heads % tp:
        problems.append(f"Total number of attention heads ({info.num_attention_heads}) must be "
                        f"divisible by tensor parallel size ({tp}).")
    kv_heads = info.num_key_value_heads
    if kv_heads % tp and tp % kv_heads:
        problems.append(f"KV heads ({kv_heads}) and tensor parallel size ({tp}) must divide one another.")
    width = "moe_intermediate_size" if info.num_experts else "intermediate_size"
    if info.mlp_intermediate_size % tp:
        problems.append(f"{width} ({info.mlp_intermediate_size}) must be divisible by "
                        f"tensor parallel size ({tp}).")
    return problems
