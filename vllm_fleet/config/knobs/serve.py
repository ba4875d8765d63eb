"""What to serve: the host's GPUs, its vLLM instances and how they share the GPUs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_fleet.config.schema import knob, section

PLACEMENTS = ("auto", "single-instance", "split")


@section("What to serve")
@dataclass(frozen=True)
class ServeKnobs:
    gpus: list[dict[str, Any]] | None = knob(
        None, "for offline plans: at deploy time nvidia-smi's answer wins",
        kind="a list of GPUs", shallow=True,
        fix='gpus = [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}, ...]',
        notes="""
        GPUs the host has, in PCI bus order: [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}, ...]
        (optional "compute_capability"). Used to plan offline (CI); at deploy time nvidia-smi's answer
        wins, and a mismatch with this declaration is an error that shows both. The names and MiB are
        nvidia-smi's exact ones: `vllm-fleet gpus INVENTORY [--limit HOST]` prints each host's declaration
        (or, on the host: nvidia-smi --query-gpu=name,memory.total,compute_cap --format=csv,noheader,nounits).
        """)
    vllm_instances: list[dict[str, Any]] = knob(
        [], "none: the host serves no model of its own (a gateway host may)",
        kind="a list", shallow=True,
        fix="vllm_instances = [{'name': ..., 'model': ..., 'served_model_name': ..., 'port': 8000}]",
        notes="""
        The vLLM instances of a host: a list of dicts, each with these keys (key = what leaving it out
        means: what it is; config.InstanceConfig declares them):
        """)
    placement: str = knob(
        "auto", 'how instances with gpus "auto" use the GPUs', choices=PLACEMENTS,
        notes="""
        "auto": identical GPUs -> smallest TP that fits, rest data-parallel; mixed GPUs -> every set of
        the GPU models is weighed, served by one instance (PP across models) or one instance per model,
        and the most full-length requests of max_model_len win, then fewer pipeline stages, then fewer
        GPUs (a GPU model left out stays free for another instance; the plan names the runner-up and
        why it lost). "single-instance": one instance over all GPUs, PP across GPU models. "split": one
        instance per group of identical GPUs.
        """)
