"""Multi-node instances, offline: `nodes` in the config, the fleet-level plan (TP inside a
server, PP across servers, on Ray), `vllm-fleet plan` / `render`, and the Ray units. No hosts."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import yaml

from support.planning_fixtures import (A100_40G, H100_80G, RTX_4090D, fleet_error_text, llama, node,
                                      rendered_fleet, run_cli, two_servers)
from vllm_fleet.config import ConfigErrors, check_fleet, node_group_of, node_groups, parse_host
from vllm_fleet.fleet import load_fleet
from vllm_fleet.plan import plan_fleet, plan_host, plan_node_group, stage_order
from vllm_fleet.render import environment_prefix, environment_spec
from vllm_fleet.host_layout import RAY_UNIT


# --- the plan ----------------------------------------------------------------------------------

def test_llama3_70b_bf16_on_two_servers_of_4xa100_40gb_is_tp4_pp2_and_fits():
    hosts = two_servers()
    check_fleet(hosts)
    head, worker = plan_fleet(hosts).hosts
    (inst,) = head.instances
    assert (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size) == (4, 2, 1)
    assert inst.nodes == ("gpu-a", "gpu-b") and inst.pp_layer_partition == (40, 40)
    assert "VLLM_PP_LAYER_PARTITION" not in inst.env  # identical nodes: vLLM's own even split
    assert inst.engine_args["distributed-executor-backend"] == "ray"
    assert inst.engine_args["tensor-parallel-size"] == 4 and inst.engine_args["pipeline-parallel-size"] == 2
    assert inst.packages == ["ray==2.60.0"]
    assert inst.cuda_visible_devices == "0,1,2,3"  # the head's own GPUs
    # Per GPU, on every node: the stage's layers split 4 ways, and KV for many 8k requests.
    rows = inst.layout.per_gpu
    assert [(u.host, u.index, u.stage) for u in rows] == [
        ("gpu-a", i, 0) for i in range(4)] + [("gpu-b", i, 1) for i in range(4)]
    for u in rows:
        assert 15 < u.weights_gib < 18 and u.kv_cache_gib > 10
        # 0.9 x CUDA's total: nvidia-smi's 40 GiB less the rule's 640 MiB for the driver (no A100 row)
        assert u.weights_gib + u.kv_cache_gib < u.budget_gib == pytest.approx(0.9 * (40960 - 640) / 1024)
    assert inst.kv_cache_tokens > 400_000 and inst.max_concurrency > 50
    assert any("TP=4 = the GPUs of each node, PP=2" in r for r in inst.reasons)
    # The worker serves nothing itself: its GPUs are the group's, its part is a Ray worker.
    assert worker.instances == [] and worker.unused_gpus == ()
    assert not worker.ray.is_head
    assert (worker.ray.head, worker.ray.head_address, worker.ray.gpus) == ("gpu-a", "10.0.0.1:6379", (0, 1, 2, 3))
    assert head.ray.is_head and head.ray.address == "10.0.0.1"


def test_llama3_70b_on_one_such_server_is_refused_with_the_numbers():
    with pytest.raises(ConfigErrors) as info:
        plan_host(parse_host("gpu-a", node("10.0.0.1", instances=[llama(nodes=None)])))
    text = str(info.value)
    assert "131.4 GiB of weights" in text and "4xA100-SXM4-40GB (141.8 GiB usable" in text
    # 32.9 GiB of weights per GPU, and the reserves, leave no KV cache in 0.9 x CUDA's 39.375 GiB.
    assert ("TP=4 PP=1 DP=1: rejected — weights do not fit: GPU 0 (NVIDIA A100-SXM4-40GB) would hold 32.9 GiB "
            "of weights of a 35.4 GiB budget") in text
    assert "spread it over servers with 'nodes'" in text


def test_two_such_servers_with_too_long_a_context_are_refused_with_the_numbers():
    hosts = two_servers(llama(model="meta-llama/Llama-3.1-70B-Instruct", gpu_memory_utilization=0.5,
                              max_model_len=131072))
    with pytest.raises(ConfigErrors) as info:
        plan_fleet(hosts)
    text = str(info.value)
    assert "cannot be served on the nodes gpu-a (4xA100-SXM4-40GB), gpu-b (4xA100-SXM4-40GB)" in text
    assert "TP=4 PP=2" in text and "less than one" in text and "instance llama70b" in text


def test_a_model_info_with_llama3_70b_numbers_plans_the_same():
    info = {"num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
            "hidden_size": 8192, "intermediate_size": 28672, "vocab_size": 128256, "weights_gib": 131.4,
            "max_position_embeddings": 8192}
    (inst,) = plan_fleet(two_servers(llama(model="/models/llama70b", model_info=info))).hosts[0].instances
    assert (inst.tensor_parallel_size, inst.pipeline_parallel_size) == (4, 2)


def test_nodes_that_differ_in_memory_get_an_uneven_layer_partition():
    hosts = two_servers(b={"gpus": [H100_80G] * 4})
    (inst,) = plan_fleet(hosts).hosts[0].instances
    first, second = inst.pp_layer_partition
    assert first + second == 80 and second > first  # the 80 GB node takes more layers
    assert inst.env["VLLM_PP_LAYER_PARTITION"] == f"{first},{second}"
    assert inst.kv_cache_tokens > inst.kv_cache_tokens_even_split


def test_stage_order_is_vllms_ray_rank_order_head_first_then_by_address():
    hosts = [parse_host("n1", node("10.0.0.9", instances=[llama(nodes=["n1", "n2", "n3"])])),
             parse_host("n2", node("10.0.0.30")), parse_host("n3", node("10.0.0.10"))]
    (group,) = node_groups(hosts)
    # As strings, like vLLM's sort: "10.0.0.10" < "10.0.0.30".
    assert stage_order(group, {"n1": "10.0.0.9", "n2": "10.0.0.30", "n3": "10.0.0.10"}) == ("n1", "n3", "n2")
    planned = plan_node_group(group, {h.name: h for h in hosts})
    assert [(u.host, u.stage) for u in planned.plan.layout.per_gpu][::4] == [("n1", 0), ("n3", 1), ("n2", 2)]
    # The deploy passes the private interface's addresses: they decide the order.
    live = plan_node_group(group, {h.name: h for h in hosts}, addresses={"n2": "192.168.0.2", "n3": "192.168.0.3"})
    assert [u.host for u in live.plan.layout.per_gpu][::4] == ["n1", "n2", "n3"]
    assert live.roles["n2"].address == "192.168.0.2"


def test_the_groups_gpus_are_reserved_on_every_node():
    small = {"name": "small", "model": "meta-llama/Meta-Llama-3-8B-Instruct", "served_model_name": "llama-3-8b",
             "port": 8001}
    hosts = [parse_host("gpu-a", node("10.0.0.1", gpus=[A100_40G] * 8,
                                      instances=[llama(gpus=[0, 1, 2, 3]), small])),
             parse_host("gpu-b", node("10.0.0.2", gpus=[A100_40G] * 8, instances=[dict(small, port=8000)]))]
    check_fleet(hosts)
    head, worker = plan_fleet(hosts).hosts
    assert [i.name for i in head.instances] == ["llama70b", "small"]
    for plan in (head, worker):
        other = next(i for i in plan.instances if i.name == "small")
        assert set(other.gpu_indices) <= {4, 5, 6, 7}
    # A GPU of the group named by another instance of a node is an error naming the group.
    text = fleet_error_text([("gpu-a", node("10.0.0.1", instances=[llama(gpus=[0, 1, 2, 3])], gpus=[A100_40G] * 8)),
                             ("gpu-b", node("10.0.0.2", gpus=[A100_40G] * 8, instances=[dict(small, gpus=[2])]))])
    assert "host gpu-b, instance small, key gpus: GPU 2 is used by multi-node instance llama70b" in text


def test_group_data_shared_by_every_node_declares_the_instance_once():
    shared = llama()
    hosts = [parse_host("gpu-a", node("10.0.0.1", instances=[shared])),
             parse_host("gpu-b", node("10.0.0.2", instances=[copy.deepcopy(shared)]))]
    assert hosts[1].instances == () and hosts[1].member_of[0].name == "llama70b"
    check_fleet(hosts)
    head, worker = plan_fleet(hosts).hosts
    assert [i.name for i in head.instances] == ["llama70b"] and worker.instances == []
    # From a worker's point of view (the deploy on gpu-b): its group and its part.
    group = node_group_of(hosts, "gpu-b")
    assert group.head == "gpu-a" and group.workers == ("gpu-b",)
    assert node_group_of(hosts, "gpu-a") == group and node_group_of(hosts, "nosuch") is None


def test_plan_host_alone_cannot_plan_a_multi_node_instance():
    with pytest.raises(ConfigErrors) as info:
        plan_host(two_servers()[0])
    assert "spans several servers" in str(info.value) and "plan_fleet" in str(info.value)


# --- bad `nodes` inputs --------------------------------------------------------------------------

def _bad(inst=None, a=None, b=None, extra=()):
    return [("gpu-a", {**node("10.0.0.1", instances=[inst or llama()]), **(a or {})}),
            ("gpu-b", {**node("10.0.0.2"), **(b or {})}), *extra]


BAD = {
    "unknown node": (_bad(llama(nodes=["gpu-a", "gpu-bb"])),
                     "host gpu-a, instance llama70b, key nodes: node 'gpu-bb' is not a host of the inventory",
                     "did you mean 'gpu-b'?"),
    "one node": (_bad(llama(nodes=["gpu-a"])), "nodes lists 1 host: a multi-node instance needs at least 2",
                 "drop 'nodes' to serve on this host alone"),
    "a host twice": (_bad(llama(nodes=["gpu-a", "gpu-b", "gpu-a"])), "nodes lists gpu-a more than once",
                     "list each host once"),
    "not a list": (_bad(llama(nodes="gpu-a,gpu-b")), "nodes must be a list of inventory host names",
                   "nodes = ['gpu-a', 'gpu-b']"),
    "declared on a host not in nodes": (
        _bad(llama(nodes=["gpu-b", "gpu-c"])),
        "host gpu-a, instance llama70b, key nodes: this host is not one of the instance's nodes",
        "declare the instance on its head gpu-b"),
    "declared on a non-head node only": (
        [("gpu-a", node("10.0.0.1")), ("gpu-b", node("10.0.0.2", instances=[llama()]))],
        "host gpu-b, instance llama70b, key nodes: multi-node instance llama70b is declared on node gpu-b, "
        "but its head gpu-a does not declare it", "declare it once, on its head gpu-a"),
    "repeated differently on a node": (
        _bad(b={"vllm_instances": [llama(max_model_len=4096)]}),
        "declared on node gpu-b, but differs from the head's declaration", "the other nodes need not repeat it"),
    "also declared on a node as its own": (
        _bad(b={"vllm_instances": [llama(nodes=None)]}),
        "host gpu-b, instance llama70b, key nodes: instance llama70b is also declared on node gpu-b of its "
        "node group", "remove it from gpu-b"),
    "a cpu node": (_bad(b={"vllm_target": "cpu", "gpus": None}),
                   "node gpu-b has vllm_target 'cpu'", "set vllm_target = 'cuda' on gpu-b"),
    "no private interface": (
        _bad(b={"vllm_private_interface": None}),
        "key vllm_private_interface: node gpu-b has no vllm_private_interface: vLLM's security guide",
        "set vllm_private_interface on gpu-b"),
    "interfaces differ": (_bad(b={"vllm_private_interface": "ens5"}),
                          "node gpu-b has vllm_private_interface 'ens5' but the head gpu-a has 'eth1'",
                          "set vllm_private_interface = 'eth1' on every node"),
    "ray versions differ": (_bad(b={"vllm_ray_version": "2.48.0"}), "Ray refuses nodes of another Ray",
                            "set vllm_ray_version = '2.60.0'"),
    "a node in two groups": (
        _bad(extra=[("gpu-c", node("10.0.0.3", instances=[llama(name="other", nodes=["gpu-c", "gpu-b"],
                                                                 port=8100)]))]),
        "host gpu-c, instance other, key nodes: node gpu-b is already in the node group of instance llama70b",
        "give each multi-node instance its own hosts"),
    "data parallel": (_bad(llama(data_parallel_size=2)), "a multi-node instance is one replica",
                      "drop data_parallel_size"),
    "nodes give different GPU counts": (
        _bad(b={"gpus": [A100_40G] * 8}), "the nodes give different numbers of GPUs (gpu-a: 4, gpu-b: 8)",
        "gpus = [0, 1, 2, 3]"),
    "mixed GPU models inside a node": (
        _bad(b={"gpus": [RTX_4090D] + [A100_40G] * 3}), "node gpu-b would put 1xRTX 4090 D, 3xA100-SXM4-40GB "
        "in one TP group", "indices of one GPU model on every node"),
    "TP does not divide the heads": (
        _bad(llama(gpus=[0, 1, 2])), "Total number of attention heads (64) must be divisible by tensor "
        "parallel size (3).", "a number of GPUs per node that vLLM accepts"),
    "a fixed TP the nodes do not make": (
        _bad(llama(tensor_parallel_size=8)), "tensor_parallel_size 8 but a multi-node instance has "
        "tensor_parallel_size = the GPUs of each node = 4", "drop tensor_parallel_size"),
    "a GPU index a node lacks": (
        _bad(llama(gpus=[4, 5, 6, 7]), a={"gpus": [A100_40G] * 8}), "GPU index 4 does not exist on node gpu-b",
        "list indices every node has"),
    "the ray port is an instance port": (
        _bad(a={"vllm_ray_port": 8000}), "vllm_ray_port 8000 is the port of instance llama70b",
        "pick a vllm_ray_port"),
    "a bad interface name": (_bad(a={"vllm_private_interface": "eth 1; rm"}),
                             "key vllm_private_interface: 'eth 1; rm' is not a network interface name",
                             "vllm_private_interface = 'eth1'"),
    "an engine_args backend that contradicts": (
        _bad(llama(engine_args={"distributed-executor-backend": "mp"})),
        "engine_args sets 'distributed-executor-backend' to 'mp', but the planner sets "
        "distributed-executor-backend = 'ray'", "remove 'distributed-executor-backend' from engine_args"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_nodes_inputs_are_located_errors_with_a_fix(case):
    hosts_data, message, fix = BAD[case]
    text = fleet_error_text(hosts_data)
    assert message in text, text
    assert fix in text.split(message, 1)[1].split("\nerror:")[0], text


# --- rendering ----------------------------------------------------------------------------------

def _exec_start(unit: str) -> str:
    return next(line for line in unit.splitlines() if line.startswith("ExecStart="))


def _environment(unit: str) -> dict[str, str]:
    pairs = [line.removeprefix('Environment="').rstrip('"') for line in unit.splitlines()
             if line.startswith("Environment=")]
    return dict(p.split("=", 1) for p in pairs)


def test_render_the_head_gets_vllm_on_ray_and_the_ray_head_unit():
    hosts = two_servers(b={"gpus": [H100_80G] * 4})
    files = rendered_fleet(hosts)["gpu-a"]
    prefix = environment_prefix(hosts[0], environment_spec(hosts[0], plan_fleet(hosts).hosts[0]))
    engine = yaml.safe_load(files["/etc/vllm-fleet/llama70b.yaml"])
    assert engine["distributed-executor-backend"] == "ray"
    assert (engine["tensor-parallel-size"], engine["pipeline-parallel-size"]) == (4, 2)
    unit = files["/etc/systemd/system/vllm-llama70b.service"]
    env = _environment(unit)
    assert env["VLLM_HOST_IP"] == "10.0.0.1" and env["RAY_ADDRESS"] == "10.0.0.1:6379"
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "eth1"
    assert sum(map(int, env["VLLM_PP_LAYER_PARTITION"].split(","))) == 80  # the nodes differ
    assert f"Requires={RAY_UNIT}" in unit and f"After={RAY_UNIT}" in unit
    ray = files[f"/etc/systemd/system/{RAY_UNIT}"]
    assert _exec_start(ray) == (
        f"ExecStart={prefix}/bin/ray start --head --block --node-ip-address 10.0.0.1 --port 6379 --num-gpus 4 "
        "--object-store-memory 2147483648 --temp-dir /var/lib/vllm-fleet/ray "
        "--object-spilling-directory /var/lib/vllm-fleet/ray-spill --dashboard-host 127.0.0.1 "
        "--include-dashboard=false --disable-usage-stats")
    ray_env = _environment(ray)
    assert ray_env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3" and ray_env["VLLM_HOST_IP"] == "10.0.0.1"
    assert ray_env["RAY_TMPDIR"] == "/var/lib/vllm-fleet" and ray_env["HF_HUB_OFFLINE"] == "1"
    manifest = json.loads(files["/etc/vllm-fleet/manifest.json"])
    assert manifest["ray"]["role"] == "head" and manifest["ray"]["unit"] == RAY_UNIT
    assert manifest["instances"]["llama70b"]["nodes"] == ["gpu-a", "gpu-b"]


def test_render_the_worker_gets_only_a_ray_worker_unit_with_the_same_hardening():
    files = rendered_fleet(two_servers())
    worker = files["gpu-b"]
    assert not any(p.endswith("llama70b.service") or "front" in p for p in worker)
    ray = worker[f"/etc/systemd/system/{RAY_UNIT}"]
    start = _exec_start(ray)
    assert "/bin/ray start --address 10.0.0.1:6379 --block --node-ip-address 10.0.0.2 --num-gpus 4 " in start
    assert "--dashboard" not in start and "--head" not in start
    assert _environment(ray)["VLLM_HOST_IP"] == "10.0.0.2"
    assert "User=vllm" in ray and "SuccessExitStatus=1" in ray and "KillMode=mixed" in ray
    vllm_unit = files["gpu-a"]["/etc/systemd/system/vllm-llama70b.service"]
    hardening = [line for line in vllm_unit.splitlines() if line.split("=")[0] in (
        "NoNewPrivileges", "ProtectSystem", "ProtectHome", "ReadWritePaths", "PrivateTmp",
        "RestrictSUIDSGID", "LockPersonality", "LimitNOFILE")]
    assert len(hardening) == 8 and all(line in ray.splitlines() for line in hardening)


def test_every_node_gets_the_same_environment_with_ray_pinned():
    hosts = two_servers()
    plan = plan_fleet(hosts)
    specs = [environment_spec(h, p) for h, p in zip(hosts, plan.hosts, strict=True)]
    assert all("ray==2.60.0" in s.packages() for s in specs)
    assert environment_prefix(hosts[0], specs[0]) == environment_prefix(hosts[1], specs[1])
    bumped = two_servers(a={"vllm_ray_version": "2.61.0"}, b={"vllm_ray_version": "2.61.0"})
    assert "ray==2.61.0" in environment_spec(bumped[1], plan_fleet(bumped).hosts[1]).packages()


# --- the commands, on an inventory file ------------------------------------------------------------

INVENTORY = textwrap.dedent("""
    A100 = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}
    llama = {"name": "llama70b", "model": "meta-llama/Meta-Llama-3-70B-Instruct",
             "served_model_name": "llama-3-70b", "port": 8000, "nodes": ["gpu-a", "gpu-b"]}
    common = {"gpus": [A100] * 4, "vllm_private_interface": "eth1"}
    gpu_servers = [
        ("gpu-a", {**common, "ssh_hostname": "10.0.0.1", "vllm_instances": [llama]}),
        ("gpu-b", {**common, "ssh_hostname": "10.0.0.2"}),
        ("gpu-c", {**common, "ssh_hostname": "10.0.0.3"}),
    ]
""")


def test_plan_json_shows_the_instance_under_its_head_with_every_nodes_gpus(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY)
    result = run_cli("plan", "inv.py", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    hosts = {h["name"]: h for h in json.loads(result.stdout)["hosts"]}
    (inst,) = hosts["gpu-a"]["instances"]
    assert inst["nodes"] == ["gpu-a", "gpu-b"]
    assert (inst["tensor_parallel_size"], inst["pipeline_parallel_size"]) == (4, 2)
    assert [(g["host"], g["index"], g["stage"]) for g in inst["per_gpu"]] == (
        [("gpu-a", i, 0) for i in range(4)] + [("gpu-b", i, 1) for i in range(4)])
    assert all(g["weights_gib"] > 0 and g["kv_cache_gib"] > 0 for g in inst["per_gpu"])
    assert hosts["gpu-b"]["instances"] == [] and hosts["gpu-b"]["ray"]["role"] == "worker"
    assert hosts["gpu-a"]["ray"]["head_address"] == "10.0.0.1:6379" and hosts["gpu-c"]["ray"] is None


def test_plan_text_shows_the_node_group_per_gpu(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY)
    result = run_cli("plan", "inv.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "gpu-a:0,1,2,3 gpu-b:0,1,2,3" in text and "4/2/1" in text
    assert "gpu-b:3 A100-SXM4-40GB:" in text
    assert "node group gpu-a, gpu-b: Ray worker of instance llama70b (planned under its head gpu-a)" in text


def test_a_limit_to_one_node_loads_its_whole_group(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY)
    assert [h.name for h in load_fleet(tmp_path / "inv.py", limit=["gpu-b"], cwd=tmp_path)] == ["gpu-a", "gpu-b"]
    assert [h.name for h in load_fleet(tmp_path / "inv.py", limit=["gpu-c"], cwd=tmp_path)] == ["gpu-c"]
    result = run_cli("plan", "inv.py", "--json", "--limit", "gpu-a", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [h["name"] for h in json.loads(result.stdout)["hosts"]] == ["gpu-a", "gpu-b"]


def test_render_writes_the_ray_units_offline(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY)
    result = run_cli("render", "inv.py", "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for host in ("gpu-a", "gpu-b"):
        assert (tmp_path / "out" / host / "etc/systemd/system" / RAY_UNIT).is_file()
    assert not (tmp_path / "out/gpu-c/etc/systemd/system" / RAY_UNIT).exists()
    assert (tmp_path / "out/gpu-a/etc/systemd/system/vllm-llama70b.service").is_file()
    assert not (tmp_path / "out/gpu-b/etc/systemd/system/vllm-llama70b.service").exists()


def test_plan_of_a_bad_node_exits_2(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY.replace('"nodes": ["gpu-a", "gpu-b"]', '"nodes": ["gpu-a", "gpu-x"]'))
    result = run_cli("plan", "inv.py", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "node 'gpu-x' is not a host of the inventory" in result.stderr
