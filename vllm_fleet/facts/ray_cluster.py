"""The Ray cluster of a multi-node instance, as its head sees it: one command, run on the head.

The probe asks Ray's GCS (the head's `ray start --head` process, at <head address>:<vllm_ray_port>)
for its nodes with Ray's own client, `ray._raylet.GcsClient.get_all_node_info` (what `ray status`
and `ray.nodes()` read; no driver is started, nothing is written in Ray's session directory), from
the node's own environment. It waits up to `timeout_s` for every node of the group to be ALIVE at
its address with the GPUs the tool declared (`ray start --num-gpus`), and prints one JSON line.

Used by the deploy (before the head's vLLM starts: deploy/ray.py wait_for_cluster; in verification:
verify_ray_node) and by `vllm-fleet status` (timeout 0: the cluster as it is now).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from vllm_fleet.config import HostConfig
from vllm_fleet.plan import RayNode
from vllm_fleet.host_layout import RAY_UNIT

JOIN_TIMEOUT_S = 120  # before the head's vLLM starts: the workers' Ray started in the operation before
VERIFY_TIMEOUT_S = 30  # in verification: every node should be there already

# Runs on the head with the environment's python; argv[1] is the spec (JSON). Prints one JSON line:
# {"ok", "nodes": [{ip, alive, state, gpus, head}], "missing": [name], "wrong": [[name, why]], "error"}.
PROBE = r'''
import json, sys, time
spec = json.loads(sys.argv[1])
deadline = time.monotonic() + spec["timeout_s"]
want = spec["nodes"]  # name -> {"address", "gpus"}
def read():
    import socket
    host, port = spec["head_address"].rsplit(":", 1)
    # Fails in a millisecond when nothing listens; GcsClient alone would block ~40 s first.
    socket.create_connection((host.strip("[]"), int(port)), timeout=2).close()
    from ray._raylet import GcsClient
    from ray.core.generated import gcs_pb2
    alive = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE
    infos = GcsClient(address=spec["head_address"]).get_all_node_info(timeout=5).values()
    return [{"ip": n.node_manager_address, "alive": n.state == alive,
             "state": gcs_pb2.GcsNodeInfo.GcsNodeState.Name(n.state),
             "gpus": dict(n.resources_total).get("GPU", 0.0), "head": bool(n.is_head_node)}
            for n in infos]
while True:
    out = {"ok": False, "nodes": [], "missing": [], "wrong": [], "error": None}
    try:
        nodes = read()
    except Exception as exc:  # the head's GCS is down or unreachable
        out["error"] = f"{type(exc).__name__}: {exc}"
        nodes = []
    out["nodes"] = nodes
    if out["error"] is None:
        for name, node in want.items():
            here = [n for n in nodes if n["ip"] == node["address"] and n["alive"]]
            if not here:
                out["missing"].append(name)
            elif here[0]["gpus"] != node["gpus"]:
                out["wrong"].append([name, f"Ray has {here[0]['gpus']:g} GPU(s) on it, the tool declared {node['gpus']}"])
        out["ok"] = not out["missing"] and not out["wrong"]
    if out["ok"] or time.monotonic() >= deadline:
        break
    time.sleep(2)
print(json.dumps(out))
'''


def spec(role: RayNode, config: HostConfig, env_prefix: str, timeout_s: int,
         only_this_node: bool = False) -> dict[str, Any]:
    """What the probe checks for `role`'s group: every node (or, `only_this_node`, this one) at its
    address with its declared GPUs. The GPUs per node are this node's count for every node (the
    group's TP is the same on each)."""
    nodes = {n: {"address": role.addresses[n], "gpus": len(role.gpus)} for n in role.nodes}
    if only_this_node:
        nodes = {role.host: nodes[role.host]}
    return group_spec(instance=role.instance, head=role.head, head_address=role.head_address, nodes=nodes,
                      config=config, env_prefix=env_prefix, timeout_s=timeout_s, is_head=role.is_head)


def group_spec(*, instance: str, head: str, head_address: str, nodes: dict[str, dict[str, Any]],
               config: HostConfig, env_prefix: str, timeout_s: int, is_head: bool = True) -> dict[str, Any]:
    """The probe's spec from its parts (rollout builds one from the nodes' manifests): run as
    `config`'s service user with the python of `env_prefix`."""
    return {"instance": instance, "head": head, "is_head": is_head, "head_address": head_address,
            "python": f"{env_prefix}/bin/python", "user": config.settings.vllm_service_user,
            "timeout_s": timeout_s, "nodes": nodes}


def probe_command(spec: dict[str, Any]) -> str:
    """The probe as the service user (Ray's processes are its own), with the node's environment."""
    args = {k: spec[k] for k in ("head_address", "nodes", "timeout_s")}
    return (f"runuser -u {shlex.quote(spec['user'])} -- {shlex.quote(spec['python'])} -c {shlex.quote(PROBE)} "
            f"{shlex.quote(json.dumps(args))}")


def parse(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def check(host, spec: dict[str, Any]) -> dict[str, Any]:
    """Run the probe on `host` (the head, over its pyinfra connection); never raises."""
    from vllm_fleet.connect.remote import run

    _ok, out, err = run(host, probe_command(spec), timeout=spec["timeout_s"] + 60)
    res = parse(out)
    if res is None:
        return {"ok": False, "nodes": [], "missing": list(spec["nodes"]), "wrong": [],
                "error": f"the Ray probe printed no result: {(err or out).strip()[-500:] or 'nothing'}"}
    return res


def failure_text(host_name: str, spec: dict[str, Any], res: dict[str, Any]) -> str:
    """Names each missing node with its address, and what to look at."""
    inst = spec["instance"]
    lines = [f"host {host_name}, instance {inst}: the Ray cluster does not have every node "
             f"(waited {spec['timeout_s']} s)"]
    if res.get("error"):
        lines.append(f"  the Ray head at {spec['head_address']} did not answer: {res['error']}; see "
                     f"`journalctl -u {RAY_UNIT}` on {spec['head']}")
    for name in res.get("missing", []):
        address = spec["nodes"][name]["address"]
        lines.append(f"  node {name} ({address}) is not in the cluster: check {RAY_UNIT} on {name} "
                     f"(`systemctl status {RAY_UNIT}`), and that it reaches {spec['head_address']} "
                     "on the nodes' network; run the deploy on every node of the group")
    for name, why in res.get("wrong", []):
        lines.append(f"  node {name}: {why}")
    return "\n".join(lines)


def success_text(spec: dict[str, Any]) -> str:
    nodes = ", ".join(f"{n} ({v['address']}, {v['gpus']} GPU)" for n, v in spec["nodes"].items())
    return f"the Ray cluster of {spec['instance']}: {len(spec['nodes'])} node(s) alive: {nodes}"
