"""Model shapes (a built-in catalog) and GPU facts the planner needs.

The catalog lets `vllm-fleet plan` work offline for common models: Llama 3/3.1/3.3, Qwen 2.5,
Qwen3 (dense and MoE), Gemma 3, Mistral Small 3/3.1/3.2 and the DeepSeek-R1 distills. Any other
model takes the instance key `model_info`: its config.json as it is (vllm_fleet/config/model_info.py).
At deploy time the model's own `config.json` and weight files on the host replace these numbers
(facts/discovery.py). Numbers are from each model's published `config.json`; `weights_gib` is the
size of the weight files (the GGUF entry: the file itself).

Attention layout (what vLLM's hybrid KV cache manager keys on): Gemma 3's published configs carry
`"sliding_window": 1024` (512 for the text-only 1B) in `text_config` and rely on transformers'
Gemma3TextConfig default `sliding_window_pattern = 6` (layer i is full attention when
(i + 1) % 6 == 0: 5 sliding : 1 full). Llama 3, Qwen 2.5, Qwen3 and Mistral Small are full
attention (Qwen's config.json has `"use_sliding_window": false`, Mistral Small's
`"sliding_window": null`).

Mixture of experts (Qwen3-30B-A3B, 235B-A22B): vLLM loads every expert on every GPU of a TP
group (each expert's MLP split over the ranks), so what the planner places is the whole
checkpoint (weights_gib), not the active parameters; the KV cache per token is the attention's
(layers x KV heads x head_dim), as for a dense model.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, fields, replace
from functools import cached_property, lru_cache
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


def _m(**kwargs: Any) -> ModelInfo:
    return ModelInfo(**kwargs)


# --- vLLM's hybrid KV cache manager, as arithmetic ------------------------------------------------
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


def _derived(**shape: Any) -> ModelInfo:
    """A catalog entry whose weights_gib is derived from its shape (text-only bf16 checkpoints)."""
    info = _m(weights_gib=1.0, **shape)
    weights_gib = derived_weights_gib(info)
    assert weights_gib is not None, f"{info.dtype}: not a dtype of fixed size"
    return replace(info, weights_gib=weights_gib)


_LLAMA3_8B = _m(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                hidden_size=4096, intermediate_size=14336, vocab_size=128256, weights_gib=14.96,
                max_position_embeddings=8192)
_LLAMA3_70B = _m(num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                 hidden_size=8192, intermediate_size=28672, vocab_size=128256, weights_gib=131.4,
                 max_position_embeddings=8192)
_QWEN25_7B = _m(num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, head_dim=128,
                hidden_size=3584, intermediate_size=18944, vocab_size=152064, weights_gib=14.19,
                max_position_embeddings=32768)
_QWEN25_14B = _m(num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
                 hidden_size=5120, intermediate_size=13824, vocab_size=152064, weights_gib=27.51,
                 max_position_embeddings=32768)
_QWEN25_72B = _m(num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, head_dim=128,
                 hidden_size=8192, intermediate_size=29568, vocab_size=152064, weights_gib=135.4,
                 max_position_embeddings=32768)
_GEMMA3_12B = _m(num_hidden_layers=48, num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                 hidden_size=3840, intermediate_size=15360, vocab_size=262208, weights_gib=22.7,
                 max_position_embeddings=131072, tie_word_embeddings=True,
                 sliding_window=1024, sliding_window_pattern=6)
_GEMMA3_27B = _m(num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                 hidden_size=5376, intermediate_size=21504, vocab_size=262208, weights_gib=51.2,
                 max_position_embeddings=131072, tie_word_embeddings=True,
                 sliding_window=1024, sliding_window_pattern=6)
# The seed's model: gemma-3-12b-it-qat-q4_0 GGUF (one 8.07 GB file). Serving it needs the
# vllm-gguf-plugin package and --tokenizer pointing at the base model's tokenizer.
_GEMMA3_12B_Q4_GGUF = replace(_GEMMA3_12B, weights_gib=7.52, dtype="gguf")

# The current families, from each model's config.json (huggingface.co/<id>/blob/main/config.json),
# read in public copies of those files: Qwen3 4B/8B/14B/32B/30B-A3B in citsjtu2020/LLM-Prof
# sglang/Model_Config.md, Qwen3 0.6B/1.7B and Gemma 3 1B in mlc-ai/mlc-llm
# python/mlc_llm/model/model_preset.py, the others in test fixtures and model tables of public
# repositories quoting the same numbers. weights_gib: derived from the shape for text-only bf16
# checkpoints (derived_weights_gib: what a pasted config.json without weights gets too); for the
# multimodal ones the vision encoder's weights are in the files as well: Gemma 3 4B's 4,300,079,472
# parameters (the same count the text shape plus the SigLIP encoder of its vision_config gives, as
# for Gemma 3 12B's published 12,187,325,040), Mistral Small 3.1/3.2's 24,011,361,280 (text 23.57e9
# plus the Pixtral encoder and projector of its vision_config).
_LLAMA31_70B = replace(_LLAMA3_70B, max_position_embeddings=131072)  # Llama 3.3 70B: the same shape
_LLAMA31_8B = replace(_LLAMA3_8B, max_position_embeddings=131072)
_QWEN3 = {"head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960}
_QWEN3_MOE = {**_QWEN3, "num_experts": 128}  # every layer routes each token to 8 of 128 experts
_GEMMA3_4B = _m(num_hidden_layers=34, num_attention_heads=8, num_key_value_heads=4, head_dim=256,
                hidden_size=2560, intermediate_size=10240, vocab_size=262208,
                weights_gib=8_600_158_944 / GIB, max_position_embeddings=131072,
                tie_word_embeddings=True, sliding_window=1024, sliding_window_pattern=6)
_MISTRAL_SMALL_3 = _derived(num_hidden_layers=40, num_attention_heads=32, num_key_value_heads=8,
                            head_dim=128, hidden_size=5120, intermediate_size=32768,
                            vocab_size=131072, max_position_embeddings=32768)
_MISTRAL_SMALL_31 = replace(_MISTRAL_SMALL_3, max_position_embeddings=131072,
                            weights_gib=24_011_361_280 * 2 / GIB)
_R1_QWEN = {"head_dim": 128, "max_position_embeddings": 131072}  # DeepSeek-R1 distills: Qwen2.5 shapes

#: Keys are matched against the end of a model id or path, case-insensitively (see `lookup`).
CATALOG: dict[str, ModelInfo] = {
    "meta-llama/meta-llama-3-8b": _LLAMA3_8B,
    "meta-llama/meta-llama-3-8b-instruct": _LLAMA3_8B,
    "meta-llama/llama-3.1-8b-instruct": _LLAMA31_8B,
    "meta-llama/meta-llama-3-70b": _LLAMA3_70B,
    "meta-llama/meta-llama-3-70b-instruct": _LLAMA3_70B,
    "meta-llama/llama-3.1-70b-instruct": _LLAMA31_70B,
    "meta-llama/llama-3.3-70b-instruct": _LLAMA31_70B,
    "qwen/qwen2.5-7b-instruct": _QWEN25_7B,
    "qwen/qwen2.5-14b-instruct": _QWEN25_14B,
    "qwen/qwen2.5-72b-instruct": _QWEN25_72B,
    "qwen/qwen3-0.6b": _derived(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                hidden_size=1024, intermediate_size=3072, tie_word_embeddings=True, **_QWEN3),
    "qwen/qwen3-1.7b": _derived(num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                hidden_size=2048, intermediate_size=6144, tie_word_embeddings=True, **_QWEN3),
    "qwen/qwen3-4b": _derived(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                              hidden_size=2560, intermediate_size=9728, tie_word_embeddings=True, **_QWEN3),
    "qwen/qwen3-8b": _derived(num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                              hidden_size=4096, intermediate_size=12288, **_QWEN3),
    "qwen/qwen3-14b": _derived(num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=8,
                               hidden_size=5120, intermediate_size=17408, **_QWEN3),
    "qwen/qwen3-32b": _derived(num_hidden_layers=64, num_attention_heads=64, num_key_value_heads=8,
                               hidden_size=5120, intermediate_size=25600, **_QWEN3),
    "qwen/qwen3-30b-a3b": _derived(num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                   hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                   **_QWEN3_MOE),
    "qwen/qwen3-235b-a22b": _derived(num_hidden_layers=94, num_attention_heads=64, num_key_value_heads=4,
                                     hidden_size=4096, intermediate_size=12288, moe_intermediate_size=1536,
                                     **_QWEN3_MOE),
    "google/gemma-3-1b-it": _derived(num_hidden_layers=26, num_attention_heads=4, num_key_value_heads=1,
                                     head_dim=256, hidden_size=1152, intermediate_size=6912, vocab_size=262144,
                                     max_position_embeddings=32768, tie_word_embeddings=True,
                                     sliding_window=512, sliding_window_pattern=6),
    "google/gemma-3-4b-it": _GEMMA3_4B,
    "google/gemma-3-12b-it": _GEMMA3_12B,
    "google/gemma-3-27b-it": _GEMMA3_27B,
    "gemma-3-12b-it-q4_0.gguf": _GEMMA3_12B_Q4_GGUF,
    "mistralai/mistral-small-24b-instruct-2501": _MISTRAL_SMALL_3,
    "mistralai/mistral-small-24b-base-2501": _MISTRAL_SMALL_3,
    "mistralai/mistral-small-3.1-24b-instruct-2503": _MISTRAL_SMALL_31,
    "mistralai/mistral-small-3.2-24b-instruct-2506": _MISTRAL_SMALL_31,
    "deepseek-ai/deepseek-r1-distill-qwen-1.5b": _derived(
        num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2, hidden_size=1536,
        intermediate_size=8960, vocab_size=151936, **_R1_QWEN),
    "deepseek-ai/deepseek-r1-distill-qwen-7b": _derived(
        num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4, hidden_size=3584,
        intermediate_size=18944, vocab_size=152064, **_R1_QWEN),
    "deepseek-ai/deepseek-r1-distill-qwen-14b": replace(_QWEN25_14B, max_position_embeddings=131072),
    "deepseek-ai/deepseek-r1-distill-qwen-32b": _derived(
        num_hidden_layers=64, num_attention_heads=40, num_key_value_heads=8, hidden_size=5120,
        intermediate_size=27648, vocab_size=152064, **_R1_QWEN),
    "deepseek-ai/deepseek-r1-distill-llama-8b": _LLAMA31_8B,
    "deepseek-ai/deepseek-r1-distill-llama-70b": _LLAMA31_70B,
}

#: Each catalog family's config.json `architectures` (the model class vLLM loads: it decides the
#: runner, and what LoRA wraps); the first prefix a key starts with gives it. A GGUF file has none
#: here (vLLM takes its class from the tokenizer repo's config).
_ARCHITECTURES = (
    ("meta-llama/", "LlamaForCausalLM"),
    ("qwen/qwen2.5-", "Qwen2ForCausalLM"),
    ("qwen/qwen3-30b-a3b", "Qwen3MoeForCausalLM"),
    ("qwen/qwen3-235b-a22b", "Qwen3MoeForCausalLM"),
    ("qwen/qwen3-", "Qwen3ForCausalLM"),
    ("google/gemma-3-1b-it", "Gemma3ForCausalLM"),
    ("google/gemma-3-", "Gemma3ForConditionalGeneration"),
    ("mistralai/mistral-small-24b-", "MistralForCausalLM"),
    ("mistralai/mistral-small-3.", "Mistral3ForConditionalGeneration"),
    ("deepseek-ai/deepseek-r1-distill-qwen-", "Qwen2ForCausalLM"),
    ("deepseek-ai/deepseek-r1-distill-llama-", "LlamaForCausalLM"),
)
CATALOG = {key: next((replace(info, architectures=(arch,)) for prefix, arch in _ARCHITECTURES
                      if key.startswith(prefix)), info) for key, info in CATALOG.items()}


def lookup(model: str) -> ModelInfo | None:
    """Find a model by its Hugging Face id, or by the last path parts of a local path."""
    key = catalog_key(model)
    return CATALOG[key] if key else None


def catalog_key(model: str) -> str | None:
    """The catalog's key for a model id or path (see `lookup`), or None."""
    wanted = model.rstrip("/").lower()
    for key in CATALOG:
        if wanted == key or wanted.endswith("/" + key) or wanted.endswith("/" + key.split("/")[-1]):
            return key
    return None


def same_shape(info: ModelInfo) -> list[str]:
    """The catalog keys of models with this shape (layers, heads, widths, vocabulary, attention
    layout, experts): Llama 3.3 70B's are Llama 3.1 70B's and DeepSeek-R1-Distill-Llama-70B's.
    The weights' size, dtype and context length may differ."""
    return [key for key, entry in CATALOG.items() if entry.shape() == info.shape()]


def closest(model: str) -> str | None:
    """The catalog key nearest to a model id or path that is not in the catalog (another size, a
    variant, a typo): for a did-you-mean."""
    wanted = model.rstrip("/").lower().split("/")[-1]

    def score(key: str) -> float:
        name = key.split("/")[-1]
        prefix = name.startswith(wanted) or wanted.startswith(name)  # -instruct, -base, -awq ...
        return max(difflib.SequenceMatcher(None, wanted, name).ratio(), 0.9 if prefix else 0.0)

    best = max(CATALOG, key=score)
    return best if score(best) >= 0.75 else None


def unknown_model_fix(model: str) -> str:
    """How to give the shape of a model the catalog does not know (the plan's error names it)."""
    fix = ("model_info = the model's config.json as it is (pasted, or its path on this workstation); "
           f"`vllm-fleet model-info {model}` prints the entry; or run the deploy, which reads "
           "config.json on the host")
    near = closest(model)
    if near and _size(near) and _size(model) and _size(near) != _size(model):
        # Another size of the family is another shape: borrowing it would plan the wrong memory.
        fix += (f". The closest built-in entry, '{near}', is another size ({_size(near)}B, not "
                f"{_size(model)}B): its shape is not this model's")
    elif near:
        twins = [k for k in same_shape(CATALOG[near]) if k != near]
        fix += (f". Did you mean '{near}' (in the built-in catalog"
                + (f"; same shape as {', '.join(twins)}" if twins else "") + ")?")
    return fix


_SIZE = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])")


def _size(model: str) -> str | None:
    """The parameter count a model id names ("32" of Qwen2.5-32B-Instruct), or None."""
    found = _SIZE.search(model.rstrip("/").split("/")[-1].lower())
    return found.group(1) if found else None


def is_gguf(model: str, info: ModelInfo | None = None) -> bool:
    return model.lower().endswith(".gguf") or (info is not None and info.dtype == "gguf")


@dataclass(frozen=True)
class GpuModelFacts:
    """What the planner needs to know about a GPU model beyond what nvidia-smi reports.

    GPUs below the pinned vLLM build's minimum compute capability (vllm_fleet/gpu_support.py's
    RUNTIMES table: 7.5 for vLLM 0.33's torch 2.14 CUDA 13.0 build) are listed so that they are
    recognised and refused by name: V100/TITAN V (7.0), P100 (6.0), P40/GTX 10x0 (6.1) are NOT
    plannable with vLLM 0.33 (`plannable` below, `gpu_support.preflight`).
    """

    compute_capability: float
    #: GeForce/consumer cards: no NVLink, and P2P over PCIe hangs NCCL in TP (vllm#14449).
    consumer: bool

    def plannable(self, min_compute_capability: float) -> bool:
        return self.compute_capability >= min_compute_capability


# Matched as substrings of the nvidia-smi name, most specific first.
_GPU_FACTS: list[tuple[str, GpuModelFacts]] = [
    ("H200", GpuModelFacts(9.0, False)),
    ("H100", GpuModelFacts(9.0, False)),
    ("H800", GpuModelFacts(9.0, False)),
    ("A100", GpuModelFacts(8.0, False)),
    ("A800", GpuModelFacts(8.0, False)),
    ("A10", GpuModelFacts(8.6, False)),
    ("A40", GpuModelFacts(8.6, False)),
    ("L40", GpuModelFacts(8.9, False)),
    ("L4", GpuModelFacts(8.9, False)),
    ("RTX 5090", GpuModelFacts(12.0, True)),
    ("RTX 4090", GpuModelFacts(8.9, True)),
    ("RTX 3090", GpuModelFacts(8.6, True)),
    ("RTX A6000", GpuModelFacts(8.6, False)),
    ("RTX 6000 Ada", GpuModelFacts(8.9, False)),
    ("T4", GpuModelFacts(7.5, False)),
    ("RTX 2080", GpuModelFacts(7.5, True)),
    # Pre-Turing: below CUDA 13's minimum (see GpuModelFacts), refused by gpu_support.preflight.
    ("V100", GpuModelFacts(7.0, False)),
    ("TITAN V", GpuModelFacts(7.0, True)),
    ("P100", GpuModelFacts(6.0, False)),
    ("P40", GpuModelFacts(6.1, False)),
    ("GTX 1080", GpuModelFacts(6.1, True)),
]


def gpu_model_facts(name: str) -> GpuModelFacts | None:
    upper = name.upper()
    for needle, facts in _GPU_FACTS:
        if needle.upper() in upper:
            return facts
    if "GEFORCE" in upper:
        return GpuModelFacts(8.0, True)
    return None


# --- the memory vLLM budgets from ------------------------------------------------------------------
#
# vLLM budgets `gpu_memory_utilization` x the total the CUDA runtime reports (torch.cuda.mem_get_info,
# which is cudaDeviceProp.totalGlobalMem), not nvidia-smi's memory.total: the driver keeps a share of
# the card for itself that CUDA never shows. Per GPU model, what that share is, with where it was seen.

@dataclass(frozen=True)
class DriverReserve:
    """What the driver keeps of one GPU model's memory: nvidia-smi's total less CUDA's, in bytes."""

    needle: str  # matched in the nvidia-smi name, as _GPU_FACTS
    memory_mib: int  # nvidia-smi's memory.total of the board it was seen on
    reserve_bytes: int
    source: str


#: Seen on real GPUs. A logged "total_gpu_memory (23.55GiB)" has two decimals (+-5 MiB): the
#: smallest total seen is taken and the reserve rounded up, so a plan never counts on memory the
#: card may not have.
DRIVER_RESERVES: tuple[DriverReserve, ...] = (
    DriverReserve("H200", 143771, 150754820096 - 150109880320,
                  "recorded on an H200 with driver 580.159.04 (tests/fixtures/device/h200-580.159.04: "
                  "CUDA's total 150109880320 B against NVML's 150754820096 B; nvidia-smi's memory.reserved "
                  "616 MiB)"),
    DriverReserve("RTX 4090", 24564, (24564 - 24115) * MIB,
                  "vLLM's own logs on RTX 4090s: total_gpu_memory 23.55 GiB (vllm-project/vllm#11550) and "
                  "23.58 GiB (vllm-project/vllm#14447) against nvidia-smi's 24564 MiB (vllm-project/vllm"
                  "#7553); the RTX 4090 D has the same 24564 MiB board"),
    DriverReserve("RTX 3090", 24576, (24576 - 24125) * MIB,
                  "vLLM's log on RTX 3090s: 'Free memory on device (22.93/23.56 GiB)' "
                  "(wtdcode/vllm-backport#34) against nvidia-smi's 24576 MiB"),
)

#: GPU models not in the table, when nothing read on the host says better: the larger of 640 MiB
#: and 0.5 % of the card. Above every reserve recorded (615 MiB on a 141 GB H200, about 450 MiB on
#: 24 GB cards), so such a plan counts fewer KV blocks than vLLM finds, never more.
FALLBACK_RESERVE_MIB = 640
FALLBACK_RESERVE_SHARE = 0.005


@dataclass(frozen=True)
class CudaTotal:
    """The memory vLLM multiplies by gpu_memory_utilization, and where the number comes from."""

    total_bytes: int
    source: str  # "host", "nvidia-smi reserved", "table" or "rule"
    detail: str  # said in the plan

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB


def driver_reserve(name: str, memory_mib: int) -> DriverReserve | None:
    """The table's row for this GPU model and board size (None: not recorded)."""
    upper = name.upper()
    for row in DRIVER_RESERVES:
        if row.needle.upper() in upper and row.memory_mib == memory_mib:
            return row
    return None


@lru_cache(maxsize=256)
def cuda_total(name: str, memory_mib: int, host_total_bytes: int | None = None,
               reserved_mib: int | None = None) -> CudaTotal:
    """What CUDA reports as the card's total, best source first: read on the host (the CUDA probe),
    nvidia-smi's memory.reserved (read with the GPU list), the recorded table, the stated rule."""
    smi_bytes = memory_mib * MIB
    smi_gib = f"{smi_bytes / GIB:.2f} GiB"
    if host_total_bytes:
        return CudaTotal(host_total_bytes, "host",
                         f"CUDA total {host_total_bytes / GIB:.2f} GiB (read on the host; nvidia-smi: {smi_gib})")
    if reserved_mib is not None and 0 <= reserved_mib < memory_mib:
        total = (memory_mib - reserved_mib) * MIB
        return CudaTotal(total, "nvidia-smi reserved",
                         f"CUDA total {total / GIB:.2f} GiB (nvidia-smi's total {smi_gib} less its "
                         f"memory.reserved {reserved_mib} MiB)")
    row = driver_reserve(name, memory_mib)
    if row is not None:
        total = smi_bytes - row.reserve_bytes
        return CudaTotal(total, "table",
                         f"CUDA total {total / GIB:.2f} GiB ({row.needle} table: nvidia-smi's {smi_gib} "
                         f"less the driver's {row.reserve_bytes / MIB:.0f} MiB)")
    # A toy board (a test's few MiB) keeps most of itself.
    reserve_mib = min(max(FALLBACK_RESERVE_MIB, math.ceil(memory_mib * FALLBACK_RESERVE_SHARE)), memory_mib // 10)
    total = smi_bytes - reserve_mib * MIB
    return CudaTotal(total, "rule",
                     f"CUDA total {total / GIB:.2f} GiB (nvidia-smi's total {smi_gib} less a conservative "
                     f"{reserve_mib} MiB for the driver: no recorded reserve for this GPU model)")
