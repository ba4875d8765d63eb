"""Two or more instances on one GPU: their gpu_memory_utilization fractions fit on it as vLLM checks
each start (plan/shared_gpus.py), each planned with its own fraction; a sum that does not fit is
refused naming the instances, the GPU, the fractions and the sum; the later instance starts after the
earlier one, and each checks the GPU's free memory first (its unit's ExecStartPre)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.pooling_models import BGE_M3, H200, QWEN3_0_6B
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.plan import plan_host
from vllm_fleet.catalog import MIB
from vllm_fleet.plan.shared_gpus import CONTEXT_HEADROOM_MIB, max_shared_fraction
from vllm_fleet.render import render_host
from vllm_fleet.sandbox import nvidia_smi as simulated

BGE = {"name": "bge", "model": "BAAI/bge-m3", "served_model_name": "bge-m3", "port": 8000, "model_info": BGE_M3,
       "gpus": [0], "gpu_memory_utilization": 0.3}
CHAT = {"name": "chat", "model": "Qwen/Qwen3-0.6B", "served_model_name": "qwen3", "port": 8001,
        "model_info": dict(QWEN3_0_6B, weights_gib=1.4), "gpus": [0], "gpu_memory_utilization": 0.6}


def host(*instances, gpus=(H200,)):
    return parse_host("gpu-1", {"gpus": list(gpus), "vllm_instances": list(instances)})


def errors_of(config) -> list:
    with pytest.raises(ConfigErrors) as err:
        plan_host(config)
    return err.value.errors


def h200_cuda_total_mib() -> float:
    """CUDA's total on the recorded H200: NVML's 150754820096 bytes less the driver's 644939776."""
    return 150109880320 / MIB


def test_the_limit_leaves_each_instance_its_cuda_context_beside_the_budgets():
    """vLLM's budget is what it measures after its context is up: N engines hold N contexts."""
    [gpu] = host(BGE).gpus
    assert max_shared_fraction(gpu, 2) == pytest.approx(1 - 2 * CONTEXT_HEADROOM_MIB / h200_cuda_total_mib())
    assert 0.985 < max_shared_fraction(gpu, 2) < 0.986
    assert max_shared_fraction(gpu, 3) < max_shared_fraction(gpu, 2)


def test_two_instances_share_a_gpu_each_with_its_own_fraction():
    plans = {p.name: p for p in plan_host(host(BGE, CHAT)).instances}
    budgets = {name: p.layout.per_gpu[0].budget_gib for name, p in plans.items()}
    assert budgets["chat"] == pytest.approx(2 * budgets["bge"])  # 0.6 and 0.3 of the same GPU
    assert plans["chat"].cuda_visible_devices == plans["bge"].cuda_visible_devices == "0"
    assert plans["chat"].max_concurrency and plans["bge"].max_concurrency is None  # the chat's KV, sized to 0.6
    assert plans["bge"].start_after == () and plans["chat"].start_after == ("bge",)
    assert plans["chat"].gpu_free_checks == {0: math.ceil(h200_cuda_total_mib() * 0.6) + CONTEXT_HEADROOM_MIB}
    assert any("shared with bge (0.3)" in r and "once bge" in r for r in plans["chat"].reasons)


def test_a_sum_that_does_not_fit_is_refused_naming_both_the_gpu_the_fractions_and_the_sum():
    [error] = errors_of(host(BGE, dict(CHAT, gpu_memory_utilization=0.7)))
    assert (error.host, error.instance, error.key) == ("gpu-1", "chat", "gpus")
    assert "GPU 0" in error.message and "bge, chat" in error.message
    assert "bge 0.3 + chat 0.7 = 1" in error.message and "0.9857" in error.message
    assert "0.68 on chat" in error.fix


def test_the_default_fractions_never_share():
    [error] = errors_of(host(dict(BGE, gpu_memory_utilization=0.9), dict(CHAT, gpu_memory_utilization=0.9)))
    assert "= 1.8" in error.message


def test_just_under_the_limit_fits_and_just_over_does_not():
    limit = max_shared_fraction(host(BGE).gpus[0], 2)
    plan_host(host(dict(BGE, gpu_memory_utilization=0.5), dict(CHAT, gpu_memory_utilization=round(limit - 0.5, 4) - 0.0001)))
    errors_of(host(dict(BGE, gpu_memory_utilization=0.5), dict(CHAT, gpu_memory_utilization=round(limit - 0.5, 4) + 0.0002)))


def test_three_instances_on_one_gpu_start_in_their_order():
    third = dict(CHAT, name="third", served_model_name="third", port=8002, gpu_memory_utilization=0.05, max_model_len=4096)
    plans = {p.name: p for p in plan_host(host(BGE, dict(CHAT, gpu_memory_utilization=0.5), third)).instances}
    assert plans["third"].start_after == ("bge", "chat")
    [error] = errors_of(host(BGE, CHAT, dict(third, gpu_memory_utilization=0.1)))
    assert error.instance == "third" and "bge 0.3 + chat 0.6 + third 0.1 = 1" in error.message
    # 0.98 leaves 2.0 % of the H200 (2863 MiB): room for two contexts, not for the three the engines hold.
    [error] = errors_of(host(BGE, dict(CHAT, gpu_memory_utilization=0.3), dict(third, gpu_memory_utilization=0.38)))
    assert "= 0.98, above the 0.9785" in error.message


def test_auto_never_takes_a_listed_gpu():
    auto = dict(CHAT, gpus="auto", gpu_memory_utilization=0.05, max_model_len=4096)
    [error] = errors_of(host(BGE, auto))  # the one GPU is BGE's: auto gets none
    assert error.key == "gpus" and "no free GPU" in error.message
    plans = {p.name: p for p in plan_host(host(BGE, auto, gpus=(H200, H200))).instances}
    assert plans["chat"].cuda_visible_devices == "1" and plans["chat"].start_after == ()


def test_a_gpu_listed_twice_by_one_instance_is_still_refused():
    [error] = errors_of_config(dict(BGE, gpus=[0, 0]))
    assert error.key == "gpus" and "twice" in error.message


def errors_of_config(*instances) -> list:
    with pytest.raises(ConfigErrors) as err:
        host(*instances)
    return err.value.errors


# --- the unit: ordered after the earlier instance, its free memory checked before it starts -------------

def unit_of(config, name: str) -> str:
    return next(f.content for f in render_host(config, plan_host(config)) if f.path.endswith(f"vllm-{name}.service"))


def test_the_later_units_start_after_the_earlier_and_each_checks_its_gpus_first():
    config = host(BGE, CHAT)
    bge, chat = unit_of(config, "bge"), unit_of(config, "chat")
    assert "After=vllm-bge.service" in chat and "After=vllm-" not in bge.replace("After=network-online.target", "")
    assert re.search(r"^ExecStartPre=/usr/bin/python3 -I -c \".*\" 0:\d+$", chat, re.M)
    alone = host(dict(BGE, gpu_memory_utilization=0.9))
    assert "ExecStartPre=" not in unit_of(alone, "bge")  # a GPU of its own: vLLM's own check is enough


def run_check(unit: str, smi_output: str, tmp_path) -> subprocess.CompletedProcess:
    """The unit's ExecStartPre as systemd runs it (its "\\n" unquoted), with an nvidia-smi that prints
    `smi_output` first on PATH."""
    line = next(line for line in unit.splitlines() if line.startswith("ExecStartPre="))
    script, args = re.fullmatch(r'ExecStartPre=/usr/bin/python3 -I -c "(.*)" (.*)', line).groups()
    fake = tmp_path / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nprintf '{smi_output}'\n")
    fake.chmod(0o755)
    env = dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-I", "-c", script.replace("\\n", "\n"), *args.split()],
                          capture_output=True, text=True, env=env, timeout=60)


def test_the_check_lets_a_start_through_with_enough_free_and_stops_it_with_too_little(tmp_path):
    chat = unit_of(host(BGE, CHAT), "chat")
    needed = int(re.search(r" 0:(\d+)$", chat, re.M).group(1))
    assert run_check(chat, f"0, {needed}\\n1, 10\\n", tmp_path).returncode == 0
    refused = run_check(chat, f"0, {needed - 1}\\n", tmp_path)
    assert refused.returncode != 0
    assert f"GPU 0 has {needed - 1} MiB free, and this instance needs {needed} MiB" in refused.stderr
    assert "no memory.free for GPU 0" in run_check(chat, "1, 99999\\n", tmp_path).stderr


def test_the_check_against_the_sandbox_s_simulated_nvidia_smi(tmp_path):
    """The check reads what the sandbox's simulated nvidia-smi answers: a GPU another process (a
    simulated one) holds memory on stops the start; all free lets it through."""
    chat = unit_of(host(BGE, CHAT), "chat")
    line = next(line for line in chat.splitlines() if line.startswith("ExecStartPre="))
    script, args = re.fullmatch(r'ExecStartPre=/usr/bin/python3 -I -c "(.*)" (.*)', line).groups()
    needed = int(args.split(":")[1])
    wrapper = tmp_path / "bin" / "nvidia-smi"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(simulated.__file__)} \"$@\"\n")
    wrapper.chmod(0o755)
    layout = tmp_path / "gpus.json"

    def start_with(used: int) -> subprocess.CompletedProcess:
        layout.write_text(json.dumps([{"name": "NVIDIA H200", "memory_mib": H200["memory_mib"],
                                       "compute_capability": "9.0", "memory_used_mib": used}]))
        env = dict(os.environ, PATH=f"{wrapper.parent}:{os.environ['PATH']}", VLLM_FLEET_SIM_GPUS=str(layout))
        return subprocess.run([sys.executable, "-I", "-c", script.replace("\\n", "\n"), *args.split()],
                              capture_output=True, text=True, env=env, timeout=60)

    assert start_with(0).returncode == 0
    held = H200["memory_mib"] - needed + 1  # one MiB short
    refused = start_with(held)
    assert refused.returncode != 0 and f"has {needed - 1} MiB free" in refused.stderr
