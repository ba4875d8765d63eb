"""A tiny random-weight Llama model and a tiny BERT encoder, generated locally and deterministically.

No model hub is reachable from the sandbox, yet the tests and the demo must serve a real model with the
genuine `vllm serve`. This module writes a Hugging Face-style model directory (~3 MB) whose shapes CPU
attention accepts (head size 32), with a byte-level BPE tokenizer trained on an embedded text and a chat
template so that `/v1/chat/completions` works. The same call always writes the same bytes.

The encoder (tiny-bert, ~1 MB) is a BertModel, which vLLM serves on its pooling runner
(/v1/embeddings): a WordPiece tokenizer over the same text, and the sentence-transformers files
vLLM reads for it (modules.json, 1_Pooling/config.json: mean pooling, then normalised).

    python -m vllm_fleet.sandbox.tiny_model OUT_DIR               # -> OUT_DIR/tiny-llama
    python -m vllm_fleet.sandbox.tiny_model OUT_DIR --encoder     # -> OUT_DIR/tiny-bert

Only numpy, safetensors and tokenizers are needed (no torch on the workstation).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save as save_safetensors
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

# Bump when the bytes written change, so that existing copies are regenerated.
GENERATOR_VERSION = 1
MANIFEST = ".vllm-fleet-tiny-model.json"

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
START, END = "<|start_header|>", "<|end_header|>"
SPECIAL_TOKENS = [BOS, EOS, PAD, START, END]

SPEC = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "max_position_embeddings": 2048,
    "target_vocab_size": 1024,
    "seed": 20240601,
}

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start_header|>{{ message['role'] }}<|end_header|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header|>assistant<|end_header|>\n{% endif %}"
)

# Training text for the tokenizer: plain English about the subject at hand, so that common words get
# their own tokens. Changing it changes the tokenizer (bump GENERATOR_VERSION).
CORPUS = """\
The fleet serves language models on bare metal servers. Each server runs one or more instances of the
inference engine, and every instance listens on its own port behind an API key. The operator declares
the hosts, the graphics cards and the models in an inventory, and the deploy converges every host to
that declaration: it installs the environment, writes the configuration, the environment file and the
service unit, reloads the service manager only when a unit changed, and restarts an instance only when
something it depends on changed. After the restart the deploy waits for the health endpoint, lists the
models with the key, and asks for one token of completion to prove that the engine really answers.
A small model with random weights is enough to test all of this: it speaks nonsense, but it speaks
through the same code paths as a large one. The quick brown fox jumps over the lazy dog. Hello, world!
What is the capital of France? Paris is the capital of France. Tell me a story about a robot who learns
to paint. Once upon a time there was a little robot that lived in a quiet workshop by the sea. Every
morning it watched the light change over the water, and every evening it tried to paint what it had
seen. Numbers and symbols appear too: 0 1 2 3 4 5 6 7 8 9 10 100 1000, 3.14, 2.71, 42; user, assistant,
system, message, content, role, token, tokens, model, models, server, servers, port, host, hosts, key.
Graphics memory is shared between the weights, the activations and the key value cache; the cache holds
the attention keys and values of every sequence in flight, and its size decides how many requests can run
at once. Tensor parallelism splits each layer across several cards, pipeline parallelism splits the
stack of layers into stages, and data parallelism runs whole copies side by side. When a card fails, the
engine stops, the service manager restarts it, and the operator reads the journal to learn why. Logs,
metrics, dashboards, alerts and rollbacks keep the fleet healthy through upgrades and reboots.
Spring brings rain to the valley; summer brings long evenings, autumn yellow leaves, winter quiet snow.
Bread, cheese, apples, coffee and tea were served on a wooden table near the open window of the kitchen.
"""


def _tokenizer() -> Tokenizer:
    """Train a byte-level BPE tokenizer on CORPUS (the trainer breaks ties by pair, so it is reproducible)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=SPEC["target_vocab_size"],
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeating lines gives every pair enough weight; the order is fixed, so the merges are too.
    tok.train_from_iterator(CORPUS.splitlines() * 4, trainer=trainer)
    return tok


def _config(vocab_size: int, bos_id: int, eos_id: int) -> dict:
    """config.json of a LlamaForCausalLM with the SPEC shapes."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": SPEC["hidden_size"],
        "intermediate_size": SPEC["intermediate_size"],
        "num_hidden_layers": SPEC["num_hidden_layers"],
        "num_attention_heads": SPEC["num_attention_heads"],
        "num_key_value_heads": SPEC["num_key_value_heads"],
        "head_dim": SPEC["head_dim"],
        "vocab_size": vocab_size,
        "max_position_embeddings": SPEC["max_position_embeddings"],
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "torch_dtype": "float32",
    }


def _weights(vocab_size: int) -> bytes:
    """model.safetensors: normal(0, 0.02) matrices and unit norms from a fixed-seed generator."""
    rng = np.random.default_rng(SPEC["seed"])
    h, i = SPEC["hidden_size"], SPEC["intermediate_size"]
    q_dim = SPEC["num_attention_heads"] * SPEC["head_dim"]
    kv_dim = SPEC["num_key_value_heads"] * SPEC["head_dim"]

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal(vocab_size, h)}
    for n in range(SPEC["num_hidden_layers"]):
        p = f"model.layers.{n}."
        tensors |= {
            p + "self_attn.q_proj.weight": normal(q_dim, h),
            p + "self_attn.k_proj.weight": normal(kv_dim, h),
            p + "self_attn.v_proj.weight": normal(kv_dim, h),
            p + "self_attn.o_proj.weight": normal(h, q_dim),
            p + "mlp.gate_proj.weight": normal(i, h),
            p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
        }
    tensors["model.norm.weight"] = np.ones(h, np.float32)
    tensors["lm_head.weight"] = normal(vocab_size, h)
    # "format": "pt" is what transformers and vLLM expect of a PyTorch-layout checkpoint.
    return save_safetensors(tensors, metadata={"format": "pt"})


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def build_files() -> dict[str, bytes]:
    """Every file of the model directory, by name, as bytes (deterministic)."""
    tok = _tokenizer()
    vocab_size = tok.get_vocab_size()  # the model's vocab equals the tokenizer's: no undecodable ids
    bos_id, eos_id = tok.token_to_id(BOS), tok.token_to_id(EOS)
    special_map = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
    return {
        "config.json": _json(_config(vocab_size, bos_id, eos_id)),
        "generation_config.json": _json({"bos_token_id": bos_id, "eos_token_id": eos_id}),
        "model.safetensors": _weights(vocab_size),
        "tokenizer.json": tok.to_str(pretty=True).encode() + b"\n",
        "tokenizer_config.json": _json(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": SPEC["max_position_embeddings"],
                "chat_template": CHAT_TEMPLATE,
                "clean_up_tokenization_spaces": False,
                **special_map,
            }
        ),
        "special_tokens_map.json": _json(special_map),
    }


# --- the encoder ---------------------------------------------------------------------------------------

# Bump when the bytes the encoder's generator writes change.
ENCODER_VERSION = 1
CLS, SEP, BERT_PAD, UNK, MASK = "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]"
ENCODER_SPEC = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,  # head size 32, as CPU attention takes
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "seed": 20240602,
}


def _wordpiece() -> Tokenizer:
    """A BERT-style WordPiece tokenizer over CORPUS: lower-cased, [CLS] ... [SEP] around a text. Its
    vocabulary is made, not trained (WordPiece's trainer breaks ties at the size limit in hash-map
    order): the special tokens, every word of CORPUS, and each character alone and as a word piece
    (so any text of those characters tokenizes), in a fixed order."""
    text = CORPUS.lower()
    words = sorted(set(re.findall(r"[a-z0-9]+", text)))
    chars = sorted({c for c in text if not c.isspace()})
    vocab = [BERT_PAD, UNK, CLS, SEP, MASK] + chars + [f"##{c}" for c in chars] + [w for w in words if len(w) > 1]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(dict.fromkeys(vocab))}, unk_token=UNK))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    cls_id, sep_id = tok.token_to_id(CLS), tok.token_to_id(SEP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} $B:1 {SEP}:1", special_tokens=[(CLS, cls_id), (SEP, sep_id)])
    return tok


def _encoder_config(vocab_size: int, pad_id: int) -> dict:
    """config.json of a BertModel with the ENCODER_SPEC shapes."""
    spec = ENCODER_SPEC
    return {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_size": spec["hidden_size"],
        "intermediate_size": spec["intermediate_size"],
        "num_hidden_layers": spec["num_hidden_layers"],
        "num_attention_heads": spec["num_attention_heads"],
        "max_position_embeddings": spec["max_position_embeddings"],
        "type_vocab_size": spec["type_vocab_size"],
        "vocab_size": vocab_size,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "layer_norm_eps": 1e-12,
        "position_embedding_type": "absolute",
        "initializer_range": 0.02,
        "pad_token_id": pad_id,
        "torch_dtype": "float32",
    }


def _encoder_weights(vocab_size: int) -> bytes:
    """model.safetensors of the encoder, under the names of a BertModel checkpoint (no prefix)."""
    rng = np.random.default_rng(ENCODER_SPEC["seed"])
    h, i = ENCODER_SPEC["hidden_size"], ENCODER_SPEC["intermediate_size"]

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, np.float32)

    tensors = {
        "embeddings.word_embeddings.weight": normal(vocab_size, h),
        "embeddings.position_embeddings.weight": normal(ENCODER_SPEC["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": normal(ENCODER_SPEC["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": ones(h), "embeddings.LayerNorm.bias": zeros(h),
    }
    for n in range(ENCODER_SPEC["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        for name in ("query", "key", "value"):
            tensors[p + f"attention.self.{name}.weight"] = normal(h, h)
            tensors[p + f"attention.self.{name}.bias"] = zeros(h)
        tensors |= {
            p + "attention.output.dense.weight": normal(h, h), p + "attention.output.dense.bias": zeros(h),
            p + "attention.output.LayerNorm.weight": ones(h), p + "attention.output.LayerNorm.bias": zeros(h),
            p + "intermediate.dense.weight": normal(i, h), p + "intermediate.dense.bias": zeros(i),
            p + "output.dense.weight": normal(h, i), p + "output.dense.bias": zeros(h),
            p + "output.LayerNorm.weight": ones(h), p + "output.LayerNorm.bias": zeros(h),
        }
    tensors |= {"pooler.dense.weight": normal(h, h), "pooler.dense.bias": zeros(h)}
    return save_safetensors(tensors, metadata={"format": "pt"})


def build_encoder_files() -> dict[str, bytes]:
    """Every file of the encoder's directory, by relative path, as bytes (deterministic)."""
    tok = _wordpiece()
    vocab_size = tok.get_vocab_size()
    special_map = {"cls_token": CLS, "sep_token": SEP, "pad_token": BERT_PAD, "unk_token": UNK, "mask_token": MASK}
    h = ENCODER_SPEC["hidden_size"]
    return {
        "config.json": _json(_encoder_config(vocab_size, tok.token_to_id(BERT_PAD))),
        "model.safetensors": _encoder_weights(vocab_size),
        "tokenizer.json": tok.to_str(pretty=True).encode() + b"\n",
        "tokenizer_config.json": _json({"tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": True,
                                        "model_max_length": ENCODER_SPEC["max_position_embeddings"],
                                        "clean_up_tokenization_spaces": False, **special_map}),
        "special_tokens_map.json": _json(special_map),
        # sentence-transformers' description, which vLLM reads for a pooling model (get_pooling_config):
        # the transformer, mean pooling over its tokens, then L2 normalisation.
        "modules.json": (json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ], indent=2) + "\n").encode(),
        "sentence_bert_config.json": _json({"max_seq_length": ENCODER_SPEC["max_position_embeddings"],
                                            "do_lower_case": False}),
        "1_Pooling/config.json": _json({"word_embedding_dimension": h, "pooling_mode_cls_token": False,
                                        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                                        "pooling_mode_mean_sqrt_len_tokens": False}),
    }


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _spec_key(encoder: bool = False) -> str:
    """Identifies what the generator would write, without generating it."""
    if encoder:
        return _sha256(json.dumps([ENCODER_VERSION, ENCODER_SPEC, CORPUS, "encoder"]).encode())
    return _sha256(json.dumps([GENERATOR_VERSION, SPEC, CORPUS, CHAT_TEMPLATE]).encode())


def matches_manifest(directory: Path, spec: str, manifest_name: str = MANIFEST) -> bool:
    """True when `directory` holds what its manifest lists, hashes checked, for the generator input
    `spec` (a generated model or adapter directory: write_generated)."""
    try:
        manifest = json.loads((directory / manifest_name).read_text())
        if manifest.get("spec") != spec:
            return False
        return all(
            _sha256((directory / name).read_bytes()) == digest
            for name, digest in manifest["files"].items()
        )
    except (OSError, ValueError, KeyError, AttributeError):
        return False


def write_generated(directory: Path, files: dict[str, bytes], spec: str, manifest_name: str = MANIFEST) -> None:
    """Write `files` (relative path -> bytes) and their manifest as `directory`: built in a sibling temp
    dir and renamed into place, so a reader never sees a half-written one. Files are 0644 and
    directories 0755: a non-root service user must read them."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    manifest = {"spec": spec, "files": {n: _sha256(b) for n, b in sorted(files.items())}}
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        for fname, data in {**files, manifest_name: _json(manifest)}.items():
            (tmp / fname).parent.mkdir(mode=0o755, exist_ok=True)
            (tmp / fname).write_bytes(data)
            (tmp / fname).chmod(0o644)
        tmp.chmod(0o755)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_up_to_date(model_dir: Path, encoder: bool = False) -> bool:
    """True when model_dir holds exactly what this generator version writes (hashes checked)."""
    return matches_manifest(model_dir, _spec_key(encoder))


def generate(out_dir: Path, name: str = "tiny-llama", encoder: bool = False) -> Path:
    """Write the tiny model (the encoder with `encoder`) to out_dir/name and return that path; skip
    when it is already up to date.

    Built in a sibling temp dir and renamed into place, so a reader never sees a half-written model.
    Files are 0644 and directories 0755: a non-root service user must read them.
    """
    model_dir = Path(out_dir) / name
    if not is_up_to_date(model_dir, encoder):
        write_generated(model_dir, build_encoder_files() if encoder else build_files(), _spec_key(encoder))
    return model_dir


def main(argv: list[str] | None = None) -> int:
    """CLI: write the tiny model under OUT_DIR and print its path."""
    parser = argparse.ArgumentParser(prog="python -m vllm_fleet.sandbox.tiny_model", description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--name", default=None, help="the directory's name (tiny-llama, or tiny-bert with --encoder)")
    parser.add_argument("--encoder", action="store_true", help="the BERT encoder (an embedding model)")
    args = parser.parse_args(argv)
    print(generate(args.out_dir, args.name or ("tiny-bert" if args.encoder else "tiny-llama"), encoder=args.encoder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
