"""Shared helpers of the tests that need no host: GPU layouts and instance configs (a multi-node
Llama 3 70B over two servers among them), the errors the config and the planner report, a fleet
rendered, a stand-in pyinfra host for the deploy's prepare(), the CLI as a process, and a free local
port."""

from __future__ import annotations

import copy
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_fleet.config import ConfigErrors, check_fleet, parse_host
from vllm_fleet.facts.gpus import GPU_QUERY
from vllm_fleet.plan import plan_fleet, plan_host
from vllm_fleet.render import render_host

REPO = Path(__file__).resolve().parents[2]

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


# The sandbox's tiny model (vllm_fleet/sandbox/tiny_model.py) as an instance's model_info declares it.
TINY_MODEL_INFO = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
                   "hidden_size": 128, "intermediate_size": 256, "vocab_size": 1024, "weights_gib": 0.003,
                   "dtype": "float32", "max_position_embeddings": 2048}


def instance(**overrides) -> dict:
    out = copy.deepcopy(SEED_GEMMA)
    out.update(overrides)
    return out


def host_data(gpus=None, instances=None, **settings) -> dict:
    data = {"gpus": copy.deepcopy(gpus if gpus is not None else SEED_BOX),
            "vllm_instances": instances if instances is not None else [instance()]}
    data.update(settings)
    return data


# The team service's clients (vllm_api_clients): one limited by rate, one to one model by a key file,
# one naming a model nobody serves.
API_CLIENTS = {"ci": {"key_env": "CI_KEY", "requests_per_minute": 6},
               "research": {"key_file": "~/research.key", "models": ["gemma3-12b-q4"]},
               "other": {"key_env": "OTHER_KEY", "models": ["not-served"]}}

LLAMA70B = "meta-llama/Meta-Llama-3-70B-Instruct"  # catalog: 80 layers, 64 heads, 8 KV heads, 131.4 GiB


def llama(**overrides) -> dict:
    """Llama 3 70B as a multi-node instance over the servers gpu-a and gpu-b."""
    inst = {"name": "llama70b", "model": LLAMA70B, "served_model_name": "llama-3-70b", "port": 8000,
            "nodes": ["gpu-a", "gpu-b"]}
    inst.update(overrides)
    return inst


def node(address: str, gpus=None, instances=None, **settings) -> dict:
    """The data of a server of a node group (4xA100-40GB unless `gpus` says others)."""
    data = {"gpus": copy.deepcopy(gpus or [A100_40G] * 4), "vllm_instances": instances or [],
            "vllm_private_interface": "eth1", "ssh_hostname": address}
    data.update(settings)
    return data


def two_servers(inst: dict | None = None, a: dict | None = None, b: dict | None = None) -> list:
    """2 servers x 4xA100-40GB, the instance declared on the head gpu-a only."""
    return [parse_host("gpu-a", {**node("10.0.0.1", instances=[inst or llama()]), **(a or {})}),
            parse_host("gpu-b", {**node("10.0.0.2"), **(b or {})})]


def rendered_fleet(hosts) -> dict[str, dict[str, str]]:
    """Every file rendered for these parsed hosts, checked and planned as one fleet: {host: {path: content}}."""
    check_fleet(hosts)
    plan = plan_fleet(hosts)
    return {h.name: {f.path: f.content for f in render_host(h, p)} for h, p in zip(hosts, plan.hosts, strict=True)}


def parse_errors(data: dict, name: str = "box") -> list:
    """The errors of parsing `data` as host `name` (fails the test when it parses)."""
    with pytest.raises(ConfigErrors) as info:
        parse_host(name, data)
    return info.value.errors


def plan_errors(data: dict, live=None) -> list:
    """The errors of parsing and planning `data` as host "box", `live` its discovered GPUs (fails the
    test when it plans)."""
    with pytest.raises(ConfigErrors) as info:
        plan_host(parse_host("box", data), live)
    return info.value.errors


def fleet_error_text(hosts: list[tuple[str, dict]]) -> str:
    """Every error of parsing, checking and planning these (name, data) hosts, as the CLI prints them
    (fails the test when the fleet plans)."""
    with pytest.raises(ConfigErrors) as info:
        parsed = [parse_host(name, data) for name, data in hosts]
        check_fleet(parsed)
        plan_fleet(parsed)
    return str(info.value)


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    """`vllm-fleet ARGS` as a process of this interpreter, run in `cwd`."""
    return subprocess.run([sys.executable, "-m", "vllm_fleet.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def free_port(headroom: int = 0) -> int:
    """A local TCP port that was free a moment ago, `headroom` ports below the top (65535): for a
    test that also listens at port + headroom."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + headroom <= 65535:
            return port


def one_gpu_smi(driver: str = "580.126.09", name: str = "NVIDIA A100-SXM4-40GB", cap: str = "8.0",
                mig: str = "Disabled") -> list[str]:
    """nvidia-smi's GPU_QUERY output of a host with one 40 GB GPU (an A100 unless `name` says another)."""
    row = {"index": "0", "pci.bus_id": "00000000:41:00.0", "name": name, "memory.total": "40960",
           "memory.used": "3", "uuid": "GPU-a", "compute_cap": cap, "driver_version": driver,
           "mig.mode.current": mig, "memory.reserved": "[N/A]"}
    return [", ".join(row[f] for f in GPU_QUERY.split(","))]


# The HostRuntime fact of a Debian host that has every OS package the runtime can need.
PROVISIONED = ({"cc": True, "cxx": True, "python3.11-headers": True, "libnuma": True, "nginx": True}, "debian")


def use_fake_host(monkeypatch, fake: "FakeHost") -> None:
    """The deploy's prepare() on `fake`: pyinfra's current `host` (the context every module of
    vllm_fleet.deploy reads) is it, and its root access check answered "root" (a FakeHost has no
    pyinfra state to wrap a command with; the check itself runs through pyinfra's @fake connector
    in tests/deploy/test_noop_commands.py)."""
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
        self.name, self.print_prefix, self.groups = "box", "[box] ", ()
        self.data = SimpleNamespace(dict=lambda: data)
        # No account of the services' users and no directory of theirs yet (a first deploy creates them).
        # No CUDA here either: the CUDA memory probe answers as on the sandbox's simulated GPUs.
        self.facts, self.asked, self.batches = ({"HostRuntime": PROVISIONED, "ServiceAccount": {"user": None, "group": None},
                                                 "PathOwners": {},
                                                 "CudaMemory": {"available": False, "reason": "no libcuda.so.1"},
                                                 **facts}, [], [])
        # No SSH client: lock.acquire says there is no session to tie the deploy lock to.
        self.connector = SimpleNamespace()
        self.state = FakeState([self])  # an inventory of this host alone

    def get_fact(self, cls, **kwargs):
        if cls.__name__ == "FactBatch":
            self.batches.append(kwargs["queries"])
            return None
        self.asked.append((cls.__name__, kwargs))
        return self.facts[cls.__name__]


def prepare_on_fake_host(monkeypatch, data: dict, facts: dict) -> tuple:
    """The deploy's prepare() on a FakeHost with `data` and `facts` (and an API key in the
    environment): what it returned, and the FakeHost (what prepare() asked)."""
    from vllm_fleet.deploy.prepare import prepare  # here: the planner's tests need no deploy

    monkeypatch.setenv("VLLM_FLEET_API_KEY", "sk-test-5b1e0c2f9a")
    fake = FakeHost(data, facts)
    use_fake_host(monkeypatch, fake)
    return prepare(), fake
