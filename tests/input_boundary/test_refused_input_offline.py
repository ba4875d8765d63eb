"""Input the tool refuses or reports cleanly, offline (no sandbox host): engine_args against the
planner's own flags, rollout's refusals and exit codes, and deploy-time errors that pyinfra prints
without a traceback."""

from __future__ import annotations

import pytest

from support.fleet_helpers import REPO
from support.planning_fixtures import RTX_3090, host_data, instance
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.plan import plan_host

TP2_ON_3090S = dict(model="Qwen/Qwen2.5-14B-Instruct", tokenizer=None, max_model_len=4096)


def _plan(engine_args):
    data = host_data(gpus=[RTX_3090, RTX_3090], instances=[instance(**TP2_ON_3090S, engine_args=engine_args)])
    return plan_host(parse_host("box", data))


# --- engine_args cannot silently override a planner-owned flag -------------------------------------

@pytest.mark.parametrize("value", [False, "false", "no"])
def test_engine_args_contradicting_a_planner_flag_is_an_error_naming_both(value):
    with pytest.raises(ConfigErrors) as info:
        _plan({"disable-custom-all-reduce": value})
    (err,) = info.value.errors
    text = err.located()
    assert err.host == "box" and err.instance == "gemma" and err.key == "engine_args.disable-custom-all-reduce"
    assert repr(value) in text  # the user's value
    assert "disable-custom-all-reduce = True" in text  # the planner's value
    assert "vllm#14449" in text  # and its reason
    assert "fix: remove 'disable-custom-all-reduce' from engine_args" in text


@pytest.mark.parametrize("value", [True, "true"])
def test_engine_args_agreeing_with_a_planner_flag_is_fine(value):
    (inst,) = _plan({"disable-custom-all-reduce": value, "enforce-eager": True}).instances
    assert inst.engine_args["disable-custom-all-reduce"] in (True, "true")
    assert inst.engine_args["enforce-eager"] is True
    assert any("--disable-custom-all-reduce" in r for r in inst.reasons)


def test_engine_args_the_planner_does_not_set_stay_free():
    # A single GPU: the planner sets no disable-custom-all-reduce, so the user's value stands.
    data = host_data(gpus=[RTX_3090], instances=[instance(**dict(TP2_ON_3090S, model="Qwen/Qwen2.5-7B-Instruct"),
                                                          engine_args={"disable-custom-all-reduce": False})])
    (inst,) = plan_host(parse_host("box", data)).instances
    assert inst.tensor_parallel_size == 1
    assert inst.engine_args["disable-custom-all-reduce"] is False


# --- rollout: refused input is a clean exit 2; states say what happened ----------------------------

import json  # noqa: E402
import os  # noqa: E402
import textwrap  # noqa: E402

from support.rollout_stubs import ROLLOUT_KEY, RolloutState, rollout_inventory, stub_pyinfra  # noqa: E402
from vllm_fleet.commands import rollout as rollout_mod  # noqa: E402

DEPLOY_ERROR_TEXT = ("error: host box1, instance tiny, key model_source: model_source '/nowhere' has no "
                     "readable config.json on this workstation\n  fix: point model_source at a model "
                     "directory\nnothing was changed on any host")


def _raise(exc):
    """A deploy that raises `exc` while it is prepared (pyinfra_cli's load_func passes it on as it is)."""
    def load(*_args, **_kwargs):
        raise exc
    return load


def test_rollout_refused_input_is_a_clean_exit_2(monkeypatch, tmp_path, capsys):
    """A DeployError in a batch ends rollout cleanly (exit 2, the located message), not in an AttributeError."""
    from vllm_fleet.deploy import DeployError

    stub_pyinfra(monkeypatch, RolloutState(), load=_raise(DeployError(DEPLOY_ERROR_TEXT)))
    code = rollout_mod.main([rollout_inventory(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 2
    assert DEPLOY_ERROR_TEXT in err
    assert "Traceback" not in out + err and "AttributeError" not in out + err


def test_rollout_refused_input_in_json_names_every_host_untouched(monkeypatch, tmp_path, capsys):
    from vllm_fleet.deploy import DeployError

    stub_pyinfra(monkeypatch, RolloutState(), load=_raise(DeployError(DEPLOY_ERROR_TEXT)))
    code = rollout_mod.main([rollout_inventory(tmp_path, ("box1", "box2")), "--json", "--batch", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and "Traceback" not in err
    report = json.loads(out)
    assert report["error"] == DEPLOY_ERROR_TEXT
    assert [h["state"] for h in report["hosts"]] == ["untouched", "untouched"]


def test_rollout_reports_unchanged_when_pyinfra_changed_nothing(monkeypatch, tmp_path, capsys):
    """A rollout in which nothing changed reports every host unchanged, not "updated"."""
    from pyinfra.api.command import FunctionCommand, StringCommand

    from vllm_fleet.deploy import access, verify

    state = RolloutState()
    hosts = stub_pyinfra(monkeypatch, state)

    def run_ops(_state):  # box1: only the lock and the verification ran; box2: a file was written
        box1, box2 = hosts["box1"], hosts["box2"]
        fresh = RolloutState({
            box1: [("Deploy manifest", []),
                   ("Verify instances", [FunctionCommand(verify.verify_instances, (), {"checks": []})]),
                   ("Release the deploy lock", [FunctionCommand(access._release_lock, (), {})])],
            box2: [("Deploy manifest", [StringCommand("mv /tmp/x /etc/vllm-fleet/manifest.json")]),
                   ("Verify instances", [FunctionCommand(verify.verify_instances, (), {"checks": []})])],
        })
        state.ops, state.op_meta, state.order = fresh.ops, fresh.op_meta, fresh.order

    monkeypatch.setattr("pyinfra.api.operations.run_ops", run_ops)
    code = rollout_mod.main([rollout_inventory(tmp_path, ("box1", "box2")), "--json", "--batch", "2"])
    out, _err = capsys.readouterr()
    assert code == 0
    assert {h["name"]: h["state"] for h in json.loads(out)["hosts"]} == {"box1": "unchanged", "box2": "updated"}
    assert set(rollout_mod.STATES) == {"untouched", "unchanged", "updated", "rolled back", "failed"}


def test_rollout_runs_the_packaged_deploy_on_each_batch_with_its_options(monkeypatch, tmp_path, capsys):
    """No deploy.py is read (an installed vllm-fleet needs no checkout): each batch runs
    vllm_fleet_deploy, executed, not serial, limited to the batch's hosts."""
    from vllm_fleet.deploy import RunOptions, vllm_fleet_deploy

    loaded = []
    stub_pyinfra(monkeypatch, RolloutState(), load=lambda state, function, **kwargs: loaded.append((function, kwargs)))
    monkeypatch.chdir(tmp_path)  # no deploy.py here
    code = rollout_mod.main([rollout_inventory(tmp_path, ("box1", "box2", "box3")), "--json", "--batch", "2"])
    capsys.readouterr()
    assert code == 0
    assert loaded == [
        (vllm_fleet_deploy, {"options": RunOptions(dry=False, serial=False, limit=("box1", "box2"),
                                                   command="vllm-fleet rollout, batch box1 box2")}),
        (vllm_fleet_deploy, {"options": RunOptions(dry=False, serial=False, limit=("box3",),
                                                   command="vllm-fleet rollout, batch box3")})]


def test_rollout_state_after_a_stop_stays_untouched(monkeypatch, tmp_path, capsys):
    state = RolloutState()
    hosts = stub_pyinfra(monkeypatch, state)

    def run_ops(_state):  # the first batch fails (and is rolled back); the second is never reached
        state.failed_hosts = {hosts["box1"]}

    monkeypatch.setattr("pyinfra.api.operations.run_ops", run_ops)
    monkeypatch.setattr(rollout_mod.rollback, "roll_back", lambda *_a: (True, "restored and verified"))
    code = rollout_mod.main([rollout_inventory(tmp_path, ("box1", "box2")), "--json"])
    out, _err = capsys.readouterr()
    assert code == 1
    assert [h["state"] for h in json.loads(out)["hosts"]] == ["rolled back", "untouched"]


@pytest.mark.skipif(os.geteuid() != 0, reason="deploy.py's first step needs `id -u` = 0 on the @local host")
def test_rollout_with_a_missing_model_source_exits_2_offline(tmp_path):
    """End to end on the @local host (no SSH, nothing written outside tmp_path): the real deploy.py
    refuses a model_source that does not exist; rollout prints its message, exits 2, no traceback."""
    import subprocess
    import sys

    inv = tmp_path / "inv.py"
    inv.write_text(textwrap.dedent(f"""
        box = [("@local", {{"vllm_target": "cpu", "vllm_root": "{tmp_path}/root",
                            "vllm_config_dir": "{tmp_path}/etc",
                            "vllm_instances": [{{"name": "tiny", "model": "{tmp_path}/models/tiny",
                                                 "model_source": "{tmp_path}/nowhere",
                                                 "served_model_name": "t", "port": 8000}}]}})]
    """))
    proc = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "rollout", str(inv)], capture_output=True,
                          text=True, timeout=300, cwd=REPO, stdin=subprocess.DEVNULL,
                          env=dict(os.environ, VLLM_FLEET_API_KEY=ROLLOUT_KEY))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "key model_source" in proc.stderr and "fix:" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr


# --- the pyinfra CLI prints a DeployError without a traceback ---------------------------------------

BAD_LOCAL_INVENTORY = """
box = [("@local", {"vllm_target": "cpu", "vllm_root": "%(tmp)s/root", "vllm_config_dir": "%(tmp)s/etc",
                    "vllm_instances": [{"name": "tiny", "model": "%(tmp)s/m", "served_model_name": "t",
                                        "port": "notaport"}]})]
"""


def _pyinfra_dry(tree, inventory):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run([sys.executable, "-m", "pyinfra", "--dry", str(inventory), "deploy.py"], cwd=tree,
                          env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def _assert_clean(proc):
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "key port: expected int" in text and "fix: port = 8000" in text, text
    assert "pyinfra error" in text, text
    assert "Traceback" not in text and "An exception occurred" not in text, text


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="deploy.py's first step needs `id -u` = 0 on @local")


@needs_root
def test_pyinfra_cli_prints_a_deploy_time_config_error_without_traceback(tmp_path):
    """`pyinfra INVENTORY deploy.py` with invalid host data prints the located error, no traceback:
    pyinfra's CLI prints a PyinfraError as `--> pyinfra error in FILE line N: MESSAGE`, and the
    deploy fails before any change (@local: no SSH; the host data is invalid, so nothing runs)."""
    from pyinfra.api.exceptions import PyinfraError

    from vllm_fleet.deploy import DeployError

    assert issubclass(DeployError, PyinfraError)
    inventory = tmp_path / "inv.py"
    inventory.write_text(BAD_LOCAL_INVENTORY % {"tmp": tmp_path})
    _assert_clean(_pyinfra_dry(REPO, inventory))
