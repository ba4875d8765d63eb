"""A canary's judgement (vllm_fleet/rules/canary.py), from figures as data: traffic, failed share,
latency ratios, preemptions, and what happens at their edges (no traffic, a quantile of nothing,
a rest without traffic, infinities, the limits themselves)."""

from __future__ import annotations

import math

import pytest

from vllm_fleet.rules.canary import PROCEED, ROLL_BACK, STOP, Side, Thresholds, Verdict, judge, latency_ratio, overall

LIMITS = Thresholds(min_requests=100, max_ttft_ratio=1.2, max_itl_ratio=1.2, max_error_rate=0.01,
                    max_preemption_increase=0.05)
HEALTHY = Side(requests=1000, ttft_p95=0.100, itl_p95=0.020)


def _checks(verdict: Verdict) -> dict:
    return {c.figure: c for c in verdict.checks}


def test_a_canary_like_the_rest_proceeds_with_every_figure_judged():
    verdict = judge("m", Side(requests=500, ttft_p95=0.110, itl_p95=0.021), HEALTHY, LIMITS)
    assert verdict.decision == PROCEED and verdict.reasons == []
    checks = _checks(verdict)
    assert [c.passed for c in checks.values()] == [True, True, True, True]
    assert checks["ttft_p95"].compared == pytest.approx(1.1)


def test_a_slower_first_token_rolls_back_naming_the_figures_and_the_knob():
    verdict = judge("m", Side(requests=500, ttft_p95=0.310, itl_p95=0.020), HEALTHY, LIMITS)
    assert verdict.decision == ROLL_BACK
    (reason,) = verdict.reasons
    assert "TTFT p95 310.0 ms is 3.10 x the rest's 100.0 ms" in reason and "vllm_canary_max_ttft_ratio" in reason


def test_the_ratio_at_its_limit_passes_and_just_above_fails():
    rest = Side(requests=1000, ttft_p95=0.5, itl_p95=0.5)
    assert judge("m", Side(requests=1000, ttft_p95=0.6, itl_p95=0.5), rest, LIMITS).decision == PROCEED
    assert judge("m", Side(requests=1000, ttft_p95=0.5, itl_p95=0.6001), rest, LIMITS).decision == ROLL_BACK


@pytest.mark.parametrize("canary,rest", [(0, 1000), (99, 1000), (1000, 0), (1000, 99.9)])
def test_too_little_traffic_on_either_side_stops_and_judges_nothing(canary, rest):
    verdict = judge("m", Side(requests=canary, ttft_p95=9.0), Side(requests=rest, ttft_p95=0.1), LIMITS)
    assert verdict.decision == STOP and verdict.checks == []
    (reason,) = verdict.reasons
    assert reason.startswith("too little traffic to judge") and "vllm_canary_min_requests" in reason
    short = "the canary" if canary < 100 else "the rest of the fleet"
    assert short in reason


def test_an_empty_window_stops_even_with_every_limit_loose():
    loose = Thresholds(min_requests=1, max_ttft_ratio=1000, max_itl_ratio=1000, max_error_rate=1.0,
                       max_preemption_increase=1000)
    assert judge("m", Side(), Side(), loose).decision == STOP


def test_5xx_answers_count_as_traffic_so_a_canary_failing_everything_is_judged_not_stopped():
    # Every request a 500 before vLLM finished it: no finished request, 400 answers.
    verdict = judge("m", Side(http_5xx=400), HEALTHY, LIMITS)
    assert verdict.decision == ROLL_BACK
    assert _checks(verdict)["error_rate"].canary == 1.0
    # Its latency has no observation: not judged, and said so.
    assert _checks(verdict)["ttft_p95"].passed is None and "no observation on the canary" in \
        _checks(verdict)["ttft_p95"].why


def test_an_error_finish_is_one_of_the_5xx_not_two_failures():
    side = Side(requests=100, errored=10, http_5xx=10, aborted=5)
    assert side.total == 100 and side.failed == 15 and side.error_rate == pytest.approx(0.15)
    more = Side(requests=100, errored=10, http_5xx=30)  # 20 more 500s that never reached the engine
    assert more.total == 120 and more.failed == 30


def test_the_error_rate_fails_only_above_the_limit_and_above_the_rests_own():
    rest = Side(requests=1000, aborted=30, ttft_p95=0.1)  # 3 % of the fleet's clients go away
    assert judge("m", Side(requests=1000, aborted=25, ttft_p95=0.1), rest, LIMITS).decision == PROCEED
    assert judge("m", Side(requests=1000, aborted=60, ttft_p95=0.1), rest, LIMITS).decision == ROLL_BACK
    clean = Side(requests=1000, ttft_p95=0.1)
    assert judge("m", Side(requests=1000, aborted=10, ttft_p95=0.1), clean, LIMITS).decision == PROCEED  # 1 %
    failing = judge("m", Side(requests=1000, aborted=11, ttft_p95=0.1), clean, LIMITS)
    assert failing.decision == ROLL_BACK and "vllm_canary_max_error_rate" in failing.reasons[0]


def test_preemptions_per_request_above_the_rests_by_more_than_the_allowance_roll_back():
    rest = Side(requests=1000, preemptions=100, ttft_p95=0.1)  # 0.1 a request
    assert judge("m", Side(requests=1000, preemptions=150, ttft_p95=0.1), rest, LIMITS).decision == PROCEED
    verdict = judge("m", Side(requests=1000, preemptions=151, ttft_p95=0.1), rest, LIMITS)
    assert verdict.decision == ROLL_BACK and "vllm_canary_max_preemption_increase" in verdict.reasons[0]


@pytest.mark.parametrize("canary,rest", [(None, 0.02), (0.02, None), (None, None)])
def test_a_histogram_without_observations_is_not_judged_and_does_not_block(canary, rest):
    """Requests of one token have no inter-token latency: histogram_quantile is NaN there."""
    verdict = judge("m", Side(requests=500, ttft_p95=0.1, itl_p95=canary),
                    Side(requests=500, ttft_p95=0.1, itl_p95=rest), LIMITS)
    assert verdict.decision == PROCEED
    assert _checks(verdict)["itl_p95"].passed is None and "not judged" in _checks(verdict)["itl_p95"].why


def test_nan_and_garbage_figures_read_as_nothing():
    side = Side.of({"requests": float("nan"), "aborted": "12", "http_5xx": -3.0, "ttft_p95": float("nan"),
                    "itl_p95": float("inf"), "preemptions": float("inf")})
    assert side == Side(requests=0.0, aborted=0.0, http_5xx=0.0, preemptions=0.0, ttft_p95=None, itl_p95=math.inf)
    assert side.error_rate is None and side.preemptions_per_request is None


def test_a_latency_beyond_the_largest_bucket_is_an_infinite_ratio_and_rolls_back():
    assert latency_ratio(math.inf, 0.1) == math.inf and latency_ratio(math.inf, math.inf) == 1.0
    assert latency_ratio(0.0, 0.0) == 1.0 and latency_ratio(0.001, 0.0) == math.inf
    assert latency_ratio(0.05, math.inf) == 0.0
    verdict = judge("m", Side(requests=500, ttft_p95=math.inf), HEALTHY, LIMITS)
    assert verdict.decision == ROLL_BACK and "beyond the largest bucket" in verdict.reasons[0]
    slow = judge("m", Side(requests=500, ttft_p95=2.5), HEALTHY, LIMITS)
    assert "TTFT p95 2.500 s is 25.00 x the rest's 100.0 ms" in slow.reasons[0]


def test_the_rollout_decision_over_models_roll_back_wins_then_stop():
    go, stop, back = (Verdict("a", PROCEED, []), Verdict("b", STOP, ["x"]), Verdict("c", ROLL_BACK, ["y"]))
    assert overall([go, go]) == PROCEED
    assert overall([go, stop]) == STOP
    assert overall([stop, back, go]) == ROLL_BACK
    assert overall([]) == STOP  # nothing judged never passes


def test_thresholds_come_from_the_knobs():
    from vllm_fleet.config import Settings

    assert Thresholds.of(Settings()) == Thresholds()
