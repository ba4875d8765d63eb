"""The config.json of pooling models and of a small decoder, as instances' model_info declares them
(the keys the planner reads, with the weights' size), for the tests of the runner and of pooling plans."""

H200 = {"name": "NVIDIA H200", "memory_mib": 143771}
#: BAAI/bge-m3's config.json (the keys the planner reads), an encoder-only embedding model.
BGE_M3 = {"architectures": ["XLMRobertaModel"], "hidden_size": 1024, "intermediate_size": 4096,
          "num_attention_heads": 16, "num_hidden_layers": 24, "vocab_size": 250002,
          "max_position_embeddings": 8194, "model_type": "xlm-roberta", "torch_dtype": "float32",
          "weights_gib": 2.11}
QWEN3_0_6B = {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 28,
              "vocab_size": 151669, "max_position_embeddings": 32768, "torch_dtype": "bfloat16",
              "tie_word_embeddings": True}
RERANKER = dict(BGE_M3, architectures=["XLMRobertaForSequenceClassification"])
