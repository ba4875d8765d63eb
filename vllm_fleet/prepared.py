"""The prepared host: everything vllm-fleet derives for one host, made by one function.

`prepare_host` takes what discovery read from the host (vllm_fleet/host/discovery.py: the config with
its models' own numbers, the live GPUs and their interconnect) and returns the plan and every file
rendered from it. The deploy (deploy.prepare: its steps and verification read the Deployment built
around it) and `vllm-fleet status` (drift, the front) both take a PreparedHost from here: neither
plans or renders on its own, so what status compares a host with is what the deploy would write.
Pure: no host is reached here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from vllm_fleet.config import HostConfig
from vllm_fleet.gateway import Backend
from vllm_fleet.plan import HostPlan, plan_host
from vllm_fleet.render import RenderedFile, Secrets, instance_paths, manifest_path, render_host

if TYPE_CHECKING:  # what discovery read; imported for its type only (this module reaches no host)
    from vllm_fleet.host.discovery import Discovered


@dataclass
class PreparedHost:
    """One host's plan and rendered files, and the config they were made from."""

    config: HostConfig  # with each instance's model numbers as discovery read them
    plan: HostPlan
    files: dict[str, RenderedFile]  # path on the host -> the file
    backends: list[Backend] | None = None  # the fleet's, rendered into the gateway host's files

    def instance_file(self, name: str, kind: str) -> RenderedFile:
        """An instance's rendered file: kind is "unit", "config" or "env"."""
        return self.files[instance_paths(self.config, name)[kind]]

    @property
    def manifest(self) -> RenderedFile:
        return self.files[manifest_path(self.config)]


def prepare_host(found: "Discovered", secrets: Secrets | None = None,
                 backends_for: Callable[[HostPlan], list[Backend] | None] | None = None) -> PreparedHost:
    """Plan the host from what discovery found (ConfigErrors when it cannot be planned), then render
    every file. `backends_for(plan)`: the fleet's gateway backends, on the gateway host (they need
    this host's plan); `secrets`: None renders placeholders (status compares no secret file)."""
    plan = plan_host(found.config, found.live, found.interconnect)
    backends = backends_for(plan) if backends_for else None
    files = {f.path: f for f in render_host(found.config, plan, secrets, backends)}
    return PreparedHost(found.config, plan, files, backends)
