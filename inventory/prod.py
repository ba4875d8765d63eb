"""An example production fleet. `vllm-fleet plan inventory/prod.py` plans it with no GPU and no SSH.

Fleet configuration of these hosts is in inventory/group_data/prod.py and per host below.
"""

_A100_40G = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0}
_RTX_4090D = {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9}
_H100_80G = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": 9.0}

# The seeds' mixed server: one RTX 4090 D and two A100-40GB, serving Gemma-3-12B (QAT Q4_0 GGUF).
# With placement "auto" the planner weighs its layouts (docs/models.md) and splits it by GPU model
# (the A100 pair and the 4090 D serve on their own, behind a gateway): the most full-length requests;
# placement "single-instance" gives the seed's plan A (PP=3, uneven).
mixed_box = [
    ("gpu-mixed-01", {
        "ssh_hostname": "10.0.0.11",
        "gpus": [_RTX_4090D, _A100_40G, _A100_40G],
        "vllm_instances": [{
            "name": "gemma",
            "model": "/data/vllm/models/gemma-3-12b-it-qat-q4_0-gguf/gemma-3-12b-it-q4_0.gguf",
            "tokenizer": "google/gemma-3-12b-it",
            "served_model_name": "gemma3-12b-q4",
            "port": 8000,
            "max_model_len": 16384,
            "max_num_seqs": 64,
            "engine_args": {"language-model-only": True},
        }],
    }),
]

a100_pair = [
    ("gpu-a100-01", {
        "ssh_hostname": "10.0.0.21",
        "gpus": [_A100_40G, _A100_40G],
        "vllm_instances": [{
            "name": "qwen14b",
            "model": "Qwen/Qwen2.5-14B-Instruct",
            "served_model_name": "qwen2.5-14b",
            "port": 8000,
            "max_model_len": 32768,
        }],
    }),
]

h100_node = [
    ("gpu-h100-01", {
        "ssh_hostname": "10.0.0.31",
        "gpus": [_H100_80G] * 8,
        "vllm_instances": [
            {
                "name": "llama70b",
                "model": "meta-llama/Meta-Llama-3-70B-Instruct",
                "served_model_name": "llama-3-70b",
                "port": 8000,
                "gpus": [0, 1, 2, 3],
                "tensor_parallel_size": 4,
                "max_model_len": 8192,
            },
            {
                "name": "qwen7b",
                "model": "Qwen/Qwen2.5-7B-Instruct",
                "served_model_name": "qwen2.5-7b",
                "port": 8001,
                "max_model_len": 32768,
            },
        ],
    }),
]
