"""A deploy that changes nothing costs a fixed handful of remote commands per host.

- The facts' shell code runs for real in tests/facts/test_fact_shell_code.py (what each command
  prints and what its `process` reads agree, alone and inside one batch).
- The operations yield nothing when the host matches and exactly the fix when it differs: that is
  their cases, tests/operations/<module>.<operation>/*.json (what --diff shows too: a changed
  file, never a secret); whose service account may be taken: tests/rules/test_ownership.py.
- The real deploy.py runs through pyinfra (prepare, then execute, as the CLI does) against pyinfra's
  @fake connector, answered by a simulated converged host: every remote command is counted. A
  converged host costs exactly what deploy.py's docstring lists; a changed engine config costs its
  upload and the instance's restart, nothing else. What the memo of a host relies on (one writer
  per path, the lock before the first read): tests/deploy/test_deploy_lock_and_writers.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support.planning_fixtures import TINY_MODEL_INFO
from support.simulated_host import TINY_CONFIG, SimulatedHost, command_kinds, run_deploy
from vllm_fleet.deploy.prepare import prepare
from vllm_fleet.facts import batch as facts
from vllm_fleet.facts import gpus as gpu_facts
from vllm_fleet.facts import host as host_facts
from vllm_fleet.facts import state as state_facts
from vllm_fleet.facts.state import FileState, UnitState
from vllm_fleet.payloads.probe.host import RESULT_PREFIX

REPO = Path(__file__).resolve().parents[2]


def _fact_class(name: str) -> type:
    """The fact class of that name, from the module of facts that defines it."""
    return next(getattr(module, name) for module in (gpu_facts, host_facts, state_facts) if hasattr(module, name))


# --- the whole deploy.py through pyinfra, against a simulated converged host -------------------------

@pytest.fixture
def model_dir(tmp_path):
    src = tmp_path / "models" / "box"
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_text(json.dumps(TINY_CONFIG))
    (src / "model.safetensors").write_bytes(os.urandom(3000))
    (src / "tokenizer" / "tokenizer.json").write_text("{}")
    return src


@pytest.mark.parametrize("check_for_changes", [True, False], ids=["pyinfra", "pyinfra -y"])
def test_a_converged_host_costs_a_fixed_handful_of_commands(tmp_path, monkeypatch, model_dir, check_for_changes):
    """With and without pyinfra's planning pass (`-y` runs each operation's body only to execute
    it): the model sync read its state again there, one command more per host, on the CLI only."""
    from vllm_fleet.commands.rollout import changed_operations

    worlds = {"gw": SimulatedHost(), "box": SimulatedHost(model_source=model_dir)}
    commands, uploads, state = run_deploy(tmp_path, monkeypatch, worlds, check_for_changes)
    # As deploy.py's docstring says (the deploy lock's channel is SSH's alone: @fake has none); the
    # gateway host's router kept running, so its check rides with the instances' verification.
    assert command_kinds(commands["box"]) == ["access check", "facts", "facts", "verify"]
    assert command_kinds(commands["gw"]) == ["access check", "facts", "facts", "verify with gateway"]
    assert uploads == {}
    for host in state.inventory:
        assert changed_operations(state, host) == [], host.name


def _counting_parses(monkeypatch) -> tuple[list[str], list[int]]:
    """(the host names parse_host was called for, one entry per Fleet built from rows), as they happen."""
    from vllm_fleet import fleet as fleet_module
    from vllm_fleet.deploy import state as state_module

    parsed: list[str] = []
    fleets: list[int] = []
    parse_host, from_rows = fleet_module.parse_host, fleet_module.Fleet.from_rows.__func__

    def counting_parse(name, data):
        parsed.append(name.removeprefix("@fake/"))
        return parse_host(name, data)

    def counting_from_rows(cls, *args, **kwargs):
        fleets.append(1)
        return from_rows(cls, *args, **kwargs)

    monkeypatch.setattr(fleet_module, "parse_host", counting_parse)
    monkeypatch.setattr(state_module, "parse_host", counting_parse)
    monkeypatch.setattr(fleet_module.Fleet, "from_rows", classmethod(counting_from_rows))
    return parsed, fleets


def test_a_runs_fleet_is_parsed_once_however_many_hosts_run_the_deploy(tmp_path, monkeypatch):
    """pyinfra runs the deploy once per host; every host's data is parsed once per run (the run's
    Fleet, deploy/state.py run_fleet), each host's own config taken from that parse, not parsed a
    second time by its own deploy."""
    parsed, fleets = _counting_parses(monkeypatch)
    worlds = {"gw": SimulatedHost(), **{f"box{i}": SimulatedHost() for i in range(1, 6)}}
    commands, _uploads, _state = run_deploy(tmp_path, monkeypatch, worlds)
    assert sorted(parsed) == sorted(worlds) and len(fleets) == 1
    for name in set(worlds) - {"gw"}:
        assert command_kinds(commands[name]) == ["access check", "facts", "facts", "verify"], name


def test_a_host_whose_data_a_deploy_file_changed_is_planned_from_what_it_is_now(tmp_path, monkeypatch):
    """A deploy file of one's own may set host.data before the packaged deploy runs: that host is
    parsed again from its data as it is then (here without verification: no probe), the others not."""
    parsed, _fleets = _counting_parses(monkeypatch)
    deploy_file = tmp_path / "own_deploy.py"
    deploy_file.write_text("import sys\n\nfrom pyinfra import host, state\n\n"
                           "from vllm_fleet.deploy import RunOptions, vllm_fleet_deploy\n\n"
                           "if host.name == '@fake/box':\n    host.data.vllm_verify = False\n"
                           "vllm_fleet_deploy(options=RunOptions.from_pyinfra_cli(sys.argv[1:], state))\n")
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost(), "other": SimulatedHost()}
    commands, _uploads, _state = run_deploy(tmp_path, monkeypatch, worlds, deploy_file=deploy_file)
    assert command_kinds(commands["box"]) == ["access check", "facts", "facts"]
    assert command_kinds(commands["other"]) == ["access check", "facts", "facts", "verify"]
    assert sorted(set(parsed)) == ["box", "gw", "other"] and parsed.count("gw") == parsed.count("other") == 1


def test_a_converged_monitored_fleet_costs_no_command_more(tmp_path, monkeypatch):
    """vllm_metrics on both hosts and the fleet's Prometheus on one: their exporters, units, targets
    and token are read in the same two batches, so a converged host costs what it did."""
    from vllm_fleet.commands.rollout import changed_operations
    from vllm_fleet.monitoring.files import MONITORING_UNITS

    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    data = {"gw": {"vllm_metrics": True, "vllm_monitoring": True}, "box": {"vllm_metrics": True}}
    commands, uploads, state = run_deploy(tmp_path, monkeypatch, worlds, host_data=data)
    assert set(MONITORING_UNITS) <= set(worlds["gw"].unit_names())
    assert command_kinds(commands["box"]) == ["access check", "facts", "facts", "verify"]
    assert command_kinds(commands["gw"]) == ["access check", "facts", "facts", "verify with gateway"]
    assert uploads == {}
    for host in state.inventory:
        assert changed_operations(state, host) == [], host.name


@pytest.mark.parametrize("changed, action", [
    ("/etc/vllm-fleet-prometheus/rules.yml", "reload"),
    ("/etc/vllm-fleet-prometheus/targets/vllm.json", None),  # Prometheus rereads a target list itself
    ("/etc/systemd/system/vllm-fleet-prometheus.service", "restart")])
def test_prometheus_is_reloaded_for_its_rules_restarted_for_its_unit_and_left_alone_for_its_targets(
        tmp_path, monkeypatch, changed, action):
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    worlds["gw"].changed_files = {changed}
    data = {"gw": {"vllm_metrics": True, "vllm_monitoring": True}, "box": {"vllm_metrics": True}}
    commands, uploads, _state = run_deploy(tmp_path, monkeypatch, worlds, host_data=data)
    assert uploads == {"gw": [changed]}
    unit = "vllm-fleet-prometheus.service"
    touching = [c for c in command_kinds(commands["gw"]) if c.startswith("systemctl ") and unit in c]
    assert touching == ([] if action is None else [f"systemctl {action} {unit}"]), touching
    assert command_kinds(commands["box"]) == ["access check", "facts", "facts", "verify"]


def test_a_gateway_whose_backends_changed_is_verified_after_its_reload_in_a_command_of_its_own(
        tmp_path, monkeypatch):
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    worlds["gw"].changed_files = {"/etc/vllm-fleet/gateway-workers.json"}
    commands, _uploads, _state = run_deploy(tmp_path, monkeypatch, worlds)
    gw = command_kinds(commands["gw"])
    assert gw[-3:] == ["verify", "systemctl reload vllm-fleet-gateway.service", "verify gateway"], gw


def test_a_gateway_that_fails_its_check_with_the_instances_fails_its_own_verification(tmp_path, monkeypatch):
    """The combined probe's gateway result is the gateway verification's: a failure there fails the
    host at "Verify the gateway", with the probe's reason, and sends no second probe."""
    from pyinfra.connectors.util import CommandOutput, OutputLine

    from vllm_fleet.deploy.outcome import failure_reason

    def gateway_down(connector, command_str, answer):
        ok, output = answer
        if "verify-with-gateway" not in command_str:
            return answer
        result = json.loads(output.stdout.removeprefix(RESULT_PREFIX))
        result["gateway"] = {"ok": False, "unit": "vllm-fleet-gateway.service", "error": "router answers 503",
                             "journal": "router: no workers"}
        return ok, CommandOutput([OutputLine("stdout", RESULT_PREFIX + json.dumps(result))])

    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    commands, _uploads, state = run_deploy(tmp_path, monkeypatch, worlds, wrap_response=gateway_down,
                                           allow_failures=True)
    assert "@fake/gw" in {h.name for h in state.failed_hosts}
    assert command_kinds(commands["gw"])[-1] == "verify with gateway"  # no second probe after it
    text = failure_reason(state, "@fake/gw")
    assert text.startswith("host @fake/gw, gateway: verification failed: router answers 503"), text
    assert "router: no workers" in text


def test_a_teams_deploy_file_runs_its_operation_then_the_packaged_deploy_under_its_name(
        tmp_path, monkeypatch, model_dir):
    """tests/fixtures/team_deploy.py as pyinfra runs a deploy file: the team's own operation first,
    then every operation of vllm-fleet's, each named under the deploy's name (how pyinfra groups a
    packaged deploy); converged hosts cost what they cost under deploy.py, plus the team's command;
    and `_sudo=True` from the call reaches every command the deploy runs, at execution too (the
    verification probes), though the inventory sets no _sudo."""
    from pyinfra.connectors.fake import FakeConnector

    from support.fleet_helpers import DEPLOY_NAME
    from vllm_fleet import deploy as packaged

    assert DEPLOY_NAME == packaged.DEPLOY_NAME  # what the sandbox tests look for in pyinfra's output
    with_sudo: dict[str, list] = {}
    run_shell_command = FakeConnector.run_shell_command

    def recording(self, command, print_output=False, print_input=False, **arguments):
        with_sudo.setdefault(self.host.name.removeprefix("@fake/"), []).append(bool(arguments.get("_sudo")))
        return run_shell_command(self, command, print_output, print_input, **arguments)

    monkeypatch.setattr(FakeConnector, "run_shell_command", recording)
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost(model_source=model_dir)}
    commands, uploads, state = run_deploy(tmp_path, monkeypatch, worlds,
                                          deploy_file=REPO / "tests" / "fixtures" / "team_deploy.py")
    # The deploy reads its facts while pyinfra prepares the run; the team's command executes first.
    team = "touch /tmp/team-deploy-ran"
    assert command_kinds(commands["box"]) == ["access check", "facts", "facts", team, "verify"]
    assert command_kinds(commands["gw"]) == ["access check", "facts", "facts", team, "verify with gateway"]
    assert uploads == {}
    # The team's command as its login user; the access check is wrapped in sudo itself (its
    # channel runs as the login user, to read what sudo says); the rest through sudo.
    assert with_sudo == {"box": [False, True, True, False, True], "gw": [False, True, True, False, True]}
    assert "sudo" in commands["box"][0]
    names = [", ".join(sorted(state.op_meta[op_hash].names)) for op_hash in state.get_op_order()]
    assert names[0] == "Team: mark the hosts this deploy reached"
    assert len(names) > 10 and all(name.startswith(f"{DEPLOY_NAME} | ") for name in names[1:]), names
    assert f"{DEPLOY_NAME} | Verify instances (health, models, completion)" in names


class ForeignModelDirectory(SimulatedHost):
    """A host whose synced model path already holds files vllm-fleet did not put there (no manifest)."""

    def answer(self, q: facts.Query, env_name: str) -> list[str]:
        if q.fact.__name__ == "ModelSyncState":
            return ["exists\t755", "f\t10\t1.0\t644\tpasswd", "f\t10\t1.0\t640\tshadow", "d\t-\t-\t755\tssh",
                    "h\t-\t-\t-\t.pwd.lock", "end\t0"]
        return super().answer(q, env_name)


def test_a_model_path_holding_files_of_others_stops_the_deploy_while_planning(tmp_path, monkeypatch, model_dir):
    """The refusal comes from prepare (a DeployError, which pyinfra prints without a traceback),
    so no operation of any host ever executes: nothing is sent, nothing removed."""
    from vllm_fleet.deploy import DeployError

    worlds = {"gw": SimulatedHost(), "box": ForeignModelDirectory(model_source=model_dir)}
    with pytest.raises(DeployError) as refused:
        run_deploy(tmp_path, monkeypatch, worlds)
    text = str(refused.value)
    assert text.startswith(
        "error: host @fake/box, instance box, key model: model path /srv/models/box holds 4 entries vllm-fleet "
        "did not put there (it has no .vllm-fleet-manifest.json), e.g. .pwd.lock, passwd, shadow, ssh; syncing "
        f"model_source {model_dir} there would replace or delete them (the sync removes what model_source lacks)\n"
        "  fix: set 'model' to an empty or new directory, e.g. under vllm_models_dir: ")
    assert "or, if /srv/models/box is meant for this model alone, remove its contents yourself" in text
    assert text.endswith("\nnothing was changed on any host")


class LinkedModelDirectory(SimulatedHost):
    """A host whose synced model path is a symlink into /etc (one its service user could have made)."""

    def answer(self, q: facts.Query, env_name: str) -> list[str]:
        if q.fact.__name__ == "ModelSyncState":
            return ["real\t/etc/box", "exists\t755", "end\t0"]
        return super().answer(q, env_name)


def test_a_model_path_reached_through_a_link_is_refused_with_the_links_own_fix(tmp_path, monkeypatch, model_dir):
    """Emptying the directory, the fix for a foreign one, would do nothing here: the way out is the
    directory the link stands for, or no link."""
    from vllm_fleet.deploy import DeployError

    worlds = {"gw": SimulatedHost(), "box": LinkedModelDirectory(model_source=model_dir)}
    with pytest.raises(DeployError) as refused:
        run_deploy(tmp_path, monkeypatch, worlds)
    text = str(refused.value)
    assert "model path /srv/models/box is reached through a symlink (it resolves to /etc/box)" in text
    assert ("fix: set 'model' to /etc/box, the directory the link stands for, if the model belongs there; "
            "else replace the link with a directory") in text
    assert "remove its contents yourself" not in text and text.endswith("\nnothing was changed on any host")


def test_a_changed_engine_config_costs_its_upload_and_the_restart(tmp_path, monkeypatch, model_dir):
    from vllm_fleet.commands.rollout import changed_operations

    worlds = {"gw": SimulatedHost(), "box": SimulatedHost(model_source=model_dir)}
    worlds["box"].changed_files = {"/etc/vllm-fleet/box.yaml"}
    commands, uploads, state = run_deploy(tmp_path, monkeypatch, worlds)
    assert command_kinds(commands["gw"]) == ["access check", "facts", "facts", "verify with gateway"]
    box = command_kinds(commands["box"])
    assert box[:3] == ["access check", "facts", "facts"] and box[-1] == "verify"
    changes = box[3:-1]
    assert changes[0] == "[ -d /etc/vllm-fleet ] || { mkdir -p /etc/vllm-fleet && chown root:vllm /etc/vllm-fleet; }"
    assert changes[-2] == "chown root:vllm /etc/vllm-fleet/box.yaml && chmod 0640 /etc/vllm-fleet/box.yaml"
    assert changes[-1].startswith("systemctl stop vllm-box.service; ")  # restarted: its config changed
    assert not any("daemon-reload" in c for c in changes)  # no unit changed
    assert uploads == {"box": ["/etc/vllm-fleet/box.yaml"]}
    box_host = next(h for h in state.inventory if h.name == "@fake/box")
    # (pyinfra names an operation by every host's name for it: "Config of box: ..., Unit of gw: ...")
    config, restart = changed_operations(state, box_host)
    assert "Config of box: /etc/vllm-fleet/box.yaml" in config
    assert "Restart vllm-box.service (its config, environment or model changed)" in restart


def test_prepare_reads_the_host_in_two_batches_that_hold_every_fact_it_asks(monkeypatch):
    """The deploy's prepare() on a GPU host: the discovery batch before the plan, the managed state after
    it; every fact prepare() then reads was in one of them (a stand-in host answers each alone)."""
    from support.planning_fixtures import A100_40G, FakeHost, host_data, instance, use_fake_host

    from vllm_fleet.facts.gpus import GPU_QUERY, parse_gpu_csv

    monkeypatch.setenv("VLLM_FLEET_API_KEY", "sk-test-5b1e0c2f9a")
    row = {"index": "0", "pci.bus_id": "00000000:41:00.0", "name": "NVIDIA A100-SXM4-40GB",
           "memory.total": "40960", "memory.used": "3", "uuid": "GPU-a", "compute_cap": "8.0",
           "driver_version": "580.126.09", "mig.mode.current": "Disabled", "memory.reserved": "[N/A]"}
    data = host_data(gpus=[A100_40G], instances=[
        instance(name="a", model="/srv/models/a", tokenizer="/srv/tok", max_model_len=1024, model_info=TINY_MODEL_INFO),
        instance(name="b", model="someone/tiny", tokenizer=None, max_model_len=1024, model_info=TINY_MODEL_INFO,
                 port=8100, served_model_name="tiny-b")])
    del data["gpus"]
    smi = [", ".join(dict(row, index=str(i), uuid=f"GPU-{i}", **{"pci.bus_id": f"00000000:4{i}:00.0"})[f]
                     for f in GPU_QUERY.split(",")) for i in (0, 1)]
    fake = FakeHost(data, {"NvidiaGpus": parse_gpu_csv(smi),
                           "GpuTopology": {"available": False, "reason": "test"}, "ManagedUnits": [],
                           "PathsPresent": {"/srv/tok": True},
                           "ModelConfig": {"config": TINY_CONFIG, "weights_bytes": 3000}})
    use_fake_host(monkeypatch, fake)
    deployment = prepare()
    assert len(fake.batches) == 2
    discovery, managed_state = ({q.fact.__name__ for q in batch} for batch in fake.batches)
    assert discovery == {"ManagedUnits", "HostRuntime", "NvidiaGpus", "GpuTopology", "CudaMemory", "ModelConfig",
                         "PathsPresent"}
    batched = set(fake.batches[0]) | set(fake.batches[1])
    assert all(facts.Query.of(_fact_class(name), **kwargs) in batched for name, kwargs in fake.asked), fake.asked
    assert {"ServiceAccount", "DirectoryState", "FileState", "UnitState", "NewestMtime", "PathsPresent",
            "LinkTarget", "InstalledEnvironment", "HubModelCached"} <= managed_state
    files = {q.kwargs["path"] for q in fake.batches[1] if q.fact is FileState}
    assert set(deployment.files) | {"/etc/vllm-fleet/hub.env"} == files  # b downloads from the hub: its token file
    units = {q.kwargs["unit"] for q in fake.batches[1] if q.fact is UnitState}
    assert {"vllm-a.service", "vllm-b.service", "vllm-fleet-front.service"} <= units


def test_deploy_docstring_counts_what_the_simulated_run_measures():
    text = (REPO / "deploy.py").read_text()
    assert "A run that changes nothing costs 4 remote commands per host, the gateway host's included" in text


def test_an_instance_removed_from_the_inventory_is_stopped_and_its_files_removed(tmp_path, monkeypatch):
    worlds = {"gw": SimulatedHost()}
    worlds["gw"].leftovers = {"/etc/systemd/system/vllm-old.service", "/etc/vllm-fleet/old.yaml",
                              "/etc/vllm-fleet/old.env"}
    commands, uploads, _state = run_deploy(tmp_path, monkeypatch, worlds)
    assert command_kinds(commands["gw"]) == [
        "access check", "facts", "facts",
        "systemctl stop vllm-old.service", "systemctl disable vllm-old.service",
        # The unit file last: a run stopped halfway still finds the instance (and its key) next time.
        "rm -f /etc/vllm-fleet/old.yaml", "rm -f /etc/vllm-fleet/old.env", "rm -f /etc/systemd/system/vllm-old.service",
        "systemctl daemon-reload",  # a unit went away
        "verify with gateway"]
    assert uploads == {}


def test_monitoring_turned_off_stops_the_exporters_and_keeps_the_instances(tmp_path, monkeypatch):
    """A host whose vllm_metrics is turned off: its exporters stop and their files go (the unit
    file last); its instance is not taken for a removed one."""
    worlds = {"gw": SimulatedHost()}
    worlds["gw"].leftovers = {"/etc/systemd/system/vllm-fleet-exporter.service",
                              "/etc/vllm-fleet/host-exporter.py",
                              "/etc/systemd/system/vllm-fleet-node-exporter.service"}
    commands, uploads, _state = run_deploy(tmp_path, monkeypatch, worlds)
    assert command_kinds(commands["gw"]) == [
        "access check", "facts", "facts",
        "systemctl stop vllm-fleet-exporter.service", "systemctl disable vllm-fleet-exporter.service",
        "rm -f /etc/vllm-fleet/host-exporter.py", "rm -f /etc/systemd/system/vllm-fleet-exporter.service",
        "systemctl stop vllm-fleet-node-exporter.service", "systemctl disable vllm-fleet-node-exporter.service",
        "rm -f /etc/systemd/system/vllm-fleet-node-exporter.service",
        "systemctl daemon-reload",
        "verify with gateway"]
    assert uploads == {}
