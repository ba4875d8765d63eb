"""What the tests of `vllm-fleet check` and its secrets share (tests/commands/test_secrets_check*.py):
inventories whose addresses answer nothing, a fixture that fails a test on any connection attempt,
the check run with the test's environment, and the secrets that no message may show."""

from __future__ import annotations

import socket
from pathlib import Path


from vllm_fleet.commands import check as check_command
from vllm_fleet.commands import connection
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


def refused_connections(monkeypatch):
    """The body of each module's `no_connection` fixture (`yield from refused_connections(monkeypatch)`):
    every way to reach a host fails the test: sockets, pyinfra's connect_all, paramiko."""
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



def make_key_file(tmp_path, text="sk-research-93c1e7a5b0\n", mode=0o600) -> Path:
    path = tmp_path / "research.key"
    path.write_text(text)
    path.chmod(mode)
    return path


def make_ssh_link(tmp_path):
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_text(FAKE_SSH_KEY)
    (ssh / "id_ed25519").chmod(0o600)
    (tmp_path / "research.key").symlink_to(ssh / "id_ed25519")
    return tmp_path / "research.key"


FLEET_KEY = {"VLLM_FLEET_API_KEY": "sk-fleet-4b2e9c0d7a"}
