"""Three servers teams run beside plain chat models, as a user writes them. `vllm-fleet plan
inventory/workloads.py` plans them with no GPU and no SSH.

- gpu-mixed-02: the seeds' mixed server (one RTX 4090 D, two A100-40GB) serving Gemma-3-12B in bf16
  at its full 128k context. Placement "auto" weighs leaving a GPU out, one instance over all three
  and one per GPU model; the plan names the layout chosen, the runner-up and the numbers of both.
- gpu-h100-02: 8x H100 serving Llama-3.1-70B with the team's fine-tune, a LoRA adapter from the hub
  (its rank given: the plan sizes vLLM's LoRA buffers from it, before anything is downloaded).
- gpu-l40s-01: 2x L40S serving a 7B chat model and, on the same first GPU, an embedding model
  (BAAI/bge-m3: a pooling model, no KV cache), each with its own share of the GPU.
"""

_A100_40G = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0}
_RTX_4090D = {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9}
_H100_80G = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": 9.0}
_L40S = {"name": "NVIDIA L40S", "memory_mib": 46068, "compute_capability": 8.9}

# BAAI/bge-m3's config.json, the keys the planner reads (`vllm-fleet model-info BAAI/bge-m3` prints
# it), and its weights' size: not in the built-in catalog.
_BGE_M3 = {"architectures": ["XLMRobertaModel"], "hidden_size": 1024, "intermediate_size": 4096,
           "num_attention_heads": 16, "num_hidden_layers": 24, "vocab_size": 250002,
           "max_position_embeddings": 8194, "model_type": "xlm-roberta", "torch_dtype": "float32",
           "weights_gib": 2.11}

mixed_box = [
    ("gpu-mixed-02", {
        "ssh_hostname": "10.0.1.11",
        "gpus": [_RTX_4090D, _A100_40G, _A100_40G],
        "vllm_instances": [{
            "name": "gemma",
            "model": "google/gemma-3-12b-it",
            "served_model_name": "gemma-3-12b",
            "port": 8000,
            "max_model_len": 131072,
            "engine_args": {"language-model-only": True},
        }],
    }),
]

h100_with_fine_tune = [
    ("gpu-h100-02", {
        "ssh_hostname": "10.0.1.31",
        "gpus": [_H100_80G] * 8,
        "vllm_instances": [{
            "name": "llama70b",
            "model": "meta-llama/Llama-3.1-70B-Instruct",
            "served_model_name": "llama-3.1-70b",
            "port": 8000,
            "max_model_len": 32768,
            "adapters": [{"name": "support-bot", "model": "acme/llama-3.1-70b-support-lora", "rank": 16}],
        }],
    }),
]

l40s_chat_and_embeddings = [
    ("gpu-l40s-01", {
        "ssh_hostname": "10.0.1.41",
        "gpus": [_L40S, _L40S],
        "vllm_instances": [
            {
                "name": "chat",
                "model": "Qwen/Qwen2.5-7B-Instruct",
                "served_model_name": "qwen2.5-7b",
                "port": 8000,
                "gpus": [0],
                "gpu_memory_utilization": 0.6,
                "max_model_len": 32768,
            },
            {
                "name": "bge",
                "model": "BAAI/bge-m3",
                "model_info": _BGE_M3,
                "served_model_name": "bge-m3",
                "port": 8001,
                "gpus": [0],
                "gpu_memory_utilization": 0.3,
            },
        ],
    }),
]
