"""Every path and unit name the deploy gives a host, in one value built from the host's settings.

`HostLayout.of(settings)` (or `host_layout(config)`) is the one place a host's file paths are
composed: the renderers (render, templating, gateway, monitoring), the deploy's steps and checks, and
the commands that read a host (status, rollback) all ask it, so a path a host gets has one spelling
and one writer. Pure: it reads settings and reaches no host.

The DP x PP x TP arrangement of an instance over its GPUs is another thing: plan.ParallelLayout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vllm_fleet.config import HUB_TOKEN_FILE, PROMETHEUS_DIR_SUFFIX, instance_unit
from vllm_fleet.environment import current_link, env_dir

if TYPE_CHECKING:
    from vllm_fleet.config import HostConfig, Settings
    from vllm_fleet.environment import EnvSpec

UNIT_DIR = "/etc/systemd/system"
# The host's front: the only listener clients reach (vLLM itself is on loopback).
FRONT_UNIT = "vllm-fleet-front.service"
RAY_UNIT = "vllm-fleet-ray.service"
GATEWAY_UNIT = "vllm-fleet-gateway.service"
KEEPALIVED_CONFIG = "/etc/keepalived/keepalived.conf"  # Debian's keepalived.service reads this one
EXPORTER_UNIT = "vllm-fleet-exporter.service"
NODE_EXPORTER_UNIT = "vllm-fleet-node-exporter.service"
PROMETHEUS_UNIT = "vllm-fleet-prometheus.service"
ALERTMANAGER_UNIT = "vllm-fleet-alertmanager.service"
# The fleet Prometheus' scrape jobs: one file of targets each (monitoring.targets fills them).
SCRAPE_JOBS = ("vllm", "vllm-router", "front", "node", "gpu")
MODEL_ACCESS_MODULE = "vllm_fleet_model_access"


@dataclass(frozen=True)
class HostLayout:
    """The directories a host's settings name, and every managed path under them."""

    root: str  # vllm_root: environments, uploads, rollback snapshots
    config_dir: str  # vllm_config_dir: engine configs, env files, the front's and gateway's files
    state_dir: str  # vllm_state_dir: the service user's home, Ray's temp and spill dirs

    @classmethod
    def of(cls, settings: Settings) -> HostLayout:
        return cls(root=settings.vllm_root, config_dir=settings.vllm_config_dir, state_dir=settings.vllm_state_dir)

    # --- the deploy's own files

    @property
    def manifest(self) -> str:
        """The deploy manifest (what was deployed: environment, instances, hashes)."""
        return f"{self.config_dir}/manifest.json"

    @property
    def upload_dir(self) -> str:
        """Where the login user uploads files before they are moved into place with privileges."""
        return f"{self.root}/.upload"

    @property
    def hub_token_file(self) -> str:
        return f"{self.config_dir}/{HUB_TOKEN_FILE}"

    @property
    def rollback_dir(self) -> str:
        """The rollout's snapshot of the files it is about to change (restored on a failed batch)."""
        return f"{self.root}/rollback"

    # --- vLLM and Ray

    @property
    def current(self) -> str:
        """The link every unit runs its environment through (environment.current_link)."""
        return current_link(self.root)

    def env(self, spec: EnvSpec) -> str:
        """Where the environment `spec` is built (environment.env_dir)."""
        return env_dir(spec, self.root)

    def instance(self, name: str) -> dict[str, str]:
        """Instance `name`'s unit, engine config and env file (its secrets)."""
        return {"unit": f"{UNIT_DIR}/{instance_unit(name)}", "config": f"{self.config_dir}/{name}.yaml",
                "env": f"{self.config_dir}/{name}.env"}

    def instance_adapters(self, name: str) -> str:
        """Instance `name`'s LoRA adapters as its running vLLM loads them (render.adapter_files)."""
        return f"{self.config_dir}/{name}.adapters.json"

    @property
    def adapter_loader(self) -> str:
        """The script that loads an instance's adapters into its running vLLM (templates/vllm-adapters.py.j2)."""
        return f"{self.config_dir}/vllm-adapters.py"

    @property
    def model_access(self) -> str:
        """The module vLLM loads (--middleware, from PYTHONPATH = its directory) on every instance:
        each client's tokens counted, and with adapters which of the instance's names each client
        may use (templates/vllm-model-access.py.j2)."""
        return f"{self.config_dir}/python/{MODEL_ACCESS_MODULE}.py"

    @property
    def ray(self) -> dict[str, str]:
        """The Ray unit, Ray's root temp dir (session dirs, logs, the raylet's and object store's unix
        sockets) and its spill dir: under the state dir, not /tmp, since PrivateTmp gives each unit its
        own /tmp and the head's vLLM (a Ray driver) must reach the raylet's sockets."""
        return {"unit": f"{UNIT_DIR}/{RAY_UNIT}", "temp": f"{self.state_dir}/ray",
                "spill": f"{self.state_dir}/ray-spill"}

    # --- the front (nginx) and the gateway (vllm-router)

    @property
    def front_secrets_dir(self) -> str:
        """The directory of the front's secrets (the keys file, the TLS key): root's, 0750, group the
        front's user, so no other service's user (vLLM's above all) can even look inside, and the vLLM
        and Ray units make it inaccessible besides (a directory, not its files: a file replaced by the
        next deploy would come back into view)."""
        return f"{self.config_dir}/front-secrets"

    @property
    def front(self) -> dict[str, str]:
        """The front's unit and config, the keys file the config includes, and (vllm_tls) its certificate
        chain, key and the CAs the host trusts (its own checks; on the gateway host, the backends), and on
        a gateway with the "prefix" policy the script that keys its requests. The keys file and the TLS
        key are in front_secrets_dir."""
        secrets = self.front_secrets_dir
        return {"unit": f"{UNIT_DIR}/{FRONT_UNIT}", "config": f"{self.config_dir}/front.conf",
                "keys": f"{secrets}/keys.conf", "tls_cert": f"{self.config_dir}/front-cert.pem",
                "tls_key": f"{secrets}/tls-key.pem", "tls_trust": f"{self.config_dir}/trust.pem",
                "prefix_key": f"{self.config_dir}/front-prefix-key.js"}

    @property
    def gateway(self) -> dict[str, str]:
        return {"unit": f"{UNIT_DIR}/{GATEWAY_UNIT}", "workers": f"{self.config_dir}/gateway-workers.json",
                "register": f"{self.config_dir}/gateway-register.py",
                "models": f"{self.config_dir}/gateway-models.json"}

    @property
    def floating(self) -> dict[str, str]:
        """On a gateway with a floating address (vllm_gateway_address): keepalived's config, where
        Debian's keepalived.service reads it, and the readiness check it runs (root's, 0644: keepalived's
        script security refuses a script a non-root user could change)."""
        return {"keepalived": KEEPALIVED_CONFIG, "check": f"{self.config_dir}/gateway-check.py"}

    def client_models(self, client: str) -> str:
        """GET /v1/models for a client limited to some models."""
        return f"{self.config_dir}/gateway-models-{client}.json"

    # --- metrics and the fleet's Prometheus

    @property
    def metrics(self) -> dict[str, str]:
        return {"exporter": f"{self.config_dir}/host-exporter.py",
                "exporter_unit": f"{UNIT_DIR}/{EXPORTER_UNIT}",
                "node_exporter_unit": f"{UNIT_DIR}/{NODE_EXPORTER_UNIT}"}

    @property
    def monitoring(self) -> dict[str, str]:
        base = f"{self.config_dir.rstrip('/')}{PROMETHEUS_DIR_SUFFIX}"
        return {"dir": base, "targets_dir": f"{base}/targets", "config": f"{base}/prometheus.yml",
                "rules": f"{base}/rules.yml", "token": f"{base}/metrics-token", "trust": f"{base}/trust.pem",
                "unit": f"{UNIT_DIR}/{PROMETHEUS_UNIT}",
                "alertmanager_config": f"{base}/alertmanager.yml",
                "alertmanager_unit": f"{UNIT_DIR}/{ALERTMANAGER_UNIT}",
                **{f"targets_{job}": f"{base}/targets/{job}.json" for job in SCRAPE_JOBS}}


def host_layout(config: HostConfig) -> HostLayout:
    """The layout of a parsed host."""
    return HostLayout.of(config.settings)
