"""The planner's entry points: plan_host (one host, its share of the multi-node instances included)
and plan_fleet (every host, the multi-node instances first)."""

from __future__ import annotations

from dataclasses import replace

from vllm_fleet.config import ConfigError, ConfigErrors, GpuSpec, HostConfig, node_groups
from vllm_fleet.plan.engine_args import add_engine_args_and_env
from vllm_fleet.plan.multinode import node_group_share, plan_node_group, reserved_gpu_errors
from vllm_fleet.plan.placement import HostPlanner, cpu_instance_plans
from vllm_fleet.plan.types import FleetPlan, HostPlan, InstancePlan, Interconnect, NodeGroupPlan


def plan_host(host_config: HostConfig, live_gpus: tuple[GpuSpec, ...] | None = None,
              interconnect: Interconnect | None = None,
              node_groups: list[NodeGroupPlan] | None = None) -> HostPlan:
    """Plan one host. `live_gpus` (from nvidia-smi at deploy time) win over the declared `gpus`;
    a mismatch between the two is an error that shows both. `interconnect` (the driver's P2P
    report, indices as in the GPUs planned on) adds NCCL_P2P_DISABLE to TP groups without P2P.
    `node_groups` (plan_node_group's results, plan_fleet makes them): the multi-node instances this
    host heads join its plans, and the GPUs any of them uses here are no one else's. Without it a
    host that heads one is an error; a worker node's GPUs would look free. Raises ConfigErrors.
    """
    target = host_config.settings.vllm_target
    if target == "cpu":
        plans = cpu_instance_plans(host_config)
        add_engine_args_and_env(host_config, plans)
        return HostPlan(host_config.name, (), "none", target, plans)
    if live_gpus is not None:
        if host_config.gpus is not None and [(g.name, g.memory_mib) for g in host_config.gpus] != [
                (g.name, g.memory_mib) for g in live_gpus]:
            raise ConfigErrors([ConfigError(
                "the live GPUs differ from the declared 'gpus':\n    declared: "
                + _describe_gpus(host_config.gpus) + "\n    live:     " + _describe_gpus(live_gpus),
                host=host_config.name, key="gpus",
                fix="update 'gpus' in the inventory to what nvidia-smi shows, or remove it")])
        gpus, source = live_gpus, "live"
    elif host_config.gpus is not None:
        gpus, source = host_config.gpus, "declared"
    else:
        raise ConfigErrors([ConfigError(
            "no GPUs known: offline planning needs the host's GPUs declared", host=host_config.name,
            key="gpus", fix='declare gpus = [{"name": ..., "memory_mib": ...}] in PCI bus order (`vllm-fleet gpus '
                            f"INVENTORY --limit {host_config.name}` reads them from the host, ready to paste), "
                            "or set vllm_target = 'cpu' for a CPU-only host")])
    if source == "declared":
        # Offline, what the declared GPUs say (compute capability, given or from the catalog;
        # driver_version / mig_mode where declared) is checked against the pinned vLLM's build.
        from vllm_fleet.gpu_support import preflight
        problems = preflight(host_config.name, gpus, host_config.instances, host_config.settings.vllm_version,
                             source="the declared 'gpus'")
        if problems:
            raise ConfigErrors(problems)
    headed, role, reserved = node_group_share(host_config, node_groups)
    taken = reserved_gpu_errors(host_config, role, reserved)
    if taken:
        raise ConfigErrors(taken)
    # The multi-node instances are planned already (plan_node_group); the rest share what is left.
    single = replace(host_config, instances=tuple(inst for inst in host_config.instances if not inst.nodes))
    planner = HostPlanner(single, tuple(g for g in gpus if g.index not in reserved), interconnect)
    plans, unused = planner.place_instances()
    if planner.errors:
        raise ConfigErrors(planner.errors)
    plans = headed + plans
    add_engine_args_and_env(host_config, plans)
    host_plan = HostPlan(host_config.name, gpus, source, target, plans, unused, ray=role)
    if unused and plans:
        host_plan.warnings.append(unused_gpus_warning(gpus, unused, plans))
    return host_plan


def unused_gpus_warning(gpus: tuple[GpuSpec, ...], unused: tuple[int, ...], plans: list[InstancePlan]) -> str:
    """Which GPUs no instance uses, by index and model, and which GPUs the instances have."""
    names = ", ".join(f"{g.index} ({g.short_name})" for g in gpus if g.index in unused)
    taken = "; ".join(f"{plan.name}: {plan.cuda_visible_devices}" for plan in plans if plan.gpu_indices)
    one = len(unused) == 1
    return (f"GPU{'' if one else 's'} {names} {'is' if one else 'are'} used by no instance (the instances "
            f"have {taken or 'none'}): give {'it' if one else 'them'} to an instance's 'gpus', or leave "
            f"{'it' if one else 'them'} for other work")


def _describe_gpus(gpus: tuple[GpuSpec, ...]) -> str:
    return ", ".join(f"{g.index}: {g.name} {g.memory_mib} MiB" for g in gpus) or "none"


def plan_fleet(host_configs: list[HostConfig], live: dict[str, tuple[GpuSpec, ...]] | None = None,
               addresses: dict[str, str] | None = None) -> FleetPlan:
    """Plan every host; all errors of all hosts are raised together. Multi-node instances first, in
    one fleet-level pass (plan_node_group), so their GPUs are reserved on every node before any
    host's own instances are placed. `addresses`: see node_addresses."""
    errors: list[ConfigError] = []
    by_name = {host_config.name: host_config for host_config in host_configs}
    groups: list[NodeGroupPlan] = []
    for group in node_groups(host_configs):
        try:
            groups.append(plan_node_group(group, by_name, live, addresses))
        except ConfigErrors as exc:
            errors.extend(exc.errors)
    out = []
    for host_config in host_configs:
        try:
            out.append(plan_host(host_config, (live or {}).get(host_config.name), node_groups=groups))
        except ConfigErrors as exc:
            errors.extend(exc.errors)
    if errors:
        raise ConfigErrors(errors)
    return FleetPlan(out)
