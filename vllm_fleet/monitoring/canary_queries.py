"""The PromQL a canary rollout asks the fleet's Prometheus, and how its answers become figures. Pure.

Each figure is asked twice, for the canary's hosts and for every other host, each answer summed by
the `served_model` label the scrape targets carry (monitoring/targets.py): one query per figure and
side, whatever the number of models. Every series is vLLM's own, from the `vllm` job:

    requests     vllm:request_success_total                 finished requests, every finished_reason
    aborted      vllm:request_success_total{finished_reason="abort"}
    errored      vllm:request_success_total{finished_reason="error"}   (vLLM answers each with a 500)
    http_5xx     http_requests_total{status="5xx"}           vLLM's API server's 5xx answers
    preemptions  vllm:num_preemptions_total
    ttft_p95     vllm:time_to_first_token_seconds            histogram_quantile(0.95, ...)
    itl_p95      vllm:inter_token_latency_seconds            histogram_quantile(0.95, ...)

Example:

    exprs = canary_queries(["gpu-01"], window_s=600)      # {"canary.requests": "sum by ...", ...}
    figures = side_figures(answers, "canary")             # {"llama-8b": {"requests": 812.0, ...}}
"""

from __future__ import annotations

import math
from typing import Any

FIGURES = ("requests", "aborted", "errored", "http_5xx", "preemptions", "ttft_p95", "itl_p95")
QUANTILES = frozenset({"ttft_p95", "itl_p95"})
SIDES = ("canary", "rest")
QUANTILE = 0.95
# RE2's metacharacters: escaped in a host name put in a regular expression.
_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def _regex_literal(names: list[str]) -> str:
    """A PromQL string literal of the RE2 alternation that matches exactly `names` (Prometheus
    anchors a label regex at both ends)."""
    alternation = "|".join("".join("\\" + c if c in _RE2_SPECIAL else c for c in name) for name in names)
    return '"' + alternation.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _selector(canary_hosts: list[str], side: str, extra: str = "") -> str:
    if not canary_hosts:
        raise ValueError("a canary has at least one host")
    op = "=~" if side == "canary" else "!~"
    return '{job="vllm",' + extra + f"host{op}{_regex_literal(sorted(canary_hosts))}" + "}"


def canary_queries(canary_hosts: list[str], window_s: int) -> dict[str, str]:
    """{"<side>.<figure>": PromQL} for both sides: each figure's increase (a quantile's rate) over the
    last `window_s` seconds, summed by served_model."""
    if isinstance(window_s, bool) or not isinstance(window_s, int) or window_s < 1:
        raise ValueError(f"a window is a whole number of seconds >= 1, not {window_s!r}")
    window = f"[{window_s}s]"

    def count(side: str, metric: str, extra: str = "") -> str:
        return f"sum by (served_model) (increase({metric}{_selector(canary_hosts, side, extra)}{window}))"

    def p95(side: str, histogram: str) -> str:
        return (f"histogram_quantile({QUANTILE}, sum by (served_model, le) "
                f"(rate({histogram}_bucket{_selector(canary_hosts, side)}{window})))")

    out = {}
    for side in SIDES:
        out.update({
            f"{side}.requests": count(side, "vllm:request_success_total"),
            f"{side}.aborted": count(side, "vllm:request_success_total", 'finished_reason="abort",'),
            f"{side}.errored": count(side, "vllm:request_success_total", 'finished_reason="error",'),
            f"{side}.http_5xx": count(side, "http_requests_total", 'status="5xx",'),
            f"{side}.preemptions": count(side, "vllm:num_preemptions_total"),
            f"{side}.ttft_p95": p95(side, "vllm:time_to_first_token_seconds"),
            f"{side}.itl_p95": p95(side, "vllm:inter_token_latency_seconds"),
        })
    return out


def _number(text: Any) -> float | None:
    """A sample value as Prometheus' JSON writes it ("12.5", "NaN", "+Inf"): a float; None for NaN
    (histogram_quantile's answer without observations) or anything that is no number."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(value) else value


def side_figures(answers: dict[str, list[dict[str, Any]]], side: str) -> dict[str, dict[str, float | None]]:
    """{served_model: {figure: value}} of one side, from the answers' vectors ({"<side>.<figure>":
    Prometheus' `result` list}). A count no series answered is 0 (nothing counted); a quantile
    without observations is None. Only models some answer names appear."""
    out: dict[str, dict[str, float | None]] = {}
    for figure in FIGURES:
        for series in answers.get(f"{side}.{figure}") or []:
            model = (series.get("metric") or {}).get("served_model")
            value = series.get("value")
            if not model or not isinstance(value, (list, tuple)) or len(value) != 2:
                continue
            row = out.setdefault(model, empty_figures())
            number = _number(value[1])
            if figure in QUANTILES:
                row[figure] = number
            else:
                row[figure] = (row[figure] or 0.0) + (number if number is not None and 0 < number < math.inf else 0.0)
    return out


def empty_figures() -> dict[str, float | None]:
    """What a side with no series has: nothing counted, no quantile."""
    return {figure: (None if figure in QUANTILES else 0.0) for figure in FIGURES}
