"""The fleet's certificates, kept on the workstation: a CA of its own, and a certificate per host.

With `vllm_tls = True` a host's front serves its instance ports (and, on the gateway host, the gateway
port) over HTTPS only. Its certificate is the user's own (`vllm_tls_cert_file` / `vllm_tls_key_file`,
with `vllm_tls_ca_file` the CA that signed it), or one this module issues from the fleet CA: created on
the first deploy in `<vllm_workstation_dir>/tls` (0700; the CA key 0600, never on a host), kept, and reused by
every later deploy. `vllm-fleet tls ca INVENTORY` prints the path of the CA certificate clients trust.
Every file is read through workstation_files (no link, no device, bounded, the user's own, writable
by no one else); the user's own files are parsed and matched (own_certificate), and only what parsed
is pushed.

A host's certificate names the host as the inventory does, its advertise and bind addresses, its SSH
address, `localhost` and the loopback addresses (the host's own verification connects there), and on
a gateway the floating address (vllm_gateway_address) clients use. It is
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
import re
import socket
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from vllm_fleet import kinds
from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig
from vllm_fleet.workstation_files import (PEM_MAX_BYTES, UnsafeFile, directory_problem, ensure_directory, read_file,
                                         shown)

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
    the host's own checks connect to; on a gateway behind a floating address, that address too
    (clients reach whichever gateway holds it)."""
    floating = config.settings.vllm_gateway_address if config.settings.vllm_gateway is True else None
    candidates = {config.name, "localhost", "127.0.0.1", "::1", config.settings.vllm_advertise_address or "",
                  config.settings.vllm_bind_host, ssh_hostname or "", floating.split("/", 1)[0] if floating else ""}
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
    """One deploy at a time creates or issues in the CA directory (two could race on the CA). The
    directory is the user's, 0700, writable by no one else (workstation_files.ensure_directory:
    UnsafeFile otherwise), and so is the directory that holds it (the workstation's)."""
    problem = directory_problem(directory.parent)
    if problem:
        raise UnsafeFile(f"sits in {shown(directory.parent)}, which {problem[0]}", problem[1])
    ensure_directory(directory)
    os.chmod(directory, 0o700)
    fd = os.open(directory / ".lock", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_private(path: Path, data: bytes, mode: int = 0o600) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        os.unlink(tmp)  # a leftover of a run that died, or a link: never written through
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, mode)
    os.replace(tmp, path)


def _kept(path: Path, private: bool) -> bytes:
    """A file the fleet CA keeps (its certificate and key, the hosts'), read safely: UnsafeFile."""
    return read_file(path, limit=PEM_MAX_BYTES, private=private)


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
        if os.path.lexists(cert_path) and os.path.lexists(key_path):
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
        ensure_directory(hosts)
        ca_pem = _kept(directory / CA_CERT, private=False)
        ca_cert = x509.load_pem_x509_certificate(ca_pem)
        # A connector's host name holds '/' (@docker/web): one file name still ('%' is in no host name).
        stem = host.replace("/", "%2F")
        cert_path, key_path = hosts / f"{stem}.pem", hosts / f"{stem}.key"
        if os.path.lexists(cert_path) and os.path.lexists(key_path):
            cert_pem = _kept(cert_path, private=False)
            if _reusable(cert_pem, ca_cert, dns, ips):
                return cert_pem.decode("ascii") + ca_pem.decode("ascii"), _kept(key_path, private=True).decode("ascii")
        ca_key = serialization.load_pem_private_key(_kept(directory / CA_KEY, private=True), password=None)
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
        return (_kept(cert_path, private=False).decode("ascii") + ca_pem.decode("ascii"),
                _kept(key_path, private=True).decode("ascii"))


#: The knobs of a host's own certificate, and what each file holds.
OWN_FILES = {"vllm_tls_cert_file": "certificate", "vllm_tls_key_file": "private key", "vllm_tls_ca_file": "CA file"}
_PEM_LABEL = re.compile(rb"-----BEGIN ([A-Z0-9 ]{1,64})-----")


@dataclass(frozen=True)
class OwnCertificate:
    """A host's own certificate, as its files were read and checked: PEM written again from what
    parsed (what the files held besides is not carried on)."""

    cert_pem: str  # the chain: the host's certificate first
    key_pem: str  # PKCS#8, unencrypted (nginx reads it at start, with no one to type a passphrase)
    ca_pem: str


def _own_file(config: HostConfig, knob: str, errors: list[ConfigError]) -> bytes | None:
    path = getattr(config.settings, knob)
    try:
        return read_file(path, limit=PEM_MAX_BYTES, private=knob == "vllm_tls_key_file")
    except UnsafeFile as exc:
        errors.append(ConfigError(f"the {OWN_FILES[knob]} {shown(path)} {exc.problem}", host=config.name, key=knob,
                                  fix=exc.fix))
        return None


def _certificates(config: HostConfig, knob: str, data: bytes, errors: list[ConfigError]) -> list:
    """The certificates of a PEM file, nothing else in it (a key beside them would be pushed as a
    public file); [] with the problem in `errors`."""
    from cryptography import x509

    path = shown(getattr(config.settings, knob))
    labels = [label.decode() for label in _PEM_LABEL.findall(data)]
    others = sorted({label for label in labels if label != "CERTIFICATE"})
    problem = None
    if others:
        problem = (f"holds {', '.join(others)} beside its certificates: the deploy pushes this file as a public one "
                   "(mode 0644, shown by --diff), so it holds certificates only")
    elif not labels:
        problem = "holds no PEM certificate (-----BEGIN CERTIFICATE-----)"
    else:
        try:
            return x509.load_pem_x509_certificates(data)
        except ValueError:
            problem = "does not parse as PEM certificates"
    errors.append(ConfigError(f"the {OWN_FILES[knob]} {path} {problem}", host=config.name, key=knob,
                              fix=f"point {knob} at a PEM file of certificates only"))
    return []


def _private_key(config: HostConfig, data: bytes, errors: list[ConfigError]):
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    knob, path = "vllm_tls_key_file", shown(config.settings.vllm_tls_key_file)
    labels = [label.decode() for label in _PEM_LABEL.findall(data)]
    keys = [label for label in labels if label.endswith("PRIVATE KEY")]
    others = sorted({label for label in labels if not label.endswith("PRIVATE KEY") and label != "EC PARAMETERS"})
    fix = "point vllm_tls_key_file at the certificate's private key alone (PEM, unencrypted)"
    problem = None
    if len(keys) != 1 or others:
        problem = (f"holds {len(keys)} private keys" + (f" and {', '.join(others)}" if others else "")
                   + ": it must hold the certificate's private key alone")
    else:
        try:
            return serialization.load_pem_private_key(data, password=None)
        except TypeError:  # cryptography: "Password was not given but private key is encrypted"
            problem = "is encrypted: nginx reads it when it starts, with no one to type its passphrase"
            fix = f"decrypt it into a file of its own, mode 0600: openssl pkey -in {path} -out <new file>"
        except (ValueError, UnsupportedAlgorithm):
            problem = "does not parse as a PEM private key (of a kind nginx takes)"
    errors.append(ConfigError(f"the private key {path} {problem}", host=config.name, key=knob, fix=fix))
    return None


def _issued_by(cert, issuer) -> bool:
    """Whether `issuer` signed `cert` (its name is cert's issuer and the signature verifies)."""
    from cryptography.exceptions import InvalidSignature

    if cert.issuer != issuer.subject:
        return False
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _names_ip(cert, address: str) -> bool:
    """Whether the certificate's subjectAltName holds the IP address `address`."""
    from cryptography import x509

    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    return ipaddress.ip_address(address) in names.get_values_for_type(x509.IPAddress)


def _name(name) -> str:
    text = name.rfc4514_string()
    return text if kinds.printable(text) else repr(text)


def own_certificate(config: HostConfig) -> OwnCertificate:
    """The host's own certificate (vllm_tls_cert_file, vllm_tls_key_file, vllm_tls_ca_file), each file
    read safely (workstation_files.read_file) and parsed with `cryptography`: the certificate file
    holds certificates only, the key file one unencrypted private key, the CA file certificates only;
    the key is the certificate's (their public keys are one), the certificate has not ended, and its
    chain leads to a CA of the CA file (each issuer's name and signature checked). ConfigErrors with
    every problem, naming the files, never their contents."""
    from cryptography.hazmat.primitives import serialization

    errors: list[ConfigError] = []
    data = {knob: _own_file(config, knob, errors) for knob in OWN_FILES}
    chain = _certificates(config, "vllm_tls_cert_file", data["vllm_tls_cert_file"], errors) \
        if data["vllm_tls_cert_file"] is not None else []
    key = _private_key(config, data["vllm_tls_key_file"], errors) if data["vllm_tls_key_file"] is not None else None
    cas = _certificates(config, "vllm_tls_ca_file", data["vllm_tls_ca_file"], errors) \
        if data["vllm_tls_ca_file"] is not None else []
    cert_path, key_path = shown(config.settings.vllm_tls_cert_file), shown(config.settings.vllm_tls_key_file)
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if chain and key is not None and chain[0].public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        errors.append(ConfigError(
            f"the private key {key_path} is not the key of the certificate {cert_path}: nginx would refuse to "
            "start with the pair", host=config.name, key="vllm_tls_key_file",
            fix="give the key the certificate was issued for (or the certificate of this key)"))
    if chain and chain[0].not_valid_after_utc < _now():
        errors.append(ConfigError(
            f"the certificate {cert_path} ended on {chain[0].not_valid_after_utc:%Y-%m-%d}: every client would "
            "refuse it", host=config.name, key="vllm_tls_cert_file", fix="renew it (or set vllm_tls_cert_file, "
            "vllm_tls_key_file and vllm_tls_ca_file to None: the fleet CA issues one)"))
    floating = config.settings.vllm_gateway_address if config.settings.vllm_gateway is True else None
    if chain and floating and not _names_ip(chain[0], floating.split("/", 1)[0]):
        errors.append(ConfigError(
            f"the certificate {cert_path} does not name the floating address {floating.split('/', 1)[0]} "
            "(vllm_gateway_address) among its IP addresses: clients reaching the gateways there would refuse it",
            host=config.name, key="vllm_tls_cert_file",
            fix=f"issue it with the IP address {floating.split('/', 1)[0]} in its subjectAltName (or set "
                "vllm_tls_cert_file, vllm_tls_key_file and vllm_tls_ca_file to None: the fleet CA issues one that does)"))
    if chain and cas:
        cert, intermediates = chain[0], chain[1:]
        for _step in range(len(intermediates) + 1):
            if any(_issued_by(cert, ca) for ca in cas):
                break
            cert = next((i for i in intermediates if _issued_by(cert, i)), None)
            if cert is None:
                ca_path = shown(config.settings.vllm_tls_ca_file)
                errors.append(ConfigError(
                    f"the certificate {cert_path} does not chain to a CA of {ca_path}: issued by "
                    f"{_name(chain[0].issuer)}, where {ca_path} holds {', '.join(_name(c.subject) for c in cas)} "
                    "(an issuer's name and signature are checked): the gateway, the verification and "
                    "clients trusting that CA would refuse the host", host=config.name, key="vllm_tls_ca_file",
                    fix="give the CA that signed the certificate (and the intermediates in the certificate file, "
                        "after the host's certificate)"))
                break
        else:  # a chain that loops through its intermediates
            errors.append(ConfigError(f"the certificate {cert_path}'s chain does not reach a CA of its CA file",
                                      host=config.name, key="vllm_tls_ca_file",
                                      fix="give the CA that signed the certificate"))
    if errors:
        raise ConfigErrors(errors)
    pem = serialization.Encoding.PEM
    return OwnCertificate(
        cert_pem="".join(c.public_bytes(pem).decode("ascii") for c in chain),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()).decode("ascii"),
        ca_pem="".join(c.public_bytes(pem).decode("ascii") for c in cas))


def own_ca(config: HostConfig) -> str:
    """A host's own CA file (vllm_tls_ca_file) as the hosts that check it trust it: its certificates,
    read safely and parsed (PEM written again). ConfigErrors."""
    from cryptography.hazmat.primitives import serialization

    errors: list[ConfigError] = []
    data = _own_file(config, "vllm_tls_ca_file", errors)
    cas = _certificates(config, "vllm_tls_ca_file", data, errors) if data is not None else []
    if errors:
        raise ConfigErrors(errors)
    return "".join(c.public_bytes(serialization.Encoding.PEM).decode("ascii") for c in cas)


def fleet_ca_error(config: HostConfig, exc: UnsafeFile | OSError | ValueError) -> ConfigErrors:
    """What the fleet CA's directory or files could not be used for, as the error naming them."""
    if isinstance(exc, UnsafeFile):
        problem, fix = exc.problem, exc.fix
    else:
        problem = f"cannot be used ({exc.strerror if isinstance(exc, OSError) else 'a file does not parse'})"
        fix = "restore its files from the workstation that made them, or remove the directory to start a new CA"
    return ConfigErrors([ConfigError(f"the fleet CA in {shown(ca_dir(config))} (or a file in it) {problem}",
                                     host=config.name, key="vllm_workstation_dir", fix=fix)])


def host_tls(config: HostConfig, trusted: list[HostConfig], ssh_hostname: str | None = None) -> HostTls | None:
    """The TLS material of one host at deploy time (None without vllm_tls). `trusted`: the hosts whose
    certificates this host must check (the gateway's backends; itself): their CAs form its trust file.
    ConfigErrors: a file refused (own_certificate, the fleet CA's directory)."""
    if config.settings.vllm_tls is not True:
        return None
    if config.settings.vllm_tls_cert_file:
        own = own_certificate(config)
        cert, key = own.cert_pem, own.key_pem
    else:
        dns, ips = host_names(config, ssh_hostname)
        try:
            cert, key = issue_host_certificate(ca_dir(config), config.name, dns, ips)
        except (UnsafeFile, OSError, ValueError) as exc:
            raise fleet_ca_error(config, exc) from None
    return HostTls(cert_pem=cert, key_pem=key, trust_pem=trust_bundle([config, *trusted]))


def trust_bundle(configs: list[HostConfig]) -> str:
    """The CA certificates of every TLS host among `configs`, each once (PEM). ConfigErrors: a CA file
    refused."""
    seen: dict[str, str] = {}
    for config in configs:
        if config.settings.vllm_tls is not True:
            continue
        path = ca_certificate_path(config)
        if str(path) in seen:
            continue
        if config.settings.vllm_tls_ca_file:
            seen[str(path)] = own_ca(config)
            continue
        try:
            ensure_ca(ca_dir(config))
            seen[str(path)] = _kept(path, private=False).decode("ascii")
        except (UnsafeFile, OSError, ValueError) as exc:
            raise fleet_ca_error(config, exc) from None
    return "".join(seen.values())
