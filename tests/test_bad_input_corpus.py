"""A corpus of broken inventories through `vllm-fleet plan`: each exits 2 with a message that names
the host, the instance (when there is one) and the key, prints nothing to stdout, and touches no host
(plan never connects). Plus a property-based fuzz of the config loader. Prints the figures."""

from __future__ import annotations

import contextlib
import copy
import io
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planning_fixtures import A100_40G, RTX_4090D, SEED_GEMMA
from vllm_fleet.cli import main as cli_main
from vllm_fleet.config import ConfigErrors, parse_host

GOOD = {"gpus": [RTX_4090D, A100_40G, A100_40G], "vllm_instances": [SEED_GEMMA]}


def inst(**changes):
    out = dict(copy.deepcopy(SEED_GEMMA))
    out.update(changes)
    return out


def host(**changes):
    out = copy.deepcopy(GOOD)
    out.update(changes)
    return out


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
    ("duplicate names", host(vllm_instances=[inst(gpus=[1]), inst(gpus=[2], port=8001)]), "name", "gemma"),
    ("duplicate ports", host(vllm_instances=[inst(name="a", gpus=[1]), inst(name="b", gpus=[2])]), "port", "b"),
    ("duplicate GPUs", host(vllm_instances=[inst(name="a", gpus=[1]), inst(name="b", gpus=[1], port=8001)]), "gpus", "b"),
    ("GPU listed twice", host(vllm_instances=[inst(gpus=[1, 1])]), "gpus", "gemma"),
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
    ("CPU host with TP", host(vllm_target="cpu", gpus=None, vllm_instances=[inst(tensor_parallel_size=2)]),
     "tensor_parallel_size", "gemma"),
    ("bad dtype", host(vllm_instances=[inst(dtype="bf16")]), "dtype", "gemma"),
    ("non-UTF-8-ish path", host(vllm_instances=[inst(model="/data/\udcff/model", tokenizer="/t")]), "model_info", "gemma"),
]


@pytest.fixture(scope="module")
def figures():
    tried = {"count": 0, "ok": 0}
    yield tried
    print(f"\nbad-input corpus: {tried['count']} bad inputs tried through `vllm-fleet plan`, "
          f"{tried['ok']} rejected with exit 2 naming host/instance/key, 0 hosts touched "
          "(plan never connects to a host)")


@pytest.mark.parametrize("label, data, key, instance", CORPUS, ids=[c[0] for c in CORPUS])
def test_bad_input_is_rejected_by_plan(label, data, key, instance, tmp_path, figures):
    figures["count"] += 1
    inventory = tmp_path / "inv.py"
    inventory.write_text(textwrap.dedent(f"""
        box = [("box1", {data!r})]
    """), encoding="utf-8", errors="surrogateescape")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli_main(["plan", str(inventory)])
    assert code == 2, err.getvalue()
    assert out.getvalue() == ""
    message = err.getvalue()
    where = f"host box1, instance {instance}, key {key}" if instance else f"host box1, key {key}"
    assert where in message, message
    assert "fix:" in message and "nothing was changed on any host" in message
    figures["ok"] += 1


def test_corpus_is_large_enough():
    assert len(CORPUS) >= 40


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 100000) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20)
KEYS = ["gpus", "vllm_instances", "placement", "vllm_target", "vllm_root", "vllm_service_user",
        "vllm_gpu_memory_utilization", "vllm_extra_packages", "vllm_typo"]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), JSONISH, max_size=5),
       st.lists(st.dictionaries(st.sampled_from(["name", "model", "port", "gpus", "served_model_name",
                                                 "tensor_parallel_size", "env", "engine_args", "typo"]),
                                JSONISH, max_size=6), max_size=3))
def test_config_loader_fuzz_only_raises_located_errors(data, instances):
    if instances:
        data = dict(data, vllm_instances=instances)
    try:
        parse_host("fuzz", data)
    except ConfigErrors as exc:
        assert exc.errors
        for err in exc.errors:
            assert err.host == "fuzz" and err.key is not None
