"""TLS on every listener clients reach (vllm_fleet/tls.py): HTTPS, the certificates, and the
workstation's own directory that keeps the fleet CA."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet import kinds
from vllm_fleet.config.knobs.common import BOOL, WORKSTATION_FILE
from vllm_fleet.config.schema import knob, section


@section("TLS on every listener clients reach (each front's instance ports, the gateway)")
@dataclass(frozen=True)
class TlsKnobs:
    vllm_tls: bool = knob(
        False, "True: the front's instance ports and the gateway speak HTTPS only", **BOOL,
        notes="""
        True: HTTPS only (TLS 1.2+); a plain-HTTP request there gets 400 and nothing is served. The host's
        certificate comes from a fleet CA that the first deploy creates on the workstation in
        <vllm_workstation_dir>/tls (the CA key 0600, never on a host); it names the host, its addresses
        and localhost, and a later deploy issues it again 30 days before it ends. `vllm-fleet tls ca
        INVENTORY` prints the path of the CA certificate clients trust. The gateway checks its backends' certificates,
        and so do the verification and status. Or give your own: all three of the files below (PEM, on the
        workstation, paths from / or ~; the key is pushed root:<service user> 0640 and never shown). Each is
        read as a secret file is (see Secrets below) and parsed before any host is reached: certificates
        only in the certificate and CA files (the certificate is pushed 0644), one unencrypted private key
        in the key file, the key the certificate's, the certificate chaining to the CA file.
        """)
    vllm_tls_cert_file: str | None = knob(
        None, "the host's certificate (chain)", **WORKSTATION_FILE,
        fix="vllm_tls_cert_file = '~/certs/gpu-a100-01.pem' (with vllm_tls_key_file and vllm_tls_ca_file), or None")
    vllm_tls_key_file: str | None = knob(
        None, "its private key", **WORKSTATION_FILE, fix="vllm_tls_key_file = '~/certs/gpu-a100-01.key', or None")
    vllm_tls_ca_file: str | None = knob(
        None, "the CA that signed it", **WORKSTATION_FILE, fix="vllm_tls_ca_file = '~/certs/ca.pem', or None")
    vllm_workstation_dir: str = knob(
        "~/.local/share/vllm-fleet", "the fleet CA, the hosts' certificates and the seed of their keys",
        check=kinds.workstation_dir_problem,
        fix="vllm_workstation_dir = '~/.local/share/vllm-fleet' (outside the repository)",
        notes="""
        The workstation's own files: the fleet CA (tls/), the hosts' certificates, and the seed of each
        host's own key (the key vLLM holds; clients never see it). Outside the repository; share it between
        the workstations that deploy one fleet, or the other's deploy re-keys every host (a restart each).
        A path from / or ~ (empty or relative, the fleet CA's key would land wherever vllm-fleet runs); it
        must belong to the user running vllm-fleet and be writable by no one else (made 0700 when missing).
        """)
