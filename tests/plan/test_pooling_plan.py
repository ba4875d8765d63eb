"""A pooling instance (an embedding or reranking model on vLLM's pooling runner) planned with its
weights and activations and no KV cache, rendered with --runner pooling, verified through the endpoint
it serves, and passed by the front on that endpoint with the client checks of /v1/."""

from __future__ import annotations

import json

import yaml

from support.pooling_models import BGE_M3, H200, QWEN3_0_6B, RERANKER
from vllm_fleet.cli import print_plan
from vllm_fleet.config import parse_host
from vllm_fleet.plan import plan_host
from vllm_fleet.plan.types import FleetPlan
from vllm_fleet.render import render_host
from vllm_fleet.render_front import POOLING_ROUTES


def host(*instances, **settings):
    return parse_host("gpu-1", {"gpus": [H200, H200], "vllm_instances": list(instances), **settings})


BGE = {"name": "bge", "model": "BAAI/bge-m3", "served_model_name": "bge-m3", "port": 8000, "model_info": BGE_M3}
CHAT = {"name": "chat", "model": "Qwen/Qwen3-0.6B", "served_model_name": "qwen3", "port": 8001,
        "model_info": dict(QWEN3_0_6B, weights_gib=1.4), "gpus": [1]}


def test_an_embedding_model_is_planned_with_weights_and_activations_and_no_kv_cache():
    plan = plan_host(host(dict(BGE, gpus=[0])))
    [inst] = plan.instances
    assert (inst.runner, inst.convert, inst.pooling_task) == ("pooling", "none", "embed")
    assert inst.kv_cache_tokens is None and inst.max_concurrency is None and inst.kv_cache_blocks is None
    [use] = inst.as_dict()["per_gpu"]
    assert "kv_cache_gib" not in use and use["weights_gib"] == 2.11
    assert use["activations_gib"] == 2.5  # vllm_activation_reserve_gib + vllm_cuda_graph_reserve_gib defaults
    text = " ".join(inst.reasons)
    assert "no KV cache is planned" in text and "KV-cache blocks" not in text and "concurrency for" not in text
    # vLLM takes a pooling model's length itself (its tokenizer's model_max_length for absolute positions)
    assert inst.max_model_len == 0 and "max-model-len" not in inst.engine_args
    assert inst.engine_args["runner"] == "pooling" and "convert" not in inst.engine_args


def test_the_plan_table_shows_no_kv_figures_for_a_pooling_instance(capsys):
    plan = plan_host(host(dict(BGE, gpus=[0]), CHAT))
    print_plan(FleetPlan([plan]))
    out = capsys.readouterr().out
    bge_row = next(line for line in out.splitlines() if "│ bge" in line)
    assert "none (pooling)" in bge_row and "activations" in bge_row
    chat_row = next(line for line in out.splitlines() if "│ chat" in line)
    assert "none (pooling)" not in chat_row


def test_a_model_too_large_for_the_gpu_is_refused_on_its_weights_alone():
    big = dict(BGE, model_info=dict(BGE_M3, weights_gib=200.0), gpus=[0])
    try:
        plan_host(host(big))
    except Exception as exc:  # ConfigErrors
        [error] = exc.errors
        assert error.key == "model" and "weights do not fit" in error.message and "KV cache holds" not in error.message
    else:
        raise AssertionError("a 200 GiB model was planned on one H200")


def test_a_decoder_converted_to_embeddings_renders_runner_and_convert():
    qwen = dict(CHAT, name="emb", served_model_name="emb", runner="pooling", gpus=[0], port=8000)
    [inst] = plan_host(host(qwen)).instances
    assert (inst.engine_args["runner"], inst.engine_args["convert"]) == ("pooling", "embed")
    assert inst.kv_cache_tokens is None


def test_a_generating_instance_renders_neither_flag_unless_it_sets_them():
    [inst] = plan_host(host(dict(CHAT))).instances
    assert "runner" not in inst.engine_args and "convert" not in inst.engine_args and inst.max_concurrency
    [inst] = plan_host(host(dict(CHAT, runner="generate"))).instances
    assert inst.engine_args["runner"] == "generate"


def rendered(config, plan):
    return {f.path: f.content for f in render_host(config, plan)}


def test_the_engine_yaml_manifest_and_front_of_a_pooling_instance():
    config = host(dict(BGE, gpus=[0]), CHAT)
    files = rendered(config, plan_host(config))
    bge_yaml = yaml.safe_load(next(text for path, text in files.items() if path.endswith("bge.yaml")))
    assert bge_yaml["runner"] == "pooling"
    manifest = json.loads(next(text for path, text in files.items() if path.endswith("manifest.json")))
    assert manifest["instances"]["bge"]["task"] == "embed" and "task" not in manifest["instances"]["chat"]
    front = next(text for path, text in files.items() if path.endswith("front.conf"))
    bge_server = front[front.index("listen 0.0.0.0:8000"):front.index("listen 0.0.0.0:8001")]
    chat_server = front[front.index("listen 0.0.0.0:8001"):]
    assert {"/score", "/rerank", "/classify", "/pooling", "/v2/rerank", "/v2/embed"} == set(POOLING_ROUTES)
    for route in POOLING_ROUTES:
        block = bge_server[bge_server.index(f"location = {route} {{"):]
        block = block[:block.index("\n        }")]
        # the same checks as /v1/: the client's key, its models, then vLLM's own key
        assert "$vllm_fleet_client_id = \"\"" in block and "$vllm_fleet_allowed_18000 = 0" in block
        assert "Authorization $vllm_fleet_vllm_authorization" in block and f"18000{route};" in block
        assert f"location = {route} " not in chat_server  # a generating instance serves none of them
    assert "location /v1/ {" in bge_server  # /v1/embeddings, /v1/score, /v1/rerank


def test_a_reranker_is_verified_with_a_classification():
    config = host(dict(BGE, model_info=RERANKER, gpus=[0]))
    [inst] = plan_host(config).instances
    assert inst.pooling_task == "classify"
    manifest = json.loads(next(text for path, text in rendered(config, plan_host(config)).items()
                               if path.endswith("manifest.json")))
    assert manifest["instances"]["bge"]["task"] == "classify"
