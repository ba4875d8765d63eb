"""A deploy that changes nothing costs a fixed handful of remote commands per host.

- The facts' shell code runs here, in dash and bash, against a small tree under tmp_path (and a
  stand-in `systemctl` on PATH): what each command prints and what its `process` reads agree, alone
  and inside one batch (facts.prefetch).
- The operations yield nothing when the host matches and exactly the fix when it differs: that is
  their cases, tests/operations/<module>.<operation>/*.json (what --diff shows too: a changed
  file, never a secret). Here: whose service account may be taken (ownership.account_problem).
- The real deploy.py runs through pyinfra (prepare, then execute, as the CLI does) against pyinfra's
  @fake connector, answered by a simulated converged host: every remote command is counted. A
  converged host costs exactly what deploy.py's docstring lists; a changed engine config costs its
  upload and the instance's restart, nothing else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from support.planning_fixtures import TINY_MODEL_INFO
from support.simulated_host import TINY_CONFIG, SimulatedHost, command_kinds, run_deploy
from vllm_fleet import kinds
from vllm_fleet.deploy.prepare import prepare
from vllm_fleet.facts import batch as facts
from vllm_fleet.facts import gpus as gpu_facts
from vllm_fleet.facts import host as host_facts
from vllm_fleet.operations import model_sync as ms
from vllm_fleet.operations import managed
from vllm_fleet.rules import ownership
from vllm_fleet.facts import state as state_facts
from vllm_fleet.facts.batch import parse_batch, query
from vllm_fleet.facts.state import DirectoryState, FileState, NewestMtime, ServiceAccount, UnitState
from vllm_fleet.payloads.probe.host import RESULT_PREFIX

REPO = Path(__file__).resolve().parents[2]
SHELLS = [path for path in map(shutil.which, ("dash", "bash")) if path]  # Debian's sh, and bash


def _fact_class(name: str) -> type:
    """The fact class of that name, from the module of facts that defines it."""
    return next(getattr(module, name) for module in (gpu_facts, host_facts, state_facts) if hasattr(module, name))


def _run(command: str, shell: str = "/bin/sh", env: dict | None = None) -> list[str]:
    out = subprocess.run([shell, "-c", command], capture_output=True, text=True, timeout=60,
                         env=env or dict(os.environ))
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:-1]  # as pyinfra reads lines: no trailing newline, blanks kept


def _fact(cls, shell="/bin/sh", env=None, **kwargs):
    """The fact's own command, run here; its lines through its process (as pyinfra's get_fact)."""
    lines = _run(cls().command(**kwargs), shell, env)
    return cls().process(lines) if lines else cls().default()


# --- the facts' shell code, run for real ------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "a b.yaml").write_text("engine: 1\n")
    (tmp_path / "etc" / "a b.yaml").chmod(0o640)
    (tmp_path / "etc" / "secret.env").write_text("KEY='it''s'\n")
    (tmp_path / "etc" / "secret.env").chmod(0o600)
    (tmp_path / "state").mkdir(mode=0o751)
    (tmp_path / "state").chmod(0o751)
    (tmp_path / "link").symlink_to(tmp_path / "etc" / "a b.yaml")
    os.utime(tmp_path / "etc" / "a b.yaml", (1_700_000_000, 1_700_000_000))
    os.utime(tmp_path / "etc" / "secret.env", (1_700_000_500, 1_700_000_500))
    return tmp_path


@pytest.mark.parametrize("shell", SHELLS)
def test_file_and_directory_state_read_mode_owner_and_sha256(tree, shell):
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    found = _fact(FileState, shell, path=str(tree / "etc" / "a b.yaml"))
    assert found == {"kind": "file", "mode": 0o640, "user": me, "group": group,
                     "sha256": hashlib.sha256(b"engine: 1\n").hexdigest()}
    assert _fact(FileState, shell, path=str(tree / "etc" / "secret.env"))["mode"] == 0o600
    assert _fact(FileState, shell, path=str(tree / "nope")) == {"kind": "absent"}
    assert _fact(FileState, shell, path=str(tree / "link")) == {"kind": "other"}  # never written through
    assert _fact(FileState, shell, path=str(tree / "state")) == {"kind": "other"}
    assert _fact(DirectoryState, shell, path=str(tree / "state")) == {"kind": "dir", "mode": 0o751, "user": me,
                                                                     "group": group}
    assert _fact(DirectoryState, shell, path=str(tree / "etc" / "a b.yaml")) == {"kind": "other"}
    assert _fact(DirectoryState, shell, path=str(tree / "nope")) == {"kind": "absent"}


@pytest.mark.parametrize("shell", SHELLS)
def test_service_account_and_newest_mtime(tree, shell):
    root = _fact(ServiceAccount, shell, user="root", group="root")
    assert root["user"]["uid"] == 0 and root["user"]["group"] == "root" and root["group"]["gid"] == 0
    assert root["user"]["home"] and root["user"]["shell"]
    assert _fact(ServiceAccount, shell, user="vf-no-such-user", group="vf-no-such-group") == {"user": None,
                                                                                            "group": None}
    paths = (str(tree / "etc" / "a b.yaml"), str(tree / "etc" / "secret.env"), str(tree / "gone"))
    assert _fact(NewestMtime, shell, paths=paths) == 1_700_000_500
    assert _fact(NewestMtime, shell, paths=(str(tree / "gone"),)) == 0


FAKE_SYSTEMCTL = """#!/bin/sh
# stands in for systemd's: `show -p A -p B UNIT` prints A=..., `--value` prints the value alone
case "$*" in
  *ExecMainStartTimestamp*--value*vllm-up.service*) echo "Tue 2023-11-14 22:13:20 UTC" ;;
  *ExecMainStartTimestamp*--value*) echo "" ;;
  *vllm-up.service*) printf 'MainPID=4242\\nLoadState=loaded\\nActiveState=active\\nSubState=running\\nUnitFileState=enabled\\nNeedDaemonReload=no\\n' ;;
  *vllm-stale.service*) printf 'MainPID=0\\nLoadState=loaded\\nActiveState=failed\\nSubState=failed\\nUnitFileState=disabled\\nNeedDaemonReload=yes\\n' ;;
  *) printf 'MainPID=0\\nLoadState=not-found\\nActiveState=inactive\\nSubState=dead\\nUnitFileState=\\nNeedDaemonReload=no\\n' ;;
esac
"""


@pytest.mark.parametrize("shell", SHELLS)
def test_unit_state_reads_systemctl_show(tmp_path, shell):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    up = _fact(UnitState, shell, env, unit="vllm-up.service")
    assert up["running"] and up["enabled"] and not up["need_daemon_reload"]
    assert up["main_pid"] == 4242 and up["started"] == 1_700_000_000  # date -d of the timestamp
    stale = _fact(UnitState, shell, env, unit="vllm-stale.service")
    assert not stale["running"] and not stale["enabled"] and stale["need_daemon_reload"]
    assert stale["started"] == 0 and stale["active_state"] == "failed"
    gone = _fact(UnitState, shell, env, unit="vllm-gone.service")
    assert gone["load_state"] == "not-found" and not gone["running"] and not gone["enabled"]
    # No systemctl at all: a unit nobody runs.
    empty = tmp_path / "empty"
    empty.mkdir()
    for tool in ("date", "stat", "sort", "tail"):
        (empty / tool).symlink_to(shutil.which(tool))
    assert _fact(UnitState, shell, dict(os.environ, PATH=str(empty)), unit="x.service") == UnitState().default()


@pytest.mark.parametrize("shell", SHELLS)
def test_one_batch_answers_each_fact_as_its_own_command_does(tree, shell):
    queries = [query(FileState, path=str(tree / "etc" / "a b.yaml")), query(FileState, path=str(tree / "x")),
               query(DirectoryState, path=str(tree / "state")),
               query(NewestMtime, paths=(str(tree / "etc" / "secret.env"),)),
               query(host_facts.PathsPresent, paths=(str(tree / "state"), str(tree / "nope"))),
               query(host_facts.LinkTarget, path=str(tree / "link")),
               query(gpu_facts.NvidiaGpus),  # no nvidia-smi here: pyinfra's "command missing" default
               query(host_facts.HostRuntime, python_version="3.11"),
               query(host_facts.ModelConfig, path=str(tree / "nope")),
               query(ms.ModelSyncState, dest=str(tree / "state"))]
    raw = parse_batch(_run(facts.batch_command(queries), shell))
    assert sorted(raw) == list(range(len(queries)))
    for i, q in enumerate(queries):
        rc, lines = raw[i]
        assert rc == 0, q
        alone = _run(q.fact().command(**q.kwargs), shell) if q.fact is not gpu_facts.NvidiaGpus else []
        if q.fact is gpu_facts.NvidiaGpus and subprocess.run(["sh", "-c", "command -v nvidia-smi"]).returncode:
            assert lines == [facts.MISSING_COMMAND] and facts._answer(q, lines) is None
            continue
        assert facts._answer(q, lines) == (q.fact().process(alone) if alone else q.fact().default()), q


def test_a_failed_fact_in_a_batch_is_asked_alone_and_the_rest_are_kept():
    # Markers around each command: a failing one keeps its status, a last line without newline its text.
    raw = parse_batch(_run("echo '##vllm-fleet-fact 0'\n( echo out; false )\necho \"##vllm-fleet-fact-end 0 $?\"\n"
                           "echo '##vllm-fleet-fact 1'\n( printf 'no newline' )\necho \"##vllm-fleet-fact-end 1 $?\""))
    assert raw == {0: (1, ["out"]), 1: (0, ["no newline"])}
    # prefetch keeps what succeeded; get asks the failed one alone (pyinfra reports its failure).
    fake = _Host({"LinkTarget": "asked alone"}, batch=lambda queries: {0: (1, ["out"]), 1: (0, ["target"])})
    failing, fine = query(host_facts.LinkTarget, path="/a"), query(host_facts.LinkTarget, path="/b")
    facts.prefetch(fake, [failing, fine])
    assert facts.get(fake, host_facts.LinkTarget, path="/b") == "target"
    assert facts.get(fake, host_facts.LinkTarget, path="/a") == "asked alone"
    assert fake.asked == ["FactBatch", "LinkTarget"]


class _Host:
    """pyinfra's host for facts.prefetch/get and the operations: facts from a dict, calls recorded."""

    name, print_prefix = "box", "[box] "
    data = {"ssh_user": "deploy"}

    def __init__(self, answers: dict | None = None, batch=None):
        self.answers, self.batch, self.asked, self.noops = answers or {}, batch, [], []
        self.current_op_global_arguments = {}

    def get_fact(self, cls, **kwargs):
        self.asked.append(cls.__name__)
        if cls is facts.FactBatch:
            return self.batch(kwargs["queries"]) if self.batch else None
        value = self.answers[cls.__name__]
        return value(**kwargs) if callable(value) else value

    def noop(self, text):
        self.noops.append(text)

    def get_temp_filename(self, key, temp_directory=None):
        return f"/tmp/pyinfra-{hashlib.sha1(key.encode()).hexdigest()}"


def test_prefetch_reads_once_and_get_answers_from_it(tree):
    def batch(queries):  # runs the real batch here
        return parse_batch(_run(facts.batch_command(queries)))

    fake = _Host({"FileState": {"kind": "absent"}}, batch)
    path = str(tree / "etc" / "a b.yaml")
    facts.prefetch(fake, [query(FileState, path=path), query(DirectoryState, path=str(tree / "state"))])
    facts.prefetch(fake, [query(FileState, path=path)])  # known already: no second command
    assert fake.asked == ["FactBatch"]
    assert facts.get(fake, FileState, path=path)["mode"] == 0o640
    assert facts.get(fake, DirectoryState, path=str(tree / "state"))["kind"] == "dir"
    assert fake.asked == ["FactBatch"]
    # Not prefetched: its own command, once.
    assert facts.get(fake, FileState, path="/elsewhere") == {"kind": "absent"}
    assert facts.get(fake, FileState, path="/elsewhere") == {"kind": "absent"}
    assert fake.asked == ["FactBatch", "FileState"]
    # A new pyinfra run (another State) reads afresh.
    fake.state = object()
    facts.get(fake, FileState, path="/elsewhere")
    assert fake.asked == ["FactBatch", "FileState", "FileState"]


def test_a_batch_is_split_only_past_its_size_limit(monkeypatch):
    fake = _Host(batch=lambda queries: {i: (0, ["absent"]) for i in range(len(queries))})
    facts.prefetch(fake, [query(FileState, path=f"/etc/vllm-fleet/instance-{i}.yaml") for i in range(300)])
    assert fake.asked == ["FactBatch"]  # 300 files (about 75 instances) in one command
    fake = _Host(batch=lambda queries: {i: (0, ["absent"]) for i in range(len(queries))})
    facts.prefetch(fake, [query(FileState, path="/x/" + "p" * 20_000 + str(i)) for i in range(5)])
    assert fake.asked == ["FactBatch"] * 3  # two of these paths fit a batch
    # Under _su_user pyinfra quotes the command twice: still one argument below Linux's 128 KiB.
    biggest = facts.batch_command([query(FileState, path="/x/" + "p" * 20_000 + str(i)) for i in range(2)])
    assert len(shlex.quote(shlex.quote(biggest))) < 131072


# --- the service account: one vllm-fleet did not create is never taken over ------------------------

def _account(name="vllm", comment=managed.ACCOUNT_COMMENT, uid=999, home="/var/lib/vllm-fleet",
             shell="/usr/sbin/nologin", members=()):
    return {"user": {"name": name, "uid": uid, "gid": uid, "comment": comment, "home": home, "shell": shell,
                     "group": name}, "group": {"name": name, "gid": uid, "members": list(members)}}


@pytest.mark.parametrize("found, words", [
    (_account("nobody", comment="nobody", uid=65534, home="/nonexistent"), "uid 65534"),  # the OS's
    (_account("deploy", comment="Deploy,,,", uid=1000, home="/home/deploy", shell="/bin/bash"), "not created by"),
    (_account("prometheus", comment="Prometheus daemon", uid=105, home="/var/lib/prometheus"), "another daemon"),
    # No comment, but not what an earlier deploy made: a login shell, another home, a person's uid.
    (_account(comment="", shell="/bin/bash"), "not created by"),
    (_account(comment="", home="/home/vllm"), "not created by"),
    (_account(comment="", uid=1001), "not created by"),
    (_account(comment="\x1b]0;x\x07"), "(not shown)"),  # a terminal's escape is never printed
    ({"user": None, "group": {"name": "vllm", "gid": 50, "members": ["alice"]}}, "'alice'"),
])
def test_an_account_vllm_fleet_did_not_create_is_never_taken_over(found, words):
    """A person's, another daemon's or the OS's account (or a group with members) would share its files,
    processes and logins with the service, and the service's secrets with its owner."""
    user = found["user"]["name"] if found["user"] else "vllm"
    problem = ownership.account_problem(found, user, user, legacy_home="/var/lib/vllm-fleet")
    assert problem and words in problem and kinds.printable(problem), problem


@pytest.mark.parametrize("found", [
    {"user": None, "group": None},
    {"user": None, "group": {"name": "vllm", "gid": 50, "members": []}},
    _account(),
    _account(comment=""),  # the vLLM user an earlier deploy made: a system user of the state dir, no shell
])
def test_an_account_of_vllm_fleets_own_or_none_is_fine(found):
    assert ownership.account_problem(found, "vllm", "vllm", legacy_home="/var/lib/vllm-fleet") is None
    if found["user"] and found["user"]["comment"] == "":  # only the vLLM user's earlier form
        assert ownership.account_problem(found, "vllm", "vllm") is not None


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

# --- what the memo relies on: one writer per path, and the lock before the first read -------------

def _prepare(monkeypatch, **data_overrides):
    from support.planning_fixtures import FakeHost, host_data, instance, use_fake_host

    from vllm_fleet.deploy import access

    monkeypatch.setenv("VLLM_FLEET_API_KEY", "sk-test-5b1e0c2f9a")
    name = data_overrides.pop("instance_name", "a")
    data = dict(host_data(gpus=None, instances=[
        instance(name=name, model="someone/tiny", tokenizer=None, max_model_len=1024, model_info=TINY_MODEL_INFO)]),
        vllm_target="cpu", **data_overrides)
    fake = FakeHost(data, {"ManagedUnits": [], "HubModelCached": False})
    use_fake_host(monkeypatch, fake)
    return access, fake


def test_an_instance_named_hub_would_share_the_token_files_path_and_is_refused(monkeypatch):
    # Its env file (the API key) and the downloads' HF token file would both be
    # /etc/vllm-fleet/hub.env: each step deciding from the same earlier read, one would go unseen.
    from vllm_fleet.deploy import DeployError

    access, fake = _prepare(monkeypatch, instance_name="hub")
    with pytest.raises(DeployError) as info:
        prepare()
    text = str(info.value)
    assert ("host box, instance hub, key name: instance hub's env file would be /etc/vllm-fleet/hub.env, the file "
            "of the Hugging Face token the downloads use") in text
    assert "rename the instance" in text and "nothing was changed on any host" in text
    assert fake.batches == []  # refused from the inventory alone, before the host is read


def test_a_config_dir_the_state_dir_also_makes_is_refused(monkeypatch):
    from vllm_fleet.deploy import DeployError

    access, _fake = _prepare(monkeypatch, vllm_config_dir="/var/lib/vllm-fleet/config")
    with pytest.raises(DeployError) as info:
        prepare()
    text = str(info.value)
    assert ("host box, key vllm_config_dir: vllm_config_dir /var/lib/vllm-fleet/config (root's) is "
            "<vllm_state_dir>/config (VLLM_CONFIG_ROOT)") in text
    assert "give vllm_config_dir a directory of its own" in text and "nothing was changed on any host" in text


def test_the_deploy_lock_is_held_before_the_first_fact_is_read(monkeypatch):
    access, fake = _prepare(monkeypatch)
    order = []
    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", lambda host, owner: order.append("lock") or "deploy lock taken")
    monkeypatch.setattr(access, "access_problem", lambda: order.append("access check"))
    real_get_fact = fake.get_fact
    monkeypatch.setattr(fake, "get_fact", lambda cls, **kw: order.append(cls.__name__) or real_get_fact(cls, **kw))
    prepare()
    # The lock's own command is the root check: no separate `id -u` round trip when it succeeds.
    assert order[0] == "lock" and order.count("lock") == 1 and "access check" not in order, order


def test_a_host_whose_lock_is_held_is_refused_before_any_fact(monkeypatch):
    access, fake = _prepare(monkeypatch)
    refused = []

    def busy(host, owner):
        raise access.host_lock.LockBusy("host box is being deployed by someone@else; this deploy changed nothing on it")

    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", busy)
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert refused == ["host box is being deployed by someone@else; this deploy changed nothing on it"]
    assert fake.batches == [] and fake.asked == []


@pytest.mark.parametrize("diagnosis", ["host box: deploy cannot run commands as root through sudo (...)", None])
def test_a_lock_that_could_not_be_taken_is_diagnosed_by_the_access_check(monkeypatch, diagnosis):
    """sudo refused the lock's command (or it ran as another user): the host is asked why, once, and
    refused with that answer (or the lock's own words when the access check finds nothing wrong)."""
    access, fake = _prepare(monkeypatch)
    refused, checks = [], []

    def failed(host, owner):
        raise access.host_lock.LockFailed("host box: could not take the deploy lock /run/vllm-fleet/deploy.lock: "
                                          "sudo: a password is required")

    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", failed)
    monkeypatch.setattr(access.ssh_lost, "transport_gone", lambda connector: False)
    monkeypatch.setattr(access, "access_problem", lambda: checks.append(1) or diagnosis)
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert checks == [1] and fake.batches == [] and fake.asked == []
    assert refused == [diagnosis or "host box: could not take the deploy lock /run/vllm-fleet/deploy.lock: "
                                    "sudo: a password is required; nothing was changed on this host"]


def test_a_lock_lost_with_its_connection_is_reported_as_such_without_asking_the_host(monkeypatch):
    access, fake = _prepare(monkeypatch)
    refused, checks = [], []

    def failed(host, owner):
        raise access.host_lock.LockFailed("host box: could not open the deploy lock's SSH channel: EOF")

    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", failed)
    monkeypatch.setattr(access.ssh_lost, "transport_gone", lambda connector: True)
    monkeypatch.setattr(access, "access_problem", lambda: checks.append(1))
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert checks == [] and fake.batches == []
    assert "the SSH connection to box was lost: run the deploy again" in refused[0]
    assert "nothing was changed on this host" in refused[0]


def test_without_an_ssh_session_the_access_check_runs_alone(monkeypatch):
    access, fake = _prepare(monkeypatch)
    refused = []
    monkeypatch.setattr(access, "access_problem", lambda: "host box: commands run as uid 1000 (deploy), not root")
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert refused == ["host box: commands run as uid 1000 (deploy), not root"] and fake.batches == []


def test_a_process_start_that_cannot_be_read_is_unknown_not_stale():
    parsed = UnitState().process(["MainPID=4242", "ActiveState=active", "SubState=running", "StartEpoch="])
    assert parsed["main_pid"] == 4242 and parsed["started"] is None
    assert UnitState().process(["MainPID=0", "SubState=dead"])["started"] == 0


def test_one_sync_per_model_directory_and_two_sources_for_one_directory_are_refused(monkeypatch, tmp_path):
    """Two instances serving one synced directory: one model_sync (a second would decide from the
    same earlier read and send every file again). Two sources into one directory: refused, naming
    both instances, before any change."""
    from types import SimpleNamespace

    from support.planning_fixtures import host_data, instance
    from vllm_fleet.config import ConfigErrors, parse_host
    from vllm_fleet.deploy import steps
    from vllm_fleet.deploy.state import Deployment
    from vllm_fleet.prepared import Discovered, prepare_host

    src, other = tmp_path / "m", tmp_path / "other"

    def config(second_source):
        insts = [instance(name=n, model="/srv/models/m", model_source=str(s), tokenizer=None, port=p,
                          max_model_len=1024, model_info=TINY_MODEL_INFO)
                 for n, s, p in (("a", src, 8000), ("b", second_source, 8100))]
        return parse_host("box", host_data(gpus=None, instances=insts, vllm_target="cpu"))

    calls = []
    monkeypatch.setattr(steps, "model_sync", lambda **kw: calls.append(kw) or f"op{len(calls)}")
    deployment = Deployment(config(src), SimpleNamespace(instances=[]), {}, None)
    steps.models(deployment)
    assert [c["dest"] for c in calls] == ["/srv/models/m"] and calls[0]["name"].startswith("Sync model a, b:")
    assert deployment.changes.model_syncs == {"a": "op1", "b": "op1"}
    with pytest.raises(ConfigErrors, match=r"instances a and b sync different model_source directories .* into "
                                           r"the same host path /srv/models/m"):
        prepare_host(Discovered(config(other), None, None, None))  # the deploy's plan and render
