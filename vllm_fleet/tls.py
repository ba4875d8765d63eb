"""The fleet's certificates, kept on the workstation: a CA of its own, and a certificate per host.

With `vllm_tls = True` a host's front serves its instance ports (and, on the gateway host, the gateway
port) over HTTPS only. Its certificate is the user's own (`vllm_tls_cert_file` / `vllm_tls_key_file`,
with `vllm_tls_ca_file` the CA that signed it), or one this module issues from the fleet CA: created on
the first deploy in `<vllm_workstation_dir>/tls` (0700; the CA key 0600, never on a host), kept, and reused by
every later deploy. `vllm-fleet tls ca INVENTORY` prints the path of the CA certificate clients trust.

A host's certificate names the host as the inventory does, its advertise and bind addresses, its SSH
address, `localhost` and the loopback addresses (the host's own verification connects there). It is
issued again when those names change, when the CA changes, and VLLM_TLS_RENEW_DAYS before it expires,
on the deploy that finds it so; else the same file is pushed, so a deploy changes nothing.

This is workstation I/O (files and keys), not part of the pure core: render takes the PEM texts
(HostTls) as it takes the secrets.
"""

from __future__ import annotations

import datetime
import fcntl
import getpass
import ipaddress
import os
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig

CA_DAYS = 3650
HOST_DAYS = 365
RENEW_DAYS = 30  # a host certificate this close to its end is issued again by the next deploy
CA_CERT = "ca.pem"
CA_KEY = "ca.key"


@dataclass(frozen=True)
class HostTls:
    """What a TLS host's front needs: its certificate chain, its key, and the CAs the host trusts for
    its own checks and, on the gateway host, for the backends (PEM texts)."""

    cert_pem: str
    key_pem: str
    trust_pem: str


def ca_dir(config: HostConfig) -> Path:
    return Path(config.settings.vllm_workstation_dir).expanduser() / "tls"


def ca_certificate_path(config: HostConfig) -> Path:
    """The file clients trust: the user's CA (vllm_tls_ca_file) or the fleet CA's certificate."""
    if config.settings.vllm_tls_ca_file:
        return Path(config.settings.vllm_tls_ca_file).expanduser()
    return ca_dir(config) / CA_CERT


def host_names(config: HostConfig, ssh_hostname: str | None = None) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) a host's certificate holds, sorted: what clients, the gateway and
    the host's own checks connect to."""
    candidates = {config.name, "localhost", "127.0.0.1", "::1", config.settings.vllm_advertise_address or "",
                  config.settings.vllm_bind_host, ssh_hostname or ""}
    dns, ips = set(), set()
    for name in candidates:
        if not name or name in ("0.0.0.0", "::"):
            continue
        try:
            ips.add(str(ipaddress.ip_address(name)))
        except ValueError:
            if not name.startswith("@"):  # pyinfra's @local and connectors are no DNS names
                dns.add(name.lower())
    return sorted(dns), sorted(ips, key=lambda a: (":" in a, a))


@contextmanager
def _locked(directory: Path):
    """One deploy at a time creates or issues in the CA directory (two could race on the CA)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    with open(directory / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def ensure_ca(directory: Path) -> Path:
    """The fleet CA in `directory`, created when missing; returns its certificate's path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    with _locked(directory):
        if cert_path.exists() and key_path.exists():
            return cert_path
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "vllm-fleet"),
                          x509.NameAttribute(NameOID.COMMON_NAME,
                                             f"vllm-fleet CA ({getpass.getuser()}@{socket.gethostname()})"[:64])])
        now = _now()
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
                .sign(key, hashes.SHA256()))
        _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        return cert_path


def _reusable(cert_pem: bytes, ca_cert, dns: list[str], ips: list[str]) -> bool:
    """Whether an issued certificate still serves: from this CA, for exactly these names, and not
    within RENEW_DAYS of its end."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return False
    have_dns = sorted(names.get_values_for_type(x509.DNSName))
    have_ips = sorted((str(a) for a in names.get_values_for_type(x509.IPAddress)), key=lambda a: (":" in a, a))
    return (cert.issuer == ca_cert.subject and have_dns == dns and have_ips == ips
            and cert.not_valid_after_utc - _now() > datetime.timedelta(days=RENEW_DAYS))


def issue_host_certificate(directory: Path, host: str, dns: list[str], ips: list[str]) -> tuple[str, str]:
    """(certificate chain PEM, key PEM) of `host` from the fleet CA in `directory`: the kept one while
    it serves (_reusable), else a new one, kept for the next deploy."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    ensure_ca(directory)
    hosts = directory / "hosts"
    with _locked(directory):
        hosts.mkdir(mode=0o700, exist_ok=True)
        ca_pem = (directory / CA_CERT).read_bytes()
        ca_cert = x509.load_pem_x509_certificate(ca_pem)
        cert_path, key_path = hosts / f"{host}.pem", hosts / f"{host}.key"
        if cert_path.exists() and key_path.exists() and _reusable(cert_path.read_bytes(), ca_cert, dns, ips):
            return cert_path.read_text() + ca_pem.decode(), key_path.read_text()
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), password=None)
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        alt = [x509.DNSName(n) for n in dns] + [x509.IPAddress(ipaddress.ip_address(a)) for a in ips]
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
                .issuer_name(ca_cert.subject).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=HOST_DAYS))
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        _write_private(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()))
        _write_private(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        return cert_path.read_text() + ca_pem.decode(), key_path.read_text()


def _read(config: HostConfig, knob: str) -> str:
    path = Path(getattr(config.settings, knob)).expanduser()
    try:
        return path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigErrors([ConfigError(f"cannot read {path}: {exc}", host=config.name, key=knob,
                                        fix=f"point {knob} at a PEM file on this workstation")]) from None


def host_tls(config: HostConfig, trusted: list[HostConfig], ssh_hostname: str | None = None) -> HostTls | None:
    """The TLS material of one host at deploy time (None without vllm_tls). `trusted`: the hosts whose
    certificates this host must check (the gateway's backends; itself): their CAs form its trust file."""
    if config.settings.vllm_tls is not True:
        return None
    if config.settings.vllm_tls_cert_file:
        cert, key = _read(config, "vllm_tls_cert_file"), _read(config, "vllm_tls_key_file")
        if "PRIVATE KEY" not in key:
            raise ConfigErrors([ConfigError("vllm_tls_key_file holds no PEM private key", host=config.name,
                                            key="vllm_tls_key_file",
                                            fix="point it at the key of vllm_tls_cert_file (PEM, unencrypted)")])
    else:
        dns, ips = host_names(config, ssh_hostname)
        cert, key = issue_host_certificate(ca_dir(config), config.name, dns, ips)
    return HostTls(cert_pem=cert, key_pem=key, trust_pem=trust_bundle([config, *trusted]))


def trust_bundle(configs: list[HostConfig]) -> str:
    """The CA certificates of every TLS host among `configs`, each once (PEM)."""
    seen: dict[str, str] = {}
    for config in configs:
        if config.settings.vllm_tls is not True:
            continue
        path = ca_certificate_path(config)
        if not config.settings.vllm_tls_ca_file:
            ensure_ca(ca_dir(config))
        if str(path) not in seen:
            seen[str(path)] = _read(config, "vllm_tls_ca_file") if config.settings.vllm_tls_ca_file else path.read_text()
    return "".join(seen.values())
