"""Canary rollouts: the hosts `vllm-fleet rollout` converges first, and what the fleet's Prometheus
must see of them before the rest follows (vllm_fleet/rules/canary.py judges it)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet.config.knobs.common import BOOL
from vllm_fleet.config.schema import knob, section

#: The longest observation window: a day (the fleet's Prometheus keeps at least that).
OBSERVE_MAX_S = 86400
#: The shortest: a window needs a few scrapes of each side (rollout also asks for 3 scrape intervals).
OBSERVE_MIN_S = 10


@section("Canary rollouts: a batch judged by the fleet's Prometheus before the rest (docs/deploy-steps.md)",
         notes="""
         `vllm-fleet rollout --canary HOST[,HOST]` (or the hosts with vllm_rollout_canary = True): the canary
         batch converges first; then, over the observation window, the fleet's Prometheus (vllm_monitoring)
         compares each of its models with the rest of the fleet serving the same model, from vLLM's own
         histograms and counters. Beyond a limit below, the canary is rolled back and the rollout stops;
         with too little traffic in the window it stops too (nothing was judged); else the rest follows.
         The canary hosts' values are used (they must agree).
         """)
@dataclass(frozen=True)
class RolloutKnobs:
    vllm_rollout_canary: bool = knob(
        False, "True: this host is in the canary batch of `vllm-fleet rollout`", **BOOL,
        fix="vllm_rollout_canary = True on the hosts to converge and judge first (or rollout --canary HOST)")
    vllm_canary_observe_s: int = knob(
        600, "the observation window after the canary converged (rollout --observe beats it)",
        low=OBSERVE_MIN_S, high=OBSERVE_MAX_S, must=f"a number of seconds from {OBSERVE_MIN_S} to {OBSERVE_MAX_S}")
    vllm_canary_min_requests: int = knob(
        100, "requests the canary and the rest must each finish in the window, or the rollout stops",
        low=1, high=10 ** 9, must="a whole number of requests from 1 to 1000000000")
    vllm_canary_max_ttft_ratio: float = knob(
        1.2, "the canary's time-to-first-token p95 over the rest's, at most", low=1.0, high=1000.0,
        must="a ratio from 1.0 to 1000.0")
    vllm_canary_max_itl_ratio: float = knob(
        1.2, "the canary's inter-token latency p95 over the rest's, at most", low=1.0, high=1000.0,
        must="a ratio from 1.0 to 1000.0")
    vllm_canary_max_error_rate: float = knob(
        0.01, "the canary's failed share (5xx and aborted), at most (or no more than the rest's)",
        low=0.0, high=1.0, must="a share from 0.0 to 1.0",
        notes="""
        Failed: vLLM's requests finished as `abort` (the client went away, or vLLM aborted them) and its 5xx
        answers (a request vLLM ends with `error` is a 500), over every request. The canary fails this only
        above both this share and the rest's own.
        """)
    vllm_canary_max_preemption_increase: float = knob(
        0.05, "the canary's preemptions per request above the rest's, at most", low=0.0, high=1000.0,
        must="a number of preemptions per request from 0.0 to 1000.0")
