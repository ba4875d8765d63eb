"""A canary's judgement: the figures the fleet's Prometheus read over the observation window, the
canary's and the rest of the fleet's of the same model, against the thresholds -> proceed, roll
the canary back, or stop (too little traffic: nothing was judged). Pure.

Per model, in this order:

1. Traffic. Each side must have finished at least `min_requests` requests (its 5xx answers
   counted as requests too): with fewer, no figure is judged and the rollout stops. A window
   without traffic never passes.
2. Failed share: (aborted + 5xx) / requests, where a request vLLM ends with `error` is one of its
   5xx (vLLM's FinishReason.ERROR is always a 500), so failed = aborted + max(errored, 5xx) and
   requests = finished + 5xx answers that never finished. The canary fails it above
   `max_error_rate` AND above the rest's own share (a fleet whose clients abort 3 % of their
   requests does not fail every canary).
3. TTFT p95 and inter-token latency p95: the canary's over the rest's, at most the ratio. A side
   with no observation of a histogram (a quantile of nothing, NaN in Prometheus: requests of one
   token have no inter-token latency) leaves that figure not judged, and says so.
4. Preemptions per request: the canary's minus the rest's, at most `max_preemption_increase`.

Any figure beyond its limit rolls the canary back. Over several models: any roll back wins (the
canary is one release), then any stop, else proceed.

Example:

    verdict = judge("llama-8b", Side(requests=900, ttft_p95=0.31, ...), Side(requests=2400, ttft_p95=0.12, ...),
                    Thresholds(max_ttft_ratio=1.2, ...))
    verdict.decision    # "roll back"
    verdict.reasons     # ["TTFT p95 310.0 ms is 2.58 x the rest's 120.0 ms (limit 1.2 x, vllm_canary_max_ttft_ratio)"]
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

PROCEED, ROLL_BACK, STOP = "proceed", "roll back", "stop"
DECISIONS = (PROCEED, ROLL_BACK, STOP)


@dataclass(frozen=True)
class Thresholds:
    """The limits (config/knobs/rollout.py), already validated."""

    min_requests: int = 100
    max_ttft_ratio: float = 1.2
    max_itl_ratio: float = 1.2
    max_error_rate: float = 0.01
    max_preemption_increase: float = 0.05

    @classmethod
    def of(cls, settings: Any) -> "Thresholds":
        return cls(min_requests=settings.vllm_canary_min_requests,
                   max_ttft_ratio=settings.vllm_canary_max_ttft_ratio,
                   max_itl_ratio=settings.vllm_canary_max_itl_ratio,
                   max_error_rate=settings.vllm_canary_max_error_rate,
                   max_preemption_increase=settings.vllm_canary_max_preemption_increase)


@dataclass(frozen=True)
class Side:
    """One side's figures over the window (monitoring/canary_queries.py): counts (increases, so not
    always whole numbers) and p95 latencies in seconds (None: no observation)."""

    requests: float = 0.0  # finished requests, every finished_reason
    aborted: float = 0.0
    errored: float = 0.0
    http_5xx: float = 0.0
    preemptions: float = 0.0
    ttft_p95: float | None = None
    itl_p95: float | None = None

    @classmethod
    def of(cls, figures: dict[str, float | None] | None) -> "Side":
        figures = figures or {}

        def count(name: str) -> float:
            value = figures.get(name)
            return float(value) if isinstance(value, (int, float)) and math.isfinite(value) and value > 0 else 0.0

        def quantile(name: str) -> float | None:
            value = figures.get(name)
            return float(value) if isinstance(value, (int, float)) and not math.isnan(value) and value >= 0 else None

        return cls(**{n: count(n) for n in ("requests", "aborted", "errored", "http_5xx", "preemptions")},
                   ttft_p95=quantile("ttft_p95"), itl_p95=quantile("itl_p95"))

    @property
    def total(self) -> float:
        """Every request: the finished ones and the 5xx answers that never finished (an `error`
        finish is a 5xx already counted among the finished)."""
        return self.requests + max(0.0, self.http_5xx - self.errored)

    @property
    def failed(self) -> float:
        return self.aborted + max(self.errored, self.http_5xx)

    @property
    def error_rate(self) -> float | None:
        return min(1.0, self.failed / self.total) if self.total > 0 else None

    @property
    def preemptions_per_request(self) -> float | None:
        return self.preemptions / self.total if self.total > 0 else None

    def row(self) -> dict[str, Any]:
        return {**asdict(self), "total": self.total, "failed": self.failed, "error_rate": self.error_rate,
                "preemptions_per_request": self.preemptions_per_request}


@dataclass(frozen=True)
class Check:
    """One figure compared: the canary's, the rest's, what was compared (a ratio, a share, a
    difference), its limit, and the outcome: True passed, False beyond the limit, None not judged."""

    figure: str
    canary: float | None
    rest: float | None
    compared: float | None
    limit: float
    passed: bool | None
    why: str


@dataclass(frozen=True)
class Verdict:
    model: str
    decision: str  # one of DECISIONS
    reasons: list[str]
    checks: list[Check] = field(default_factory=list)
    canary: Side = field(default_factory=Side)
    rest: Side = field(default_factory=Side)

    def row(self) -> dict[str, Any]:
        return {"model": self.model, "decision": self.decision, "reasons": list(self.reasons),
                "checks": [asdict(c) for c in self.checks], "canary": self.canary.row(), "rest": self.rest.row()}


def _seconds(value: float | None) -> str:
    if value is None:
        return "none"
    if math.isinf(value):
        return "beyond the largest bucket"
    return f"{value:.3f} s" if value >= 1 else f"{value * 1000:.1f} ms"


def latency_ratio(canary: float, rest: float) -> float:
    """canary / rest, where both are p95s >= 0 (infinite: beyond the histogram's largest bucket).
    Equal values are 1 (two infinities too); more than a zero or finite rest is inf."""
    if canary == rest:
        return 1.0
    if rest == 0 or math.isinf(canary):
        return math.inf
    return canary / rest


def _latency_check(figure: str, label: str, knob: str, canary: float | None, rest: float | None,
                   limit: float) -> Check:
    if canary is None or rest is None:
        missing = " and ".join(side for side, v in (("the canary", canary), ("the rest", rest)) if v is None)
        return Check(figure, canary, rest, None, limit, None,
                     f"{label}: not judged, no observation on {missing} in the window")
    ratio = latency_ratio(canary, rest)
    shown = "inf" if math.isinf(ratio) else f"{ratio:.2f}"
    if ratio <= limit:
        return Check(figure, canary, rest, ratio, limit, True,
                     f"{label} {_seconds(canary)} is {shown} x the rest's {_seconds(rest)} (limit {limit:g} x)")
    return Check(figure, canary, rest, ratio, limit, False,
                 f"{label} {_seconds(canary)} is {shown} x the rest's {_seconds(rest)} (limit {limit:g} x, {knob})")


def judge(model: str, canary: Side, rest: Side, limits: Thresholds) -> Verdict:
    """One model's verdict (see the module's docstring)."""
    short = [f"{name} finished {side.total:.0f} request(s) of {model} in the window, fewer than "
             f"{limits.min_requests} (vllm_canary_min_requests)"
             for name, side in (("the canary", canary), ("the rest of the fleet", rest))
             if side.total < limits.min_requests]
    if short:
        return Verdict(model, STOP, ["too little traffic to judge: " + "; ".join(short)], [], canary, rest)
    checks = []
    c_rate, r_rate = canary.error_rate or 0.0, rest.error_rate or 0.0
    beyond = c_rate > limits.max_error_rate and c_rate > r_rate
    checks.append(Check("error_rate", c_rate, r_rate, c_rate, limits.max_error_rate, not beyond,
                        f"failed share (5xx, aborted) {c_rate:.2%} against the rest's {r_rate:.2%} (limit "
                        f"{limits.max_error_rate:.2%}" + (", vllm_canary_max_error_rate)" if beyond else ")")))
    checks.append(_latency_check("ttft_p95", "TTFT p95", "vllm_canary_max_ttft_ratio", canary.ttft_p95,
                                 rest.ttft_p95, limits.max_ttft_ratio))
    checks.append(_latency_check("itl_p95", "inter-token latency p95", "vllm_canary_max_itl_ratio", canary.itl_p95,
                                 rest.itl_p95, limits.max_itl_ratio))
    c_pre, r_pre = canary.preemptions_per_request or 0.0, rest.preemptions_per_request or 0.0
    increase = c_pre - r_pre
    over = increase > limits.max_preemption_increase
    checks.append(Check("preemptions_per_request", c_pre, r_pre, increase, limits.max_preemption_increase, not over,
                        f"preemptions per request {c_pre:.3f} against the rest's {r_pre:.3f} (at most "
                        f"{limits.max_preemption_increase:g} more" + (", vllm_canary_max_preemption_increase)"
                                                                     if over else ")")))
    failed = [c.why for c in checks if c.passed is False]
    if failed:
        return Verdict(model, ROLL_BACK, failed, checks, canary, rest)
    return Verdict(model, PROCEED, [], checks, canary, rest)


def overall(verdicts: list[Verdict]) -> str:
    """The rollout's decision over every model of the canary: any roll back, then any stop, else
    proceed. No verdict at all is a stop: nothing was judged."""
    decisions = {v.decision for v in verdicts}
    if ROLL_BACK in decisions:
        return ROLL_BACK
    if STOP in decisions or not verdicts:
        return STOP
    return PROCEED
