"""The Fleet value (vllm_fleet/fleet.py): the inventory read once, every host parsed once with its
errors kept, --limit widened to node groups, the gateway planned from every host, and one host
prepared as the deploy and `vllm-fleet status` prepare it. No host is reached."""

from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace

import pytest

from support.planning_fixtures import A100_40G, host_data, instance, llama, node
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


@pytest.fixture
def parsed(monkeypatch) -> list[str]:
    """The names of the hosts parse_host parsed, in order, wherever the fleet or the deploy's state
    call it (each test says how many times a host may be parsed)."""
    from vllm_fleet.deploy import state as state_module

    names: list[str] = []
    real_parse = fleet_module.parse_host

    def counting(name, data):
        names.append(name)
        return real_parse(name, data)

    monkeypatch.setattr(fleet_module, "parse_host", counting)
    monkeypatch.setattr(state_module, "parse_host", counting)
    return names


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


def test_status_reads_the_inventory_once(tmp_path, monkeypatch, parsed):
    """Once for the hosts' data and the connections both: the fleet's pyinfra Inventory is what
    `connected` gets, and neither loader runs a second time; each host's data is parsed once."""
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
        in_order = SimpleNamespace(map=lambda fn, items: [fn(i) for i in items])
        yield SimpleNamespace(pool=in_order), {n: None for n in names}

    monkeypatch.setattr(connection, "connected", unreachable)
    monkeypatch.chdir(tmp_path)
    report, gateways, ray, _usage = status.collect("inv.py", ["cpu2"])
    assert [h["name"] for h in report] == ["cpu2"] and not report[0]["reachable"]
    assert len(reads) == 1 and given == [reads[0]] and (gateways, ray) == ([], [])
    assert parsed == ["cpu1", "cpu2"]  # each host once (a node's group needs the others)


def test_status_probes_every_host_at_once_and_reports_them_in_inventory_order(tmp_path, monkeypatch):
    """Each host's probe waits on the network: status runs them side by side in pyinfra's greenlet
    pool, so a fleet costs about one host's time, not the sum; the report keeps the inventory's order."""
    from contextlib import contextmanager

    import gevent
    from gevent.pool import Pool

    from vllm_fleet.commands import connection, status

    names = [f"cpu{i}" for i in range(1, 7)]
    (tmp_path / "inv.py").write_text("hosts = " + repr([(n, {"vllm_target": "cpu"}) for n in names]) + "\n")

    @contextmanager
    def reachable(inventory, hosts, **_kw):
        yield SimpleNamespace(pool=Pool(len(hosts))), {n: SimpleNamespace(name=n) for n in hosts}

    running, most = [0], [0]

    def probe(name, host, config, fleet):
        running[0] += 1
        most[0] = max(most[0], running[0])
        gevent.sleep(0.05 * (7 - int(name[-1])))  # the first host answers last
        running[0] -= 1
        return {"name": name}

    monkeypatch.setattr(connection, "connected", reachable)
    monkeypatch.setattr(status, "host_status", probe)
    monkeypatch.chdir(tmp_path)
    report, _gateways, _ray, _usage = status.collect("inv.py", None)
    assert [h["name"] for h in report] == names
    assert most[0] == len(names)


def test_the_deploys_pyinfra_inventory_makes_the_same_fleet():
    """The deploy's Fleet (deploy.state.run_fleet): every host of the run's State, parsed once, and
    the same Fleet for every host of that run."""
    import gc
    import weakref
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


# --- parsed once: a host's data parsed again only where it changed -----------------------------------

@pytest.mark.parametrize("inventory", ["prod.py", "multinode.py", "sandbox.py"])
def test_a_knob_at_its_default_parses_as_a_knob_left_out(inventory):
    """What lets the deploy take its own host's config from the run's Fleet (Fleet.parsed_config):
    inside the deploy, pyinfra puts the deploy's data_defaults (every knob's default) under the
    inventory's values, and that data parses as the data read outside it, errors and all."""
    from support.fleet_helpers import REPO
    from vllm_fleet.config import inventory_rows, parse_host, read_pyinfra_inventory
    from vllm_fleet.deploy import vllm_fleet_deploy
    from vllm_fleet.config import Settings

    assert vllm_fleet_deploy._inner.deploy_data == Settings.defaults()
    rows = inventory_rows(read_pyinfra_inventory(REPO / "inventory" / inventory, cwd=REPO))
    for name, data, _groups in rows:
        assert parse_host(name, {**Settings.defaults(), **data}) == parse_host(name, data), name
    # An unknown knob, a wrong type and a bad instance; a control character (checked first, alone).
    for broken in ({**rows[0][1], **BROKEN, "vllm_gpu_memory_utilisation": 0.9, "vllm_root": 5},
                   {**rows[0][1], "vllm_root": "/srv/\nx"}):
        errors = []
        for data in (broken, {**Settings.defaults(), **broken}):
            with pytest.raises(ConfigErrors) as info:
                parse_host("box", data)
            errors.append([e.located() for e in info.value.errors])
        assert errors[0] == errors[1] and errors[0]


def test_a_fleet_read_again_parses_only_the_hosts_whose_data_changed(parsed):
    before = Fleet.from_rows(gateway_rows(third=BROKEN), ["h2"])
    assert parsed == ["h1", "h2", "h3"]
    parsed.clear()
    rows = gateway_rows(third=BROKEN)
    rows[1] = ("h2", {**rows[1][1], "vllm_verify": False}, rows[1][2])
    again = Fleet.from_rows(rows, parsed=before)
    assert parsed == ["h2"]  # h1 unchanged, h3 unchanged and still broken: their parse is kept
    assert again.configs["h1"] is before.configs["h1"] and again.errors["h3"] is before.errors["h3"]
    assert again.configs["h2"].settings.vllm_verify is False and again.matched == ("h1", "h2", "h3")
    # The deploy's own host: its data with the deploy's data defaults under it is the data parsed.
    from vllm_fleet.config import Settings

    assert again.parsed_config("h1", {**Settings.defaults(), **rows[0][1]}) is again.configs["h1"]
    assert again.parsed_config("h1", {**rows[0][1], "vllm_verify": False}) is None  # changed since
    assert again.parsed_config("h3", rows[2][1]) is None  # broken: its caller parses it, for its errors


def test_data_changed_in_place_or_only_in_its_type_is_parsed_again():
    """A deploy file may edit host.data's lists in place, after the Fleet read them: that host's parse
    is not reused (it would silently keep the old config); nor is it where True became 1."""
    rows = gateway_rows()
    fleet = Fleet.from_rows(rows)
    name, data, _groups = rows[1]
    assert fleet.parsed_config(name, data) is fleet.configs[name]
    data["vllm_instances"][0]["port"] = "not-a-port"  # in place: the Fleet's own copy, were it kept
    assert fleet.parsed_config(name, data) is None
    with pytest.raises(ConfigErrors):
        fleet_module.parse_host(name, data)
    flag = dict(rows[0][1], vllm_verify=True)
    flagged = Fleet.from_rows([(rows[0][0], flag, rows[0][2])])
    assert flagged.parsed_config(rows[0][0], dict(flag, vllm_verify=1)) is None


def test_the_deploy_parses_its_own_host_once_with_the_fleet_and_again_only_if_its_data_changed(parsed):
    """deploy.state.host_config: the run's Fleet's parse of the current host; a host whose data
    a deploy file changed before the deploy ran (host.data.x = ...) is parsed from what it is now."""
    from vllm_fleet.deploy import state as state_module
    from vllm_fleet.config import Settings

    rows = gateway_rows()
    inventory = [SimpleNamespace(name=name, data=SimpleNamespace(dict=lambda data=data: data), groups=groups)
                 for name, data, groups in rows]

    class RunState:
        pass

    state = RunState()
    state.inventory = inventory

    def in_its_deploy(name, **changed):  # host.data as the deploy reads it: the deploy's data defaults under it
        data = {**Settings.defaults(), **{n: d for n, d, _g in rows}[name], **changed}
        return SimpleNamespace(name=name, state=state, data=SimpleNamespace(dict=lambda: data))

    configs = [state_module.host_config(in_its_deploy(name)) for name, _d, _g in rows]
    assert parsed == ["h1", "h2", "h3"] and configs == [state_module.run_fleet(state).configs[n] for n in parsed]
    parsed.clear()
    assert state_module.host_config(in_its_deploy("h2", vllm_verify=False)).settings.vllm_verify is False
    assert parsed == ["h2"]


def test_rollout_parses_each_host_once_not_once_a_batch(tmp_path, monkeypatch, capsys, parsed):
    """Every host is parsed before the first batch; each batch's run (a State of its own over the
    inventory read again, as pyinfra's Hosts keep one run's state) keeps that parse for the run's
    Fleet and for each host's own config, rather than parsing the whole fleet once a batch."""
    import vllm_fleet.commands.connection as connection

    connection.install()  # first: gevent patched before pyinfra_cli is imported

    import pyinfra.api.operations
    import pyinfra_cli.util

    from support.rollout_stubs import ROLLOUT_KEY, RolloutState, rollout_inventory
    from vllm_fleet.commands import rollout
    from vllm_fleet.config import read_pyinfra_inventory
    from vllm_fleet.deploy import state as state_module
    from vllm_fleet.connect import remote
    from vllm_fleet.config import Settings

    reads = []

    @contextmanager
    def connected(inventory, names, **_kw):  # as connection.connected does: the file read for each batch
        state = RolloutState()
        state.inventory = read_pyinfra_inventory(inventory)
        reads.append(names)
        yield state, {h.name: h for h in state.inventory if h.name in names}

    def deploy(state, _function, options):  # what the deploy asks of the run on each host of its batch
        for name in options.limit:
            data = {**Settings.defaults(), **state.inventory.get_host(name).data.dict()}
            its_host = SimpleNamespace(name=name, state=state, data=SimpleNamespace(dict=lambda data=data: data))
            state_module.host_config(its_host)
        state_module.run_fleet(state).every()

    monkeypatch.setenv("VLLM_FLEET_API_KEY", ROLLOUT_KEY)
    monkeypatch.setattr(connection, "connected", connected)
    monkeypatch.setattr(remote, "run", lambda *_a, **_k: (True, "{}", ""))
    monkeypatch.setattr(pyinfra_cli.util, "load_func", deploy)
    monkeypatch.setattr(pyinfra.api.operations, "run_ops", lambda _state: None)
    code = rollout.main([rollout_inventory(tmp_path, ("box1", "box2", "box3")), "--json", "--batch", "1"])
    capsys.readouterr()
    assert code == 0 and reads == [["box1"], ["box2"], ["box3"]]
    assert parsed == ["box1", "box2", "box3"]


def test_unlock_reads_the_inventory_once_and_names_a_host_whose_data_does_not_parse(tmp_path, monkeypatch, capsys):
    from vllm_fleet.commands import connection, unlock

    (tmp_path / "inv.py").write_text("hosts = [('cpu1', {'vllm_target': 'cpu'}), ('bad', {'vllm_target': 'gpu'})]\n")
    reads = []
    real = unlock.read_pyinfra_inventory
    monkeypatch.setattr(unlock, "read_pyinfra_inventory", lambda *a, **k: reads.append(real(*a, **k)) or reads[-1])
    monkeypatch.setattr(connection, "load_pyinfra_inventory", lambda *a, **k: pytest.fail("read again"))
    given = []

    @contextmanager
    def unreachable(inventory, names, **_kw):
        given.append((inventory, names))
        yield None, {n: None for n in names}

    monkeypatch.setattr(connection, "connected", unreachable)
    monkeypatch.chdir(tmp_path)
    assert unlock.main(["inv.py", "--limit", "bad"]) == 1
    assert len(reads) == 1 and given == [(reads[0], ["bad"])]
    assert "bad: unreachable over SSH" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="--limit nobody matches no host in 'inv.py'"):
        unlock.main(["inv.py", "--limit", "nobody"])
