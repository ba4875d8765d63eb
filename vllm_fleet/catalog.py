"""The built-in catalog of model shapes, and how a model id finds its entry (or the closest one).

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
import re
from dataclasses import replace
from typing import Any

# Re-exported: the planner, the commands and the tests name a model's shape, its KV cache groups
# and the GPU facts through the catalog.
from vllm_fleet.gpu_models import DRIVER_RESERVES as DRIVER_RESERVES
from vllm_fleet.gpu_models import FALLBACK_RESERVE_MIB as FALLBACK_RESERVE_MIB
from vllm_fleet.gpu_models import FALLBACK_RESERVE_SHARE as FALLBACK_RESERVE_SHARE
from vllm_fleet.gpu_models import CudaTotal as CudaTotal
from vllm_fleet.gpu_models import DriverReserve as DriverReserve
from vllm_fleet.gpu_models import GpuModelFacts as GpuModelFacts
from vllm_fleet.gpu_models import cuda_total as cuda_total
from vllm_fleet.gpu_models import driver_reserve as driver_reserve
from vllm_fleet.gpu_models import gpu_model_facts as gpu_model_facts
from vllm_fleet.kv_cache_groups import GROUP_SIZE_PADDING_LIMIT as GROUP_SIZE_PADDING_LIMIT
from vllm_fleet.kv_cache_groups import KV_BLOCK_SIZE as KV_BLOCK_SIZE
from vllm_fleet.kv_cache_groups import KvGroups as KvGroups
from vllm_fleet.kv_cache_groups import concurrent_batches as concurrent_batches
from vllm_fleet.model_shape import DTYPE_BYTES as DTYPE_BYTES
from vllm_fleet.model_shape import GIB as GIB
from vllm_fleet.model_shape import MIB as MIB
from vllm_fleet.model_shape import ModelInfo as ModelInfo
from vllm_fleet.model_shape import attention_from_config as attention_from_config
from vllm_fleet.model_shape import derived_weights_gib as derived_weights_gib


def _m(**kwargs: Any) -> ModelInfo:
    return ModelInfo(**kwargs)


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
