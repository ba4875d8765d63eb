"""`vllm-fleet check` and the secrets it reads, offline: every missing secret of every host at once,
no secret in two roles, keys strong enough, client models that no instance serves, group data that
no host reads, the deploy and rollout running the check first; each refused naming host, key and
fix, never showing a secret or a raw control character, and nothing connected (a connection attempt
fails the test). Secret files read safely and the workstation's directory: test_secrets_check_files.py;
the user's own TLS files: test_secrets_check_tls.py."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from vllm_fleet.commands import check as check_command
from vllm_fleet.config import ConfigErrors
from support.secrets_check import FOUR_CLIENTS, KEYS, assert_clean, make_key_file, refused_connections, run_check, team


@pytest.fixture
def no_connection(monkeypatch):
    yield from refused_connections(monkeypatch)


# --- the check: everything at once, nothing connected ----------------------------------------------

def test_four_clients_and_a_metrics_token_unset_are_five_errors_of_one_run_and_nothing_connects(
        tmp_path, monkeypatch, capsys, no_connection):
    inventory = team(tmp_path)
    for name in KEYS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert check_command.main([inventory]) == 2
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 5, err
    for name in ("ALICE_KEY", "BOB_KEY", "CI_KEY", "RESEARCH_KEY", "VLLM_FLEET_METRICS_TOKEN"):
        assert sum(f"${name} is not set" in line for line in lines) == 1, err
    assert "(for hosts gpu-a, gpu-b alike)" in err and "5 problem(s); no host was connected to." in err
    assert "key vllm_api_clients.alice.key_env" in err and "fix: export ALICE_KEY=$(openssl rand -hex 32)" in err
    # And what the fleet will be, all the same.
    assert "gpu-a: http at 10.255.255.1 (gateway, metrics)" in out
    assert ("qwen7b: vllm-qwen7b.service, port 8000, serves qwen2.5-7b at http://10.255.255.1:8000/v1 "
            "(the gateway's only: clients use the gateway)") in out
    assert "gateway: http://10.255.255.1:9000/v1 on gpu-a, models llama-3.1-8b, qwen2.5-7b" in out
    assert "monitoring: Prometheus on gpu-b at http://10.255.255.2:9410/prometheus/" in out
    assert "ci: its own key, from $CI_KEY; every model; 60 requests a minute" in out


def test_with_every_secret_set_the_check_passes_and_json_holds_the_summary(tmp_path, monkeypatch, capsys,
                                                                           no_connection):
    inventory = team(tmp_path, vllm_tls=True)
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)
    assert check_command.main([inventory, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True and report["problems"] == []
    summary = report["fleet_summary"]
    assert [(h["name"], h["scheme"]) for h in summary["hosts"]] == [("gpu-a", "https"), ("gpu-b", "https")]
    assert summary["hosts"][0]["instances"][0] == {
        "name": "qwen7b", "unit": "vllm-qwen7b.service", "port": 8000, "served_model_name": "qwen2.5-7b", "adapters": [],
        "url": "https://10.255.255.1:8000/v1", "gateway_only": True, "nodes": None}
    assert summary["gateway"]["url"] == "https://10.255.255.1:9000/v1"
    assert summary["monitoring"]["host"] == "gpu-b" and summary["monitoring"]["scrapes"] == ["gpu-a", "gpu-b"]
    assert {c["name"]: (c["key_source"], c["models"], c["requests_per_minute"]) for c in summary["clients"]} == {
        "alice": ("$ALICE_KEY", None, None), "bob": ("$BOB_KEY", ["qwen2.5-7b"], None),
        "ci": ("$CI_KEY", None, 60), "research": ("$RESEARCH_KEY", ["llama-3.1-8b"], None)}
    assert not any(value in json.dumps(report) for value in KEYS.values())
    assert not (tmp_path / "workstation").exists()  # the check writes nothing: the deploy makes the CA and seed


def test_a_host_with_bad_data_shows_no_summary_of_a_smaller_fleet(tmp_path, monkeypatch, capsys, no_connection):
    """The gateway host's data has a typo: a summary of the other host alone would say the fleet has
    no gateway; the check says why there is none instead."""
    inventory = team(tmp_path)
    text = Path(inventory).read_text()
    assert "'vllm_gateway': True" in text
    Path(inventory).write_text(text.replace("'vllm_gateway': True", "'vllm_gateway': True, 'vllm_gatway_policy': 'x'", 1))
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    assert check_command.main([inventory]) == 2
    captured = capsys.readouterr()
    assert "What the fleet will be (" not in captured.out and "gateway: none" not in captured.out
    assert "not shown until every host's data is valid" in captured.out
    assert "vllm_gatway_policy" in captured.err
    assert check_command.main([inventory, "--json"]) == 2
    assert json.loads(capsys.readouterr().out)["fleet_summary"] is None


def test_an_instance_port_open_to_clients_is_not_shown_as_the_gateways_only(tmp_path):
    (tmp_path / "open").mkdir()
    (tmp_path / "closed").mkdir()
    errors, summary = run_check(tmp_path / "open", team(tmp_path / "open", vllm_direct_access=True))
    assert errors == [] and [i["gateway_only"] for h in summary["hosts"] for i in h["instances"]] == [False, False]
    errors, summary = run_check(tmp_path / "closed", team(tmp_path / "closed"))
    assert errors == [] and [i["gateway_only"] for h in summary["hosts"] for i in h["instances"]] == [True, True]

def test_plan_prints_the_same_summary_and_holds_it_in_json(tmp_path, monkeypatch, capsys):
    from vllm_fleet import cli

    inventory = team(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan", inventory, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["fleet_summary"]
    assert check_command.check(inventory, cwd=tmp_path, environ=KEYS)[1] == summary
    assert cli.main(["plan", inventory]) == 0
    assert "What the fleet will be (2 host(s)):" in capsys.readouterr().out


# --- client models ---------------------------------------------------------------------------------

def test_a_client_naming_an_instance_is_refused_with_the_served_name_meant(tmp_path, monkeypatch, capsys,
                                                                           no_connection):
    from vllm_fleet import cli

    clients = dict(FOUR_CLIENTS, bob={"key_env": "BOB_KEY", "models": ["qwen7b"]},
                   research={"key_env": "RESEARCH_KEY", "models": ["llama-3.1-8"]})
    inventory = team(tmp_path, vllm_api_clients=clients)
    errors, _summary = run_check(tmp_path, inventory)
    assert [(e.host, e.key) for e in errors] == [("gpu-a", "vllm_api_clients.bob.models"),
                                                 ("gpu-a", "vllm_api_clients.research.models")]
    assert "'qwen7b', which no instance of the fleet serves" in errors[0].message
    assert errors[0].fix.startswith("did you mean 'qwen2.5-7b'? qwen7b is the instance's name")
    assert errors[1].fix == "did you mean 'llama-3.1-8b'?"
    assert_clean(errors)
    # plan and the deploy refuse it as well: it is the fleet's rule, not the check's.
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan", inventory]) == 2
    assert "did you mean 'qwen2.5-7b'?" in capsys.readouterr().err


def test_a_client_model_served_outside_the_limit_is_no_error(tmp_path):
    from vllm_fleet.fleet import Fleet

    inventory = team(tmp_path)
    Fleet.load(inventory, ["gpu-a"], cwd=tmp_path).hosts()  # research's llama-3.1-8b is gpu-b's


# --- one source and one value per secret -----------------------------------------------------------

@pytest.mark.parametrize("group_data, key, words", [
    ({"vllm_api_clients": dict(FOUR_CLIENTS, bob={"key_env": "ALICE_KEY"})},
     "vllm_api_clients.bob.key_env", "client bob's key is read from $ALICE_KEY, and so is client alice's key"),
    ({"vllm_metrics_token_env": "CI_KEY"}, "vllm_metrics_token_env", "the metrics token is read from $CI_KEY"),
    ({"vllm_hf_token_env": "RESEARCH_KEY"}, "vllm_hf_token_env", "the Hugging Face token is read from $RESEARCH_KEY"),
    ({"vllm_api_clients": dict(FOUR_CLIENTS, bob={"key_file": "~/k"}, ci={"key_file": "~/x/../k"})},
     "vllm_api_clients.ci.key_file", "read from file ~/k"),
])
def test_one_variable_or_file_read_for_two_secrets_is_refused_by_plan_and_check(tmp_path, group_data, key, words):
    from vllm_fleet.fleet import Fleet

    inventory = team(tmp_path, **group_data)
    with pytest.raises(ConfigErrors) as info:
        Fleet.load(inventory, cwd=tmp_path).hosts()
    assert [(e.host, e.key) for e in info.value.errors] == [("gpu-a", key)], info.value
    assert words in info.value.errors[0].message
    errors, _summary = run_check(tmp_path, inventory)
    assert any(e.key == key and words in e.message for e in errors)
    assert_clean(errors)


def test_an_hf_token_equal_to_a_client_key_or_the_metrics_token_is_refused_never_shown(tmp_path):
    inventory = team(tmp_path)
    errors, _ = run_check(tmp_path, inventory, dict(KEYS, HF_TOKEN=KEYS["CI_KEY"]))
    (error,) = errors
    assert (error.host, error.key) == ("gpu-a", "vllm_hf_token_env")
    assert "the Hugging Face token ($HF_TOKEN) has the same value as client ci's key ($CI_KEY" in error.message
    errors, _ = run_check(tmp_path, inventory, dict(KEYS, HF_TOKEN=KEYS["VLLM_FLEET_METRICS_TOKEN"]))
    assert [e.key for e in errors] == ["vllm_hf_token_env"] and "the metrics token" in errors[0].message
    errors, _ = run_check(tmp_path, inventory, dict(KEYS, BOB_KEY=KEYS["ALICE_KEY"]))
    assert [e.key for e in errors] == ["vllm_api_clients.bob.key_env"]
    assert "the fronts could not tell the two clients apart" in errors[0].message
    assert_clean(errors)


def test_one_key_file_under_two_paths_for_two_clients_is_one_value_refused(tmp_path):
    key = tmp_path / "shared.key"
    key.write_text("sk-shared-7e1d0c9b2a\n")
    key.chmod(0o600)
    os.link(key, tmp_path / "other.key")
    clients = dict(FOUR_CLIENTS, alice={"key_file": str(key)}, bob={"key_file": str(tmp_path / "other.key")})
    errors, _ = run_check(tmp_path, team(tmp_path, vllm_api_clients=clients))
    assert [e.key for e in errors] == ["vllm_api_clients.bob.key_file"]
    assert "the same value as client alice's key" in errors[0].message
    assert_clean(errors, ["sk-shared-7e1d0c9b2a"])


def test_a_client_key_file_not_made_yet_gets_the_command_that_makes_one(tmp_path):
    clients = dict(FOUR_CLIENTS, dave={"key_file": str(tmp_path / "dave.key")})
    errors, _ = run_check(tmp_path, team(tmp_path, vllm_api_clients=clients))
    (error,) = [e for e in errors if e.key == "vllm_api_clients.dave.key_file"]
    assert "does not exist" in error.message
    assert "(umask 077; openssl rand -hex 32 > FILE)" in error.fix
    assert_clean(errors)

@pytest.mark.parametrize("value, words", [
    ("k", "shorter than 16 characters"),
    ("sk-test", "shorter than 16 characters"),
    ("aaaaaaaaaaaaaaaaaaaaaaaa", "fewer than 5 different characters"),
    ("abababababababababab", "fewer than 5 different characters"),
])
def test_a_weak_key_or_metrics_token_is_refused(tmp_path, value, words):
    inventory = team(tmp_path)
    for variable, key in (("CI_KEY", "vllm_api_clients.ci.key_env"),
                          ("VLLM_FLEET_METRICS_TOKEN", "vllm_metrics_token_env")):
        errors, _ = run_check(tmp_path, inventory, dict(KEYS, **{variable: value}))
        assert [(e.host, e.key) for e in errors] == [("gpu-a", key)] and words in errors[0].message
        assert_clean(errors, [value] if len(value) > 2 else [])
    # The Hugging Face token is the hub's: a short one passes.
    assert run_check(tmp_path, inventory, dict(KEYS, HF_TOKEN="hf_x"))[0] == []


# --- group data that no host reads ---------------------------------------------------------------------

def test_group_data_that_matches_no_group_is_named_with_the_groups_there_are(tmp_path):
    inventory = team(tmp_path)
    (tmp_path / "group_data" / "gpu_servers.py").write_text("vllm_tls = True\n")
    (tmp_path / "staging.py").write_text("hosts = []\n")  # another inventory: its group's data is its own
    (tmp_path / "group_data" / "staging.py").write_text("vllm_tls = True\n")
    (tmp_path / "group_data" / "gpu_hosts.py").write_text("vllm_tls = True\n")  # a group of this inventory
    errors, summary = run_check(tmp_path, inventory)
    (error,) = errors
    assert error.key == "group_data" and "gpu_servers.py" in error.message
    assert "which no host of" in error.message and "all, fleet, gpu_hosts" in error.fix
    assert [h["scheme"] for h in summary["hosts"]] == ["https", "https"]  # gpu_hosts.py did apply


def test_plan_and_render_warn_of_group_data_that_matches_no_group(tmp_path, monkeypatch, capsys):
    """What `check` refuses, plan and render (which CI runs) say on stderr: they still succeed."""
    from vllm_fleet import cli

    inventory = team(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["plan", inventory]) == 0
    assert "gpu_servers.py" not in capsys.readouterr().err
    (tmp_path / "group_data" / "gpu_servers.py").write_text("vllm_gateway_policy = 'consistent_hash'\n")
    for command in (["plan", inventory], ["render", inventory, "--out", str(tmp_path / "out")]):
        assert cli.main(command) == 0
        err = capsys.readouterr().err
        assert "warning: " in err and "gpu_servers.py" in err and "apply to no host" in err, (command, err)

def test_group_data_linked_from_a_folder_other_inventories_share_is_theirs(tmp_path):
    """A variant inventory elsewhere links the repository's group_data: the files there named after
    the inventories beside that folder are those inventories' groups, not mistakes of this one's; a
    file named after no inventory and no group still is."""
    shared = tmp_path / "repo"
    shared.mkdir()
    inventory = team(shared)
    (shared / "prod.py").write_text("hosts = []\n")
    (shared / "group_data" / "prod.py").write_text("vllm_tls = True\n")
    (shared / "group_data" / "gpu_servers.py").write_text("vllm_tls = True\n")
    variant = tmp_path / "variant"
    variant.mkdir()
    (variant / "group_data").symlink_to(shared / "group_data")
    (variant / "fleet.py").write_text(Path(inventory).read_text())
    errors, _summary = run_check(variant, str(variant / "fleet.py"))
    assert [e.key for e in errors] == ["group_data"] and "gpu_servers.py" in errors[0].message, errors


# --- the deploy and rollout run the check first ------------------------------------------------------

def test_the_deploy_reports_every_missing_secret_before_its_lock_or_any_fact(monkeypatch, tmp_path):
    from support.planning_fixtures import FakeHost, host_data, use_fake_host

    from vllm_fleet.deploy import DeployError, access
    from vllm_fleet.deploy.prepare import prepare

    for name in KEYS:
        monkeypatch.delenv(name, raising=False)
    data = dict(host_data(), vllm_api_clients=FOUR_CLIENTS, vllm_metrics=True,
                vllm_workstation_dir=str(tmp_path / "ws"))
    data["vllm_api_clients"] = {name: {k: v for k, v in spec.items() if k != "models"}
                                for name, spec in FOUR_CLIENTS.items()}
    fake = FakeHost(data, {})
    use_fake_host(monkeypatch, fake)
    locks = []
    monkeypatch.setattr(access, "take_lock", lambda *a: locks.append(a) or True)
    with pytest.raises(DeployError) as info:
        prepare()
    text = str(info.value)
    assert text.count("is not set on this workstation") == 5 and "nothing was changed on any host" in text
    assert locks == [] and fake.asked == [] and fake.batches == []


def test_rollout_reports_every_problem_before_its_first_batch_connects(tmp_path, monkeypatch, capsys):
    from vllm_fleet.commands import connection, rollout

    batches = []
    monkeypatch.setattr(connection, "connected", lambda *a, **k: batches.append(a))
    for name in KEYS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert rollout.main([team(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("is not set on this workstation") == 5 and batches == []


def test_the_pyinfra_cli_deploy_reports_every_missing_secret_without_a_traceback(tmp_path):
    """`pyinfra --dry INVENTORY deploy.py` on @local: the run stops on the check, each missing secret
    named, before any command (no lock: a dry run)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    (tmp_path / "inv.py").write_text(textwrap.dedent(f"""
        box = [("@local", {{"vllm_target": "cpu", "vllm_root": "{tmp_path}/root", "vllm_config_dir": "{tmp_path}/etc",
                            "vllm_workstation_dir": "{tmp_path}/ws", "vllm_metrics": True,
                            "vllm_api_clients": {{"a": {{"key_env": "A_KEY"}}, "b": {{"key_env": "B_KEY"}}}},
                            "vllm_instances": []}})]
    """))
    env = {k: v for k, v in os.environ.items() if k not in KEYS and not k.endswith("_KEY")}
    done = subprocess.run([sys.executable, "-m", "pyinfra", "--dry", str(tmp_path / "inv.py"), "deploy.py"],
                          cwd=repo, env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    text = done.stdout + done.stderr
    assert done.returncode != 0, text
    assert "$A_KEY is not set" in text and "$B_KEY is not set" in text and "$VLLM_FLEET_METRICS_TOKEN is not set" in text
    assert "Traceback" not in text


def test_tls_ca_refuses_a_workstation_dir_others_can_write_without_a_traceback(tmp_path, monkeypatch, capsys):
    from vllm_fleet import cli

    inventory = team(tmp_path, vllm_tls=True)
    (tmp_path / "workstation").mkdir()
    (tmp_path / "workstation").chmod(0o777)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["tls", "ca", inventory]) == 2
    err = capsys.readouterr().err
    assert "key vllm_workstation_dir" in err and "(mode 0777)" in err and "fix: chmod go-w" in err
    assert not (tmp_path / "workstation" / "tls").exists()


def test_the_summary_shows_a_key_files_path_only_where_something_is(tmp_path):
    key = make_key_file(tmp_path)
    clients = dict(FOUR_CLIENTS, alice={"key_file": str(key)}, bob={"key_file": "/X8kq2v9Zp1sLw7Ty4Rb0"})
    _errors, summary = run_check(tmp_path, team(tmp_path, vllm_api_clients=clients))
    sources = {c["name"]: c["key_source"] for c in summary["clients"]}
    assert sources["alice"] == f"file {key}" and "X8kq2v9Zp1sLw7Ty4Rb0" not in json.dumps(summary)
