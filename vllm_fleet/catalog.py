"""Model shapes (a small built-in catalog) and GPU facts the planner needs.

The catalog lets `vllm-fleet plan` work offline for common models. At deploy time the model's own
`config.json` and weight files on the host replace these numbers (see `facts.ModelOnHost`).
Numbers are from each model's published `config.json`; `weights_gib` is the size of the weight
files (the GGUF entry: the file itself).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
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
    max_position_embeddings: int = 8192
    tie_word_embeddings: bool = False

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def layer_params(self) -> int:
        """Parameters of one decoder layer: q, k, v, o projections and a gated MLP."""
        q_and_o = 2 * self.hidden_size * self.num_attention_heads * self.head_dim
        k_and_v = 2 * self.hidden_size * self.num_key_value_heads * self.head_dim
        mlp = 3 * self.hidden_size * self.intermediate_size
        return q_and_o + k_and_v + mlp

    @cached_property
    def embedding_gib(self) -> float:
        """Weight GiB of the token embedding (also the size of an untied lm_head).

        Derived as the embedding's share of all parameters, so that it holds for quantized
        files (GGUF) as well as for bf16 ones.
        """
        embedding = self.vocab_size * self.hidden_size
        copies = 1 if self.tie_word_embeddings else 2
        total = embedding * copies + self.layer_params() * self.num_hidden_layers
        return self.weights_gib * embedding / total

    @cached_property
    def layer_gib(self) -> float:
        """Weight GiB of one decoder layer (the rest of the weights spread evenly)."""
        copies = 1 if self.tie_word_embeddings else 2
        return (self.weights_gib - copies * self.embedding_gib) / self.num_hidden_layers

    def kv_bytes_per_token_per_layer(self, tensor_parallel_size: int, kv_dtype_bytes: int) -> int:
        """KV-cache bytes one token costs in one layer on ONE GPU of a TP group.

        KV heads are split over TP ranks; with more ranks than KV heads they are replicated.
        """
        heads_per_rank = max(1, self.num_key_value_heads // tensor_parallel_size)
        return 2 * heads_per_rank * self.head_dim * kv_dtype_bytes


def _m(**kwargs: Any) -> ModelInfo:
    return ModelInfo(**kwargs)


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
                 max_position_embeddings=131072, tie_word_embeddings=True)
_GEMMA3_27B = _m(num_hidden_layers=62, num_attention_heads=32, num_key_value_heads=16, head_dim=128,
                 hidden_size=5376, intermediate_size=21504, vocab_size=262208, weights_gib=51.2,
                 max_position_embeddings=131072, tie_word_embeddings=True)
# The seed's model: gemma-3-12b-it-qat-q4_0 GGUF (one 8.07 GB file). Serving it needs the
# vllm-gguf-plugin package and --tokenizer pointing at the base model's tokenizer.
_GEMMA3_12B_Q4_GGUF = replace(_GEMMA3_12B, weights_gib=7.52, dtype="gguf")

#: Keys are matched against the end of a model id or path, case-insensitively (see `lookup`).
CATALOG: dict[str, ModelInfo] = {
    "meta-llama/meta-llama-3-8b": _LLAMA3_8B,
    "meta-llama/meta-llama-3-8b-instruct": _LLAMA3_8B,
    "meta-llama/llama-3.1-8b-instruct": replace(_LLAMA3_8B, max_position_embeddings=131072),
    "meta-llama/meta-llama-3-70b": _LLAMA3_70B,
    "meta-llama/meta-llama-3-70b-instruct": _LLAMA3_70B,
    "meta-llama/llama-3.1-70b-instruct": replace(_LLAMA3_70B, max_position_embeddings=131072),
    "qwen/qwen2.5-7b-instruct": _QWEN25_7B,
    "qwen/qwen2.5-14b-instruct": _QWEN25_14B,
    "qwen/qwen2.5-72b-instruct": _QWEN25_72B,
    "google/gemma-3-12b-it": _GEMMA3_12B,
    "google/gemma-3-27b-it": _GEMMA3_27B,
    "gemma-3-12b-it-q4_0.gguf": _GEMMA3_12B_Q4_GGUF,
}


def lookup(model: str) -> ModelInfo | None:
    """Find a model by its Hugging Face id, or by the last path parts of a local path."""
    wanted = model.rstrip("/").lower()
    for key, info in CATALOG.items():
        if wanted == key or wanted.endswith("/" + key) or wanted.endswith("/" + key.split("/")[-1]):
            return info
    return None


def is_gguf(model: str, info: ModelInfo | None = None) -> bool:
    return model.lower().endswith(".gguf") or (info is not None and info.dtype == "gguf")


@dataclass(frozen=True)
class GpuModelFacts:
    """What the planner needs to know about a GPU model beyond what nvidia-smi reports."""

    compute_capability: float
    #: GeForce/consumer cards: no NVLink, and P2P over PCIe hangs NCCL in TP (vllm#14449).
    consumer: bool


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
    ("V100", GpuModelFacts(7.0, False)),
    ("T4", GpuModelFacts(7.5, False)),
]


def gpu_model_facts(name: str) -> GpuModelFacts | None:
    upper = name.upper()
    for needle, facts in _GPU_FACTS:
        if needle.upper() in upper:
            return facts
    if "GEFORCE" in upper:
        return GpuModelFacts(8.0, True)
    return None
