"""The packaged deploy as a team's own code meets it: importing it changes nothing in pyinfra or gevent
until install(); its run options come from its caller (the root deploy.py and a team's deploy file
hand on pyinfra's command line), and a run whose options are unknown takes no lock and changes
nothing; its public API is what such a file needs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from support.simulated_host import SimulatedHost, command_kinds, run_deploy

REPO = Path(__file__).resolve().parents[2]
TEAM_DEPLOY = REPO / "tests" / "fixtures" / "team_deploy.py"


def test_importing_the_deploy_or_the_connection_changes_nothing_until_install_is_called():
    """In a process of its own: the test process has long been patched by other tests."""
    script = textwrap.dedent("""
        import importlib, json
        import gevent.monkey
        from pyinfra.api import util
        from vllm_fleet.connect import ssh_lost
        import vllm_fleet.deploy, vllm_fleet.commands.connection, vllm_fleet.commands.rollout

        operation = importlib.import_module("pyinfra.api.operation")

        def seen():
            order = operation.get_operation_order_from_stack
            return {"socket patched": gevent.monkey.is_module_patched("socket"),
                    "order replaced": order is not util.get_operation_order_from_stack,
                    "ssh wrapped": ssh_lost.installed()}

        after_import = seen()
        vllm_fleet.deploy.install()
        after_deploy_install = seen()
        vllm_fleet.commands.connection.install()
        print(json.dumps([after_import, after_deploy_install, seen()]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    after_import, after_deploy_install, after_both = json.loads(out.stdout)
    assert after_import == {"socket patched": False, "order replaced": False, "ssh wrapped": False}
    assert after_deploy_install == {"socket patched": False, "order replaced": True, "ssh wrapped": True}
    assert after_both == {"socket patched": True, "order replaced": True, "ssh wrapped": True}



def test_a_dropped_ssh_connection_prints_no_paramiko_traceback_once_the_connection_is_installed():
    """paramiko logs a host that closes the connection before its banner as an error with a
    traceback; the command's report names the host as unreachable, so nothing else reaches stderr
    (without install(), Python's last-resort handler prints it). In a process of its own: no logging
    set up by pytest."""
    script = textwrap.dedent("""
        import logging
        import vllm_fleet.commands.connection as connection
        def dropped():
            try:
                raise EOFError()
            except EOFError:
                logging.getLogger("paramiko.transport").error("Exception (client): Error reading SSH protocol banner",
                                                              exc_info=True)
        dropped()
        print("-- installed --", flush=True)
        connection.install()
        dropped()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "-- installed --", out
    assert out.stderr.count("Error reading SSH protocol banner") == 1, out.stderr  # before install() only
    assert out.stderr.count("Traceback") == 1, out.stderr

def test_the_public_api_is_what_a_deploy_file_needs():
    import vllm_fleet.deploy as deploy

    assert sorted(deploy.__all__) == ["DEPLOY_NAME", "DeployError", "RunOptions", "install", "vllm_fleet_deploy"]
    assert all(hasattr(deploy, name) for name in deploy.__all__)


def test_run_options_are_pyinfras_own_parse_of_its_command_line(monkeypatch):
    import pyinfra

    from vllm_fleet.deploy import RunOptions

    state = SimpleNamespace(limit_hosts=[SimpleNamespace(name="gpu-a"), SimpleNamespace(name="gpu-b")])
    unlimited = SimpleNamespace(limit_hosts=None)
    monkeypatch.setattr(pyinfra, "is_cli", True)
    options = RunOptions.from_pyinfra_cli(["-vvy", "--dry", "inv.py", "deploy.py", "--limit", "gpu-a,gpu-b"], state)
    assert (options.dry, options.serial, options.limit) == (True, False, ("gpu-a", "gpu-b"))
    options = RunOptions.from_pyinfra_cli(["inv.py", "deploy.py", "--serial"], unlimited)
    assert (options.dry, options.serial, options.limit) == (False, True, None)
    # A value that reads like the option is a value: only pyinfra's parser tells them apart.
    options = RunOptions.from_pyinfra_cli(["inv.py", "deploy.py", "--limit", "--dry"], unlimited)
    assert (options.dry, options.command) == (False, "pyinfra inv.py deploy.py --limit --dry")
    # Not a command line pyinfra accepts (another program's, a test runner's): unknown.
    assert RunOptions.from_pyinfra_cli(["-q", "--no-sandbox", "tests/"], unlimited) is None
    assert RunOptions.from_pyinfra_cli([], unlimited) is None
    # pyinfra's Python API runs the deploy file: the process's command line is not pyinfra's.
    monkeypatch.setattr(pyinfra, "is_cli", False)
    assert RunOptions.from_pyinfra_cli(["--dry", "inv.py", "deploy.py"], unlimited) is None


def test_pyinfras_cli_hands_a_deploy_file_its_own_options(tmp_path):
    """The real `pyinfra` command, on @local, with --dry: the deploy file finds --dry, --serial and
    the limit as RunOptions.from_pyinfra_cli reads them (nothing executes)."""
    out_file = tmp_path / "options.json"
    deploy_file = tmp_path / "probe.py"
    deploy_file.write_text(textwrap.dedent(f"""
        import json, sys
        from dataclasses import asdict
        from pyinfra import state
        from vllm_fleet.deploy import RunOptions

        with open({str(out_file)!r}, "w") as f:
            json.dump(asdict(RunOptions.from_pyinfra_cli(sys.argv[1:], state)), f)
    """))
    done = subprocess.run([sys.executable, "-m", "pyinfra", "--dry", "--serial", "@local", str(deploy_file),
                           "--limit", "@local"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    options = json.loads(out_file.read_text())
    assert (options["dry"], options["serial"], options["limit"]) == (True, True, ["@local"])
    assert options["command"] == f"pyinfra --dry --serial @local {deploy_file} --limit @local"


@pytest.fixture
def lock_calls(monkeypatch):
    """The simulated hosts as if reached over SSH, each with a deploy lock to take: the names of the
    hosts whose lock the deploy took, in order."""
    from vllm_fleet.connect import lock

    taken: list[str] = []

    def acquire(host, owner):
        taken.append(host.name.removeprefix("@fake/"))
        return f"deploy lock {lock.LOCK_FILE} taken"

    monkeypatch.setattr(lock, "lockable", lambda host: True)
    monkeypatch.setattr(lock, "acquire", acquire)
    return taken


def test_the_team_example_under_dry_takes_no_lock_and_executes_nothing(tmp_path, monkeypatch, lock_calls):
    """tests/fixtures/team_deploy.py (docs/deploy-steps.md's example) as `pyinfra --dry INVENTORY
    team_deploy.py` runs it: the access check runs alone (no lock's command to carry it), the facts
    are read, nothing executes; the same file without --dry takes each host's lock."""
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    commands, uploads, _state = run_deploy(tmp_path, monkeypatch, worlds, deploy_file=TEAM_DEPLOY,
                                           cli_options=("--dry",))
    assert lock_calls == []
    assert {name: command_kinds(sent) for name, sent in commands.items()} == {
        "gw": ["access check", "facts", "facts"], "box": ["access check", "facts", "facts"]}
    assert uploads == {}
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    commands, _uploads, _state = run_deploy(tmp_path, monkeypatch, worlds, deploy_file=TEAM_DEPLOY)
    assert sorted(lock_calls) == ["box", "gw"]
    assert command_kinds(commands["box"]) == ["facts", "facts", "touch /tmp/team-deploy-ran", "verify"]


@pytest.mark.parametrize("call", ["vllm_fleet_deploy(_sudo=True)", "vllm_fleet_deploy(options=None)"])
def test_a_deploy_file_that_passes_no_options_is_refused_before_any_lock_or_command(
        tmp_path, monkeypatch, lock_calls, call):
    """Without its options the deploy cannot tell `--dry` from a run that changes the hosts: it
    refuses the run, naming what to pass, before the lock, the access check or any fact."""
    from vllm_fleet.deploy import DeployError

    deploy_file = tmp_path / "own_deploy.py"
    deploy_file.write_text("from pyinfra.operations import server\n\n"
                           "from vllm_fleet.deploy import vllm_fleet_deploy\n\n"
                           "server.shell(name='Team: a step', commands=['true'])\n"
                           f"{call}\n")
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    with pytest.raises(DeployError) as info:
        run_deploy(tmp_path, monkeypatch, worlds, deploy_file=deploy_file, cli_options=("--dry",))
    text = str(info.value)
    assert text.startswith("vllm_fleet_deploy() was called without options=RunOptions(...)")
    assert "options=RunOptions.from_pyinfra_cli(sys.argv[1:], state)" in text
    assert text.endswith("nothing was changed on any host")
    assert lock_calls == []
    assert all(world.config is None for world in worlds.values())  # nothing planned, nothing rendered


def test_the_root_deploy_through_pyinfras_api_is_refused_its_options_unknown(tmp_path, monkeypatch, lock_calls):
    """deploy.py loaded by a script of pyinfra's API (not its CLI): its command line is not pyinfra's,
    so the options are unknown and the run is refused, no lock taken."""
    from vllm_fleet.deploy import DeployError

    worlds = {"box": SimulatedHost()}
    with pytest.raises(DeployError, match="called without options"):
        run_deploy(tmp_path, monkeypatch, worlds, cli_mode=False)
    assert lock_calls == [] and worlds["box"].config is None
