"""A tiny LoRA adapter for the tiny model, generated locally and deterministically.

The sandbox serves LoRA adapters with the genuine `vllm serve`, so it needs adapters that vLLM loads
and that change what the model says. This module writes a PEFT-style adapter directory
(adapter_config.json and adapter_model.safetensors with PEFT's tensor names) for the tiny model's
attention and MLP projections. Both lora_A and lora_B are non-zero (PEFT's own initialisation leaves
lora_B at zero, which would change nothing), and scaled so that the greedy output differs from the
base model's. The same (seed) always writes the same bytes.

    python -m vllm_fleet.sandbox.tiny_adapter OUT_DIR [--name NAME] [--seed N]

Only numpy and safetensors are needed (no torch on the workstation).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save as save_safetensors

from vllm_fleet.sandbox.tiny_model import SPEC, _json, _sha256, matches_manifest, write_generated

# Bump when the bytes written change, so that existing copies are regenerated.
GENERATOR_VERSION = 1
MANIFEST = ".vllm-fleet-tiny-adapter.json"

RANK = 8
ALPHA = 16
# PEFT module name -> (out features, in features) in the tiny model.
_Q_DIM = SPEC["num_attention_heads"] * SPEC["head_dim"]
_KV_DIM = SPEC["num_key_value_heads"] * SPEC["head_dim"]
TARGETS = {
    "self_attn.q_proj": (_Q_DIM, SPEC["hidden_size"]),
    "self_attn.v_proj": (_KV_DIM, SPEC["hidden_size"]),
    "self_attn.o_proj": (SPEC["hidden_size"], _Q_DIM),
    "mlp.down_proj": (SPEC["hidden_size"], SPEC["intermediate_size"]),
}


def adapter_config(base_model: str) -> dict:
    """adapter_config.json as PEFT writes it for a plain LoRA (the fields vLLM's PEFTHelper reads)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": RANK,
        "lora_alpha": ALPHA,
        "lora_dropout": 0.0,
        "target_modules": sorted(name.rsplit(".", 1)[1] for name in TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
    }


def _weights(seed: int) -> bytes:
    """adapter_model.safetensors: lora_A (r x in) and lora_B (out x r), both non-zero.

    The base weights are normal(0, 0.02); with these scales each delta entry (alpha/r * B @ A) is
    about 0.2, ten times the base, so the adapter decides the greedy tokens.
    """
    rng = np.random.default_rng(seed)
    tensors = {}
    for layer in range(SPEC["num_hidden_layers"]):
        for module, (out_features, in_features) in TARGETS.items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[prefix + ".lora_A.weight"] = (rng.standard_normal((RANK, in_features)) * 0.25).astype(
                np.float32
            )
            tensors[prefix + ".lora_B.weight"] = (rng.standard_normal((out_features, RANK)) * 0.25).astype(
                np.float32
            )
    return save_safetensors(tensors, metadata={"format": "pt"})


def build_files(seed: int, base_model: str = "tiny-llama") -> dict[str, bytes]:
    """Every file of the adapter directory, by name, as bytes (deterministic for a seed)."""
    return {
        "adapter_config.json": _json(adapter_config(base_model)),
        "adapter_model.safetensors": _weights(seed),
    }


def _spec_key(seed: int) -> str:
    return _sha256(json.dumps([GENERATOR_VERSION, SPEC, RANK, ALPHA, sorted(TARGETS), seed]).encode())


def is_up_to_date(adapter_dir: Path, seed: int) -> bool:
    """True when adapter_dir holds exactly what this generator writes for seed (hashes checked)."""
    return matches_manifest(adapter_dir, _spec_key(seed), MANIFEST)


def generate(out_dir: Path, name: str = "tiny-lora", seed: int = 1) -> Path:
    """Write the adapter to out_dir/name and return that path; skip when it is already up to date.

    Built in a sibling temp dir and renamed into place; files 0644, directory 0755 (the service user
    reads them).
    """
    adapter_dir = Path(out_dir) / name
    if not is_up_to_date(adapter_dir, seed):
        write_generated(adapter_dir, build_files(seed), _spec_key(seed), MANIFEST)
    return adapter_dir


def main(argv: list[str] | None = None) -> int:
    """CLI: write the adapter under OUT_DIR and print its path."""
    parser = argparse.ArgumentParser(prog="python -m vllm_fleet.sandbox.tiny_adapter", description=__doc__)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--name", default="tiny-lora")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    print(generate(args.out_dir, args.name, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
