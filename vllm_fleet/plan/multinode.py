"""Multi-node instances (`nodes`, on Ray): TP = the GPUs of each node, PP = the nodes, one stage per
node in vLLM's Ray rank order. Planned once for the fleet (plan_node_group), before any host's own
instances; each node's part (its Ray node, the GPUs reserved on it) then joins that host's plan."""

from __future__ import annotations

from vllm_fleet.catalog import ModelInfo, unknown_model_fix
from vllm_fleet.config import ConfigError, ConfigErrors, GpuSpec, HostConfig, NodeGroup
from vllm_fleet.plan.layouts import node_group_layout
from vllm_fleet.plan.memory import MemoryModel
from vllm_fleet.plan.reasons import NODE_GROUP_NO_FIT_FIX, apply_layout, node_group_no_fit, node_group_reasons
from vllm_fleet.plan.rules import choose_dtype, resolve_max_model_len, tp_problems
from vllm_fleet.plan.types import InstancePlan, NodeGroupPlan, RayNode, count_gpu_models, gpu_model_and_memory


def node_addresses(group: NodeGroup, host_configs: dict[str, HostConfig],
                   addresses: dict[str, str] | None = None) -> dict[str, str]:
    """Each node's address on the nodes' network: `addresses` where given (the deploy: the IP of the
    node's vllm_private_interface, from its facts), else its vllm_advertise_address (offline: the
    stand-in that `vllm-fleet plan` and `render` show)."""
    given = addresses or {}
    return {node: given.get(node) or host_configs[node].advertise_address
            for node in group.nodes}


def stage_order(group: NodeGroup, addresses: dict[str, str]) -> tuple[str, ...]:
    """The nodes in vLLM's rank order, which is the PP stage order (rank = pp_rank x TP + tp_rank).
    vLLM's Ray executor sorts its workers: the driver's node (the head) first, then nodes with fewer
    workers (equal here: TP on each), then by IP address as a string
    (vllm/v1/executor/ray_executor.py, sort_by_driver_then_worker_ip)."""
    return (group.head, *sorted(group.workers, key=lambda node: addresses[node]))


class _NodeGroupPlanner:
    """Plans one multi-node instance over its nodes' GPUs; collects errors like HostPlanner, located
    at the head."""

    def __init__(self, group: NodeGroup, host_configs: dict[str, HostConfig],
                 live: dict[str, tuple[GpuSpec, ...]] | None):
        self.group, self.inst, self.host_configs, self.live = group, group.instance, host_configs, live or {}
        self.head_config = host_configs[group.head]
        self.errors: list[ConfigError] = []

    def error(self, key: str, message: str, fix: str) -> None:
        self.errors.append(ConfigError(message, host=self.head_config.name, instance=self.inst.name, key=key,
                                       fix=fix))

    def node_gpus(self) -> dict[str, list[GpuSpec]] | None:
        """The GPUs the instance uses on each node: its 'gpus' indices on every node, else all of
        each node's GPUs. Each node is one TP group, so one GPU model, and every node gives as many."""
        out: dict[str, list[GpuSpec]] = {}
        for node in self.group.nodes:
            known = self.live.get(node) or self.host_configs[node].gpus
            if not known:
                self.error("nodes", f"no GPUs known for node {node}: offline planning needs its GPUs "
                           "declared", f'declare gpus = [{{"name": ..., "memory_mib": ...}}] on {node}')
                continue
            by_index = {g.index: g for g in known}
            wanted = self.inst.gpus or tuple(by_index)
            missing = [i for i in wanted if i not in by_index]
            if missing:
                self.error("gpus", f"GPU index {missing[0]} does not exist on node {node} (it has "
                           f"{len(known)} GPUs): a multi-node instance's 'gpus' are used on every node",
                           "list indices every node has, or drop 'gpus' to use all GPUs of each node")
                continue
            chosen = [by_index[i] for i in wanted]
            if len({gpu_model_and_memory(g) for g in chosen}) > 1:
                mix = ", ".join(f"{count}x{name}" for name, count in count_gpu_models(chosen))
                self.error("gpus", f"node {node} would put {mix} in one TP group: each node is one TP "
                           "group, and a TP group is one GPU model",
                           "set the instance's 'gpus' to indices of one GPU model on every node")
                continue
            out[node] = chosen
        counts = {node: len(gpus) for node, gpus in out.items()}
        if len(set(counts.values())) > 1:
            self.error("gpus", "the nodes give different numbers of GPUs ("
                       + ", ".join(f"{node}: {count}" for node, count in counts.items())
                       + "): TP = the GPUs of each node must be the same on every node",
                       f"set the instance's 'gpus' to {min(counts.values())} indices every node has, e.g. "
                       f"gpus = {list(range(min(counts.values())))}")
        return out if not self.errors else None

    def sizes_are_valid(self, info: ModelInfo, tp: int) -> bool:
        """A fixed TP must be what the nodes' GPUs make (config checks PP, the number of nodes, and
        DP); vLLM's TP divisibility rules. Records each problem; True when there is none."""
        key, given = "tensor_parallel_size", self.inst.tensor_parallel_size
        if given is not None and given != tp:
            self.error(key, f"{key} {given} but a multi-node instance has {key} = the GPUs of each node = {tp}",
                       f"drop {key} (the nodes decide it), or change 'nodes'/'gpus'")
        problems = tp_problems(info, tp)
        if problems:
            self.error("tensor_parallel_size", " ".join(problems) + f" (TP = the {tp} GPUs of each node)",
                       "set the instance's 'gpus' to a number of GPUs per node that vLLM accepts for "
                       "this model")
        return not self.errors

    def plan(self, addresses: dict[str, str]) -> InstancePlan | None:
        inst, info = self.inst, self.inst.model_info
        if info is None:
            self.error("model_info", f"model {inst.model!r} is not in the built-in catalog, so its "
                       "shape is unknown", unknown_model_fix(inst.model))
            return None
        per_node = self.node_gpus()
        if per_node is None:
            return None
        order = stage_order(self.group, addresses)
        tp, pp = len(per_node[self.group.head]), len(order)
        if not self.sizes_are_valid(info, tp):
            return None
        # The head's knobs (reserves, min KV sequences) and the single-host planner's rules apply.
        all_gpus = [g for node in order for g in per_node[node]]
        warnings: list[str] = []
        notes: list[str] = []
        max_len = resolve_max_model_len(inst, info, self.error, notes)
        if max_len is None or pp > info.num_hidden_layers:
            if pp > info.num_hidden_layers:
                self.error("nodes", f"PP={pp} exceeds the model's {info.num_hidden_layers} layers",
                           "use fewer nodes")
            return None
        dtype = choose_dtype(inst, info, all_gpus, warnings)
        mem = MemoryModel.for_instance(self.head_config, inst, info, dtype, max_len)
        stages = [per_node[node] for node in order]
        candidate = node_group_layout(mem, stages, tp, order)
        if candidate.problem or mem.concurrency(candidate.built) < 1:
            self.error("model", node_group_no_fit(inst, mem, candidate, order, per_node, max_len),
                       NODE_GROUP_NO_FIT_FIX)
            return None
        layout = candidate.built
        ray_version = self.head_config.settings.vllm_ray_version
        plan = InstancePlan(
            config=inst, name=inst.name, layout=layout, dtype=dtype, max_model_len=max_len,
            tensor_parallel_size=tp, pipeline_parallel_size=pp, data_parallel_size=1,
            warnings=warnings, reasons=node_group_reasons(self.group.head, ray_version, order, per_node, tp)
            + notes, port=inst.port, nodes=self.group.nodes,
            node_gpus={node: tuple(g.index for g in per_node[node]) for node in self.group.nodes})
        apply_layout(plan, mem, candidate, all_gpus, int(self.head_config.settings.vllm_min_kv_sequences), None)
        # The Ray executor is what spans servers (vLLM's documented multi-node way); the planner
        # sets it, so an engine_args that says otherwise is refused by add_engine_args_and_env.
        plan.engine_args["distributed-executor-backend"] = "ray"
        plan.packages.append(f"ray=={ray_version}")
        return plan


def plan_node_group(group: NodeGroup, host_configs: dict[str, HostConfig],
                    live: dict[str, tuple[GpuSpec, ...]] | None = None,
                    addresses: dict[str, str] | None = None) -> NodeGroupPlan:
    """Plan one multi-node instance (config.node_groups) on its nodes' GPUs: `live` GPUs per node
    where known (nvidia-smi), else each node's declared 'gpus'; `addresses` as node_addresses takes
    them. Pure. Raises ConfigErrors (located at the head, naming the node)."""
    absent = [node for node in group.nodes if node not in host_configs]
    if absent:  # check_fleet names unknown hosts; a caller that passed too few hosts gets this
        raise ConfigErrors([ConfigError(
            f"node {absent[0]} is not among the hosts planned", host=group.head, instance=group.instance.name,
            key="nodes", fix="plan every node of the group together (load_fleet widens a --limit to them)")])
    addrs = node_addresses(group, host_configs, addresses)
    planner = _NodeGroupPlanner(group, host_configs, live)
    plan = planner.plan(addrs)
    if plan is None:
        raise ConfigErrors(planner.errors)
    head_config = host_configs[group.head]
    roles = {node: RayNode(instance=plan.name, nodes=group.nodes, host=node, gpus=plan.node_gpus[node],
                           addresses=addrs, port=head_config.settings.vllm_ray_port,
                           packages=(f"ray=={host_configs[node].settings.vllm_ray_version}",))
             for node in group.nodes}
    return NodeGroupPlan(group, plan, roles)


def node_group_share(host_config: HostConfig, groups: list[NodeGroupPlan] | None,
                     ) -> tuple[list[InstancePlan], RayNode | None, set[int]]:
    """A host's part of the fleet's multi-node instances: (the plans it heads, its Ray node, its
    GPUs the groups use). `groups` None: the caller planned no group, so a host that heads one
    cannot be planned."""
    if groups is None:
        own = [inst.name for inst in host_config.instances if inst.nodes]
        if own:
            raise ConfigErrors([ConfigError(
                f"instance {own[0]} spans several servers: it is planned with every node's GPUs",
                host=host_config.name, instance=own[0], key="nodes",
                fix="plan the fleet (plan_fleet), or pass plan_node_group's result as node_groups")])
        return [], None, set()
    mine = [group_plan for group_plan in groups if host_config.name in group_plan.group.nodes]
    headed = [group_plan.plan for group_plan in mine if group_plan.group.head == host_config.name]
    role = mine[0].roles[host_config.name] if mine else None
    return headed, role, {index for group_plan in mine for index in group_plan.reserved(host_config.name)}


def reserved_gpu_errors(host_config: HostConfig, role: RayNode | None, reserved: set[int]) -> list[ConfigError]:
    """A GPU of a node group is no other instance's: 'gpus' naming one is an error."""
    if role is None:  # in no node group: no GPU reserved
        return []
    errors = []
    for inst in host_config.instances:
        taken = sorted(set(inst.gpus or ()) & reserved) if not inst.nodes else []
        if taken:
            errors.append(ConfigError(
                f"GPU {taken[0]} is used by multi-node instance {role.instance} (nodes "
                f"{', '.join(role.nodes)})", host=host_config.name, instance=inst.name, key="gpus",
                fix=f"use GPUs it leaves free, or set the multi-node instance's 'gpus' on its head {role.head}"))
    return errors
