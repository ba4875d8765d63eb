"""`vllm-fleet check` and the secrets it reads, offline: every missing secret of every host at once,
files read safely (links, devices, FIFOs, huge files, directories, owners and modes), no secret in two
roles, keys strong enough, TLS pairs parsed and matched, the workstation's directory and seed, client
models that no instance serves, group data that no host reads; hostile and careless values of each
class, each refused naming host, key and fix, never showing a secret or a raw control character, and
nothing connected (a connection attempt fails the test)."""

from __future__ import annotations

import datetime
import json
import os
import socket
import stat
import textwrap
from pathlib import Path

import pytest

from vllm_fleet import fleet_secrets, host_keys
from vllm_fleet.commands import check as check_command
from vllm_fleet.commands import connection
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.kinds import LINE_BREAKING

connection.install()  # first: gevent's sockets in, as the commands have them, before no_connection patches them

H100 = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": 9.0}
QWEN = {"name": "qwen7b", "model": "Qwen/Qwen2.5-7B-Instruct", "served_model_name": "qwen2.5-7b", "port": 8000}
LLAMA = {"name": "llama8b", "model": "meta-llama/Llama-3.1-8B-Instruct", "served_model_name": "llama-3.1-8b",
         "port": 8000}
FOUR_CLIENTS = {"alice": {"key_env": "ALICE_KEY"}, "bob": {"key_env": "BOB_KEY", "models": ["qwen2.5-7b"]},
                "ci": {"key_env": "CI_KEY", "requests_per_minute": 60},
                "research": {"key_env": "RESEARCH_KEY", "models": ["llama-3.1-8b"]}}
# Values a test's environment gives; none may appear in any message.
KEYS = {"ALICE_KEY": "sk-alice-8d2f0c9e71b4", "BOB_KEY": "sk-bob-5a7c3e1f90d2", "CI_KEY": "sk-ci-0e4b6d8f2a1c",
        "RESEARCH_KEY": "sk-research-93c1e7a5b0", "VLLM_FLEET_METRICS_TOKEN": "mt-prom-6f2d9b4e0a8c"}
FAKE_SSH_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
                "-----END OPENSSH PRIVATE KEY-----\n")
SSH_KEY_BODY = "b3BlbnNzaC1rZXktdjEAAAAA"


@pytest.fixture
def no_connection(monkeypatch):
    """Every way to reach a host fails the test: sockets, pyinfra's connect_all, paramiko."""
    import paramiko
    import pyinfra.api.connect

    attempts = []

    def refuse(*args, **kwargs):
        attempts.append((args[1:], kwargs))
        raise ConnectionRefusedError("this test connects to nothing")

    for owner, name in ((socket.socket, "connect"), (socket.socket, "connect_ex"), (socket, "create_connection"),
                        (pyinfra.api.connect, "connect_all"), (paramiko.SSHClient, "connect")):
        monkeypatch.setattr(owner, name, refuse)
    yield attempts
    assert attempts == [], f"something tried to connect: {attempts}"


def write_inventory(tmp_path: Path, hosts: dict[str, dict], group_data: dict | None = None,
                    files: dict[str, str] | None = None) -> str:
    """An inventory file of `hosts` (name -> data) in group gpu_hosts, whose addresses answer nothing
    (a connection would hang or fail), group_data/all.py from `group_data`, and more group-data files."""
    (tmp_path / "group_data").mkdir(exist_ok=True)
    rows = [(name, {"ssh_hostname": f"10.255.255.{i}", "ssh_port": 1, "gpus": [H100], **data})
            for i, (name, data) in enumerate(hosts.items(), 1)]
    (tmp_path / "fleet.py").write_text(f"gpu_hosts = {rows!r}\n")
    all_data = {"vllm_workstation_dir": str(tmp_path / "workstation"), **(group_data or {})}
    (tmp_path / "group_data" / "all.py").write_text("".join(f"{k} = {v!r}\n" for k, v in all_data.items()))
    for name, text in (files or {}).items():
        (tmp_path / "group_data" / name).write_text(text)
    return str(tmp_path / "fleet.py")


def team(tmp_path, **group_data) -> str:
    """Two hosts, the gateway on one and Prometheus on the other, with the four clients."""
    return write_inventory(tmp_path, {"gpu-a": {"vllm_instances": [QWEN], "vllm_gateway": True},
                                      "gpu-b": {"vllm_instances": [LLAMA], "vllm_monitoring": True}},
                           {"vllm_metrics": True, "vllm_api_clients": FOUR_CLIENTS, **group_data})


def run_check(tmp_path, inventory, environ=None):
    errors, summary = check_command.check(inventory, cwd=tmp_path, environ=dict(KEYS if environ is None else environ))
    return errors, summary


def assert_clean(errors, secrets=()):
    """Each error names a key and a fix (a host where one is concerned), holds no secret of `secrets`
    or of KEYS, and no raw control character."""
    for error in errors:
        text = error.located()
        assert error.key and error.fix, text
        assert not LINE_BREAKING.search(text.replace("\n  fix: ", " ")), repr(text)
        for secret in (*KEYS.values(), *secrets):
            assert secret not in text, text


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


# --- files read safely ------------------------------------------------------------------------------

def _key_file(tmp_path, text="sk-research-93c1e7a5b0\n", mode=0o600) -> Path:
    path = tmp_path / "research.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def _fifo(tmp_path):
    os.mkfifo(tmp_path / "pipe.key")
    return tmp_path / "pipe.key"


def _huge(tmp_path):
    path = tmp_path / "huge.key"
    with open(path, "wb") as f:
        f.truncate(100 * 1024 * 1024)  # 100 MB, sparse
    path.chmod(0o600)
    return path


def _ssh_link(tmp_path):
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_text(FAKE_SSH_KEY)
    (ssh / "id_ed25519").chmod(0o600)
    (tmp_path / "research.key").symlink_to(ssh / "id_ed25519")
    return tmp_path / "research.key"


def _other_owner(tmp_path):
    path = _key_file(tmp_path)
    os.chown(path, 65534, 65534)
    return path


@pytest.mark.parametrize("make, words", [
    (_ssh_link, "is a symbolic link"),
    (lambda tmp: Path("/dev/zero"), "is a character device"),
    (_fifo, "is a FIFO"),
    (_huge, "is 104857600 bytes, more than the 8192"),
    (lambda tmp: tmp, "is a directory"),
    (lambda tmp: _key_file(tmp, mode=0o644), "every user of this workstation may access it (mode 0644)"),
    (lambda tmp: _key_file(tmp, mode=0o620), "is writable by its group (mode 0620)"),
    (lambda tmp: _key_file(tmp, mode=0o606), "is writable by every user (mode 0606)"),
    (lambda tmp: _key_file(tmp, "[default]\naws_secret_access_key = sk-research-93c1e7a5b0\n"), "holds 2 lines"),
    (lambda tmp: _key_file(tmp, FAKE_SSH_KEY), "holds a PEM block"),
    (lambda tmp: _key_file(tmp, ""), "is empty"),
    (lambda tmp: _key_file(tmp, "\n\n"), "is empty"),
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
    path = _key_file(tmp_path, "sk-research-93c1e7a5b0\n", 0o640)  # its group may read it
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


# --- TLS: the user's own certificate ---------------------------------------------------------------

def _ca(name: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(ca, host: str, days: int = 30):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_cert, ca_key = ca
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=2)).not_valid_after(now + datetime.timedelta(days=days))
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def _pem(obj, password: bytes | None = None) -> str:
    from cryptography.hazmat.primitives import serialization

    if hasattr(obj, "private_bytes"):
        encryption = (serialization.BestAvailableEncryption(password) if password
                      else serialization.NoEncryption())
        return obj.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 encryption).decode()
    return obj.public_bytes(serialization.Encoding.PEM).decode()


def _own_tls(tmp_path, cert_text: str, key_text: str, ca_text: str) -> dict:
    paths = {}
    for knob, name, text, mode in (("vllm_tls_cert_file", "host.pem", cert_text, 0o644),
                                   ("vllm_tls_key_file", "host.key", key_text, 0o600),
                                   ("vllm_tls_ca_file", "ca.pem", ca_text, 0o644)):
        path = tmp_path / name
        path.write_text(text)
        path.chmod(mode)
        paths[knob] = str(path)
    return {"vllm_tls": True, **paths}


def _one_host_with(tmp_path, tls: dict) -> str:
    return write_inventory(tmp_path, {"gpu-a": {"vllm_instances": [QWEN], **tls}})


FLEET_KEY = {"VLLM_FLEET_API_KEY": "sk-fleet-4b2e9c0d7a"}


def test_own_certificate_key_and_ca_that_match_pass_and_only_what_parsed_is_pushed(tmp_path):
    ca = _ca("Team CA")
    cert, key = _leaf(ca, "gpu-a")
    tls = _own_tls(tmp_path, _pem(cert) + "# a comment the file had\n", _pem(key), _pem(ca[0]))
    assert run_check(tmp_path, _one_host_with(tmp_path, tls), FLEET_KEY)[0] == []
    config = parse_host("gpu-a", {"vllm_instances": [QWEN], "gpus": [H100], **tls,
                                  "vllm_workstation_dir": str(tmp_path / "ws")})
    secrets = fleet_secrets.read_host_secrets(config, environ=FLEET_KEY)
    assert secrets.tls.cert_pem == _pem(cert) and "comment" not in secrets.tls.cert_pem
    assert secrets.tls.trust_pem == _pem(ca[0]) and secrets.tls.key_pem.startswith("-----BEGIN PRIVATE KEY-----")


def _mismatched(tmp_path):
    ca = _ca("Team CA")
    cert, _key = _leaf(ca, "gpu-a")
    _other_cert, other_key = _leaf(ca, "gpu-b")
    return _own_tls(tmp_path, _pem(cert), _pem(other_key), _pem(ca[0]))


def _other_ca(tmp_path):
    cert, key = _leaf(_ca("Team CA"), "gpu-a")
    return _own_tls(tmp_path, _pem(cert), _pem(key), _pem(_ca("Team CA")[0]))  # same name, another key


def _key_in_cert_file(tmp_path):
    ca = _ca("Team CA")
    cert, key = _leaf(ca, "gpu-a")
    return _own_tls(tmp_path, _pem(cert) + _pem(key), _pem(key), _pem(ca[0]))


def _encrypted_key(tmp_path):
    ca = _ca("Team CA")
    cert, key = _leaf(ca, "gpu-a")
    return _own_tls(tmp_path, _pem(cert), _pem(key, b"passphrase"), _pem(ca[0]))


def _expired(tmp_path):
    ca = _ca("Team CA")
    cert, key = _leaf(ca, "gpu-a", days=-1)
    return _own_tls(tmp_path, _pem(cert), _pem(key), _pem(ca[0]))


def _zero_ca(tmp_path):
    ca = _ca("Team CA")
    cert, key = _leaf(ca, "gpu-a")
    return dict(_own_tls(tmp_path, _pem(cert), _pem(key), _pem(ca[0])), vllm_tls_ca_file="/dev/zero")


def _linked_key(tmp_path):
    ca = _ca("Team CA")
    cert, key = _leaf(ca, "gpu-a")
    tls = _own_tls(tmp_path, _pem(cert), _pem(key), _pem(ca[0]))
    os.unlink(tls["vllm_tls_key_file"])
    ssh = _ssh_link(tmp_path)  # tmp/research.key -> a fake ~/.ssh/id_ed25519
    return dict(tls, vllm_tls_key_file=str(ssh))


def _world_readable_key(tmp_path):
    tls = _mismatched(tmp_path)
    os.chmod(tls["vllm_tls_key_file"], 0o644)
    return tls


@pytest.mark.parametrize("make, key, words", [
    (_mismatched, "vllm_tls_key_file", "is not the key of the certificate"),
    (_other_ca, "vllm_tls_ca_file", "does not chain to a CA of"),
    (_key_in_cert_file, "vllm_tls_cert_file", "holds PRIVATE KEY beside its certificates"),
    (_encrypted_key, "vllm_tls_key_file", "is encrypted"),
    (_expired, "vllm_tls_cert_file", "ended on"),
    (_zero_ca, "vllm_tls_ca_file", "is a character device"),
    (_linked_key, "vllm_tls_key_file", "is a symbolic link"),
    (_world_readable_key, "vllm_tls_key_file", "may access it (mode 0644)"),
])
def test_own_tls_files_that_do_not_parse_or_match_are_refused_naming_the_files(tmp_path, no_connection, make,
                                                                               key, words):
    tls = make(tmp_path)
    errors, _ = run_check(tmp_path, _one_host_with(tmp_path, tls), FLEET_KEY)
    assert [(e.host, e.key) for e in errors] == [("gpu-a", key)], errors
    assert words in errors[0].message
    named = tls[key] if key != "vllm_tls_ca_file" or "chain" not in words else tls["vllm_tls_cert_file"]
    assert named in errors[0].message
    assert_clean(errors, ["PRIVATE KEY-----\n", "MI", SSH_KEY_BODY])


def test_a_mismatched_pair_names_both_files_and_the_deploy_refuses_it_too(tmp_path):
    tls = _mismatched(tmp_path)
    config = parse_host("gpu-a", {"vllm_instances": [QWEN], "gpus": [H100], **tls,
                                  "vllm_workstation_dir": str(tmp_path / "ws")})
    with pytest.raises(ConfigErrors) as info:
        fleet_secrets.read_host_secrets(config, environ=FLEET_KEY)
    (error,) = info.value.errors
    assert tls["vllm_tls_key_file"] in error.message and tls["vllm_tls_cert_file"] in error.message


def test_every_hosts_tls_problem_is_reported_in_one_run(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    inventory = write_inventory(tmp_path, {"gpu-a": {"vllm_instances": [QWEN], **_mismatched(tmp_path / "a")},
                                           "gpu-b": {"vllm_instances": [LLAMA], **_expired(tmp_path / "b")}})
    errors, _ = run_check(tmp_path, inventory, FLEET_KEY)
    assert [(e.host, e.key) for e in errors] == [("gpu-a", "vllm_tls_key_file"), ("gpu-b", "vllm_tls_cert_file")]


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
    key = _key_file(tmp_path)
    clients = dict(FOUR_CLIENTS, alice={"key_file": str(key)}, bob={"key_file": "/X8kq2v9Zp1sLw7Ty4Rb0"})
    _errors, summary = run_check(tmp_path, team(tmp_path, vllm_api_clients=clients))
    sources = {c["name"]: c["key_source"] for c in summary["clients"]}
    assert sources["alice"] == f"file {key}" and "X8kq2v9Zp1sLw7Ty4Rb0" not in json.dumps(summary)
