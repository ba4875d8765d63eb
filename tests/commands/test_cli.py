"""The `vllm-fleet plan` / `render` commands on real inventory files (no GPU, no SSH)."""

from __future__ import annotations

import json
import textwrap

from support.planning_fixtures import run_cli


def test_plan_prod_json_has_the_contract_shape():
    result = run_cli("plan", "inventory/prod.py", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    names = [h["name"] for h in plan["hosts"]]
    assert names == ["gpu-mixed-01", "gpu-a100-01", "gpu-h100-01"]
    for host in plan["hosts"]:
        assert host["gpus"]
        for inst in host["instances"]:
            for key in ("name", "cuda_visible_devices", "tensor_parallel_size", "pipeline_parallel_size",
                        "data_parallel_size", "pp_layer_partition", "dtype", "kv_cache_tokens",
                        "per_gpu", "env", "warnings", "reasons"):
                assert key in inst
            assert inst["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
            for gpu in inst["per_gpu"]:
                assert set(gpu) >= {"index", "name", "weights_gib", "kv_cache_gib"}


def test_plan_table_and_limit():
    result = run_cli("plan", "inventory/prod.py", "--limit", "gpu-a100-01")
    assert result.returncode == 0, result.stderr
    assert "gpu-a100-01" in result.stdout and "gpu-h100-01" not in result.stdout
    assert "qwen14b" in result.stdout and "reason" in result.stdout


def test_limit_matching_nothing_is_an_error():
    result = run_cli("plan", "inventory/prod.py", "--limit", "nosuch")
    assert result.returncode == 2
    assert "matches no host" in result.stderr and result.stdout == ""


def test_render_writes_every_file_per_host(tmp_path):
    result = run_cli("render", "inventory/prod.py", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    unit = tmp_path / "gpu-h100-01/etc/systemd/system/vllm-llama70b.service"
    assert unit.is_file()
    assert (tmp_path / "gpu-h100-01/etc/vllm-fleet/llama70b.yaml").is_file()
    assert (tmp_path / "gpu-mixed-01/etc/vllm-fleet/manifest.json").is_file()


def test_invalid_inventory_exits_2_and_names_host_instance_key(tmp_path):
    inv = tmp_path / "bad.py"
    inv.write_text(textwrap.dedent("""
        box = [("box1", {
            "gpus": [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}] * 2,
            "vllm_instances": [{"name": "gemma", "model": "google/gemma-3-12b-it",
                                "served_model_name": "g", "port": 8000, "gpus": [0, 1],
                                "tensor_parallel_size": 1, "pipeline_parallel_size": 3}],
        })]
    """))
    result = run_cli("plan", str(inv), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "host box1, instance gemma, key tensor_parallel_size" in result.stderr
    assert "World size (3) is larger than the number of available GPUs (2)" in result.stderr
    assert "nothing was changed" in result.stderr


def test_unknown_key_did_you_mean(tmp_path):
    inv = tmp_path / "typo.py"
    inv.write_text('box = [("box1", {"vllm_target": "cpu", "vllm_instances": [{"name": "a", '
                   '"model": "/m", "served_model_name": "a", "port": 8000, "max_modle_len": 10}]})]\n')
    result = run_cli("plan", str(inv), cwd=tmp_path)
    assert result.returncode == 2
    assert "key max_modle_len" in result.stderr and "did you mean 'max_model_len'" in result.stderr
