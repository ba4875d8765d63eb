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


# --- the encoder: an embedding model vLLM serves on its pooling runner ------------------------------------

ENCODER_FILES = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "modules.json", "sentence_bert_config.json", "1_Pooling/config.json"}


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory):
    return tiny_model.generate(tmp_path_factory.mktemp("encoders"), "tiny-bert", encoder=True)


def test_the_encoder_is_the_same_bytes_every_time_and_apart_from_the_chat_model(encoder_dir, tmp_path):
    again = tiny_model.generate(tmp_path, "again", encoder=True)
    assert _manifest(again)["files"] == _manifest(encoder_dir)["files"]
    assert set(_manifest(encoder_dir)["files"]) == ENCODER_FILES
    assert not tiny_model.is_up_to_date(encoder_dir)  # the chat model's spec: another model
    assert tiny_model.is_up_to_date(encoder_dir, encoder=True)


def test_the_encoder_s_weights_match_its_config_and_tokenizer(encoder_dir):
    config = json.loads((encoder_dir / "config.json").read_text())
    assert config["architectures"] == ["BertModel"] and config["hidden_size"] // config["num_attention_heads"] == 32
    weights = load_file(encoder_dir / "model.safetensors")
    assert weights["embeddings.word_embeddings.weight"].shape == (config["vocab_size"], config["hidden_size"])
    assert len([k for k in weights if k.endswith("attention.self.query.weight")]) == config["num_hidden_layers"]
    tok = Tokenizer.from_file(str(encoder_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == config["vocab_size"]
    ids = tok.encode("The quick brown fox").ids
    assert ids[0] == tok.token_to_id("[CLS]") and ids[-1] == tok.token_to_id("[SEP]")
    pooling = json.loads((encoder_dir / "1_Pooling" / "config.json").read_text())
    assert pooling["pooling_mode_mean_tokens"] and pooling["word_embedding_dimension"] == config["hidden_size"]
    assert stat.S_IMODE((encoder_dir / "1_Pooling").stat().st_mode) & 0o005 == 0o005  # the service user reads it


def test_the_encoder_is_planned_as_a_pooling_model_from_its_directory(encoder_dir):
    from vllm_fleet.config import parse_host
    from vllm_fleet.plan import plan_host

    config = parse_host("box", {"vllm_target": "cpu", "vllm_instances": [
        {"name": "emb", "model": "/srv/models/tiny-bert", "served_model_name": "tiny-bert", "port": 8001,
         "model_info": str(encoder_dir)}]})
    [inst] = plan_host(config).instances
    assert (inst.runner, inst.pooling_task) == ("pooling", "embed") and inst.engine_args["runner"] == "pooling"
    assert "sentence-transformers" in " ".join(inst.reasons)
