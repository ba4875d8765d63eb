"""Step 7: every rendered file in place (engine YAML, root-only env file, units, the front's and the
gateway's files, the manifest), and the files of units the plan no longer has removed. Each write
notifies its service in the run's Changes, by its kind (handlers.HANDLERS: what restarts and what
reloads each service), for steps 8 and 10."""

from __future__ import annotations

from typing import Any

from vllm_fleet import gateway
from vllm_fleet.operations.managed import managed_file, secret_file, systemd_service
from vllm_fleet.monitoring.files import metrics_paths, monitoring_paths
from vllm_fleet.host_layout import ALERTMANAGER_UNIT, EXPORTER_UNIT, NODE_EXPORTER_UNIT, PROMETHEUS_UNIT
from vllm_fleet.monitoring.targets import JOBS
from vllm_fleet.render import RenderedFile, front_paths, instance_paths, manifest_path, ray_paths
from vllm_fleet.host_layout import FRONT_UNIT, RAY_UNIT, host_layout

from .managed import removed_units, upload_dir
from .state import Deployment


def _put(name: str, rendered: RenderedFile, **owner: Any):
    return managed_file(name=name, dest=rendered.path, content=rendered.content, mode=rendered.mode,
                        **(owner or {"user": rendered.owner, "group": rendered.group}))


def _put_secret(rendered: RenderedFile, what: str, config):
    return secret_file(name=f"Front {what}: {rendered.path} (secret)", dest=rendered.path, content=rendered.content,
                       upload_dir=upload_dir(config), group=rendered.group, mode=rendered.mode)


def monitoring_files(deployment: Deployment) -> None:
    """A vllm_metrics host's exporters; on the monitoring host, Prometheus' unit, config, rules, token
    and every job's targets, and its Alertmanager's config and unit."""
    config, files, changes = deployment.config, deployment.files, deployment.changes
    paths = metrics_paths(config)
    if paths["exporter_unit"] not in files:
        return
    for unit, service, kind, key in ((EXPORTER_UNIT, "exporter", "script", "exporter"),
                                     (EXPORTER_UNIT, "exporter", "unit", "exporter_unit"),
                                     (NODE_EXPORTER_UNIT, "node_exporter", "unit", "node_exporter_unit")):
        changes.notify(unit, service, kind,
                       _put(f"Monitoring {key.replace('_', ' ')}: {files[paths[key]].path}", files[paths[key]]))
    prometheus = monitoring_paths(config)
    if prometheus["unit"] not in files:
        return
    unit = PROMETHEUS_UNIT
    changes.notify(unit, "prometheus", "config",
                   _put("Prometheus config: " + files[prometheus["config"]].path, files[prometheus["config"]]))
    if prometheus["trust"] in files:
        changes.notify(unit, "prometheus", "trust",
                       _put(f"Prometheus trusted CAs: {prometheus['trust']}", files[prometheus["trust"]]))
    changes.notify(unit, "prometheus", "rules",
                   _put("Prometheus alert rules: " + files[prometheus["rules"]].path, files[prometheus["rules"]]))
    token = files[prometheus["token"]]
    changes.notify(unit, "prometheus", "token",
                   secret_file(name=f"Prometheus metrics token: {token.path} (secret)", dest=token.path,
                               content=token.content, upload_dir=upload_dir(config), group=token.group,
                               mode=token.mode)
                   if token.secret else _put(f"Prometheus metrics token: {token.path}", token))
    for job in JOBS:
        changes.notify(unit, "prometheus", "targets",
                       _put(f"Prometheus targets of job {job}: {prometheus[f'targets_{job}']}",
                            files[prometheus[f"targets_{job}"]]))
    changes.notify(unit, "prometheus", "unit",
                   _put(f"Prometheus unit: {files[prometheus['unit']].path}", files[prometheus["unit"]]))
    # Alertmanager's config holds the receivers' secrets: root's alone, never shown (systemd hands
    # the unit its copy).
    config_file = files[prometheus["alertmanager_config"]]
    changes.notify(ALERTMANAGER_UNIT, "alertmanager", "config",
                   secret_file(name=f"Alertmanager config: {config_file.path} (secret)", dest=config_file.path,
                               content=config_file.content, upload_dir=upload_dir(config), mode=config_file.mode)
                   if config_file.secret else _put(f"Alertmanager config: {config_file.path}", config_file))
    changes.notify(ALERTMANAGER_UNIT, "alertmanager", "unit",
                   _put(f"Alertmanager unit: {files[prometheus['alertmanager_unit']].path}",
                        files[prometheus["alertmanager_unit"]]))


def service_files(deployment: Deployment) -> None:
    """7. Engine YAML, root-only env file, units; units of removed instances are removed."""
    config, files, changes = deployment.config, deployment.files, deployment.changes
    shared: dict[str, Any] = {}  # a file several instances read (the module vLLM loads): written once
    for inst in deployment.plan.instances:
        paths, unit = instance_paths(config, inst.name), inst.unit_name
        engine_config, unit_file, env = files[paths["config"]], files[paths["unit"]], files[paths["env"]]
        changes.notify(unit, "instance", "config", _put(f"Config of {inst.name}: {engine_config.path}", engine_config),
                       instance=inst.name)
        changes.notify(unit, "instance", "unit", _put(f"Unit of {inst.name}: {unit_file.path}", unit_file),
                       instance=inst.name)
        changes.notify(unit, "instance", "env",
                       secret_file(name=f"Secrets of {inst.name}: {env.path}", dest=env.path, content=env.content,
                                   upload_dir=upload_dir(config)), instance=inst.name)
        layout = host_layout(config)
        shared_kinds = [("model_access", layout.model_access)]
        if inst.config.adapters:
            adapters = files[layout.instance_adapters(inst.name)]
            changes.notify(unit, "instance", "adapters", _put(f"Adapters of {inst.name}: {adapters.path}", adapters),
                           instance=inst.name)
            shared_kinds.append(("adapter_loader", layout.adapter_loader))
        for kind, path in shared_kinds:
            if path not in shared:
                shared[path] = _put(f"{kind.replace('_', ' ').capitalize()}: {path}", files[path])
            changes.notify(unit, "instance", kind, shared[path], instance=inst.name)
    ray_unit = files.get(ray_paths(config)["unit"])
    if ray_unit is not None:  # a node of a multi-node instance: its Ray head or worker
        role = deployment.plan.ray
        changes.notify(RAY_UNIT, "ray", "unit", _put(f"Ray {'head' if role.is_head else 'worker'} unit of "
                                                     f"{role.instance}: {ray_unit.path}", ray_unit))
    front = front_paths(config)
    if front["unit"] in files:
        front_config, front_unit = files[front["config"]], files[front["unit"]]
        # Before the front (re)starts: its config includes these, and `nginx -t` checks them.
        for kind, what in (("keys", "API keys"), ("tls_cert", "TLS certificate"), ("tls_key", "TLS key"),
                           ("tls_trust", "trusted CAs"), ("prefix_key", "gateway's prefix keyer")):
            if front[kind] in files:
                rendered = files[front[kind]]
                changes.notify(FRONT_UNIT, "front", kind, _put_secret(rendered, what, config) if rendered.secret
                               else _put(f"Front {what}: {rendered.path}", rendered))
        changes.notify(FRONT_UNIT, "front", "config", _put(f"Front config: {front_config.path}", front_config))
        changes.notify(FRONT_UNIT, "front", "unit", _put(f"Front unit: {front_unit.path}", front_unit))
    gateway_files = gateway.gateway_paths(config)
    if gateway_files["unit"] in files:
        for kind in ("unit", "workers", "register", "models"):
            changes.notify(gateway.GATEWAY_UNIT, "gateway", kind,
                           _put(f"Gateway {kind}: {files[gateway_files[kind]].path}", files[gateway_files[kind]]))
        for client in config.api_clients:
            path = gateway.client_models_path(config, client.name)
            if path in files:
                changes.notify(gateway.GATEWAY_UNIT, "gateway", "client_models",
                               _put(f"Gateway models of client {client.name}: {path}", files[path]))
    floating = gateway.floating_paths(config)
    if floating["keepalived"] in files:
        # The check first: the config that names it may be reloaded as soon as it is in place.
        changes.notify(gateway.KEEPALIVED_UNIT, "keepalived", "check",
                       _put(f"Gateway readiness check: {floating['check']}", files[floating["check"]]))
        changes.notify(gateway.KEEPALIVED_UNIT, "keepalived", "config",
                       _put(f"keepalived config (floating address): {floating['keepalived']}",
                            files[floating["keepalived"]]))
    monitoring_files(deployment)
    _put("Deploy manifest", files[manifest_path(config)], user=None, group=None)  # its owner is not checked
    for unit, why, paths in removed_units(deployment):
        systemd_service(name=why, unit=unit, running=False, enabled=False)
        for path in paths:
            changes.removed_files.append(managed_file(name=f"Remove {path}", dest=path, present=False))
