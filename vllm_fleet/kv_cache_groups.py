"""vLLM's hybrid KV cache manager, as arithmetic: how a model's attention layers are grouped for
the KV cache, the batches in flight at once, the blocks one request takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm_fleet.model_shape import ModelInfo

# Followed in the vllm 0.33.0 wheel:
# - vllm/v1/core/kv_cache_planning.py:416-535 (_get_kv_cache_groups_uniform_page_size): layers of
#   one spec are split into groups of `group_size` = the smallest per-type layer count, or the
#   largest when max < 1.5 x min; each group is one block table drawing from ONE block pool.
# - vllm/v1/core/kv_cache_utils.py:1061-1092 (get_max_concurrency_for_kv_cache_config):
#   num_blocks / sum over groups of cdiv(spec.max_memory_usage_bytes, spec.page_size_bytes).
# - vllm/v1/kv_cache_interface.py:643-648 (FullAttentionSpec): cdiv(max_model_len, block_size)
#   pages; 919-955 (SlidingWindowSpec.max_admission_blocks_per_request): cdiv(min(sliding_window
#   - 1 + max_in_flight_tokens, max_model_len), block_size) + 1 pages.
# - vllm/config/vllm.py:587-609: max_in_flight_tokens = max_concurrent_batches x
#   max_num_batched_tokens; max_concurrent_batches is PP + 1 with async scheduling on the V2 model
#   runner, 2 with it on the V1 runner without PP, else PP (see concurrent_batches).

#: vLLM's default KV block size on CUDA (tokens per block).
KV_BLOCK_SIZE = 16

#: vLLM pads the smaller layer type up to the larger one's count when max < this x min
#: (kv_cache_planning.py:524), rather than grouping by the smaller count.
GROUP_SIZE_PADDING_LIMIT = 1.5


def concurrent_batches(pipeline_parallel_size: int, async_scheduling: bool,
                       v2_model_runner: bool) -> int:
    """VllmConfig.max_concurrent_batches (vllm/config/vllm.py:587-598): the batches in flight at
    once, each up to max_num_batched_tokens. PP needs PP batches to fill the pipeline; async
    scheduling overlaps one more (the V1 runner only without PP)."""
    if async_scheduling:
        if v2_model_runner:
            return pipeline_parallel_size + 1
        if pipeline_parallel_size <= 1:
            return 2
    return pipeline_parallel_size


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KvGroups:
    """How vLLM groups a model's attention layers for its KV cache."""

    group_size: int  # layers per group (= KV tensors per block slot)
    full_groups: int
    sliding_groups: int
    sliding_window: int | None
    total_layers: int

    @classmethod
    def of(cls, info: "ModelInfo", hybrid: bool = True) -> "KvGroups":
        full, sliding = info.attention_layers() if hybrid else (info.num_hidden_layers, 0)
        counts = [c for c in (full, sliding) if c]
        size = min(counts)
        if max(counts) < size * GROUP_SIZE_PADDING_LIMIT:
            size = max(counts)
        return cls(size, _cdiv(full, size) if full else 0, _cdiv(sliding, size) if sliding else 0,
                   info.sliding_window if sliding else None, info.num_hidden_layers)

    @property
    def hybrid(self) -> bool:
        return self.sliding_groups > 0

    def slots(self, layers_on_stage: int) -> int:
        """KV tensors (layer slots per block) on a PP stage holding this many layers."""
        if self.full_groups + self.sliding_groups == 1:
            return layers_on_stage
        return max(1, _cdiv(self.group_size * layers_on_stage, self.total_layers))

    def blocks_per_request(self, max_model_len: int, max_in_flight_tokens: int,
                           block_size: int = KV_BLOCK_SIZE) -> int:
        """Blocks one max_model_len request takes over all groups; `max_in_flight_tokens` is
        concurrent_batches(...) x max_num_batched_tokens."""
        full = _cdiv(max_model_len, block_size)
        blocks = self.full_groups * full
        if self.sliding_groups:
            assert self.sliding_window is not None  # sliding groups come with their window (KvGroups.of)
            window = min(self.sliding_window - 1 + max_in_flight_tokens, max_model_len)
            blocks += self.sliding_groups * (_cdiv(window, block_size) + 1)
        return blocks
