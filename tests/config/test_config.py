"""Config validation: every bad input names host, instance and key, and says the fix."""

from __future__ import annotations


import pytest

from support.planning_fixtures import host_data, instance, parse_errors
from vllm_fleet.config import (HOST_DEFAULTS, INSTANCE_DECLARED, INSTANCE_FLAGS, INSTANCE_KEYS, REQUIRED_INSTANCE_KEYS,
                               Checker, HostKnob, InstanceConfig, parse_host)
from vllm_fleet.config.settings import KNOBS, Settings


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
    (host_data(instances=[instance(dtype="bf16")]), "dtype", "is not one of auto, bfloat16, float16"),
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
    errs = parse_errors(data)
    match = [e for e in errs if e.key == key]
    assert match, [e.located() for e in errs]
    assert words in match[0].located()
    assert match[0].host == "box"
    assert match[0].fix


def test_instance_errors_name_the_instance():
    errs = parse_errors(host_data(instances=[instance(name="gemma", port=-1)]))
    assert errs[0].instance == "gemma"
    assert errs[0].located().startswith("host box, instance gemma, key port:")


def test_all_errors_are_reported_together():
    errs = parse_errors(host_data(placment="x", instances=[instance(port="x", dtype="bf17")]))
    assert {e.key for e in errs} >= {"placment", "port", "dtype"}


def test_pyinfra_keys_pass_through():
    host = parse_host("box", host_data(ssh_user="deploy", ssh_port=2222, _sudo=True, sandbox_gpus=[]))
    assert host.instances[0].name == "gemma"


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
    from vllm_fleet.render import instance_paths
    from vllm_fleet.host_layout import FRONT_UNIT

    host = parse_host("box", host_data())
    inst = host.instances[0]
    assert inst.unit_name == instance_unit(inst.name) == "vllm-gemma.service"
    assert instance_paths(host, inst.name)["unit"].endswith("/" + inst.unit_name)
    assert instance_of_unit(inst.unit_name) == inst.name
    assert instance_of_unit("nginx.service") is None and instance_of_unit("vllm-.service") is None
    assert instance_of_unit(FRONT_UNIT) == "fleet-front"  # vllm-fleet's own units are told apart by name first


# --- The instance schema: declared once, as the knobs are (InstanceConfig's knob() fields) ----------

@pytest.mark.parametrize("key", INSTANCE_KEYS)
def test_each_instance_key_has_a_one_line_doc_and_a_default_it_reads_back(key):
    declared = INSTANCE_DECLARED[key]
    assert declared.doc.strip() and "\n" not in declared.doc
    if declared.required:
        assert key in REQUIRED_INSTANCE_KEYS and declared.rule.get("fix")
        return
    written = declared.written
    if isinstance(written, HostKnob):
        assert written.knob in KNOBS and written.value == HOST_DEFAULTS[written.knob]
        written = written.value
    if key != "model_info":  # left out: the catalog's shape; given as None: refused
        check = Checker("box")
        assert declared.read(check, written, "gemma", Settings.from_data({})) == declared.default
        assert not check.errors, [e.located() for e in check.errors]


def test_the_flags_an_instance_key_sets_are_refused_in_engine_args_naming_the_key():
    assert INSTANCE_FLAGS["max-model-len"] == "max_model_len" and INSTANCE_FLAGS["dtype"] == "dtype"
    for flag, key in INSTANCE_FLAGS.items():
        errs = parse_errors(host_data(instances=[instance(engine_args={flag: 1})]))
        assert [(e.key, e.message, e.fix) for e in errs] == [
            (f"engine_args.{flag}", f"'{flag}' has its own instance key", f"set {key} on the instance instead")]


def test_an_instance_without_gpu_memory_utilization_takes_the_hosts_knob():
    host = parse_host("box", host_data(vllm_gpu_memory_utilization=0.8,
                                       instances=[instance(), instance(name="b", port=8001, gpu_memory_utilization=0.5)]))
    assert [i.gpu_memory_utilization for i in host.instances] == [0.8, 0.5]
    assert parse_host("box", host_data()).instances[0].gpu_memory_utilization == HOST_DEFAULTS[
        "vllm_gpu_memory_utilization"] == InstanceConfig.__dataclass_fields__["gpu_memory_utilization"].default


def test_a_bad_host_utilization_is_reported_once_on_the_host_knob():
    errs = parse_errors(host_data(vllm_gpu_memory_utilization=2))
    assert [(e.instance, e.key) for e in errs] == [(None, "vllm_gpu_memory_utilization")]


# --- Rules between an instance's keys, and between an instance and its host ------------------------

def test_a_multi_node_instances_pipeline_size_is_its_number_of_nodes():
    errs = parse_errors(host_data(instances=[instance(nodes=["box", "gpu-b"], pipeline_parallel_size=3)]))
    assert [(e.instance, e.key, e.message, e.fix) for e in errs] == [(
        "gemma", "pipeline_parallel_size",
        "pipeline_parallel_size 3 but a multi-node instance has pipeline_parallel_size = the number of nodes = 2",
        "drop pipeline_parallel_size (the nodes decide it), or change 'nodes'/'gpus'")]
    assert parse_host("box", host_data(instances=[instance(nodes=["box", "gpu-b"], pipeline_parallel_size=2)]))


@pytest.mark.parametrize("changes, key, message", [
    ({"tensor_parallel_size": 2}, "tensor_parallel_size", "a CPU host (vllm_target 'cpu') serves each instance in one process"),
    ({"gpus": [0]}, "gpus", "a CPU host (vllm_target 'cpu') serves each instance in one process"),
    ({"nodes": ["box", "gpu-b"]}, "nodes", "a multi-node instance runs on GPU servers only"),
])
def test_a_cpu_host_refuses_what_needs_gpus_when_its_data_is_read(changes, key, message):
    errs = parse_errors(host_data(gpus=None, instances=[instance(**changes)], vllm_target="cpu"))
    assert [(e.instance, e.key, e.message) for e in errs] == [("gemma", key, message)]
    assert "vllm_target = 'cuda'" in errs[0].fix
    assert parse_host("box", host_data(gpus=None, instances=[instance(data_parallel_size=1)], vllm_target="cpu"))


@pytest.mark.parametrize("data, key, words", [
    ({"vllm_config_dir": "/var/lib/vllm-fleet/config"}, "vllm_config_dir", "is <vllm_state_dir>/config"),
    ({"vllm_config_dir": "/var/lib/vllm-fleet"}, "vllm_config_dir", "is vllm_state_dir"),
    ({"vllm_root": "/var/lib/vllm-fleet/opt"}, "vllm_root", "is inside vllm_state_dir"),
    ({"vllm_config_dir": "/srv/cache/etc", "vllm_cache_root": "/srv/cache"}, "vllm_config_dir",
     "is inside vllm_cache_root"),
    ({"vllm_hf_home": "/opt/vllm-fleet/hf"}, "vllm_hf_home", "is inside vllm_root"),
])
def test_roots_directories_and_the_service_users_are_never_one_inside_the_other(data, key, words):
    """Root runs python from vllm_root and reads vllm_config_dir: inside a directory the service user
    owns, that user could rename them and put its own in their place."""
    errors = parse_errors(host_data(**data))
    assert [(e.key, e.instance) for e in errors] == [(key, None)], errors
    assert words in errors[0].message and errors[0].fix
