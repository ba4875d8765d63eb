"""Multi-node instances (issue 14), the deploy's side offline: each node plans its group from its own
facts, checks its address on the nodes' network, the Ray probe's verdicts, and rollout's batches
that keep a node group together. The sandbox run is tests/test_multinode_sandbox.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from test_multinode_plan import llama, node
from vllm_fleet.commands.rollout import make_batches
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.host import ray_cluster
from vllm_fleet.host.discovery import Discovered
from vllm_fleet.host.facts import InterfaceAddresses
from vllm_fleet.prepared import node_group_plans, prepare_host
from vllm_fleet.render import RAY_UNIT, ray_paths


def _fleet() -> dict:
    return {"gpu-a": parse_host("gpu-a", node("10.0.0.1", instances=[llama()])),
            "gpu-b": parse_host("gpu-b", node("10.0.0.2")),
            "other": parse_host("other", node("10.0.0.9"))}


def _found(name: str, configs: dict, addresses=("10.0.0.1",)) -> Discovered:
    config = configs[name]
    return Discovered(config, config.gpus, None, None, addresses)


def test_each_node_plans_its_part_of_the_group_from_its_own_facts():
    configs = _fleet()
    [head] = node_group_plans(_found("gpu-a", configs), configs)
    [worker] = node_group_plans(_found("gpu-b", configs, ("10.0.0.2", "fe80::1")), configs)
    assert head.roles["gpu-a"].is_head and not worker.roles["gpu-b"].is_head
    assert worker.roles["gpu-b"].head_address == "10.0.0.1:6379" == head.roles["gpu-a"].head_address
    assert node_group_plans(_found("other", configs, ("10.0.0.9",)), configs) is None
    # The worker's files: its Ray worker unit and no vLLM unit; the head's: both.
    head_files = prepare_host(_found("gpu-a", configs), node_groups=[head]).files
    worker_files = prepare_host(_found("gpu-b", configs, ("10.0.0.2",)),
                                node_groups=[worker]).files
    unit = ray_paths(configs["gpu-b"])["unit"]
    assert "--address 10.0.0.1:6379" in worker_files[unit].content
    assert not [p for p in worker_files if p.endswith("llama70b.service")]
    assert [p for p in head_files if p.endswith("vllm-llama70b.service")]


@pytest.mark.parametrize("addresses, words, fix", [
    (None, "interface eth1 (vllm_private_interface) does not exist on this host", "`ip -o addr`"),
    (("192.168.5.2",), "reaches gpu-b at 10.0.0.2, but its vllm_private_interface eth1 has 192.168.5.2",
     "vllm_advertise_address = '192.168.5.2' on gpu-b"),
])
def test_a_node_whose_private_interface_lacks_its_group_address_is_refused(addresses, words, fix):
    configs = _fleet()
    with pytest.raises(ConfigErrors) as info:
        node_group_plans(_found("gpu-b", configs, addresses), configs)
    text = str(info.value)
    assert "host gpu-b, instance llama70b" in text and words in text and fix in text


def test_interface_addresses_reads_ip_o_addr():
    fact = InterfaceAddresses()
    out = ["2: eth1    inet 10.0.0.2/24 brd 10.0.0.255 scope global eth1\\       valid_lft forever",
           "2: eth1    inet6 fe80::1/64 scope link \\       valid_lft forever preferred_lft forever"]
    assert fact.process(out) == ["10.0.0.2", "fe80::1"]
    assert fact.process(["none"]) is None
    assert "ip -o addr show dev eth1" in fact.command(interface="eth1")


def test_rollout_batches_keep_a_node_group_together():
    names = ["a", "head", "b", "worker", "c"]
    groups = [("head", "worker")]
    assert make_batches(names, 1, groups) == [["a"], ["head", "worker"], ["b"], ["c"]]
    assert make_batches(names, 2, groups) == [["a"], ["head", "worker"], ["b", "c"]]
    assert make_batches(names, 3, groups) == [["a", "head", "worker"], ["b", "c"]]
    assert make_batches(["worker", "x"], 1, groups) == [["worker"], ["x"]]  # the head not in --limit
    assert make_batches(names, 1, []) == [[n] for n in names]


# --- the Ray probe, against a stand-in of Ray's GCS client (the real one: the sandbox test) ---------

FAKE_RAY = {
    "ray/__init__.py": "",
    "ray/core/__init__.py": "",
    "ray/core/generated/__init__.py": "",
    "ray/core/generated/gcs_pb2.py": textwrap.dedent("""
        class _State:
            ALIVE, DEAD = 0, 1
            @staticmethod
            def Name(v): return {0: "ALIVE", 1: "DEAD"}[v]
        class GcsNodeInfo:
            GcsNodeState = _State
    """),
    "ray/_raylet.py": textwrap.dedent("""
        import json, os, types
        class GcsClient:
            def __init__(self, address):
                if not os.environ.get("FAKE_NODES"):
                    raise ConnectionError(f"cannot reach GCS at {address}")
            def get_all_node_info(self, timeout=None):
                nodes = json.loads(os.environ["FAKE_NODES"])
                return {i: types.SimpleNamespace(node_manager_address=n["ip"], state=n["state"],
                                                 resources_total={"GPU": n["gpus"]}, is_head_node=i == 0)
                        for i, n in enumerate(nodes)}
    """),
}


def _probe(tmp_path: Path, nodes: list | None, timeout_s: int = 0, listening: bool = True) -> dict:
    """The probe against the stand-in client; the head's port is a loopback socket that listens
    (the probe connects to it first) or one that does not."""
    for rel, text in FAKE_RAY.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    with socket.socket() as head:
        head.bind(("127.0.0.1", 0))
        if listening:
            head.listen()
        spec = {"head_address": f"127.0.0.1:{head.getsockname()[1]}", "timeout_s": timeout_s,
                "nodes": {"gpu-a": {"address": "10.0.0.1", "gpus": 4}, "gpu-b": {"address": "10.0.0.2", "gpus": 4}}}
        env = dict(os.environ, PYTHONPATH=str(tmp_path), FAKE_NODES=json.dumps(nodes) if nodes is not None else "")
        out = subprocess.run([sys.executable, "-c", ray_cluster.PROBE, json.dumps(spec)], env=env,
                             capture_output=True, text=True, timeout=60)
    return ray_cluster.parse(out.stdout)


def test_the_probe_passes_with_every_node_alive_and_its_gpus(tmp_path):
    res = _probe(tmp_path, [{"ip": "10.0.0.1", "state": 0, "gpus": 4.0}, {"ip": "10.0.0.2", "state": 0, "gpus": 4.0}])
    assert res["ok"] and not res["missing"]


def test_the_probe_names_a_dead_or_absent_node_and_wrong_gpus(tmp_path):
    dead = _probe(tmp_path, [{"ip": "10.0.0.1", "state": 0, "gpus": 4.0}, {"ip": "10.0.0.2", "state": 1, "gpus": 4.0}])
    assert not dead["ok"] and dead["missing"] == ["gpu-b"]
    wrong = _probe(tmp_path, [{"ip": "10.0.0.1", "state": 0, "gpus": 4.0}, {"ip": "10.0.0.2", "state": 0, "gpus": 2.0}])
    assert wrong["wrong"] == [["gpu-b", "Ray has 2 GPU(s) on it, the tool declared 4"]]
    down = _probe(tmp_path, None)
    assert not down["ok"] and "cannot reach GCS" in down["error"]
    closed = _probe(tmp_path, [], listening=False)  # nothing on the head's port: fails at once
    assert not closed["ok"] and "ConnectionRefusedError" in closed["error"]
    spec = {"instance": "llama70b", "head": "gpu-a", "head_address": "10.0.0.1:6379", "timeout_s": 30,
            "nodes": {"gpu-b": {"address": "10.0.0.2", "gpus": 4}}}
    text = ray_cluster.failure_text("gpu-a", spec, dead)
    assert "host gpu-a, instance llama70b" in text and "node gpu-b (10.0.0.2) is not in the cluster" in text
    assert RAY_UNIT in text


def test_the_probe_waits_for_a_node_until_its_timeout(tmp_path):
    import time
    started = time.monotonic()
    res = _probe(tmp_path, [{"ip": "10.0.0.1", "state": 0, "gpus": 4.0}], timeout_s=3)
    assert res["missing"] == ["gpu-b"] and time.monotonic() - started >= 3


def test_the_probe_runs_as_the_service_user_with_the_nodes_environment():
    configs = _fleet()
    [group] = node_group_plans(_found("gpu-a", configs), configs)
    spec = ray_cluster.spec(group.roles["gpu-a"], configs["gpu-a"], "/opt/vllm-fleet/envs/current", 0)
    command = ray_cluster.probe_command(spec)
    assert command.startswith("runuser -u vllm -- /opt/vllm-fleet/envs/current/bin/python -c ")
    assert spec["nodes"] == {"gpu-a": {"address": "10.0.0.1", "gpus": 4}, "gpu-b": {"address": "10.0.0.2", "gpus": 4}}
