"""SSH: no knob of vllm-fleet, but a default of pyinfra's own that vllm-fleet sets for every host."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.config.schema import section


@section("SSH (pyinfra's own keys)", pyinfra={"ssh_strict_host_key_checking": "yes"}, notes="""
    Host keys are checked: an unknown or changed host key fails the connection. pyinfra's default,
    "accept-new", would trust any first key; set "accept-new" (or "no") here or per host only on
    purpose, e.g. for freshly installed servers whose keys you cannot pre-load into known_hosts.
    """)
@dataclass(frozen=True)
class SshKnobs:
    pass
