"""`vllm-fleet check` and the user's own TLS certificate, offline: a certificate, key and CA that
match pass and only what parsed is pushed; files that do not parse or match are refused naming the
files, every host's problem in one run."""

from __future__ import annotations

import datetime
import os

import pytest

from vllm_fleet import fleet_secrets
from vllm_fleet.config import ConfigErrors, parse_host
from support.secrets_check import (
    FLEET_KEY,
    H100,
    LLAMA,
    QWEN,
    SSH_KEY_BODY,
    assert_clean,
    make_ssh_link,
    refused_connections,
    run_check,
    write_inventory,
)


@pytest.fixture
def no_connection(monkeypatch):
    yield from refused_connections(monkeypatch)


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
    ssh = make_ssh_link(tmp_path)  # tmp/research.key -> a fake ~/.ssh/id_ed25519
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
