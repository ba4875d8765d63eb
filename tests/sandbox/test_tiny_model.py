"""The tiny model generator: deterministic, shaped as vLLM's CPU backend needs, tokenizer round-trips."""

from __future__ import annotations

import json
import stat

import pytest

from safetensors.numpy import load_file
from tokenizers import Tokenizer

from vllm_fleet.sandbox import tiny_model

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model.generate(tmp_path_factory.mktemp("models"))


def _manifest(path):
    return json.loads((path / tiny_model.MANIFEST).read_text())


def test_same_bytes_every_time(model_dir, tmp_path):
    other = tiny_model.generate(tmp_path, name="again")
    assert _manifest(other)["files"] == _manifest(model_dir)["files"]
    assert set(_manifest(model_dir)["files"]) == EXPECTED_FILES


def test_up_to_date_copy_is_kept_and_a_damaged_one_rewritten(tmp_path):
    path = tiny_model.generate(tmp_path)
    weights = path / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert tiny_model.generate(tmp_path) == path
    assert weights.stat().st_mtime_ns == before  # skipped: nothing rewritten
    weights.write_bytes(b"damaged")
    tiny_model.generate(tmp_path)
    assert tiny_model.is_up_to_date(path)


def test_config_shape(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (128, 2)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 32)
    assert cfg["head_dim"] * cfg["num_attention_heads"] == cfg["hidden_size"]
    assert cfg["max_position_embeddings"] == 2048 and cfg["torch_dtype"] == "float32"
    assert 512 <= cfg["vocab_size"] <= 1024


def test_weights_match_config(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    tensors = load_file(model_dir / "model.safetensors")
    assert tensors["model.embed_tokens.weight"].shape == (cfg["vocab_size"], 128)
    assert tensors["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 32, 128)
    assert tensors["model.layers.0.mlp.down_proj.weight"].shape == (128, cfg["intermediate_size"])
    assert {t.dtype.name for t in tensors.values()} == {"float32"}


def test_tokenizer_round_trips_and_matches_vocab(model_dir):
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    cfg = json.loads((model_dir / "config.json").read_text())
    assert tok.get_vocab_size() == cfg["vocab_size"]
    text = "Hello, world! The fleet serves 42 models; ünïcode ✓."
    ids = tok.encode(text).ids
    assert max(ids) < cfg["vocab_size"]
    assert tok.decode(ids) == text
    assert tok.token_to_id(tiny_model.EOS) == cfg["eos_token_id"]


def test_chat_template_and_permissions(model_dir):
    tok_cfg = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert "add_generation_prompt" in tok_cfg["chat_template"]
    for f in model_dir.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f  # a non-root service user reads them
