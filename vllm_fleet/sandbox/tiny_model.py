"""A tiny random-weight Llama model, generated locally and deterministically.

No model hub is reachable from the sandbox, yet the tests and the demo must serve a real model with the
genuine `vllm serve`. This module writes a Hugging Face-style model directory (~3 MB) whose shapes CPU
attention accepts (head size 32), with a byte-level BPE tokenizer trained on an embedded text and a chat
template so that `/v1/chat/completions` works. The same call always writes the same bytes.

    python -m vllm_fleet.sandbox.tiny_model OUT_DIR      # -> OUT_DIR/tiny-llama

Only numpy, safetensors and tokenizers are needed (no torch on the workstation).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save as save_safetensors
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _spec_key() -> str:
    """Identifies what the generator would write, without generating it."""
    return _sha256(json.dumps([GENERATOR_VERSION, SPEC, CORPUS, CHAT_TEMPLATE]).encode())


def is_up_to_date(model_dir: Path) -> bool:
    """True when model_dir holds exactly what this generator version writes (hashes checked)."""
    try:
        manifest = json.loads((model_dir / MANIFEST).read_text())
        if manifest.get("spec") != _spec_key():
            return False
        return all(
            _sha256((model_dir / name).read_bytes()) == digest
            for name, digest in manifest["files"].items()
        )
    except (OSError, ValueError, KeyError, AttributeError):
        return False


def generate(out_dir: Path, name: str = "tiny-llama") -> Path:
    """Write the tiny model to out_dir/name and return that path; skip when it is already up to date.

    Built in a sibling temp dir and renamed into place, so a reader never sees a half-written model.
    Files are 0644 and directories 0755: a non-root service user must read them.
    """
    model_dir = Path(out_dir) / name
    if is_up_to_date(model_dir):
        return model_dir
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    files = build_files()
    manifest = {"spec": _spec_key(), "files": {n: _sha256(b) for n, b in sorted(files.items())}}
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=model_dir.parent))
    try:
        for fname, data in {**files, MANIFEST: _json(manifest)}.items():
            (tmp / fname).write_bytes(data)
            (tmp / fname).chmod(0o644)
        tmp.chmod(0o755)
        if model_dir.exists():
            shutil.rmtree(model_dir)
        tmp.rename(model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_dir


def main(argv: list[str] | None = None) -> int:
    """CLI: write the tiny model under OUT_DIR and print its path."""
    parser = argparse.ArgumentParser(prog="python -m vllm_fleet.sandbox.tiny_model", description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--name", default="tiny-llama")
    args = parser.parse_args(argv)
    print(generate(args.out_dir, args.name))
    return 0


if __name__ == "__main__":
    sys.exit(main())
