"""Fleet configuration of the multi-node sandbox (inventory/multinode.py): one instance across
both hosts, on Ray. Both hosts read this file; the instance's head is the first of `nodes`, and
sbx-node2 only runs a Ray worker for it (config.NodeGroup)."""

import os

from vllm_fleet.sandbox import assets as _assets

__all__ = ["vllm_extra_packages", "vllm_wheelhouse", "vllm_instances", "vllm_api_key_env", "vllm_private_interface", "vllm_verify_timeout_s"]

# Its own wheelhouse, with Ray (`vllm-fleet sandbox up inventory/multinode.py` builds it);
# VLLM_FLEET_RAY_WHEELHOUSE, when set, names another one.
vllm_wheelhouse = (os.environ.get("VLLM_FLEET_RAY_WHEELHOUSE")
                   or str(_assets.wheelhouse_dir("cpu", _assets.RAY_WHEELHOUSE_EXTRAS)))
vllm_api_key_env = "VLLM_FLEET_API_KEY"
# VLLM_FLEET_ENGINE=standin (the tests of the tool's own mechanics): the hosts install the SIMULATED
# stand-in engine from the wheelhouse VLLM_FLEET_RAY_WHEELHOUSE names, labelled by this package.
vllm_extra_packages = _assets.engine_packages(os.environ)
# The nodes' network: in the sandbox, each host's only interface (its own bridge, no route out).
vllm_private_interface = "eth0"

vllm_instances = [{
    "name": "tiny-2node",
    "nodes": ["sbx-node1", "sbx-node2"],  # the head first: TP = 2 GPUs of each node, PP = 2 nodes
    "model": "/var/lib/vllm-fleet/models/tiny-llama",
    "model_source": str(_assets.tiny_model_dir()),
    "served_model_name": "tiny-llama",
    "port": 8000,
    "max_model_len": 1024,
    "dtype": "float32",
    "engine_args": {"enforce-eager": True},
    "model_info": {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 32, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 1024,
                   "weights_gib": 0.003, "dtype": "float32", "max_position_embeddings": 2048},
}]
vllm_verify_timeout_s = 20  # bounds the head's wait for the Ray worker (and vLLM's start, which fails fast here)
