"""Multi-node instances, the deploy's side offline: each node plans its group from its own
facts, checks its address on the nodes' network, the Ray probe's verdicts, and rollout's batches
that keep a node group together. The sandbox run is tests/sandbox/test_multinode_sandbox.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.planning_fixtures import llama, node
from vllm_fleet.commands.rollout import make_batches
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.facts import ray_cluster
from vllm_fleet.prepared import Discovered
from vllm_fleet.facts.host import InterfaceAddresses
from vllm_fleet.prepared import node_group_plans, prepare_host
from vllm_fleet.render import ray_paths
from vllm_fleet.host_layout import RAY_UNIT


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


# --- the deploy's prepare on a Ray worker, with its facts answered here --------------------------------

def _four_a100s() -> list:
    from vllm_fleet.facts.gpus import GPU_QUERY, parse_gpu_csv
    rows = []
    for i in range(4):
        row = {"index": str(i), "pci.bus_id": f"00000000:{0x41 + i:02X}:00.0", "name": "NVIDIA A100-SXM4-40GB",
               "memory.total": "40960", "memory.used": "3", "uuid": f"GPU-{i}", "compute_cap": "8.0",
               "driver_version": "580.126.09", "mig.mode.current": "Disabled", "memory.reserved": "[N/A]"}
        rows.append(", ".join(row[f] for f in GPU_QUERY.split(",")))
    return parse_gpu_csv(rows)


def test_a_worker_gets_the_model_its_pipeline_stage_loads(monkeypatch):
    """The worker declares no instance, but vLLM's Ray workers there load their layers from the same
    model path: the deploy downloads the head's model on the worker too (review finding)."""
    from types import SimpleNamespace

    from support.planning_fixtures import LLAMA70B, FakeHost, FakeState, use_fake_host
    from vllm_fleet.deploy.managed import hub_downloads
    from vllm_fleet.deploy.prepare import prepare

    monkeypatch.setenv("VLLM_FLEET_API_KEY", "sk-test-5b1e0c2f9a")
    head_data = node("10.0.0.1", instances=[llama()])
    worker = FakeHost(node("10.0.0.2"), {"NvidiaGpus": _four_a100s(), "GpuTopology": {"available": False, "reason": "test"},
                                         "ManagedUnits": [], "PathsPresent": {}, "InterfaceAddresses": ["10.0.0.2"]})
    worker.name, worker.print_prefix = "gpu-b", "[gpu-b] "
    head = SimpleNamespace(name="gpu-a", data=SimpleNamespace(dict=lambda: head_data), groups=())
    worker.state = FakeState([head, worker])
    use_fake_host(monkeypatch, worker)
    deployment = prepare()
    assert deployment.plan.ray is not None and not deployment.plan.ray.is_head and deployment.plan.instances == []
    assert deployment.node_instance.name == "llama70b"
    assert {download.repo for _inst, download in hub_downloads(deployment)} == {LLAMA70B}
    asked = [str(q) for batch in worker.batches for q in batch]
    assert any("HubModelCached" in q and LLAMA70B in q for q in asked), asked


# --- operation order: the same call sites on every host --------------------------------------------

def _services_call_sites(monkeypatch, running: list[bool]) -> list[int]:
    """The code lines of the operations the deploy's services() adds for two instances, their units
    running as given. pyinfra's CLI order identifies an operation by its line: two hosts whose
    sequences list the same lines in another order form a cycle in its ordering DAG."""
    import sys as _sys
    from types import SimpleNamespace

    from vllm_fleet.deploy import services, state

    sites: list[int] = []

    def op(*_a, **_kw):
        sites.append(_sys._getframe(1).f_lineno)
        return SimpleNamespace(did_change=lambda: False)

    for name in ("server", "systemd", "python"):
        monkeypatch.setattr(services, name, SimpleNamespace(shell=op, daemon_reload=op, call=op))
    monkeypatch.setattr(services, "systemd_service", op)
    monkeypatch.setattr(state, "any_changed", lambda *ops: (lambda: False))
    states = {f"vllm-i{n}.service": r for n, r in enumerate(running)}

    def fact(_host, cls, **kw):
        if cls.__name__ == "UnitState":
            up = states.get(kw["unit"], False)
            return {"running": up, "main_pid": 7 if up else 0, "started": 100, "need_daemon_reload": False}
        return 0  # NewestMtime: older than the process

    monkeypatch.setattr(services.facts, "get", fact)
    monkeypatch.setattr(services, "host", SimpleNamespace(state=None, print_prefix="", name="h"))
    insts = [SimpleNamespace(name=f"i{n}", unit_name=f"vllm-i{n}.service", nodes=None,
                             config=SimpleNamespace(model="/m", model_source=None)) for n in range(len(running))]
    config = parse_host("h", node("10.0.0.5"))
    changes = state.Changes()
    for inst in insts:
        for kind in ("config", "unit", "env"):
            changes.notify(inst.unit_name, "instance", kind, None, instance=inst.name)
    services.services(state.Deployment(config, SimpleNamespace(instances=insts, ray=None), {}, None, changes))
    return sites


def test_every_host_adds_the_same_service_operations_whatever_runs(monkeypatch):
    """Found by review: a host whose first instance ran and one whose first instance was stopped
    took different branches (an "ensure running" or a "start" operation), a cycle for pyinfra's
    CLI order, which `vllm-fleet rollout` now uses too. Each instance gets the same operations."""
    layouts = [[True, True], [False, True], [True, False], [False, False]]
    sites = [_services_call_sites(monkeypatch, layout) for layout in layouts]
    assert all(s == sites[0] for s in sites), sites


# --- rollout: a node group is one unit -------------------------------------------------------------

def _group_inventory(tmp_path) -> str:
    inv = tmp_path / "inv.py"
    inv.write_text(f"nodes = [('gpu-a', {node('10.0.0.1', instances=[llama()])!r}), "
                   f"('gpu-b', {node('10.0.0.2')!r}), ('solo', {{'vllm_target': 'cpu'}})]\n")
    return str(inv)


def _manifest(address: str) -> str:
    return json.dumps({"ray": {"instance": "llama70b", "head": "gpu-a", "head_address": "10.0.0.1:6379",
                               "address": address, "gpus": [0, 1, 2, 3]}, "instances": {}})


def test_a_failed_head_rolls_its_whole_group_back_files_first_then_the_head_then_the_workers(
        monkeypatch, tmp_path, capsys):
    from support.rollout_stubs import RolloutState, stub_pyinfra
    from vllm_fleet.commands import rollout as rollout_mod
    import vllm_fleet.connect.remote

    state = RolloutState()
    hosts = stub_pyinfra(monkeypatch, state)
    sent: list[tuple[str, str]] = []

    def run(host, command, timeout=None):
        sent.append((host.name, command))
        if "cp -a --parents" in command:  # the snapshot: the manifest as it was
            return True, _manifest({"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2"}.get(host.name, "")), ""
        if "GcsClient" in command:
            return True, json.dumps({"ok": True, "nodes": [], "missing": [], "wrong": [], "error": None}), ""
        return True, "{}", ""

    monkeypatch.setattr(vllm_fleet.connect.remote, "run", run)
    monkeypatch.setattr("pyinfra.api.operations.run_ops", lambda _s: setattr(state, "failed_hosts", {hosts["gpu-a"]}))
    code = rollout_mod.main([_group_inventory(tmp_path), "--json", "--batch", "1", "--limit", "gpu-b"])
    out, err = capsys.readouterr()
    assert code == 1
    assert "batch 1: gpu-a, gpu-b" in err  # --limit gpu-b brought its head; --batch 1 kept them together
    rows = {h["name"]: h for h in json.loads(out)["hosts"]}
    assert set(rows) == {"gpu-a", "gpu-b"}  # solo is neither limited nor a node
    assert rows["gpu-a"]["state"] == rows["gpu-b"]["state"] == "rolled back"
    assert "node gpu-a failed: the node group is rolled back as one" in rows["gpu-b"]["error"]
    steps = [(h, "restore" if "daemon-reload" in c and "restart" not in c else
              "restart" if "systemctl restart vllm-fleet-ray.service" in c else
              "cluster" if "GcsClient" in c else None) for h, c in sent]
    steps = [s for s in steps if s[1]]
    assert steps == [("gpu-a", "restore"), ("gpu-b", "restore"), ("gpu-a", "restart"), ("gpu-b", "restart"),
                     ("gpu-a", "cluster")], steps


def test_a_node_that_cannot_be_snapshotted_keeps_its_whole_group_out(monkeypatch, tmp_path, capsys):
    from support.rollout_stubs import RolloutState, stub_pyinfra
    from vllm_fleet.commands import rollout as rollout_mod
    import vllm_fleet.connect.remote

    state = RolloutState()
    stub_pyinfra(monkeypatch, state)
    deployed = []
    monkeypatch.setattr(vllm_fleet.connect.remote, "run", lambda host, command, timeout=None: (
        (False, "", "No space left on device") if host.name == "gpu-b" and "cp -a --parents" in command
        else (True, "{}", "")))
    monkeypatch.setattr("pyinfra.api.operations.run_ops", lambda s: deployed.append(set(s.limit_hosts)))
    code = rollout_mod.main([_group_inventory(tmp_path), "--json", "--batch", "2", "--limit", "gpu-a,gpu-b"])
    out, _err = capsys.readouterr()
    rows = {h["name"]: h for h in json.loads(out)["hosts"]}
    assert code == 1 and deployed == []  # deploy.py never ran on the head alone
    assert rows["gpu-b"]["state"] == "failed" and "snapshot failed" in rows["gpu-b"]["error"]
    assert rows["gpu-a"]["state"] == "untouched" and "node gpu-b of its multi-node instance" in rows["gpu-a"]["error"]
