"""Shared GPU layouts and instance configs for the planner/renderer tests (no hosts involved)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

A100_40G = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}
RTX_4090D = {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564}
H100_80G = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
T4 = {"name": "Tesla T4", "memory_mib": 15360}
RTX_3090 = {"name": "NVIDIA GeForce RTX 3090", "memory_mib": 24576}

SEED_BOX = [RTX_4090D, A100_40G, A100_40G]

SEED_GEMMA = {
    "name": "gemma",
    "model": "/data/vllm/models/gemma-3-12b-it-qat-q4_0-gguf/gemma-3-12b-it-q4_0.gguf",
    "tokenizer": "google/gemma-3-12b-it",
    "served_model_name": "gemma3-12b-q4",
    "port": 8000,
    "max_model_len": 16384,
}


def instance(**overrides) -> dict:
    out = copy.deepcopy(SEED_GEMMA)
    out.update(overrides)
    return out


def host_data(gpus=None, instances=None, **settings) -> dict:
    data = {"gpus": copy.deepcopy(gpus if gpus is not None else SEED_BOX),
            "vllm_instances": instances if instances is not None else [instance()]}
    data.update(settings)
    return data


# The HostRuntime fact of a Debian host that has every OS package the runtime can need.
PROVISIONED = ({"cc": True, "cxx": True, "python3.11-headers": True, "libnuma": True, "nginx": True}, "debian")


def use_fake_host(monkeypatch, fake: "FakeHost") -> None:
    """The deploy's prepare() on `fake`: pyinfra's current `host` (the context every module of
    vllm_fleet.deploy reads) is it, and its root access check answered "root" (a FakeHost has no
    pyinfra state to wrap a command with; the check itself runs through pyinfra's @fake connector
    in tests/test_noop_commands.py)."""
    from pyinfra.context import ctx_host

    from vllm_fleet.deploy import access

    monkeypatch.setattr(ctx_host.context._container, "module", fake)
    monkeypatch.setattr(access, "access_problem", lambda: None)


class FakeState:
    """Stands in for pyinfra's State where the deploy's prepare() reads the inventory (weakly keyed)."""

    def __init__(self, inventory: list):
        self.inventory = inventory


class FakeHost:
    """Stands in for pyinfra's `host` inside the deploy's prepare(): data and facts from dicts; `asked`
    records (fact name, arguments) in the order prepare() asked. The OS packages are there unless
    the test gives a HostRuntime fact of its own. A batch (facts.prefetch) is recorded in `batches`
    and answered with nothing, so each fact is then asked alone (facts.get) and answered here."""

    def __init__(self, data: dict, facts: dict):
        self.name, self.print_prefix = "box", "[box] "
        self.data = SimpleNamespace(dict=lambda: data)
        self.facts, self.asked, self.batches = {"HostRuntime": PROVISIONED, **facts}, [], []
        # No SSH client: lock.acquire says there is no session to tie the deploy lock to.
        self.connector = SimpleNamespace()
        self.state = FakeState([self])  # an inventory of this host alone

    def get_fact(self, cls, **kwargs):
        if cls.__name__ == "FactBatch":
            self.batches.append(kwargs["queries"])
            return None
        self.asked.append((cls.__name__, kwargs))
        return self.facts[cls.__name__]
