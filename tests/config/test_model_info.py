"""`model_info` from a model's config.json as it is: three real config.json files of models outside
the catalog (tests/fixtures/model-configs/, SOURCES.md names where each was copied from), pasted as a
dict and given as a path, plan to the same numbers (weights per GPU, KV blocks, max concurrency) as
a catalog entry with the same shape, written by hand from the config's numbers; multimodal configs
(text_config and transformers' defaults); the weights' size from the safetensors index, the files,
or the shape; what is refused (hostile values, paths that leave the model's directory), with host,
instance, key and fix; the catalog's families, shape twins and did-you-mean."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest

from support.model_configs import model_config_fixture, model_dir, planned
from support.planning_fixtures import A100_40G, H100_80G, RTX_4090D, host_data, instance
from vllm_fleet import catalog
from vllm_fleet.catalog import GIB, ModelInfo, closest, derived_weights_gib, lookup, same_shape, unknown_model_fix
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.config.model_files import MAX_CONFIG_BYTES, ModelFilesError, read_model_files
from vllm_fleet.facts.discovery import model_info_from_config
from vllm_fleet.plan import plan_host
from vllm_fleet.plan.rules import tp_problems

# The shape of each fixture as a catalog entry writes it, copied by hand from the config's numbers
# (what `model_info` must read out of the whole file), and the parameter count each model publishes.
HAND_COPIED = {
    "microsoft--Phi-4-mini-instruct": (dict(
        num_hidden_layers=32, num_attention_heads=24, num_key_value_heads=8, head_dim=128, hidden_size=3072,
        intermediate_size=8192, vocab_size=200064, max_position_embeddings=131072, tie_word_embeddings=True,
        sliding_window=262144), 3.8e9),
    "google--gemma-2-9b": (dict(
        num_hidden_layers=42, num_attention_heads=16, num_key_value_heads=8, head_dim=256, hidden_size=3584,
        intermediate_size=14336, vocab_size=256000, max_position_embeddings=8192, tie_word_embeddings=True,
        sliding_window=4096, sliding_window_pattern=2), 9.24e9),
    "mistralai--Mixtral-8x7B-v0.1": (dict(
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128, hidden_size=4096,
        intermediate_size=14336, vocab_size=32000, max_position_embeddings=32768, num_experts=8,
        moe_intermediate_size=14336), 46.7e9),
}
# Where each is planned: GPUs, max_model_len.
WHERE = {"microsoft--Phi-4-mini-instruct": ([RTX_4090D], 16384),
         "google--gemma-2-9b": ([A100_40G, A100_40G], 8192),
         "mistralai--Mixtral-8x7B-v0.1": ([H100_80G] * 2, 32768)}


@pytest.mark.parametrize("name", sorted(HAND_COPIED))
def test_a_real_config_json_plans_like_a_catalog_entry_of_its_shape(name, tmp_path, monkeypatch):
    shape, published = HAND_COPIED[name]
    gpus, max_len = WHERE[name]
    derived = derived_weights_gib(ModelInfo(weights_gib=1.0, **shape))
    # The weights derived from the shape are the model's published parameter count in bf16.
    assert derived * GIB / 2 == pytest.approx(published, rel=0.02)
    monkeypatch.setitem(catalog.CATALOG, "acme/hand-copied", ModelInfo(weights_gib=derived, **shape))
    by_catalog = planned(model="acme/hand-copied", gpus=gpus, max_model_len=max_len)
    assert by_catalog[1] > 0 and by_catalog[2] >= 1
    # Pasted verbatim: every key of config.json (rope_theta, torch_dtype, architectures...) as it is.
    assert planned(model_config_fixture(name), gpus=gpus, max_model_len=max_len) == by_catalog
    # As a path: the directory's safetensors index gives the weights' size.
    total = int((derived + 0.5) * GIB) + 12345  # another checkpoint's files (e.g. with norms and biases)
    folder = model_dir(tmp_path, model_config_fixture(name), total_size=total)
    monkeypatch.setitem(catalog.CATALOG, "acme/hand-copied", ModelInfo(weights_gib=total / GIB, **shape))
    by_catalog = planned(model="acme/hand-copied", gpus=gpus, max_model_len=max_len)
    assert planned(str(folder), gpus=gpus, max_model_len=max_len) == by_catalog
    assert planned(str(folder / "config.json"), gpus=gpus, max_model_len=max_len) == by_catalog
    # Pasted with the weights' size beside it.
    assert planned({**model_config_fixture(name), "weights_gib": total / GIB}, gpus=gpus, max_model_len=max_len) == by_catalog


def test_the_mixture_of_experts_fixture_places_every_expert_and_splits_each_over_tp():
    info = parse_host("box", host_data(instances=[instance(
        model="acme/mixtral", tokenizer=None, model_info=model_config_fixture("mistralai--Mixtral-8x7B-v0.1"))])).instances[0].model_info
    assert (info.num_experts, info.moe_intermediate_size) == (8, 14336)
    assert info.weights_gib == pytest.approx(86.99, abs=0.01)  # all 8 experts, not the 2 active per token
    assert info.kv_bytes_per_token_per_layer(1, 2) == 2 * 8 * 128 * 2  # the attention's, as if dense
    assert tp_problems(info, 8) == [] and tp_problems(replace(info, moe_intermediate_size=14337), 8) == [
        "moe_intermediate_size (14337) must be divisible by tensor parallel size (8)."]


def test_qwen3_moe_in_the_catalog_is_planned_with_every_expert_on_the_gpus():
    info = lookup("Qwen/Qwen3-30B-A3B")
    assert info.parameters() == pytest.approx(30.5e9, rel=0.01)  # "30.5B in total and 3.3B activated"
    weights, blocks, _, layout = planned(model="Qwen/Qwen3-30B-A3B", gpus=[H100_80G], max_model_len=32768)
    assert layout == (1, 1, 1) and weights == [round(info.weights_gib, 6)]
    big = lookup("Qwen/Qwen3-235B-A22B")
    weights, _, _, layout = planned(model="Qwen/Qwen3-235B-A22B", gpus=[H100_80G] * 8, max_model_len=32768)
    assert layout[0] == 8 and weights[0] == pytest.approx(big.weights_gib / 8, rel=0.01)


GEMMA3_12B_IT = {  # google/gemma-3-12b-it's config.json, its layout: text_config without head_dim
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999, "eoi_token_index": 256000,
    "eos_token_id": [1, 106], "image_token_index": 262144, "initializer_range": 0.02, "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {"hidden_size": 3840, "intermediate_size": 15360, "model_type": "gemma3_text",
                    "num_attention_heads": 16, "num_hidden_layers": 48, "num_key_value_heads": 8,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"}, "sliding_window": 1024},
    "torch_dtype": "bfloat16", "transformers_version": "4.50.0.dev0",
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                      "patch_size": 14, "vision_use_head": False}}


def test_a_multimodal_config_reads_its_text_config_with_transformers_defaults():
    pasted = {**GEMMA3_12B_IT, "weights_gib": 22.7}
    info = parse_host("box", host_data(instances=[instance(model_info=pasted)])).instances[0].model_info
    assert info.architectures == ("Gemma3ForConditionalGeneration",)  # the runner is resolved from them
    # head_dim 256, vocab 262208, 5:1 sliding layers, tied, and the class: the catalog's entry exactly
    assert info == lookup("google/gemma-3-12b-it")
    assert model_info_from_config(GEMMA3_12B_IT, int(22.7 * GIB)).shape() == info.shape()  # the deploy reads alike
    with pytest.raises(ConfigErrors) as err:
        parse_host("box", host_data(instances=[instance(model_info=GEMMA3_12B_IT)]))
    (e,) = err.value.errors
    assert (e.host, e.instance, e.key) == ("box", "gemma", "model_info.weights_gib")
    assert "multimodal" in e.message and "weights_gib" in e.fix and "model-info" in e.fix


def test_the_newer_dtype_key_and_a_quantized_config():
    config = model_config_fixture("google--gemma-2-9b")
    config["dtype"] = config.pop("torch_dtype")
    info = parse_host("box", host_data(instances=[instance(model_info=config)])).instances[0].model_info
    assert info.dtype == "bfloat16"
    quantized = {**config, "quantization_config": {"quant_method": "awq", "bits": 4}}
    with pytest.raises(ConfigErrors) as err:
        parse_host("box", host_data(instances=[instance(model_info=quantized)]))
    assert err.value.errors[0].key == "model_info.weights_gib" and "quantized" in err.value.errors[0].message


HOSTILE = [
    ({"num_hidden_layers": True}, "model_info.num_hidden_layers", "whole number"),
    ({"num_hidden_layers": -3}, "model_info.num_hidden_layers", "whole number"),
    ({"hidden_size": 10**100}, "model_info.hidden_size", "whole number from 1 to"),
    ({"vocab_size": "32000"}, "model_info.vocab_size", "'32000'"),
    ({"weights_gib": float("nan")}, "model_info.weights_gib", "nan"),
    ({"weights_gib": 1e30}, "model_info.weights_gib", "above 0"),
    ({"torch_dtype": "int4\x1b[2J"}, "model_info.torch_dtype", "\\x1b"),
    ({"num_key_value_heads": 5}, "model_info.num_key_value_heads", "not a multiple"),
    ({"layer_types": ["sliding_attention"] * 3}, "model_info.layer_types", "lists 3 layers"),
    ({"layer_types": ["linear_attention"] * 32}, "model_info.layer_types", "full_attention and sliding_attention"),
    ({"kv_lora_rank": 512}, "model_info.kv_lora_rank", "latent attention"),
    ({"tie_word_embeddings": "yes"}, "model_info.tie_word_embeddings", "true or false"),
    ({"weight_gib": 12}, "model_info", "unknown key 'weight_gib'"),
]


@pytest.mark.parametrize("change, key, words", HOSTILE)
def test_a_bad_value_in_a_pasted_config_is_refused_with_its_key_and_a_fix(change, key, words):
    config = {**model_config_fixture("mistralai--Mixtral-8x7B-v0.1"), **change}
    with pytest.raises(ConfigErrors) as err:
        parse_host("box", host_data(instances=[instance(model_info=config)]))
    (e,) = err.value.errors
    assert (e.host, e.instance, e.key) == ("box", "gemma", key) and words in e.message and e.fix
    assert "\x1b" not in e.located()


def test_unknown_keys_are_ignored_and_a_bare_dict_names_what_is_missing():
    config = {**model_config_fixture("microsoft--Phi-4-mini-instruct"), "rope_theta": "anything", "x": [1]}
    assert parse_host("box", host_data(instances=[instance(model_info=config)])).instances[0].model_info
    with pytest.raises(ConfigErrors) as err:
        parse_host("box", host_data(instances=[instance(model_info={"rope_theta": 1e6})]))
    (e,) = err.value.errors
    assert e.key == "model_info" and "missing num_hidden_layers, num_attention_heads" in e.message
    assert "model-info MODEL_DIR|HF_ID" in e.fix


# --- A path on this workstation, read safely ------------------------------------------------------

def test_the_weights_from_the_safetensors_files_or_the_shape(tmp_path):
    config = model_config_fixture("google--gemma-2-9b")
    folder = model_dir(tmp_path, config)
    assert read_model_files(str(folder)).weights_bytes is None  # config.json alone: derived from the shape
    assert parse_host("box", host_data(instances=[instance(model_info=str(folder))])).instances[0].model_info \
        == parse_host("box", host_data(instances=[instance(model_info=config)])).instances[0].model_info
    for i, size in enumerate((3 * GIB, 2 * GIB + 7)):
        with open(folder / f"model-0000{i + 1}-of-00002.safetensors", "wb") as f:
            f.truncate(size)  # sparse: the size is looked at, never the content
    files = read_model_files(str(folder))
    assert (files.weights_bytes, files.weights_source) == (5 * GIB + 7, "2 *.safetensors files")
    with open(folder / "consolidated.safetensors", "wb") as f:
        f.truncate(4 * GIB)  # a Mistral-format copy beside them: vLLM loads that one alone
    assert read_model_files(str(folder)).weights_bytes == 4 * GIB


def test_a_hugging_face_cache_snapshot_follows_its_links_into_the_blobs(tmp_path):
    repo = tmp_path / "hub" / "models--acme--mixtral"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "0123abc"
    snapshot.mkdir(parents=True)
    (repo / "blobs" / "c0ffee").write_text(json.dumps(model_config_fixture("mistralai--Mixtral-8x7B-v0.1")))
    (snapshot / "config.json").symlink_to("../../blobs/c0ffee")
    (repo / "blobs" / "beef").write_text(json.dumps({"metadata": {"total_size": 93405585408}}))
    (snapshot / "model.safetensors.index.json").symlink_to("../../blobs/beef")
    files = read_model_files(str(snapshot))
    assert files.config["num_local_experts"] == 8 and files.weights_bytes == 93405585408


@pytest.mark.parametrize("case", ["link outside", "fifo", "device", "too big", "not json", "relative",
                                  "no config", "list", "bad index"])
def test_a_path_that_is_no_model_directory_is_refused_with_a_fix(case, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    config = folder / "config.json"
    given = str(folder)
    if case == "link outside":
        secret = tmp_path / "elsewhere.json"
        secret.write_text("{}")
        config.symlink_to(secret)
    elif case == "fifo":
        os.mkfifo(config)
    elif case == "device":
        config.symlink_to("/dev/zero")
    elif case == "too big":
        config.write_text(" " * (MAX_CONFIG_BYTES + 1) + "{}")
    elif case == "not json":
        config.write_text('{"num_hidden_layers": NaN}')
    elif case == "relative":
        given = "model/config.json"
    elif case == "list":
        config.write_text("[1, 2]")
    elif case == "bad index":
        config.write_text(json.dumps(model_config_fixture("google--gemma-2-9b")))
        (folder / "model.safetensors.index.json").write_text('{"metadata": {"total_size": -1}}')
    with pytest.raises(ModelFilesError) as err:
        read_model_files(given)
    assert err.value.fix
    with pytest.raises(ConfigErrors) as parsed:
        parse_host("box", host_data(instances=[instance(model_info=given)]))
    (e,) = parsed.value.errors
    assert (e.host, e.instance, e.key) == ("box", "gemma", "model_info") and e.fix
    if case == "link outside":
        assert "outside the model's directory" in e.message


# --- The catalog: the current families, their shape twins, and the closest id --------------------

@pytest.mark.parametrize("model", [
    "meta-llama/Llama-3.3-70B-Instruct", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-4B", "Qwen/Qwen3-8B",
    "Qwen/Qwen3-14B", "Qwen/Qwen3-32B", "Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-235B-A22B", "google/gemma-3-1b-it",
    "google/gemma-3-4b-it", "mistralai/Mistral-Small-24B-Instruct-2501",
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503", "mistralai/Mistral-Small-3.2-24B-Instruct-2506",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B",
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B",
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B"])
def test_the_current_families_are_in_the_catalog(model):
    info = lookup(model)
    assert info is not None and info.num_attention_heads % info.num_key_value_heads == 0
    assert lookup("/srv/models/" + model.split("/")[1]) is info


def test_shape_twins_and_the_catalogs_derived_weights():
    assert "meta-llama/llama-3.1-70b-instruct" in same_shape(lookup("meta-llama/Llama-3.3-70B-Instruct"))
    assert "deepseek-ai/deepseek-r1-distill-llama-8b" in same_shape(lookup("meta-llama/Llama-3.1-8B-Instruct"))
    # Llama 3 8B's published weights (14.96 GiB) are what the derivation from its shape gives.
    assert derived_weights_gib(lookup("meta-llama/Meta-Llama-3-8B")) == pytest.approx(14.96, abs=0.01)


def test_an_unknown_model_gets_the_closest_catalog_id_and_how_to_give_its_shape():
    assert closest("nvidia/Llama-3.3-70B-Instruct-FP8") == "meta-llama/llama-3.3-70b-instruct"
    assert closest("Qwen/Qwen3-8B-Base") == "qwen/qwen3-8b"
    assert closest("microsoft/phi-4") is None
    data = host_data(gpus=[H100_80G] * 4, instances=[instance(model="acme/Llama-3.3-70B-Instruct-tuned",
                                                              tokenizer=None)])
    with pytest.raises(ConfigErrors) as err:
        plan_host(parse_host("box", data))
    (e,) = err.value.errors
    assert e.key == "model_info" and "not in the built-in catalog" in e.message
    assert "Did you mean 'meta-llama/llama-3.3-70b-instruct'" in e.fix
    assert "same shape as" in e.fix and "meta-llama/llama-3.1-70b-instruct" in e.fix
    assert "vllm-fleet model-info acme/Llama-3.3-70B-Instruct-tuned" in e.fix


def test_the_closest_entry_of_another_size_is_named_as_such_not_offered():
    """The nearest id of a 32B model is the family's 72B entry: another shape, so no did-you-mean."""
    fix = unknown_model_fix("Qwen/Qwen2.5-32B-Instruct")
    assert "Did you mean" not in fix
    assert "'qwen/qwen2.5-72b-instruct', is another size (72B, not 32B)" in fix
    assert "Did you mean 'meta-llama/llama-3.1-8b-instruct'" in unknown_model_fix("meta-llama/Llama-3.1-8B-Instruc")
