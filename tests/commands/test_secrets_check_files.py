"""`vllm-fleet check` reading secret files safely, offline: links, devices, FIFOs, huge files,
directories, owners and modes refused; a good file read once for every host; a secret pasted where
its name or path belongs never shown; the workstation's directory and seed trusted only when no one
else could change them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from vllm_fleet import fleet_secrets, host_keys
from vllm_fleet.config import ConfigErrors, parse_host
from support.secrets_check import (
    FAKE_SSH_KEY,
    FLEET_KEY,
    FOUR_CLIENTS,
    H100,
    KEYS,
    QWEN,
    SSH_KEY_BODY,
    assert_clean,
    make_key_file,
    make_ssh_link,
    refused_connections,
    run_check,
    team,
    write_inventory,
)


@pytest.fixture
def no_connection(monkeypatch):
    yield from refused_connections(monkeypatch)


# --- files read safely ------------------------------------------------------------------------------

def _fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe.key")
    return tmp_path / "pipe.key"


def _huge(tmp_path):
    path = tmp_path / "huge.key"
    with open(path, "wb") as f:
        f.truncate(100 * 1024 * 1024)  # 100 MB, sparse
    path.chmod(0o600)
    return path


def _other_owner(tmp_path):
    path = make_key_file(tmp_path)
    os.chown(path, 65534, 65534)
    return path


@pytest.mark.parametrize("make, words", [
    (make_ssh_link, "is a symbolic link"),
    (lambda tmp: Path("/dev/zero"), "is a character device"),
    (_fifo, "is a FIFO"),
    (_huge, "is 104857600 bytes, more than the 8192"),
    (lambda tmp: tmp, "is a directory"),
    (lambda tmp: make_key_file(tmp, mode=0o644), "every user of this workstation may access it (mode 0644)"),
    (lambda tmp: make_key_file(tmp, mode=0o620), "is writable by its group (mode 0620)"),
    (lambda tmp: make_key_file(tmp, mode=0o606), "is writable by every user (mode 0606)"),
    (lambda tmp: make_key_file(tmp, "[default]\naws_secret_access_key = sk-research-93c1e7a5b0\n"), "holds 2 lines"),
    (lambda tmp: make_key_file(tmp, FAKE_SSH_KEY), "holds a PEM block"),
    (lambda tmp: make_key_file(tmp, ""), "is empty"),
    (lambda tmp: make_key_file(tmp, "\n\n"), "is empty"),
    pytest.param(_other_owner, "belongs to nobody (uid 65534)",
                 marks=pytest.mark.skipif(os.geteuid() != 0, reason="only root gives a file to another user")),
])
def test_a_key_file_that_is_no_safe_regular_file_of_ones_own_is_refused(tmp_path, no_connection, make, words):
    path = make(tmp_path)
    clients = dict(FOUR_CLIENTS, research={"key_file": str(path), "models": ["llama-3.1-8b"]})
    errors, _ = run_check(tmp_path, team(tmp_path, vllm_api_clients=clients))
    assert [(e.host, e.key) for e in errors] == [("gpu-a", "vllm_api_clients.research.key_file")], errors
    assert words in errors[0].message and "(for hosts gpu-a, gpu-b alike)" in errors[0].message
    assert_clean(errors, [SSH_KEY_BODY, "aws_secret_access_key"])


def test_a_good_key_file_is_read_and_the_same_file_once_for_every_host(tmp_path, monkeypatch):
    path = make_key_file(tmp_path, "sk-research-93c1e7a5b0\n", 0o640)  # its group may read it
    clients = dict(FOUR_CLIENTS, research={"key_file": str(path), "models": ["llama-3.1-8b"]})
    inventory = team(tmp_path, vllm_api_clients=clients)
    opened = []
    real = fleet_secrets.read_file
    monkeypatch.setattr(fleet_secrets, "read_file", lambda p, **kw: opened.append(p) or real(p, **kw))
    assert run_check(tmp_path, inventory)[0] == []
    assert opened == [str(path)]


@pytest.mark.parametrize("knob, value", [
    ("vllm_api_key_file", "sk-live-4f1c9e2a7b0d"),  # a key pasted where its file's path belongs
    ("vllm_api_key_file", "~/sk-live-4f1c9e2a7b0d"),  # a path naming nothing: not shown either
    ("vllm_api_key_env", "sk-live-4f1c9e2a7b0d"),
    ("vllm_hf_token_env", "hf_live4f1c9e2a7b0d"),  # a valid variable name, if a lowercase one
    ("vllm_api_key_env", "deadbeef4f1c9e2a7b0d"),  # `openssl rand -hex` output that starts with a letter
    ("vllm_metrics_token_env", "mt-live-4f1c9e2a7b0d"),
    ("vllm_api_key_env", 40196178926047195893),
    ("vllm_api_key_file", 40196178926047195893),
])
def test_a_secret_pasted_where_its_name_or_path_belongs_is_never_shown(tmp_path, knob, value):
    inventory = write_inventory(tmp_path, {"gpu-a": {"vllm_instances": [QWEN], "vllm_metrics": True, knob: value}})
    environ = {"VLLM_FLEET_METRICS_TOKEN": KEYS["VLLM_FLEET_METRICS_TOKEN"]}
    if knob != "vllm_api_key_file":  # the file is read only where the variable is not set
        environ["VLLM_FLEET_API_KEY"] = "sk-fleet-4b2e9c0d7a"
    errors, _ = run_check(tmp_path, inventory, environ)
    assert errors and all(e.key == knob for e in errors), errors
    assert_clean(errors, [str(value), "4f1c9e2a7b0d", "40196178926047195893"])


@pytest.mark.parametrize("client", [{"key_env": "sk-live-4f1c9e2a7b0d"}, {"key_env": "cafe4f1c9e2a7b0d"},
                                    {"key_file": "sk-live-4f1c9e2a7b0d"},
                                    {"key_file": 40196178926047195893}, {"key_env": "CI\x07KEY"}])
def test_a_clients_key_pasted_in_place_of_its_source_is_never_shown(tmp_path, client):
    inventory = team(tmp_path, vllm_api_clients=dict(FOUR_CLIENTS, ci=client))
    errors, _ = run_check(tmp_path, inventory)
    assert errors and all(e.key.startswith("vllm_api_clients.ci.") for e in errors), errors
    assert_clean(errors, ["4f1c9e2a7b0d", "40196178926047195893"])


def test_control_characters_in_names_never_reach_the_terminal(tmp_path):
    clients = dict(FOUR_CLIENTS)
    clients["ci\x1b]0;pwned\x07"] = {"key_env": "CI_KEY"}
    inventory = team(tmp_path, vllm_api_clients=clients)
    (tmp_path / "group_data" / "gpu\x1b[31mhosts.py").write_text("vllm_tls = True\n")
    errors, _ = run_check(tmp_path, inventory)
    assert {e.key for e in errors} >= {"vllm_api_clients (a key)", "group_data"}, errors
    assert any("gpu\\x1b[31mhosts.py" in e.message for e in errors)
    assert_clean(errors)


# --- the workstation's directory and seed ------------------------------------------------------------

@pytest.mark.parametrize("value, words", [("", "is empty"), ("   ", "is empty"), ("keys", "not a path from / or ~"),
                                          ("./vllm-fleet", "not a path from / or ~")])
def test_an_empty_or_relative_workstation_dir_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                                   value, words):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigErrors) as info:
        parse_host("gpu-a", {"vllm_instances": [QWEN], "gpus": [H100], "vllm_workstation_dir": value})
    (error,) = info.value.errors
    assert error.key == "vllm_workstation_dir" and words in error.message and "fleet CA's private key" in error.message
    assert list(tmp_path.iterdir()) == []


def _config(tmp_path, **data):
    return parse_host("gpu-a", {"vllm_instances": [QWEN], "gpus": [H100],
                                "vllm_workstation_dir": str(tmp_path / "ws"), **data})


def test_the_workstation_dir_is_made_0700_by_the_deploy_and_left_alone_by_the_check(tmp_path):
    config = _config(tmp_path, vllm_tls=True)
    assert fleet_secrets.check_secrets([config], lambda: [config], FLEET_KEY) == []
    assert not (tmp_path / "ws").exists()
    secrets = fleet_secrets.read_host_secrets(config, environ=FLEET_KEY)
    assert secrets.host_key.startswith("vf-host-") and secrets.tls is not None
    assert stat.S_IMODE((tmp_path / "ws").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "ws" / "host-key-seed").stat().st_mode) == 0o600
    assert fleet_secrets.check_secrets([config], lambda: [config], FLEET_KEY) == []  # what it made passes


def _world_writable_dir(ws):
    ws.mkdir()
    ws.chmod(0o777)


def _foreign_dir(ws):
    ws.mkdir(mode=0o700)
    os.chown(ws, 65534, 65534)


def _world_writable_seed(ws):
    ws.mkdir(mode=0o700)
    (ws / "host-key-seed").write_text("ab" * 32 + "\n")
    (ws / "host-key-seed").chmod(0o666)


def _linked_seed(ws):
    ws.mkdir(mode=0o700)
    (ws.parent / "elsewhere").write_text("ab" * 32 + "\n")
    (ws.parent / "elsewhere").chmod(0o600)
    (ws / "host-key-seed").symlink_to(ws.parent / "elsewhere")


def _garbled_seed(ws):
    ws.mkdir(mode=0o700)
    (ws / "host-key-seed").write_text("not hex\n")
    (ws / "host-key-seed").chmod(0o600)


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="only root gives a directory to another user")


@pytest.mark.parametrize("make, words", [
    (_world_writable_dir, "is writable by its group and every user (mode 0777)"),
    pytest.param(_foreign_dir, "belongs to nobody (uid 65534)", marks=root_only),
    (_world_writable_seed, "the seed of the hosts' keys"),
    (_linked_seed, "is a symbolic link"),
    (_garbled_seed, "does not hold 64 hex digits"),
])
def test_a_workstation_dir_or_seed_others_could_change_is_not_trusted(tmp_path, make, words):
    make(tmp_path / "ws")
    config = _config(tmp_path)
    for errors in (fleet_secrets.check_secrets([config], lambda: [config], FLEET_KEY),
                   pytest.raises(ConfigErrors, fleet_secrets.read_host_secrets, config, environ=FLEET_KEY).value.errors):
        assert [(e.host, e.key) for e in errors] == [("gpu-a", "vllm_workstation_dir")], errors
        assert words in errors[0].message
        assert_clean(errors, ["ab" * 32])
    if make is _world_writable_seed:
        assert "writable by its group and every user (mode 0666)" in errors[0].message
        with pytest.raises(ConfigErrors):
            host_keys.host_key(config)  # the host's key is never derived from it
