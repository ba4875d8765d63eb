"""inventory/workloads.py: the three servers of the workloads teams run, written as a user writes
them and planned offline by `vllm-fleet plan`, as a user runs it: the seed's mixed box weighed by
what each GPU adds, an 8x H100 box serving a 70B model with its fine-tune (a LoRA adapter), and a
2x L40S box serving a chat model and an embedding model on one GPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.planning_fixtures import REPO, run_cli

INVENTORY = REPO / "inventory" / "workloads.py"


def plan_json(inventory: Path) -> dict:
    done = run_cli("plan", str(inventory), "--json")
    assert done.returncode == 0, done.stderr
    return {inst["name"]: dict(inst, host=host["name"], host_gpus=host["gpus"])
            for host in json.loads(done.stdout)["hosts"] for inst in host["instances"]}


@pytest.fixture(scope="module")
def planned() -> dict:
    return plan_json(INVENTORY)


def test_the_mixed_box_shows_the_layout_chosen_the_runner_up_and_the_numbers_of_both(planned):
    gemma = planned["gemma"]
    choice = gemma["placement_choice"]
    chosen, runner_up = choice["chosen"], choice["runner_up"]
    assert chosen["gpus"] == [1, 2] and chosen["left_free"] == [0]  # the A100 pair; the 4090 D left free
    assert runner_up["gpus"] == [0, 1, 2] and runner_up["pipeline_stages"] == 3
    assert chosen["max_concurrency"] == gemma["max_concurrency"]
    assert chosen["full_length_requests"] >= runner_up["full_length_requests"]
    assert runner_up["lost_on"]
    text = run_cli("plan", str(INVENTORY), "--limit", "gpu-mixed-02").stdout
    for numbers in (chosen, runner_up):
        assert f"max concurrency {numbers['max_concurrency']:.2f} at 131,072 tokens" in text
    assert "runner-up:" in text and "left free" in text


def test_the_fine_tune_is_served_beside_its_base_and_its_buffers_cost_kv_cache(planned, tmp_path):
    llama = planned["llama70b"]
    assert llama["adapters"] == ["support-bot"]
    summary = run_cli("plan", str(INVENTORY), "--limit", "gpu-h100-02").stdout
    assert "serves llama-3.1-70b and its adapters support-bot at" in summary
    args = llama["engine_args"]
    assert args["enable-lora"] is True and args["max-lora-rank"] == 16 and args["max-loras"] >= 1
    # The same server without the adapter: vLLM's LoRA buffers come out of what the KV cache gets.
    text = INVENTORY.read_text()
    adapter_line = next(line for line in text.splitlines() if '"adapters":' in line)
    bare = tmp_path / "workloads.py"
    bare.write_text(text.replace(adapter_line + "\n", ""))
    without = plan_json(bare)["llama70b"]
    assert "enable-lora" not in without["engine_args"] and without["adapters"] == []
    assert llama["kv_cache_blocks"] < without["kv_cache_blocks"]


def test_the_embedding_model_shares_the_chat_models_gpu_with_no_kv_cache(planned):
    chat, bge = planned["chat"], planned["bge"]
    assert bge["runner"] == "pooling" and chat["runner"] == "generate"
    assert bge["kv_cache_tokens"] is None and bge["max_concurrency"] is None
    assert chat["cuda_visible_devices"] == bge["cuda_visible_devices"] == "0"
    [chat_gpu], [bge_gpu] = chat["per_gpu"], bge["per_gpu"]
    assert chat_gpu["budget_gib"] == pytest.approx(2 * bge_gpu["budget_gib"], abs=0.02)  # 0.6 and 0.3 of one GPU
    assert any("shared with bge" in reason for reason in chat["reasons"])
