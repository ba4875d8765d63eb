"""The two hosts whose every text field the input boundary's property tries (test_boundary_properties)
and the real tools' tests render as they are: a host with three GPUs of two models, its instance
with env and engine_args of every kind of flag, and a CPU host that is the fleet's gateway."""

from __future__ import annotations

import copy

from support.planning_fixtures import A100_40G, RTX_4090D, TINY_MODEL_INFO, host_data, instance

GPU_HOST, CPU_HOST = "gpu-box", "cpu-gw"
ENGINE_ARGS = {
    "uvicorn-log-level": "info",  # a flag that takes one value
    "enforce-eager": True,  # a flag that takes none
    "allowed-media-domains": ["upload.example.org"],  # a flag that takes several
    "override-generation-config": {"temperature": "0.7"},  # a JSON argument
    "max-log-len": "100",  # renamed by the flag-name field
}
ENV = {"VLLM_LOGGING_LEVEL": "INFO", "OMP_NUM_THREADS": "4"}
# Every GPU string declared, so each GPU field has a benign value; the capability is declared so that
# a GPU's name (the planner looks capabilities up by name) changes no dtype.
GPU_DETAILS = [{"compute_capability": "8.9", "pci_bus_id": "00000000:01:00.0"},
               {"compute_capability": "8.0", "pci_bus_id": "00000000:41:00.0"},
               {"compute_capability": "8.0", "pci_bus_id": "00000000:81:00.0"}]


def base_data(kind: str) -> dict:
    """The data of host GPU_HOST or CPU_HOST, before any field is changed."""
    if kind == GPU_HOST:  # three GPUs of two models: split into two instances
        gpus = [dict(gpu, **details, driver_version="580.126.09", mig_mode="Disabled")
                for gpu, details in zip([RTX_4090D, A100_40G, A100_40G], GPU_DETAILS, strict=True)]
        return host_data(gpus=gpus, instances=[instance(env=dict(ENV), engine_args=copy.deepcopy(ENGINE_ARGS))])
    # A CPU host that is the fleet's gateway: the front's gateway block and the gateway's files too.
    # Its interface named, so that a floating address (vllm_gateway_address) is all it takes to add keepalived.
    return {"vllm_target": "cpu", "vllm_gateway": True, "ssh_hostname": "10.0.0.5", "vllm_gateway_interface": "eth0",
            "vllm_instances": [{
                "name": "tiny", "model": "/var/lib/vllm-fleet/models/tiny", "served_model_name": "tiny-llama",
                "tokenizer": "hf-internal-testing/llama-tokenizer", "port": 8000, "max_model_len": 1024,
                "model_info": dict(TINY_MODEL_INFO), "env": dict(ENV), "engine_args": copy.deepcopy(ENGINE_ARGS)}]}
