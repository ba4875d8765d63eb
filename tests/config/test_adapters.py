"""LoRA adapters (the instance key `adapters`): read and checked, the plan's flags and memory, the
gateway's workers and model lists, the front's checks and vLLM's model-access middleware, the tiny
adapter the sandbox serves. No host."""

from __future__ import annotations

import asyncio
import json
import sys
import types

import numpy as np
import pytest
from safetensors.numpy import load as load_safetensors

from support.planning_fixtures import H100_80G, host_data, instance
from vllm_fleet import gateway as gw
from vllm_fleet.config import ConfigErrors, check_fleet, parse_host
from vllm_fleet.config.adapters import LORA_RANKS, lora_rank, max_loras
from vllm_fleet.config.runner import lora_support
from vllm_fleet.plan import plan_fleet, plan_host
from vllm_fleet.render import render_host
from vllm_fleet.sandbox import tiny_adapter
from vllm_fleet.templating import jinja_environment

LLAMA = dict(name="llama", model="meta-llama/Meta-Llama-3-8B-Instruct", served_model_name="llama", tokenizer=None,
             max_model_len=8192)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory):
    return tiny_adapter.generate(tmp_path_factory.mktemp("adapters"), "bot", seed=1)


@pytest.fixture(scope="module")
def wide_dir(tmp_path_factory):
    """An adapter directory of rank 64 (only its config: the plan reads no weights)."""
    path = tmp_path_factory.mktemp("wide")
    (path / "adapter_config.json").write_text(json.dumps(dict(tiny_adapter.adapter_config("x"), r=64)))
    return path


def llama_host(adapters, name="h1", **settings):
    return parse_host(name, host_data(gpus=[H100_80G], instances=[instance(**LLAMA, adapters=adapters)], **settings))


def errors_of(data, name="h1"):
    with pytest.raises(ConfigErrors) as caught:
        parse_host(name, data)
    return caught.value.errors


def test_a_source_adapter_is_read_and_its_rank_sizes_the_flags(adapter_dir):
    config = llama_host([{"name": "bot", "source": str(adapter_dir)}])
    (adapter,) = config.instances[0].adapters
    assert (adapter.name, adapter.rank, adapter.source) == ("bot", tiny_adapter.RANK, str(adapter_dir))
    args = plan_host(config).instances[0].engine_args
    assert args["enable-lora"] is True and args["max-lora-rank"] == 16 and args["max-loras"] == 4
    assert "lora-modules" not in args  # loaded at run time: adding one restarts nothing


def test_the_flags_follow_vllms_ranks_and_change_rarely():
    assert [lora_rank([r]) for r in (1, 8, 16, 17, 200, 300, 512)] == [16, 16, 16, 32, 256, 320, 512]
    assert all(lora_rank([r]) in LORA_RANKS for r in range(1, 513))
    assert [max_loras(n) for n in (1, 2, 4, 5, 9, 17, 300)] == [4, 4, 4, 8, 16, 16, 16]


def test_many_adapters_share_a_batchs_slots_and_stay_loaded_in_host_memory(adapter_dir):
    """vLLM allocates LoRA buffers for every max-loras slot on every GPU: 300 adapters get 16 slots
    (not 512, which would take most of the KV cache), and --max-cpu-loras keeps them all loaded; vLLM
    refuses a max-cpu-loras below max-loras, so engine_args may not set it."""
    many = [{"name": f"bot{i}", "model": f"org/bot{i}", "rank": 8} for i in range(300)]
    [inst] = plan_host(llama_host(many)).instances
    assert (inst.engine_args["max-loras"], inst.engine_args["max-cpu-loras"]) == (16, 512)
    assert "max-cpu-loras" not in plan_host(llama_host(many[:16])).instances[0].engine_args
    with pytest.raises(ConfigErrors) as caught:
        parse_host("h1", host_data(gpus=[H100_80G], instances=[
            instance(**LLAMA, adapters=many[:2], engine_args={"max-cpu-loras": 1})]))
    assert any(e.key == "engine_args.max-cpu-loras" for e in caught.value.errors)


def test_adapters_take_gpu_memory_from_the_kv_cache(adapter_dir, wide_dir):
    plans = [plan_host(llama_host(adapters)).instances[0] for adapters in (
        [], [{"name": "bot", "source": str(adapter_dir)}],
        [{"name": "bot", "source": str(adapter_dir)}, {"name": "wide", "source": str(wide_dir)}])]
    kv = [p.kv_cache_tokens for p in plans]
    weights = [p.layout.per_gpu[0].weights_gib for p in plans]
    assert kv[0] > kv[1] > kv[2]
    # Llama 3 8B, bf16, rank 16, 4 slots: 32 layers x 81920 + 2 x (128256 + 4096) elements per rank
    # and slot (memory.LoraBuffers), x 64 x 2 bytes.
    expected = (32 * 81920 + 2 * (128256 + 4096)) * 64 * 2 / 2**30
    assert weights[1] - weights[0] == pytest.approx(expected, rel=1e-6)
    assert weights[2] - weights[0] == pytest.approx(expected * 4, rel=1e-6)  # rank 64


def test_bad_adapters_are_refused_naming_host_instance_key_and_fix(tmp_path, adapter_dir):
    not_adapter = tmp_path / "plain"
    not_adapter.mkdir()
    dora = tmp_path / "dora"
    dora.mkdir()
    (dora / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "target_modules": ["q_proj"],
                                                          "use_dora": True}))
    cases = [
        ({"name": "bot", "source": str(not_adapter)}, "adapters[0].source", "adapter_config.json"),
        ({"name": "bot", "source": str(dora)}, "adapters[0].source", "DoRA"),
        ({"name": "bot", "source": "relative/dir"}, "adapters[0].source", "absolute"),
        ({"name": "bot", "model": "org/x", "rank": 513}, "adapters[0].rank", "512"),
        ({"name": "bot", "source": str(adapter_dir), "rank": 64}, "adapters[0].rank", "says 8"),
        ({"name": "Ｂot", "model": "org/x", "rank": 8}, "adapters[0].name", "served model name"),
    ]
    for entry, key, words in cases:
        errors = errors_of(host_data(gpus=[H100_80G], instances=[instance(**LLAMA, adapters=[entry])]))
        found = [e for e in errors if e.key == key]
        assert found, (entry, [e.located() for e in errors])
        assert words in str(found[0]) and found[0].host == "h1" and found[0].instance == "llama" and found[0].fix
    own_name = llama_host([{"name": "llama", "source": str(adapter_dir)}])
    with pytest.raises(ConfigErrors) as caught:
        check_fleet([own_name])
    (error,) = [e for e in caught.value.errors if e.key == "adapters[0].name"]
    assert "served_model_name" in str(error) and error.instance == "llama" and error.fix


def test_an_adapter_name_is_one_adapter_and_no_served_name_across_the_fleet(adapter_dir, wide_dir):
    one = llama_host([{"name": "bot", "source": str(adapter_dir)}], name="a")
    same = llama_host([{"name": "bot", "source": str(adapter_dir)}], name="b")
    check_fleet([one, same])  # one adapter served twice (two replicas): fine
    other = llama_host([{"name": "bot", "source": str(wide_dir)}], name="c")
    with pytest.raises(ConfigErrors) as caught:
        check_fleet([one, other])
    assert any(e.key == "adapters[0].name" and e.host == "c" for e in caught.value.errors)
    clash = parse_host("d", host_data(gpus=[H100_80G], instances=[instance(**{**LLAMA, "served_model_name": "bot"})]))
    with pytest.raises(ConfigErrors) as caught:
        check_fleet([one, clash])
    assert any(e.key == "adapters[0].name" and "served_model_name" in str(e) for e in caught.value.errors)
    # One hub adapter declared with two ranks: one host would size vLLM's buffers too small for it.
    low = llama_host([{"name": "hub-bot", "model": "org/bot-lora", "rank": 8}], name="e")
    high = llama_host([{"name": "hub-bot", "model": "org/bot-lora", "rank": 64}], name="f")
    check_fleet([low, llama_host([{"name": "hub-bot", "model": "org/bot-lora", "rank": 8}], name="g")])
    with pytest.raises(ConfigErrors) as caught:
        check_fleet([low, high])
    assert any(e.host == "f" and "of rank 64" in e.message and "of rank 8" in e.message for e in caught.value.errors)


def test_engine_args_may_not_set_what_adapters_decide(adapter_dir):
    for flag in ("enable-lora", "max-lora-rank", "max-loras", "lora-modules"):
        errors = errors_of(host_data(gpus=[H100_80G], instances=[instance(**LLAMA, engine_args={flag: "x"})]))
        assert any(e.key == f"engine_args.{flag}" for e in errors), flag
    errors = errors_of(host_data(gpus=[H100_80G], instances=[instance(
        **LLAMA, adapters=[{"name": "bot", "source": str(adapter_dir)}], engine_args={"middleware": "m.M"})]))
    assert any(e.key == "engine_args.middleware" for e in errors)


def test_adapters_are_models_to_clients_and_the_gateway(adapter_dir):
    clients = {"bot-only": {"key_env": "BOT_KEY", "models": ["bot"]}}
    backend = llama_host([{"name": "bot", "source": str(adapter_dir)}], name="gpu", vllm_api_clients=clients)
    gateway = parse_host("gw", {"gpus": [], "vllm_instances": [], "vllm_gateway": True, "vllm_target": "cpu",
                                "vllm_advertise_address": "10.0.0.1",
                                "vllm_api_clients": clients})
    configs = [backend, gateway]
    check_fleet(configs)  # the client's model is the adapter: served
    backends = gw.fleet_backends(configs, plan_fleet(configs))
    workers = json.loads(gw.workers_json(backends))
    urls = {w["model_id"]: w["url"] for w in workers}
    assert set(urls) == {"llama", "bot"}
    assert urls["bot"].startswith(urls["llama"] + gw.ADAPTER_PATH + "/") and urls["bot"] != urls["llama"]
    assert [m["id"] for m in json.loads(gw.models_json(backends))["data"]] == ["bot", "llama"]
    only = backend.api_clients[0]
    assert [m["id"] for m in json.loads(gw.models_json(backends, only))["data"]] == ["bot"]


def test_the_front_passes_each_clients_names_and_refuses_the_adapter_routes(adapter_dir):
    clients = {"bot-only": {"key_env": "BOT_KEY", "models": ["bot"]}, "base-only": {"key_env": "B", "models": ["llama"]}}
    config = llama_host([{"name": "bot", "source": str(adapter_dir)}], vllm_api_clients=clients)
    files = {f.path: f.content for f in render_host(config, plan_host(config))}
    front = files["/etc/vllm-fleet/front.conf"]
    ids = {c.name: c.id for c in config.api_clients}
    assert f'{ids["bot-only"]} "bot";' in front and f'{ids["base-only"]} "llama";' in front
    assert "proxy_set_header X-Vllm-Fleet-Models $vllm_fleet_models_" in front
    assert "location ~ ^/v1/+(load|unload)_lora_adapter {\n            return 403" in front
    unit = next(text for path, text in files.items() if path.endswith("vllm-llama.service"))
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1" in unit and "PYTHONPATH=/etc/vllm-fleet/python" in unit
    assert "class ModelAccess" in files["/etc/vllm-fleet/python/vllm_fleet_model_access.py"]
    plain = parse_host("h2", host_data(gpus=[H100_80G], instances=[instance(**LLAMA)]))
    plain_files = {f.path: f.content for f in render_host(plain, plan_host(plain))}
    assert "X-Vllm-Fleet-Models" not in plain_files["/etc/vllm-fleet/front.conf"]
    # Without adapters the module is still loaded (it counts each client's tokens), with no loader.
    assert "class ModelAccess" in plain_files["/etc/vllm-fleet/python/vllm_fleet_model_access.py"]
    assert not any(p.endswith("vllm-adapters.py") for p in plain_files)


def _model_access():
    module = types.ModuleType("vllm_fleet_model_access")
    exec(jinja_environment().get_template("vllm-model-access.py.j2").render(), module.__dict__)
    return module


def _call(body: bytes, allowed: str | None, method="POST", scope_type="http", path="/v1/completions",
          answer=b"ok"):
    """(status, what the app saw) of one request through ModelAccess around a recording app; with
    path /v1/models, (status, the answer the client got)."""
    seen = {}

    async def app(scope, receive, send):
        message = await receive()
        seen["body"] = message["body"]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer[:3], "more_body": True})
        await send({"type": "http.response.body", "body": answer[3:]})

    headers = [(b"content-type", b"application/json")]
    if allowed is not None:
        headers.append((b"x-vllm-fleet-models", allowed.encode()))
    chunks = [body[:5], body[5:]]
    sent = []

    async def receive():
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    middleware = _model_access().ModelAccess(app)
    asyncio.run(middleware({"type": scope_type, "method": method, "headers": headers, "path": path}, receive, send))
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    if path == "/v1/models":
        start = next(m for m in sent if m["type"] == "http.response.start")
        got = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
        assert dict(start["headers"])[b"content-length"] == str(len(got)).encode()
        return status, got
    return status, seen.get("body")


def test_vllms_model_check_parses_the_body_as_vllm_does():
    allowed = json.dumps({"model": "bot", "prompt": "hi"}).encode()
    assert _call(allowed, "bot") == (200, allowed)  # the whole body reaches vLLM
    assert _call(json.dumps({"model": "llama"}).encode(), "bot")[0] == 403
    assert _call(json.dumps({"model": "llama"}).encode(), "*")[0] == 200
    assert _call(json.dumps({"model": "llama"}).encode(), None)[0] == 200  # the host's own key on loopback
    # Hostile spellings: the last of two keys wins (as in vLLM), escapes are decoded, no model at all
    # would be vLLM's default (the base model), a case variant is another name.
    assert _call(b'{"model": "bot", "model": "llama"}', "bot")[0] == 403
    assert _call(b'{"model": "bot", "mod\\u0065l": "llama"}', "bot")[0] == 403
    assert _call(b'{"model": "b\\u006ft"}', "bot")[0] == 200
    assert _call(b'{"prompt": "x", "extra": {"model": "bot"}}', "bot")[0] == 403
    assert _call(b'{"model": "BOT"}', "bot")[0] == 403
    assert _call(b'[{"model": "bot"}]', "bot")[0] == 403
    assert _call(b'--form\r\nname="model"\r\n\r\nbot', "bot")[0] == 403
    assert _call(b"", "bot", method="GET")[0] == 200
    assert _call(b"", "bot", scope_type="websocket")[0] is None  # closed, never passed on
    listing = json.dumps({"object": "list", "data": [{"id": "llama"}, {"id": "bot"}, {"id": "sql"}]}).encode()
    status, got = _call(b"", "bot sql", method="GET", path="/v1/models", answer=listing)
    assert status == 200 and [m["id"] for m in json.loads(got)["data"]] == ["bot", "sql"]
    assert json.loads(_call(b"", "*", method="GET", path="/v1/models", answer=listing)[1]) == json.loads(listing)


def test_the_tiny_adapter_is_deterministic_and_changes_the_model(tmp_path):
    files = tiny_adapter.build_files(seed=1)
    assert files == tiny_adapter.build_files(seed=1) and files != tiny_adapter.build_files(seed=2)
    config = json.loads(files["adapter_config.json"])
    assert config["peft_type"] == "LORA" and config["r"] == tiny_adapter.RANK
    tensors = load_safetensors(files["adapter_model.safetensors"])
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight" in tensors
    assert all(np.abs(t).min() > 0 or np.abs(t).mean() > 0.01 for t in tensors.values())
    q_b = tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"]
    assert q_b.shape == (128, tiny_adapter.RANK) and np.abs(q_b).mean() > 0.1
    first = tiny_adapter.generate(tmp_path, "bot", seed=1)
    mtime = (first / "adapter_model.safetensors").stat().st_mtime_ns
    assert tiny_adapter.generate(tmp_path, "bot", seed=1) == first
    assert (first / "adapter_model.safetensors").stat().st_mtime_ns == mtime  # up to date: not rewritten


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_status_says_which_planned_adapters_vllm_does_not_serve():
    from vllm_fleet.commands.status import adapter_drift
    entry = {"health": True, "served_models": ["bot", "llama", "old"]}
    assert adapter_drift(entry, ["bot", "sql"], "llama") == ["adapters not loaded: sql",
                                                             "adapters loaded but not planned: old"]
    assert adapter_drift({"health": True, "served_models": ["bot", "llama"]}, ["bot"], "llama") == []
    assert adapter_drift({"health": False}, ["bot"], "llama") == []  # down: said elsewhere


def test_a_hub_adapter_downloads_its_config_and_one_weights_file():
    from vllm_fleet.rules import hub
    listing = [{"path": "adapter_config.json", "size": 700}, {"path": "adapter_model.safetensors", "size": 5000},
               {"path": "adapter_model.bin", "size": 5100}, {"path": "README.md", "size": 10},
               {"path": "checkpoint-10/adapter_model.safetensors", "size": 5000}]
    download = hub.adapter_download("org/bot-lora", "a" * 40, name="bot", listing=listing)
    assert download.allow_patterns == ("adapter_config.json", "adapter_model.safetensors")
    assert download.total_bytes == 5700 and download.adapter and download.marker_key == "org/bot-lora@" + "a" * 40
    only_bin = [e for e in listing if e["path"] != "adapter_model.safetensors"]
    assert hub.adapter_download("org/x", name="x", listing=only_bin).allow_patterns[-1] == "adapter_model.bin"
    with pytest.raises(ValueError, match="not a PEFT LoRA adapter"):
        hub.adapter_download("org/x", name="x", listing=[{"path": "config.json", "size": 1}])
    assert hub.adapter_download("org/x", name="x").marker_key == "org/x"
    script = hub.download_script("org/x", ["adapter_config.json"], revision="b" * 40)
    assert "REVISION = '" + "b" * 40 + "'" in script and '{"revision": REVISION}' in script
    assert "revision='" + "b" * 40 + "'" in hub.listing_script("org/x", "b" * 40)
    assert "revision" not in hub.listing_script("org/x")


def test_hub_adapters_are_downloaded_before_start_and_loaded_from_the_cache():
    from vllm_fleet.deploy.managed import adapter_downloads
    from vllm_fleet.render import adapter_paths
    config = llama_host([{"name": "bot", "model": "org/bot-lora", "rank": 8},
                         {"name": "pinned", "model": "org/p", "rank": 8, "revision": "c" * 40}])
    downloads = adapter_downloads(config.instances[0])
    assert [(d.repo, d.revision, d.why) for d in downloads] == [
        ("org/bot-lora", None, "LoRA adapter bot"), ("org/p", "c" * 40, "LoRA adapter pinned")]
    paths = adapter_paths(config, plan_host(config).instances[0])
    # Absolute paths only: vLLM tries a bare id as a path relative to its working directory first.
    assert paths == [{"name": "bot", "path": "/var/lib/vllm-fleet/hf/hub/models--org--bot-lora/refs/main"},
                     {"name": "pinned", "path": "/var/lib/vllm-fleet/hf/hub/models--org--p/snapshots/" + "c" * 40}]


def _loader():
    module = types.ModuleType("vllm_adapters")
    exec(jinja_environment().get_template("vllm-adapters.py.j2").render(), module.__dict__)
    return module


def test_the_loader_gives_vllm_the_snapshot_a_refs_main_names(tmp_path):
    repo = tmp_path / "hub" / "models--org--bot-lora"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("d" * 40 + "\n")
    loader = _loader()
    assert loader.snapshot(str(repo / "refs" / "main")) == f"{repo}/snapshots/{'d' * 40}"
    pinned = f"{repo}/snapshots/{'c' * 40}"
    assert loader.snapshot(pinned) == pinned  # a revision's snapshot: as it is
    with pytest.raises(SystemExit, match="did not finish"):
        loader.snapshot(str(tmp_path / "hub" / "models--org--gone" / "refs" / "main"))
    (repo / "refs" / "main").write_text("../../../etc")
    with pytest.raises(SystemExit, match="holds no commit"):
        loader.snapshot(str(repo / "refs" / "main"))


@pytest.mark.parametrize("path, method", [("/adapters", "POST"), ("/adapters/bot", "DELETE"), ("/invocations", "POST")])
@pytest.mark.parametrize("allowed", [None, "*", "bot"])
def test_the_sagemaker_adapter_routes_are_refused_to_every_caller(path, method, allowed):
    """Runtime LoRA updating also opens SageMaker's /adapters (load any path, unload any adapter) and
    /invocations (an adapter from a header), outside vLLM's API key: refused even on loopback."""
    status, seen = _call(b'{"name": "x", "src": "/etc"}', allowed, method=method, path=path)
    assert status == 403 and seen is None  # vLLM never saw it


def test_what_lora_wraps_is_the_model_classs_own():
    """vLLM wraps the token embedding and the LM head only where the class lists them in its
    embedding_modules (Llama does, Gemma 3 and Qwen2 do not): only those get LoRA buffers, and only
    an LM head meets vLLM's vocabulary limit, so Gemma 3 (262208 tokens) takes adapters."""
    def lora_plan(model, **extra):
        config = parse_host("h1", host_data(gpus=[H100_80G], instances=[instance(
            name="m", model=model, served_model_name="m", tokenizer=None, max_model_len=8192,
            adapters=[{"name": "bot", "model": "org/bot-lora", "rank": 16}], **extra)]))
        [inst] = plan_host(config).instances
        return inst
    gemma = lora_plan("google/gemma-3-12b-it")  # accepted: Gemma 3 has no LoRA on its LM head
    assert gemma.engine_args["enable-lora"] is True
    assert lora_support(lora_plan("google/gemma-3-1b-it").config.model_info).embeddings == frozenset()
    llama = lora_plan("meta-llama/Meta-Llama-3-8B-Instruct")
    assert lora_support(llama.config.model_info).embeddings == {"input_embeddings", "output_embeddings"}
    # Qwen2.5-7B: the embedding buffers (2 x 16 slots x rank 16 x (152064 + 3584) x 2 bytes, ~152 MiB)
    # are not taken from its KV cache, as they would be on a class that wraps them.
    qwen = lora_plan("Qwen/Qwen2.5-7B-Instruct")
    wrapped = lora_plan("Qwen/Qwen2.5-7B-Instruct", model_info=dict(
        architectures=["LlamaForCausalLM"], hidden_size=3584, intermediate_size=18944, num_attention_heads=28,
        num_key_value_heads=4, num_hidden_layers=28, vocab_size=152064, max_position_embeddings=32768,
        torch_dtype="bfloat16", weights_gib=qwen.config.model_info.weights_gib))
    assert qwen.kv_cache_blocks > wrapped.kv_cache_blocks
