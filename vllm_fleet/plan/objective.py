"""How `placement: "auto"` weighs the ways a host of mixed GPU models can serve one instance: over
all its GPUs, over some of them (the rest left free), or one instance per GPU model. The objective,
in order: the full-length requests the KV cache holds at once (whole requests of max_model_len,
summed over the instances and their data-parallel replicas), then fewer pipeline stages (each adds
a hop and bubbles; across GPU models a slow one), then fewer GPUs (the rest free for other work)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vllm_fleet.config import GpuSpec
from vllm_fleet.plan.types import InstancePlan, count_gpu_models, logged_concurrency

OBJECTIVE = ("full-length concurrency at max_model_len (whole requests, summed over instances and "
             "replicas), then fewer pipeline stages, then fewer GPUs")


@dataclass
class PlacementOption:
    """One way to serve the instance on some of the host's free GPUs: its plans (one instance, or
    one per GPU model when `split`) and the free GPUs it leaves."""

    plans: list[InstancePlan]
    split: bool
    free: tuple[GpuSpec, ...]  # every free GPU of the host, to name the ones left out

    @property
    def gpus(self) -> tuple[GpuSpec, ...]:
        return tuple(g for plan in self.plans if plan.layout for g in plan.layout.gpus)

    @property
    def full_length_requests(self) -> int:
        """Requests of max_model_len the KV caches hold at once: a replica's fraction of a request
        serves no full-length one."""
        return sum(plan.data_parallel_size * math.floor(plan.max_concurrency or 0.0) for plan in self.plans)

    @property
    def concurrency(self) -> float:
        return sum(plan.data_parallel_size * (plan.max_concurrency or 0.0) for plan in self.plans)

    @property
    def pipeline_stages(self) -> int:
        return max(plan.pipeline_parallel_size for plan in self.plans)

    @property
    def left_free(self) -> tuple[GpuSpec, ...]:
        used = {g.index for g in self.gpus}
        return tuple(g for g in self.free if g.index not in used)

    def rank(self) -> tuple[int, int, int, float]:
        """Smaller is better: the objective's three criteria, then the exact concurrency."""
        return (-self.full_length_requests, self.pipeline_stages, len(self.gpus), -self.concurrency)

    def describe(self) -> str:
        if self.split:
            parts = " + ".join(f"{plan.name} {_layout_text(plan)}" for plan in self.plans)
            return f"one instance per GPU model ({parts})"
        return _layout_text(self.plans[0])

    def numbers(self, max_model_len: int) -> str:
        parts = [f"{plan.data_parallel_size} x {logged_concurrency(plan.max_concurrency or 0.0)}"
                 if plan.data_parallel_size > 1 else logged_concurrency(plan.max_concurrency or 0.0)
                 for plan in self.plans]
        each = f" ({' + '.join(parts)})" if len(self.plans) > 1 or self.plans[0].data_parallel_size > 1 else ""
        stages, count = self.pipeline_stages, len(self.gpus)
        return (f"max concurrency {logged_concurrency(self.concurrency)}{each} at {max_model_len:,} tokens = "
                f"{self.full_length_requests} full-length requests, {stages} pipeline "
                f"stage{'s' if stages > 1 else ''}, {count} GPU{'s' if count > 1 else ''}")

    def as_dict(self) -> dict[str, Any]:
        return {"layout": self.describe(),
                "instances": [plan.name for plan in self.plans],
                "gpus": [g.index for g in self.gpus],
                "max_concurrency": float(logged_concurrency(self.concurrency)),
                "full_length_requests": self.full_length_requests,
                "pipeline_stages": self.pipeline_stages,
                "gpu_count": len(self.gpus),
                "left_free": [g.index for g in self.left_free]}


def _layout_text(plan: InstancePlan) -> str:
    assert plan.layout is not None  # planned on GPUs
    layout = plan.layout
    models = "+".join(f"{count}x{name}" for name, count in count_gpu_models(layout.gpus))
    return (f"TP={layout.tp} PP={layout.pp} DP={layout.dp} on {models} "
            f"(GPU{'s' if len(layout.gpus) > 1 else ''} {','.join(str(g.index) for g in layout.gpus)})")


def why_lost(winner: PlacementOption, loser: PlacementOption) -> str:
    """The first criterion of the objective on which `loser` is behind `winner`."""
    if loser.full_length_requests != winner.full_length_requests:
        return (f"fewer full-length requests ({loser.full_length_requests} vs "
                f"{winner.full_length_requests})")
    if loser.pipeline_stages != winner.pipeline_stages:
        return f"more pipeline stages ({loser.pipeline_stages} vs {winner.pipeline_stages})"
    if len(loser.gpus) != len(winner.gpus):
        return f"more GPUs ({len(loser.gpus)} vs {len(winner.gpus)}) for the same requests and stages"
    if loser.concurrency != winner.concurrency:
        return (f"a lower max concurrency ({logged_concurrency(loser.concurrency)} vs "
                f"{logged_concurrency(winner.concurrency)}), all else equal")
    return "a tie on every criterion, broken by the order weighed (all GPUs first)"


def choose(options: list[PlacementOption]) -> tuple[PlacementOption, PlacementOption | None]:
    """The best option by the objective and the runner-up (None when there was only one).
    `options` come in the order tried, which breaks exact ties."""
    ranked = sorted(enumerate(options), key=lambda item: (item[1].rank(), item[0]))
    best = ranked[0][1]
    return best, (ranked[1][1] if len(ranked) > 1 else None)


def choice_record(best: PlacementOption, runner_up: PlacementOption | None, weighed: int,
                  max_model_len: int) -> dict[str, Any]:
    """What `plan --json` shows of the choice (InstancePlan.placement_choice)."""
    return {"objective": OBJECTIVE, "weighed": weighed, "chosen": best.as_dict(),
            "runner_up": ({**runner_up.as_dict(), "lost_on": why_lost(best, runner_up)}
                          if runner_up else None),
            "max_model_len": max_model_len}


def choice_reasons(best: PlacementOption, runner_up: PlacementOption | None, weighed: int,
                   max_model_len: int) -> list[str]:
    """The chosen option, the runner-up and why it lost; and the GPUs left free."""
    out = [f"placement 'auto' on mixed GPU models: {weighed} layout{'s' if weighed > 1 else ''} weighed by "
           f"{OBJECTIVE}; chosen: {best.describe()}: {best.numbers(max_model_len)}"]
    if runner_up is not None:
        out.append(f"runner-up: {runner_up.describe()}: {runner_up.numbers(max_model_len)}; lost on "
                   f"{why_lost(best, runner_up)}")
    left = best.left_free
    if left:
        names = ", ".join(f"GPU {g.index} ({g.short_name})" for g in left)
        one = len(left) == 1
        out.append(f"{names} left free: no layout with {'it' if one else 'them'} ranked higher by the "
                   f"objective; another instance may use {'it' if one else 'them'} "
                   f"(pin {'it' if one else 'them'} with that instance's 'gpus', e.g. a smaller model "
                   "behind the gateway)")
    return out
