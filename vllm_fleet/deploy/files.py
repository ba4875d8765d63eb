"""Step 7: every rendered file in place (engine YAML, root-only env file, units, the front's and the
gateway's files, the manifest), and the files of units the plan no longer has removed. Each write
is kept in the run's Changes, by what it is, for step 8 to restart or reload what it changed."""

from __future__ import annotations

from typing import Any

from vllm_fleet import gateway
from vllm_fleet.host.operations import managed_file, secret_file, systemd_service
from vllm_fleet.monitoring.files import metrics_paths, monitoring_paths
from vllm_fleet.monitoring.targets import JOBS
from vllm_fleet.render import RenderedFile, front_paths, instance_paths, manifest_path, ray_paths

from .layout import removed_units, upload_dir
from .state import Deployment, FrontFileChanges, GatewayFileChanges, InstanceFileChanges, MonitoringFileChanges


def _put(name: str, rendered: RenderedFile, **owner: Any):
    return managed_file(name=name, dest=rendered.path, content=rendered.content, mode=rendered.mode,
                        **(owner or {"user": rendered.owner, "group": rendered.group}))


def _put_secret(rendered: RenderedFile, what: str, config):
    return secret_file(name=f"Front {what}: {rendered.path} (secret)", dest=rendered.path, content=rendered.content,
                       upload_dir=upload_dir(config), group=rendered.group, mode=rendered.mode)


def monitoring_files(deployment: Deployment) -> None:
    """A vllm_metrics host's exporters; on the monitoring host, Prometheus' unit, config, rules, token
    and every job's targets (a changed target list is reread by Prometheus: no operation depends on it)."""
    config, files = deployment.config, deployment.files
    paths = metrics_paths(config)
    if paths["exporter_unit"] not in files:
        return
    written = {kind: _put(f"Monitoring {kind.replace('_', ' ')}: {files[paths[kind]].path}", files[paths[kind]])
               for kind in ("exporter", "exporter_unit", "node_exporter_unit")}
    changes = MonitoringFileChanges(**written)
    prometheus = monitoring_paths(config)
    if prometheus["unit"] in files:
        token = files[prometheus["token"]]
        changes.prometheus_config = [
            _put("Prometheus config: " + files[prometheus["config"]].path, files[prometheus["config"]]),
            *([_put(f"Prometheus trusted CAs: {prometheus['trust']}", files[prometheus["trust"]])]
              if prometheus["trust"] in files else []),
            _put("Prometheus alert rules: " + files[prometheus["rules"]].path, files[prometheus["rules"]]),
            secret_file(name=f"Prometheus metrics token: {token.path} (secret)", dest=token.path, content=token.content,
                        upload_dir=upload_dir(config), group=token.group, mode=token.mode)
            if token.secret else _put(f"Prometheus metrics token: {token.path}", token)]
        for job in JOBS:
            _put(f"Prometheus targets of job {job}: {prometheus[f'targets_{job}']}", files[prometheus[f"targets_{job}"]])
        changes.prometheus_unit = _put(f"Prometheus unit: {files[prometheus['unit']].path}", files[prometheus["unit"]])
    deployment.changes.monitoring = changes


def service_files(deployment: Deployment) -> None:
    """7. Engine YAML, root-only env file, units; units of removed instances are removed."""
    config, files, changes = deployment.config, deployment.files, deployment.changes
    for inst in deployment.plan.instances:
        paths = instance_paths(config, inst.name)
        engine_config, unit, env = files[paths["config"]], files[paths["unit"]], files[paths["env"]]
        changes.instance_files[inst.name] = InstanceFileChanges(
            config=_put(f"Config of {inst.name}: {engine_config.path}", engine_config),
            unit=_put(f"Unit of {inst.name}: {unit.path}", unit),
            secrets=secret_file(name=f"Secrets of {inst.name}: {env.path}", dest=env.path, content=env.content,
                                upload_dir=upload_dir(config)))
    ray_unit = files.get(ray_paths(config)["unit"])
    if ray_unit is not None:  # a node of a multi-node instance: its Ray head or worker
        role = deployment.plan.ray
        changes.ray_unit = _put(f"Ray {'head' if role.is_head else 'worker'} unit of {role.instance}: "
                                f"{ray_unit.path}", ray_unit)
    front = front_paths(config)
    if front["unit"] in files:
        front_config, front_unit = files[front["config"]], files[front["unit"]]
        # Before the front (re)starts: its config includes these, and `nginx -t` checks them.
        includes = [_put_secret(files[front[kind]], what, config) if files[front[kind]].secret
                    else _put(f"Front {what}: {files[front[kind]].path}", files[front[kind]])
                    for kind, what in (("keys", "API keys"), ("tls_cert", "TLS certificate"),
                                       ("tls_key", "TLS key"), ("tls_trust", "trusted CAs"))
                    if front[kind] in files]
        changes.front = FrontFileChanges(config=_put(f"Front config: {front_config.path}", front_config),
                                         unit=_put(f"Front unit: {front_unit.path}", front_unit),
                                         includes=includes)
    gateway_files = gateway.gateway_paths(config)
    if gateway_files["unit"] in files:
        written = {kind: _put(f"Gateway {kind}: {files[gateway_files[kind]].path}", files[gateway_files[kind]])
                   for kind in ("unit", "workers", "register", "models")}
        for client in config.api_clients:
            path = gateway.client_models_path(config, client.name)
            if path in files:
                _put(f"Gateway models of client {client.name}: {path}", files[path])
        changes.gateway = GatewayFileChanges(**written)
    monitoring_files(deployment)
    _put("Deploy manifest", files[manifest_path(config)], user=None, group=None)  # its owner is not checked
    for unit, why, paths in removed_units(deployment):
        systemd_service(name=why, unit=unit, running=False, enabled=False)
        for path in paths:
            changes.removed_files.append(managed_file(name=f"Remove {path}", dest=path, present=False))
