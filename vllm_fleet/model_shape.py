"""A model's shape, as far as placement and memory are concerned: ModelInfo, the dtypes' sizes, the
attention fields read from a Hugging Face config.json, the weights a shape holds.

The built-in entries are in vllm_fleet/catalog.py; an instance's `model_info` is read by
vllm_fleet/config/model_info.py; how vLLM groups the attention layers for its KV cache is in
vllm_fleet/kv_cache_groups.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cached_property
from typing import Any

GIB = 1024**3
MIB = 1024**2

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


@dataclass(frozen=True)
class ModelInfo:
    """The shape of a model, as far as placement and memory are concerned."""

    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    weights_gib: float
    #: dtype of the weights as stored: bfloat16, float16, float32 or "gguf" (quantized).
    dtype: str = "bfloat16"
    #: None: not known (no offline length check; vLLM checks the real config.json at start).
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    #: config.json's sliding_window (tokens); None: every layer attends to the whole sequence.
    sliding_window: int | None = None
    #: config.json's layer_types ("sliding_attention" / "full_attention" per layer), if given.
    layer_types: tuple[str, ...] | None = None
    #: Gemma-style pattern: layer i is full attention when (i + 1) % pattern == 0, else sliding.
    sliding_window_pattern: int | None = None
    #: Mixture of experts: the routed experts per layer (config.json's num_experts, num_local_experts
    #: or n_routed_experts); None: a dense model. vLLM loads every expert, so weights_gib is the
    #: whole checkpoint, not the active parameters; the KV cache is the attention's, as for a dense
    #: model of the same layers and heads.
    num_experts: int | None = None
    #: One expert's MLP width (moe_intermediate_size; Mixtral's intermediate_size).
    moe_intermediate_size: int | None = None
    #: config.json's architectures: vLLM resolves the runner (generate or pooling) from them
    #: (config/runner.py). (): not known, a decoder (every catalog model is one).
    architectures: tuple[str, ...] = ()
    #: A sentence-transformers model (modules.json beside config.json): vLLM runs it as a pooling model.
    sentence_transformers: bool = False

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def shape(self) -> tuple:
        """What makes two models plan alike apart from their weights' size, dtype and context
        length: the layers, heads, widths, vocabulary, attention layout and experts."""
        ignored = ("weights_gib", "dtype", "max_position_embeddings", "architectures", "sentence_transformers")
        return tuple(getattr(self, name) for name in self.field_names() if name not in ignored)

    @property
    def mlp_intermediate_size(self) -> int:
        """The MLP width tensor parallelism splits: an expert's for a MoE model, else the dense one."""
        return (self.moe_intermediate_size or self.intermediate_size) if self.num_experts else self.intermediate_size

    def layer_params(self) -> int:
        """Parameters of one decoder layer: q, k, v, o projections and a gated MLP (for a MoE
        model, every expert's and the router)."""
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_key_value_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.mlp_intermediate_size
        if self.num_experts:
            mlp = self.num_experts * (mlp + self.hidden_size)
        return q_and_o + k_and_v + mlp

    def parameters(self) -> int:
        """Every parameter of the decoder: embedding (and an untied lm_head) and the layers (norms
        and biases, a few per mille, left out)."""
        copies = 1 if self.tie_word_embeddings else 2
        return self.vocab_size * self.hidden_size * copies + self.layer_params() * self.num_hidden_layers

    @cached_property
    def embedding_gib(self) -> float:
        """Weight GiB of the token embedding (also the size of an untied lm_head).

        Derived as the embedding's share of all parameters, so that it holds for quantized
        files (GGUF) as well as for bf16 ones.
        """
        return self.weights_gib * self.vocab_size * self.hidden_size / self.parameters()

    @cached_property
    def layer_gib(self) -> float:
        """Weight GiB of one decoder layer (the rest of the weights spread evenly)."""
        copies = 1 if self.tie_word_embeddings else 2
        return (self.weights_gib - copies * self.embedding_gib) / self.num_hidden_layers

    def attention_layers(self) -> tuple[int, int]:
        """(full-attention layers, sliding-window layers), as vLLM's model code assigns them."""
        n = self.num_hidden_layers
        if not self.sliding_window:
            return n, 0
        if self.layer_types:
            sliding = sum(1 for t in self.layer_types if t == "sliding_attention")
            return len(self.layer_types) - sliding, sliding
        if self.sliding_window_pattern:
            full = n // self.sliding_window_pattern
            return full, n - full
        return 0, n  # Mistral-style: every layer slides

    def kv_bytes_per_token_per_layer(self, tensor_parallel_size: int, kv_dtype_bytes: int) -> int:
        """KV-cache bytes one token costs in one layer on ONE GPU of a TP group.

        KV heads are split over TP ranks; with more ranks than KV heads they are replicated.
        """
        heads_per_rank = max(1, self.num_key_value_heads // tensor_parallel_size)
        return 2 * heads_per_rank * self.head_dim * kv_dtype_bytes



def attention_from_config(cfg: dict[str, Any], model_type: str | None = None) -> dict[str, Any]:
    """The ModelInfo attention fields from a Hugging Face config.json (text part).

    Qwen2-style `use_sliding_window: false` means no sliding window whatever `sliding_window` says;
    Gemma 3 / Gemma 2 configs without `layer_types` get transformers' own defaults
    (sliding_window_pattern 6, and 2 for Gemma 2's alternating layers).
    """
    window = cfg.get("sliding_window")
    if cfg.get("use_sliding_window") is False or not isinstance(window, int) or window <= 0:
        return {"sliding_window": None, "layer_types": None, "sliding_window_pattern": None}
    types = cfg.get("layer_types")
    pattern = cfg.get("sliding_window_pattern")
    kind = str(model_type or cfg.get("model_type") or "")
    if not isinstance(pattern, int) or pattern <= 0:
        pattern = 6 if kind.startswith("gemma3") else 2 if kind.startswith("gemma2") else None
    if isinstance(types, list) and all(isinstance(t, str) for t in types):
        return {"sliding_window": window, "layer_types": tuple(types), "sliding_window_pattern": None}
    return {"sliding_window": window, "layer_types": None, "sliding_window_pattern": pattern}


def derived_weights_gib(info: ModelInfo) -> float | None:
    """The weights' GiB a checkpoint of this shape holds in its dtype: every parameter
    (`ModelInfo.parameters`) x the dtype's bytes; None for a dtype without a fixed size (GGUF).
    Llama 3 8B: 8.03e9 x 2 bytes = 14.96 GiB, the size of its safetensors files."""
    size = DTYPE_BYTES.get(info.dtype)
    return info.parameters() * size / GIB if size else None
