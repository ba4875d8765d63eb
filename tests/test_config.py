"""Config validation: every bad input names host, instance and key, and says the fix."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from planning_fixtures import host_data, instance
from vllm_fleet.config import HOST_DEFAULTS, ConfigErrors, parse_host

ROOT = Path(__file__).resolve().parent.parent


def errors_of(data: dict) -> list:
    with pytest.raises(ConfigErrors) as info:
        parse_host("box", data)
    return info.value.errors


@pytest.mark.parametrize("data, key, words", [
    (host_data(instances=[instance(tensor_paralel_size=2)]), "tensor_paralel_size",
     "did you mean 'tensor_parallel_size'"),
    (host_data(placment="auto"), "placment", "did you mean 'placement'"),
    (host_data(vllm_verison="0.33.0"), "vllm_verison", "did you mean 'vllm_version'"),
    (host_data(instances=[instance(port="8000")]), "port", "expected int"),
    (host_data(instances=[instance(port=80)]), "port", "1024-65535"),
    (host_data(instances=[instance(gpu_memory_utilization=1.2)]), "gpu_memory_utilization", "(0, 1]"),
    (host_data(instances=[instance(gpu_memory_utilization=-0.5)]), "gpu_memory_utilization", "(0, 1]"),
    (host_data(instances=[instance(name="../x")]), "name", "letters, digits"),
    (host_data(instances=[instance(name="a;b")]), "name", "letters, digits"),
    (host_data(instances=[instance(served_model_name="my model")]), "served_model_name", "without spaces"),
    (host_data(instances=[instance(tokenizer=None)]), "tokenizer", "GGUF model needs 'tokenizer'"),
    (host_data(instances=[instance(engine_args={"api-key": "sk-x"})]), "engine_args.api-key", "secret"),
    (host_data(instances=[instance(engine_args={"tensor-parallel-size": 2})]),
     "engine_args.tensor-parallel-size", "its own instance key"),
    (host_data(instances=[instance(engine_args={"x; rm -rf /": 1})]), "engine_args.x; rm -rf /",
     "not a vllm serve flag name"),
    (host_data(instances=[instance(env={"HF_TOKEN": "hf_x"})]), "env.HF_TOKEN", "looks like a secret"),
    (host_data(instances=[instance(env={"TRANSFORMERS_CACHE": "/x"})]), "env.TRANSFORMERS_CACHE", "HF_HOME"),
    (host_data(instances=[instance(dtype="bf16")]), "dtype", "not one vLLM accepts"),
    (host_data(instances=[instance(gpus=[1, 1])]), "gpus", "twice"),
    (host_data(instances=[instance(tensor_parallel_size=0)]), "tensor_parallel_size", "at least 1"),
    (host_data(instances=[instance(tensor_parallel_size=True)]), "tensor_parallel_size", "expected int"),
    (host_data(gpus=[{"name": "A100", "memory_mib": "40G"}]), "gpus[0].memory_mib", "positive integer"),
    (host_data(vllm_service_user="root"), "vllm_service_user", "non-root"),
    (host_data(vllm_root="opt/vllm"), "vllm_root", "absolute path"),
    (host_data(instances=[instance(name="a"), instance(name="a", port=8001)]), "name", "already used"),
    (host_data(instances=[instance(model_info={"num_hidden_layers": 2})]), "model_info", "missing"),
    (host_data(vllm_index_url="pypi.org/simple"), "vllm_index_url", "not an index URL"),
    (host_data(vllm_index_url="https://x/simple; rm -rf /"), "vllm_index_url", "not an index URL"),
    (host_data(vllm_extra_index_urls="https://download.pytorch.org/whl/cpu"), "vllm_extra_index_urls",
     "list of index URLs"),
    (host_data(vllm_extra_index_urls=["ftp://x/simple"]), "vllm_extra_index_urls", "'ftp://x/simple' is not an index URL"),
    (host_data(vllm_env_manager="cnda"), "vllm_env_manager", "did you mean 'conda'"),
    (host_data(vllm_env_manager="pip"), "vllm_env_manager", "not one of uv, conda"),
    (host_data(vllm_conda_exe="conda"), "vllm_conda_exe", "absolute path"),
    (host_data(vllm_conda_exe="/opt/my conda/bin/conda"), "vllm_conda_exe", "absolute path"),
    (host_data(vllm_miniforge_installer="ftp://x/Miniforge3.sh"), "vllm_miniforge_installer",
     "http(s) URL or a path"),
    (host_data(vllm_miniforge_installer=""), "vllm_miniforge_installer", "http(s) URL or a path"),
    (host_data(vllm_conda_exe_path="/x"), "vllm_conda_exe_path", "did you mean 'vllm_conda_exe'"),
])
def test_bad_input_is_located_and_has_a_fix(data, key, words):
    errs = errors_of(data)
    match = [e for e in errs if e.key == key]
    assert match, [e.located() for e in errs]
    assert words in match[0].located()
    assert match[0].host == "box"
    assert match[0].fix


def test_instance_errors_name_the_instance():
    errs = errors_of(host_data(instances=[instance(name="gemma", port=-1)]))
    assert errs[0].instance == "gemma"
    assert errs[0].located().startswith("host box, instance gemma, key port:")


def test_all_errors_are_reported_together():
    errs = errors_of(host_data(placment="x", instances=[instance(port="x", dtype="bf17")]))
    assert {e.key for e in errs} >= {"placment", "port", "dtype"}


def test_pyinfra_keys_pass_through():
    host = parse_host("box", host_data(ssh_user="deploy", ssh_port=2222, _sudo=True, sandbox_gpus=[]))
    assert host.instances[0].name == "gemma"


def test_group_data_all_documents_every_knob_with_the_same_default():
    tree = ast.parse((ROOT / "group_data" / "all.py").read_text())
    documented = {node.targets[0].id: ast.literal_eval(node.value)
                  for node in tree.body if isinstance(node, ast.Assign)}
    ssh = {k: documented.pop(k) for k in list(documented) if k.startswith("ssh_")}
    assert documented == HOST_DEFAULTS
    assert ssh == {"ssh_strict_host_key_checking": "yes"}  # host keys checked unless said otherwise


def test_environment_source_knobs_accept_good_values():
    host = parse_host("box", host_data(
        vllm_index_url="http://10.213.7.13:8099/simple", vllm_extra_index_urls=["https://download.pytorch.org/whl/cpu"],
        vllm_env_manager="conda", vllm_conda_exe="/opt/conda/bin/conda",
        vllm_miniforge_installer="~/Downloads/Miniforge3-Linux-x86_64.sh"))
    assert host.settings.vllm_env_manager == "conda" and host.settings.vllm_index_url.startswith("http://")
    defaults = parse_host("box", host_data())
    assert (defaults.settings.vllm_index_url, defaults.settings.vllm_extra_index_urls, defaults.settings.vllm_env_manager,
            defaults.settings.vllm_conda_exe, defaults.settings.vllm_miniforge_installer) == (None, [], "uv", None, None)


def test_one_rule_names_an_instances_unit_and_reads_it_back():
    from vllm_fleet.config import instance_of_unit, instance_unit
    from vllm_fleet.render import FRONT_UNIT, instance_paths

    host = parse_host("box", host_data())
    inst = host.instances[0]
    assert inst.unit_name == instance_unit(inst.name) == "vllm-gemma.service"
    assert instance_paths(host, inst.name)["unit"].endswith("/" + inst.unit_name)
    assert instance_of_unit(inst.unit_name) == inst.name
    assert instance_of_unit("nginx.service") is None and instance_of_unit("vllm-.service") is None
    assert instance_of_unit(FRONT_UNIT) == "fleet-front"  # vllm-fleet's own units are told apart by name first
