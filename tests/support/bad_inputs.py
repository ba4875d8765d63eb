"""The corpus of broken host data: (label, host data, key the message must name, instance it must
name or None). Used through `vllm-fleet plan` (test_bad_input_corpus.py) and through `pyinfra --dry`
on the sandbox (test_sandbox_bad_input.py)."""

from __future__ import annotations

from support.planning_fixtures import A100_40G, SEED_GEMMA, host_data
from support.pooling_models import BGE_M3, QWEN3_0_6B
from support.planning_fixtures import instance as inst  # a short name: one case a line


def host(**changes) -> dict:
    """The seed box's host data with each key in `changes` set as given (a None too, where
    host_data() would take None for its default)."""
    return {**host_data(), **changes}


def floating(**changes) -> dict:
    """host() as a gateway behind the floating address 10.0.0.100/24, its own address 10.0.0.5 on eth0:
    vllm_advertise_address, not ssh_hostname, so the sandbox's run of the corpus still reaches its host
    (tests/sandbox/test_sandbox_bad_input.py keeps the box's own SSH settings)."""
    return host(**{"vllm_gateway": True, "vllm_advertise_address": "10.0.0.5", "vllm_gateway_address": "10.0.0.100/24",
                   "vllm_gateway_interface": "eth0", **changes})


def alerting(receivers=None, **changes) -> dict:
    """host() as the monitoring host, with `receivers` as its vllm_alert_receivers."""
    return host(**{"vllm_metrics": True, "vllm_monitoring": True, "vllm_alert_receivers": receivers or {}, **changes})


def hook(url) -> dict:
    return {"ops": {"url": url}}


def mail(**changes) -> dict:
    return {"oncall": {"to": "oncall@example.org", "from": "alerts@example.org", "smarthost": "mail.example.org:587",
                       **changes}}


R = "vllm_alert_receivers.ops"
M = "vllm_alert_receivers.oncall"

# (label, host data, key the message must name, instance it must name or None)
CORPUS = [
    ("unknown instance key", host(vllm_instances=[inst(tensor_parallell_size=2)]), "tensor_parallell_size", "gemma"),
    ("typo host key", host(placment="split"), "placment", None),
    ("unknown vllm_ knob", host(vllm_api_kee_env="X"), "vllm_api_kee_env", None),
    ("port as string", host(vllm_instances=[inst(port="8000")]), "port", "gemma"),
    ("port too low", host(vllm_instances=[inst(port=22)]), "port", "gemma"),
    ("port too high", host(vllm_instances=[inst(port=70000)]), "port", "gemma"),
    ("negative utilisation", host(vllm_instances=[inst(gpu_memory_utilization=-0.1)]), "gpu_memory_utilization", "gemma"),
    ("utilisation > 1", host(vllm_instances=[inst(gpu_memory_utilization=1.5)]), "gpu_memory_utilization", "gemma"),
    ("utilisation as text", host(vllm_instances=[inst(gpu_memory_utilization="high")]), "gpu_memory_utilization", "gemma"),
    ("host utilisation > 1", host(vllm_gpu_memory_utilization=2), "vllm_gpu_memory_utilization", None),
    ("canary mark as text", host(vllm_rollout_canary="yes"), "vllm_rollout_canary", None),
    ("canary window of zero", host(vllm_canary_observe_s=0), "vllm_canary_observe_s", None),
    ("canary window of a year", host(vllm_canary_observe_s=365 * 86400), "vllm_canary_observe_s", None),
    ("canary window as text", host(vllm_canary_observe_s="10m"), "vllm_canary_observe_s", None),
    ("canary TTFT ratio as 'nan'", host(vllm_canary_max_ttft_ratio="nan"), "vllm_canary_max_ttft_ratio", None),
    ("canary TTFT ratio below 1", host(vllm_canary_max_ttft_ratio=0.9), "vllm_canary_max_ttft_ratio", None),
    ("canary ITL ratio above 1000", host(vllm_canary_max_itl_ratio=1000.5), "vllm_canary_max_itl_ratio", None),
    ("canary error rate negative", host(vllm_canary_max_error_rate=-0.01), "vllm_canary_max_error_rate", None),
    ("canary error rate as a percent", host(vllm_canary_max_error_rate=5), "vllm_canary_max_error_rate", None),
    ("canary preemptions huge", host(vllm_canary_max_preemption_increase=1e300), "vllm_canary_max_preemption_increase",
     None),
    ("canary minimum of no request", host(vllm_canary_min_requests=0), "vllm_canary_min_requests", None),
    ("canary minimum beyond int64", host(vllm_canary_min_requests=2 ** 64), "vllm_canary_min_requests", None),
    ("canary knob with a unicode look-alike", host(**{"vllm_canary_max_ttft_rati\u043e": 1.5}),
     "vllm_canary_max_ttft_rati\u043e", None),
    ("duplicate names", host(vllm_instances=[inst(gpus=[1]), inst(gpus=[2], port=8001)]), "name", "gemma"),
    ("duplicate ports", host(vllm_instances=[inst(name="a", gpus=[1]), inst(name="b", gpus=[2])]), "port", "b"),
    ("duplicate GPUs", host(vllm_instances=[inst(name="a", gpus=[1]), inst(name="b", gpus=[1], port=8001)]), "gpus", "b"),
    ("GPU listed twice", host(vllm_instances=[inst(gpus=[1, 1])]), "gpus", "gemma"),
    ("shared GPU over 1", host(vllm_instances=[inst(name="a", gpus=[1], gpu_memory_utilization=0.6),
                                               inst(name="b", gpus=[1], port=8001, gpu_memory_utilization=0.5)]),
     "gpus", "b"),
    ("shared GPU at exactly 1: no room for a CUDA context", host(vllm_instances=[
        inst(name="a", gpus=[1], gpu_memory_utilization=0.5),
        inst(name="b", gpus=[1], port=8001, gpu_memory_utilization=0.5)]), "gpus", "b"),
    ("shared GPU, one of two listed", host(vllm_instances=[
        inst(name="a", gpus=[1, 2], tensor_parallel_size=2, gpu_memory_utilization=0.9),
        inst(name="b", gpus=[2], port=8001, gpu_memory_utilization=0.1)]), "gpus", "b"),
    ("GPU listed twice, not next to each other", host(vllm_instances=[inst(gpus=[1, 2, 1])]), "gpus", "gemma"),
    ("GPU index out of range", host(vllm_instances=[inst(gpus=[7])]), "gpus", "gemma"),
    ("negative GPU index", host(vllm_instances=[inst(gpus=[-1])]), "gpus", "gemma"),
    ("TP not dividing heads", host(gpus=[A100_40G] * 8, vllm_instances=[inst(
        gpus=list(range(8)), tensor_parallel_size=8, model="Qwen/Qwen2.5-7B-Instruct", tokenizer=None,
        max_model_len=4096)]), "tensor_parallel_size", "gemma"),
    ("TP=3 on the seed box", host(vllm_instances=[inst(gpus=[0, 1, 2], tensor_parallel_size=3)]), "tensor_parallel_size", "gemma"),
    ("world size > GPUs", host(vllm_instances=[inst(gpus=[1, 2], pipeline_parallel_size=3)]), "pipeline_parallel_size", "gemma"),
    ("world size < GPUs", host(vllm_instances=[inst(gpus=[0, 1, 2], tensor_parallel_size=1,
                                                    pipeline_parallel_size=1, data_parallel_size=1)]), "gpus", "gemma"),
    ("TP zero", host(vllm_instances=[inst(tensor_parallel_size=0)]), "tensor_parallel_size", "gemma"),
    ("PP as float", host(vllm_instances=[inst(pipeline_parallel_size=1.5)]), "pipeline_parallel_size", "gemma"),
    ("model too large", host(gpus=[A100_40G] * 4, vllm_instances=[inst(model="meta-llama/Meta-Llama-3-70B-Instruct",
                                                                       tokenizer=None, max_model_len=8192)]), "model", "gemma"),
    ("max_model_len beyond the model", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct",
                                                                 tokenizer=None, max_model_len=100000)]), "max_model_len", "gemma"),
    ("unit-name injection ../x", host(vllm_instances=[inst(name="../x")]), "name", "../x"),
    ("unit-name injection a;b", host(vllm_instances=[inst(name="a;b")]), "name", "a;b"),
    ("unit-name with space", host(vllm_instances=[inst(name="a b")]), "name", "a b"),
    ("served name with spaces", host(vllm_instances=[inst(served_model_name="gemma 3")]), "served_model_name", "gemma"),
    ("empty served name", host(vllm_instances=[inst(served_model_name="")]), "served_model_name", "gemma"),
    ("engine arg with shell metacharacters in its name", host(vllm_instances=[inst(engine_args={"x;reboot": 1})]),
     "engine_args.x;reboot", "gemma"),
    ("engine arg value with a newline", host(vllm_instances=[inst(engine_args={"chat-template": "a\nb"})]),
     "engine_args.chat-template", "gemma"),
    ("API key in engine args", host(vllm_instances=[inst(engine_args={"api-key": "sk-1"})]), "engine_args.api-key", "gemma"),
    ("parallel size in engine args", host(vllm_instances=[inst(engine_args={"tensor_parallel_size": 2})]),
     "engine_args.tensor_parallel_size", "gemma"),
    ("secret in env", host(vllm_instances=[inst(env={"HF_TOKEN": "hf_x"})]), "env.HF_TOKEN", "gemma"),
    ("TRANSFORMERS_CACHE in env", host(vllm_instances=[inst(env={"TRANSFORMERS_CACHE": "/c"})]), "env.TRANSFORMERS_CACHE", "gemma"),
    ("CUDA_VISIBLE_DEVICES in env", host(vllm_instances=[inst(env={"CUDA_VISIBLE_DEVICES": "0"})]), "env.CUDA_VISIBLE_DEVICES", "gemma"),
    ("bad env name", host(vllm_instances=[inst(env={"1X": "a"})]), "env.1X", "gemma"),
    ("GGUF without tokenizer", host(vllm_instances=[inst(tokenizer=None)]), "tokenizer", "gemma"),
    ("unknown model, no model_info", host(vllm_instances=[inst(model="acme/model", tokenizer=None)]), "model_info", "gemma"),
    ("model_info incomplete", host(vllm_instances=[inst(model_info={"num_hidden_layers": 2})]), "model_info", "gemma"),
    ("model_info wrong type", host(vllm_instances=[inst(model_info={**{k: 2 for k in (
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
        "intermediate_size", "vocab_size")}, "weights_gib": "big"})]), "model_info.weights_gib", "gemma"),
    ("missing port", host(vllm_instances=[{k: v for k, v in SEED_GEMMA.items() if k != "port"}]), "port", "gemma"),
    ("instances not a list", host(vllm_instances={"name": "x"}), "vllm_instances", None),
    ("instance not a dict", host(vllm_instances=["gemma"]), "vllm_instances[0]", None),
    ("gpus not a list", host(gpus="A100"), "gpus", None),
    ("GPU memory as text", host(gpus=[{"name": "A100", "memory_mib": "40G"}]), "gpus[0].memory_mib", None),
    ("unknown placement", host(placement="spread"), "placement", None),
    ("unknown target", host(vllm_target="rocm"), "vllm_target", None),
    ("root service user", host(vllm_service_user="root"), "vllm_service_user", None),
    ("relative env root", host(vllm_root="opt/vllm"), "vllm_root", None),
    ("path with shell characters", host(vllm_config_dir="/etc/x;rm -rf /"), "vllm_config_dir", None),
    ("no GPUs declared on a cuda host", {"vllm_instances": [SEED_GEMMA]}, "gpus", None),
    # Two writers of one host path: the downloads' token file and the instance's env file; a
    # model synced onto a rendered file of vllm_config_dir.
    ("instance named hub", host(vllm_instances=[inst(name="hub")]), "name", "hub"),
    ("model synced onto a rendered file", host(vllm_config_dir="/srv/vf", vllm_instances=[inst(
        model="/srv/vf/gemma.env", model_source="/tmp", tokenizer=None)]), "model", "gemma"),
    ("two sources synced into one model path", host(vllm_instances=[
        inst(name="a", served_model_name="a", gpus=[1], model="/srv/m", model_source="/tmp/a", tokenizer=None),
        inst(name="b", served_model_name="b", gpus=[2], port=8001, model="/srv/m", model_source="/tmp/b",
             tokenizer=None)]), "model", "b"),
    ("model synced onto the uploads directory", host(vllm_instances=[inst(
        model="/opt/vllm-fleet/.upload", model_source="/tmp", tokenizer=None)]), "model", "gemma"),
    ("model synced into the engine's hub cache", host(vllm_instances=[inst(
        model="/var/lib/vllm-fleet/hf/hub/gemma", model_source="/tmp", tokenizer=None)]), "model", "gemma"),
    ("model synced into vLLM's compile cache", host(vllm_instances=[inst(
        model="/var/lib/vllm-fleet/cache/torch_compile_cache", model_source="/tmp", tokenizer=None)]), "model", "gemma"),
    ("model synced into root's environments", host(vllm_instances=[inst(
        model="/opt/vllm-fleet/envs/gemma", model_source="/tmp", tokenizer=None)]), "model", "gemma"),
    ("CPU host with TP", host(vllm_target="cpu", gpus=None, vllm_instances=[inst(tensor_parallel_size=2)]),
     "tensor_parallel_size", "gemma"),
    ("bad dtype", host(vllm_instances=[inst(dtype="bf16")]), "dtype", "gemma"),
    ("non-UTF-8-ish path", host(vllm_instances=[inst(model="/data/\udcff/model", tokenizer="/t")]), "model", "gemma"),
    # runner and convert: vLLM's values only, case and look-alikes included, and only together as vLLM takes them
    ("unknown runner", host(vllm_instances=[inst(runner="embedding")]), "runner", "gemma"),
    ("runner in capitals", host(vllm_instances=[inst(runner="POOLING")]), "runner", "gemma"),
    ("runner with a fullwidth letter", host(vllm_instances=[inst(runner="\uff50ooling")]), "runner", "gemma"),
    ("runner with a zero-width space", host(vllm_instances=[inst(runner="pooling\u200b")]), "runner", "gemma"),
    ("vLLM's draft runner", host(vllm_instances=[inst(runner="draft")]), "runner", "gemma"),
    ("unknown convert", host(vllm_instances=[inst(convert="score")]), "convert", "gemma"),
    ("convert in capitals", host(vllm_instances=[inst(convert="Embed")]), "convert", "gemma"),
    ("convert with a trailing space", host(vllm_instances=[inst(convert="embed ")]), "convert", "gemma"),
    ("runner as a list", host(vllm_instances=[inst(runner=["pooling"])]), "runner", "gemma"),
    ("convert with the generate runner", host(vllm_instances=[inst(runner="generate", convert="embed")]),
     "convert", "gemma"),
    ("an embedding model on the generate runner", host(vllm_instances=[inst(
        model="BAAI/bge-m3", tokenizer=None, max_model_len=None, model_info=BGE_M3, runner="generate")]),
     "runner", "gemma"),
    ("a decoder on the pooling runner unconverted", host(vllm_instances=[inst(
        model="Qwen/Qwen3-0.6B", tokenizer=None, model_info=QWEN3_0_6B, runner="pooling", convert="none")]),
     "convert", "gemma"),
    ("speculative decoding on an embedding model", host(vllm_instances=[inst(
        model="BAAI/bge-m3", tokenizer=None, max_model_len=None, model_info=BGE_M3,
        engine_args={"speculative-config": {"method": "ngram", "num_speculative_tokens": 2}})]),
     "engine_args.speculative-config", "gemma"),
    ("runner in engine args", host(vllm_instances=[inst(engine_args={"runner": "pooling"})]), "engine_args.runner",
     "gemma"),
    ("convert in engine args", host(vllm_instances=[inst(engine_args={"convert": "embed"})]), "engine_args.convert",
     "gemma"),
    # The token counting's flags (plan/engine_args.py USAGE_FLAGS): repeated, never changed.
    ("a middleware of its own in engine args", host(vllm_instances=[inst(engine_args={"middleware": "evil.Mw"})]),
     "engine_args.middleware", "gemma"),
    ("streams without their usage", host(vllm_instances=[inst(engine_args={"enable-force-include-usage": False})]),
     "engine_args.enable-force-include-usage", "gemma"),
    ("architectures that are no class names", host(vllm_instances=[inst(
        model="BAAI/bge-m3", tokenizer=None, max_model_len=None, model_info=dict(BGE_M3, architectures=["../x"]))]),
     "model_info.architectures", "gemma"),
    # LoRA adapters (config/adapters.py): each refused before any host changes.
    ("adapter source missing", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "source": "/nonexistent/vllm-fleet-adapter"}])]), "adapters[0].source", "gemma"),
    ("adapter rank above vLLM's limit", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "org/bot-lora", "rank": 1024}])]), "adapters[0].rank", "gemma"),
    ("adapter rank huge", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "org/bot-lora", "rank": 10**30}])]), "adapters[0].rank", "gemma"),
    ("hub adapter without rank", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "org/bot-lora"}])]), "adapters[0].rank", "gemma"),
    ("adapter name with a newline", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot\nx", "model": "org/bot-lora", "rank": 8}])]), "adapters[0].name", "gemma"),
    ("adapter name with a space", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot x", "model": "org/bot-lora", "rank": 8}])]), "adapters[0].name", "gemma"),
    ("adapter model path traversal", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "../../etc", "rank": 8}])]), "adapters[0].model", "gemma"),
    ("adapter source and model", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "org/bot-lora", "source": "/tmp", "rank": 8}])]), "adapters[0]", "gemma"),
    ("adapter revision not a commit", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "org/bot-lora", "rank": 8, "revision": "main; rm -rf /"}])]),
     "adapters[0].revision", "gemma"),
    ("adapter named twice", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "org/a", "rank": 8}, {"name": "bot", "model": "org/b", "rank": 8}])]),
     "adapters[1].name", "gemma"),
    ("adapters not a list", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters={"name": "bot"})]), "adapters", "gemma"),
    ("unknown adapter key", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, adapters=[
        {"name": "bot", "model": "org/bot-lora", "rank": 8, "alpha": 16}])]), "adapters[0].alpha", "gemma"),
    ("enable-lora in engine_args", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, engine_args={"enable-lora": True})]),
     "engine_args.enable-lora", "gemma"),
    ("max-lora-rank in engine_args", host(vllm_instances=[inst(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192, engine_args={"max-lora-rank": 64})]),
     "engine_args.max-lora-rank", "gemma"),
    ("adapters on a vocabulary vLLM refuses", host(vllm_instances=[inst(
        model="Qwen/Qwen3-0.6B", tokenizer=None, model_info=dict(QWEN3_0_6B, vocab_size=300_000),
        adapters=[{"name": "bot", "model": "org/bot-lora", "rank": 8}])]), "adapters", "gemma"),
    ("adapters on a model class without LoRA", host(vllm_instances=[inst(  # Orion: no LoRA in vLLM
        model="OrionStarAI/Orion-14B-Chat", tokenizer=None, model_info=dict(QWEN3_0_6B, architectures=["OrionForCausalLM"]),
        adapters=[{"name": "bot", "model": "org/bot-lora", "rank": 8}])]), "adapters", "gemma"),
    # The gateway's policy: vllm-router's names and the fleet's "prefix", exactly (no case or Unicode variant).
    ("gateway policy in capitals", host(vllm_gateway=True, vllm_gateway_policy="PREFIX"), "vllm_gateway_policy", None),
    ("gateway policy with a trailing space", host(vllm_gateway=True, vllm_gateway_policy="prefix "), "vllm_gateway_policy", None),
    ("gateway policy in fullwidth letters", host(vllm_gateway=True, vllm_gateway_policy="ｐrefix"), "vllm_gateway_policy", None),
    ("gateway policy with a newline", host(vllm_gateway=True, vllm_gateway_policy="prefix\n"), "vllm_gateway_policy", None),
    ("gateway policy kv_aware", host(vllm_gateway=True, vllm_gateway_policy="kv_aware"), "vllm_gateway_policy", None),
    # Two gateways behind a floating address (vllm_gateway_address, keepalived): box1 a gateway at 10.0.0.5.
    ("floating address with a leading zero", floating(vllm_gateway_address="010.0.0.100/24"), "vllm_gateway_address", None),
    ("floating address in fullwidth digits", floating(vllm_gateway_address="１0.0.0.100/24"), "vllm_gateway_address", None),
    ("floating address with a newline", floating(vllm_gateway_address="10.0.0.100/24\n"), "vllm_gateway_address", None),
    ("floating address without its prefix", floating(vllm_gateway_address="10.0.0.100"), "vllm_gateway_address", None),
    ("floating address IPv6", floating(vllm_gateway_address="fd00::100/64"), "vllm_gateway_address", None),
    ("floating address the network's", floating(vllm_gateway_address="10.0.0.0/24"), "vllm_gateway_address", None),
    ("floating address the broadcast", floating(vllm_gateway_address="10.0.0.255/24"), "vllm_gateway_address", None),
    ("floating address unspecified", floating(vllm_gateway_address="0.0.0.0/8"), "vllm_gateway_address", None),
    ("floating address loopback", floating(vllm_gateway_address="127.0.0.100/8"), "vllm_gateway_address", None),
    # keepalived would route the whole /0 (the host's default route) or /1 through the gateway's interface.
    ("floating address with a /0 subnet", floating(vllm_gateway_address="0.0.0.1/0"), "vllm_gateway_address", None),
    ("floating address with a /1 subnet", floating(vllm_gateway_address="10.0.0.100/1"), "vllm_gateway_address", None),
    ("floating address in this network", floating(vllm_gateway_address="0.0.0.1/8"), "vllm_gateway_address", None),
    ("floating address multicast", floating(vllm_gateway_address="224.0.0.18/24"), "vllm_gateway_address", None),
    ("floating address with keepalived words", floating(vllm_gateway_address="10.0.0.100/24 dev lo"),
     "vllm_gateway_address", None),
    ("floating address outside the gateway's subnet", floating(vllm_advertise_address="10.0.1.5"), "vllm_gateway_address", None),
    ("floating address the host's own", floating(vllm_advertise_address="10.0.0.100"), "vllm_gateway_address", None),
    ("floating address without an interface", floating(vllm_gateway_interface=None), "vllm_gateway_interface", None),
    ("gateway interface with a space", floating(vllm_gateway_interface="eth0 dev lo"), "vllm_gateway_interface", None),
    ("gateway interface a dot", floating(vllm_gateway_interface="."), "vllm_gateway_interface", None),
    ("gateway interface the loopback", floating(vllm_gateway_interface="lo"), "vllm_gateway_interface", None),
    ("gateway front on one address", floating(vllm_bind_host="10.0.0.5"), "vllm_bind_host", None),
    ("VRRP id above 255", floating(vllm_gateway_vrrp_id=256), "vllm_gateway_vrrp_id", None),
    ("VRRP priority of the address owner", floating(vllm_gateway_priority=255), "vllm_gateway_priority", None),
    ("readiness check as root", floating(vllm_gateway_check_user="root"), "vllm_gateway_check_user", None),
    ("readiness check as the router's user", floating(vllm_gateway_check_user="vllm-router"), "vllm_gateway_check_user",
     None),
    ("KV-event offset as text", host(vllm_kv_events_port_offset="20000"), "vllm_kv_events_port_offset", None),
    ("KV-event offset as full-width digits", host(vllm_kv_events_port_offset="２００００"), "vllm_kv_events_port_offset",
     None),
    ("KV-event offset with a line break", host(vllm_kv_events_port_offset="20000\nExecStart=/bin/sh"),
     "vllm_kv_events_port_offset", None),
    ("KV-event offset huge", host(vllm_kv_events_port_offset=10 ** 40), "vllm_kv_events_port_offset", None),
    ("KV-event offset zero", host(vllm_kv_events_port_offset=0), "vllm_kv_events_port_offset", None),
    ("KV-event port past 65535", host(vllm_instances=[inst(port=60000)], vllm_kv_events_port_offset=9000),
     "vllm_kv_events_port_offset", "gemma"),
    ("KV-event port on the engine port", host(vllm_kv_events_port_offset=10000), "vllm_kv_events_port_offset", "gemma"),
    ("KV-event port on the gateway port", host(vllm_gateway=True, vllm_gateway_port=28000,
                                               vllm_kv_events_port_offset=20000), "vllm_gateway_port", None),
    # --- alert receivers: every value ends up in alertmanager.yml, an email's in a mail header
    ("webhook URL with a line break (YAML and header injection)",
     alerting(hook("https://hooks.example.org/a\nreceivers: []")), f"{R}.url", None),
    ("webhook URL with a carriage return", alerting(hook("https://hooks.example.org/a\rX")), f"{R}.url", None),
    ("webhook URL with a NUL", alerting(hook("https://hooks.example.org/a\x00")), f"{R}.url", None),
    ("webhook URL of the file scheme", alerting(hook("file:///etc/shadow")), f"{R}.url", None),
    ("webhook URL of the gopher scheme", alerting(hook("gopher://127.0.0.1:25/xHELO")), f"{R}.url", None),
    ("webhook URL in capitals of another scheme", alerting(hook("FTP://hooks.example.org/a")), f"{R}.url", None),
    ("webhook URL with user:password in the inventory", alerting(hook("https://ops:hunter2@hooks.example.org/a")),
     f"{R}.url", None),
    ("webhook URL with a token in its query string", alerting(hook("https://hooks.example.org/a?token=abc")),
     f"{R}.url", None),
    ("webhook URL with a quote and a YAML flow", alerting(hook("https://hooks.example.org/a\" {x: y}")), f"{R}.url", None),
    ("webhook URL with a space", alerting(hook("https://hooks.example.org/a b")), f"{R}.url", None),
    ("webhook URL with a Cyrillic look-alike host", alerting(hook("https://h\u043eoks.example.org/a")), f"{R}.url", None),
    ("webhook URL with a fullwidth colon", alerting(hook("https\uff1a//hooks.example.org/a")), f"{R}.url", None),
    ("webhook URL with port 99999", alerting(hook("https://hooks.example.org:99999/a")), f"{R}.url", None),
    ("webhook URL of 5000 characters", alerting(hook("https://hooks.example.org/" + "a" * 5000)), f"{R}.url", None),
    ("webhook URL without a host", alerting(hook("https:///alerts")), f"{R}.url", None),
    ("webhook URL as a number", alerting(hook(8080)), f"{R}.url", None),
    ("webhook given as url and url_env", alerting({"ops": {"url": "https://h.example.org/a", "url_env": "OPS_URL"}}),
     R, None),
    ("webhook url_env in lower case (the secret pasted in)", alerting({"ops": {"url_env": "https://h.example.org/t0k3n"}}),
     f"{R}.url_env", None),
    ("webhook token_env with a line break", alerting({"ops": {"url": "https://h.example.org/a", "token_env": "A\nB"}}),
     f"{R}.token_env", None),
    ("receiver both webhook and mailbox", alerting({"ops": {"url": "https://h.example.org/a", "to": "a@example.org"}}),
     R, None),
    ("receiver of neither kind", alerting({"ops": {}}), R, None),
    ("receiver key misspelt", alerting({"ops": {"url": "https://h.example.org/a", "tokn_env": "X"}}), f"{R}.tokn_env",
     None),
    ("receiver name with a slash", alerting({"../ops": {"url": "https://h.example.org/a"}}), "vllm_alert_receivers", None),
    ("receiver name vllm-fleet's own, in capitals", alerting({"VLLM-FLEET-NONE": {"url": "https://h.example.org/a"}}),
     "vllm_alert_receivers.VLLM-FLEET-NONE", None),
    ("receiver names differing in case", alerting({"ops": {"url": "https://h.example.org/a"},
                                                   "OPS": {"url": "https://h.example.org/b"}}),
     "vllm_alert_receivers.OPS", None),
    ("receivers as a list", alerting(["https://h.example.org/a"]), "vllm_alert_receivers", None),
    ("40 receivers", alerting({f"r{i}": {"url": "https://h.example.org/a"} for i in range(40)}),
     "vllm_alert_receivers", None),
    ("mail to two addresses with a comma (header injection)", alerting(mail(to="a@example.org,b@example.org")),
     f"{M}.to", None),
    ("mail to with CR LF and a Bcc header", alerting(mail(to="a@example.org\r\nBcc: x@evil.example")), f"{M}.to", None),
    ("mail from with a display name", alerting(mail(**{"from": "Alerts <alerts@example.org>"})), f"{M}.from", None),
    ("mail to with a Cyrillic look-alike", alerting(mail(to="\u043encall@example.org")), f"{M}.to", None),
    ("mail to without a domain", alerting(mail(to="oncall")), f"{M}.to", None),
    ("mail without from", alerting({"oncall": {"to": "a@example.org", "smarthost": "m.example.org:25"}}),
     f"{M}.from", None),
    ("smarthost without a port", alerting(mail(smarthost="mail.example.org")), f"{M}.smarthost", None),
    ("smarthost with a space", alerting(mail(smarthost="mail.example.org :587")), f"{M}.smarthost", None),
    ("smarthost port 0", alerting(mail(smarthost="mail.example.org:0")), f"{M}.smarthost", None),
    ("smarthost port 70000", alerting(mail(smarthost="mail.example.org:70000")), f"{M}.smarthost", None),
    ("smarthost with a fullwidth digit", alerting(mail(smarthost="mail.example.org:58\uff17")), f"{M}.smarthost", None),
    ("smarthost login without its password", alerting(mail(auth_username="alerts")), M, None),
    ("smarthost login name with a line break", alerting(mail(auth_username="a\nb", password_env="SMTP_PASSWORD")),
     f"{M}.auth_username", None),
    ("require_tls as text", alerting(mail(require_tls="no")), f"{M}.require_tls", None),
    ("alert group wait of a year", alerting(vllm_alert_group_wait_s=31_536_000), "vllm_alert_group_wait_s", None),
    ("alert group interval of 0", alerting(vllm_alert_group_interval_s=0), "vllm_alert_group_interval_s", None),
    ("alert repeat interval huge", alerting(vllm_alert_repeat_interval_s=10**30), "vllm_alert_repeat_interval_s", None),
    ("alert repeat interval as text", alerting(vllm_alert_repeat_interval_s="4h"), "vllm_alert_repeat_interval_s", None),
    ("metrics port whose Alertmanager port is above 65535", alerting(vllm_metrics_port=65531), "vllm_metrics_port",
     None),
]
