"""The Fleet value (vllm_fleet/fleet.py): the inventory read once, every host parsed once with its
errors kept, --limit widened to node groups, the gateway planned from every host, and one host
prepared as the deploy and `vllm-fleet status` prepare it. No host is reached."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace

import pytest

from planning_fixtures import A100_40G, host_data, instance
from test_multinode_plan import llama, node
from vllm_fleet import fleet as fleet_module
from vllm_fleet.config import ConfigError, ConfigErrors
from vllm_fleet.fleet import Fleet, GatewayUnplanned
from vllm_fleet.gateway import gateway_paths
from vllm_fleet.plan import plan_host
from vllm_fleet.prepared import Discovered

BROKEN = {"vllm_instances": [{"name": "bad", "model": "m", "port": "eighty"}]}


def gateway_rows(third: dict | None = None) -> list:
    """Three 2x A100 servers serving one model; h1 is the fleet's gateway."""
    def server(address: str, **settings) -> dict:
        return host_data(gpus=[A100_40G] * 2, ssh_hostname=address, **settings)

    return [("h1", server("10.0.0.1", vllm_gateway=True), ["gpu"]), ("h2", server("10.0.0.2"), ["gpu"]),
            ("h3", third if third is not None else server("10.0.0.3"), ["gpu", "spare"])]


def node_rows() -> list:
    return [("gpu-a", node("10.0.0.1", instances=[llama()]), []), ("gpu-b", node("10.0.0.2"), []),
            ("gpu-c", node("10.0.0.3"), [])]


def test_every_host_is_parsed_once_and_a_broken_one_keeps_its_errors():
    fleet = Fleet.from_rows(gateway_rows(third=BROKEN), limit=["h2"])
    assert set(fleet.configs) == {"h1", "h2"} and set(fleet.errors) == {"h3"}
    [error] = [e for e in fleet.errors["h3"].errors if e.key == "port"]
    assert (error.host, error.instance) == ("h3", "bad") and error.fix
    assert [h.name for h in fleet.hosts()] == ["h2"]  # outside the limit: not this run's to report
    with pytest.raises(ConfigErrors) as info:
        Fleet.from_rows(gateway_rows(third=BROKEN), limit=["spare"]).hosts()
    assert "host h3, instance bad, key port" in str(info.value)


def test_load_reads_the_inventory_file_once(tmp_path, monkeypatch):
    (tmp_path / "inv.py").write_text(f"gpu = {[(name, data) for name, data, _g in gateway_rows()[:2]]!r}\n")
    calls = []
    real = fleet_module.read_pyinfra_inventory
    monkeypatch.setattr(fleet_module, "read_pyinfra_inventory",
                        lambda *a, **k: calls.append(real(*a, **k)) or calls[-1])
    fleet = Fleet.load(tmp_path / "inv.py", ["h2"], cwd=tmp_path)
    assert fleet.names == ("h1", "h2") and fleet.matched == ("h2",) and len(calls) == 1
    assert [b.host for b in fleet.gateway_backends()] == ["h1", "h2"] and len(calls) == 1
    # The commands that connect (status) take pyinfra's Inventory from the fleet, not from the file.
    assert fleet.pyinfra_inventory is calls[0] and [h.name for h in fleet.pyinfra_inventory] == ["h1", "h2"]


def test_a_limit_matches_hosts_or_groups_and_nothing_is_an_error():
    assert Fleet.from_rows(gateway_rows(), ["spare"]).matched == ("h3",)
    assert Fleet.from_rows(gateway_rows(), ["gpu"]).matched == ("h1", "h2", "h3")
    with pytest.raises(ConfigError, match="--limit nope matches no host in 'the inventory'"):
        Fleet.from_rows(gateway_rows(), ["nope"])


def test_a_limit_widens_to_the_other_nodes_of_its_node_group_only():
    fleet = Fleet.from_rows(node_rows(), ["gpu-b"])
    assert fleet.matched == ("gpu-b",) and fleet.selected == ("gpu-a", "gpu-b")
    assert [h.name for h in fleet.plan().hosts] == ["gpu-a", "gpu-b"]
    assert Fleet.from_rows(node_rows(), ["gpu-c"]).selected == ("gpu-c",)
    assert [g.nodes for g in fleet.node_groups()] == [("gpu-a", "gpu-b")]


def test_the_gateway_backends_are_the_whole_fleets_whatever_the_limit():
    fleet = Fleet.from_rows(gateway_rows(), ["h2"])
    assert fleet.gateway().name == "h1"
    backends = fleet.gateway_backends()
    assert [(b.host, b.url) for b in backends] == [("h1", "http://10.0.0.1:8000"), ("h2", "http://10.0.0.2:8000"),
                                                  ("h3", "http://10.0.0.3:8000")]
    without = Fleet.from_rows([(n, {**d, "vllm_gateway": False}, g) for n, d, g in gateway_rows()], ["h2"])
    assert without.gateway() is None and without.gateway_backends() == []


def test_the_gateway_stops_on_a_host_that_does_not_parse_or_cannot_be_planned():
    with pytest.raises(ConfigErrors) as info:  # the deploy on the gateway host: the broken host's own errors
        Fleet.from_rows(gateway_rows(third=BROKEN), ["h1"]).gateway_backends()
    assert "host h3, instance bad" in str(info.value) and not isinstance(info.value, GatewayUnplanned)
    too_big = host_data(ssh_hostname="10.0.0.3", gpus=[{"name": "Tesla T4", "memory_mib": 15360}],
                        instances=[instance(model="meta-llama/Meta-Llama-3-70B-Instruct", tokenizer=None,
                                            served_model_name="llama-3-70b")])
    with pytest.raises(GatewayUnplanned) as info:
        Fleet.from_rows(gateway_rows(third=too_big), ["h1"]).gateway_backends()
    assert any(e.host == "h3" for e in info.value.errors)


def test_the_preparing_host_brings_its_own_config_and_live_plan():
    """The deploy on the gateway host: this host as discovery filled it in and planned from its live
    GPUs, the others from their declared data."""
    fleet = Fleet.from_rows(gateway_rows(), ["h1"])
    own = fleet.configs["h1"]
    own = replace(own, settings=replace(own.settings, vllm_advertise_address="10.9.9.1"))
    plan = plan_host(own)
    assert [b.url for b in fleet.gateway_backends(own, plan)][0] == "http://10.9.9.1:8000"
    assert [b.host for b in fleet.gateway_backends(own, replace(plan, instances=[]))] == ["h2", "h3"]


def test_a_possible_node_is_refused_while_another_hosts_data_does_not_parse():
    """The deploy on a host that may be a node: the host that does not parse may be its head."""
    rows = node_rows()[1:] + [("gpu-x", BROKEN, [])]
    fleet = Fleet.from_rows(rows)
    with pytest.raises(ConfigErrors) as info:
        fleet.node_group_configs(fleet.configs["gpu-b"])
    [error] = info.value.errors
    assert (error.host, error.key) == ("gpu-b", "nodes")
    assert "host gpu-x's data does not parse, so whether gpu-b is a node" in error.message
    assert "fix gpu-x's host data" in error.fix
    plain = Fleet.from_rows([("cpu", {"vllm_target": "cpu"}, []), ("gpu-x", BROKEN, [])])
    assert set(plain.node_group_configs(plain.configs["cpu"])) == {"cpu"}


def test_prepare_gives_the_gateway_host_the_fleets_backends_and_drift_none():
    fleet = Fleet.from_rows(gateway_rows(), ["h1"])
    found = Discovered(fleet.configs["h1"], None, None, None)
    prepared = fleet.prepare(found)
    workers = json.loads(prepared.files[gateway_paths(found.config)["workers"]].content)
    assert [w["host"] for w in workers] == ["h1", "h2", "h3"] and prepared.node_groups is None
    assert fleet.prepare_for_drift(found).backends == []
    # The instances' files, which status compares, are the deploy's.
    assert fleet.prepare_for_drift(found).instance_file("gemma", "unit") == prepared.instance_file("gemma", "unit")


def test_prepare_plans_a_node_with_its_group():
    fleet = Fleet.from_rows(node_rows(), ["gpu-b"])
    config = fleet.configs["gpu-b"]
    prepared = fleet.prepare(Discovered(config, config.gpus, None, None, ("10.0.0.2",)))
    [group] = prepared.node_groups
    assert group.group.head == "gpu-a" and not group.roles["gpu-b"].is_head
    assert prepared.plan.ray.head_address == "10.0.0.1:6379"


def test_status_reads_the_inventory_once(tmp_path, monkeypatch):
    """Once for the hosts' data and the connections both: the fleet's pyinfra Inventory is what
    `connected` gets, and neither loader runs a second time."""
    from vllm_fleet.commands import connection, status

    (tmp_path / "inv.py").write_text("hosts = [('cpu1', {'vllm_target': 'cpu'}), ('cpu2', {'vllm_target': 'cpu'})]\n")
    reads = []
    real = fleet_module.read_pyinfra_inventory
    monkeypatch.setattr(fleet_module, "read_pyinfra_inventory", lambda *a, **k: reads.append(real(*a, **k)) or reads[-1])
    monkeypatch.setattr(connection, "load_pyinfra_inventory", lambda *a, **k: reads.append(a) or pytest.fail("read again"))
    given = []

    @contextmanager
    def unreachable(inventory, names, **_kw):
        given.append(inventory)
        yield None, {n: None for n in names}

    monkeypatch.setattr(connection, "connected", unreachable)
    monkeypatch.chdir(tmp_path)
    report, gateways, ray = status.collect("inv.py", ["cpu2"])
    assert [h["name"] for h in report] == ["cpu2"] and not report[0]["reachable"]
    assert len(reads) == 1 and given == [reads[0]] and (gateways, ray) == ([], [])


def test_the_deploys_pyinfra_inventory_makes_the_same_fleet():
    """The deploy's Fleet (deploy.state.run_fleet): every host of the run's State, parsed once, and
    the same Fleet for every host of that run."""
    import gc
    import weakref
    from types import SimpleNamespace

    from vllm_fleet.deploy.state import run_fleet

    hosts = [SimpleNamespace(name=name, data=SimpleNamespace(dict=lambda data=data: data), groups=groups)
             for name, data, groups in gateway_rows(third=BROKEN)]
    fleet = Fleet.from_pyinfra(hosts)
    assert fleet.names == ("h1", "h2", "h3") and set(fleet.configs) == {"h1", "h2"} and set(fleet.errors) == {"h3"}
    assert Fleet.from_pyinfra(hosts, ["spare"]).matched == ("h3",)
    class RunState:  # what run_fleet reads of pyinfra's State (weakly referenced, as a State is)
        inventory = hosts

    def one_run():  # the run's State lives only in here
        state = RunState()
        first = run_fleet(state)
        return weakref.ref(state), run_fleet(state) is first, first.names, set(first.errors)

    run_state, same, names, broken = one_run()
    assert same and names == fleet.names and broken == {"h3"}
    gc.collect()
    assert run_state() is None  # the run's cache does not keep a finished run alive
