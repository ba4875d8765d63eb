"""The fleet's alert rules, checked by Prometheus' own promtool (tests/support/promtool_tool.py fetches it):
the rendered rules load, every alert fires when it should and not when it should not
(tests/promtool/alerts_test.yml), and a broken rule is refused (so a pass means something).
The dashboard's queries are parsed by promtool too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from support import promtool_tool
from vllm_fleet.monitoring import metric_names, rules

HERE = Path(__file__).resolve().parents[1]
ALERTS_TEST = HERE / "promtool" / "alerts_test.yml"
DASHBOARD = HERE.parent / "vllm_fleet" / "monitoring" / "grafana" / "vllm-fleet.json"


def _promtool(*args: str | Path, cwd: Path | None = None) -> str:
    result = promtool_tool.run(*args, cwd=cwd)
    assert result.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{result.stdout}{result.stderr}"
    return result.stdout


def _alerts(text: str) -> list[dict]:
    (group,) = yaml.safe_load(text)["groups"]
    assert group["name"] == "vllm-fleet"
    return group["rules"]


@pytest.mark.parametrize("tls", [True, False])
def test_rendered_rules_pass_promtool_check(tmp_path: Path, tls: bool) -> None:
    path = tmp_path / "rules.yml"
    path.write_text(rules.alert_rules(120, tls=tls))
    out = _promtool("check", "rules", path)
    assert f"SUCCESS: {len(rules.rule_names(tls))} rules found" in out


@pytest.mark.parametrize("tls", [True, False])
def test_rendered_rules_hold_the_named_alerts(tls: bool) -> None:
    alerts = _alerts(rules.alert_rules(20, tls=tls))
    assert tuple(a["alert"] for a in alerts) == rules.rule_names(tls)
    for alert in alerts:
        assert alert["labels"]["severity"] in ("critical", "warning"), alert["alert"]
        annotations = alert["annotations"]
        # Prometheus' templates survived jinja: each message names the host it is about.
        assert "{{ $labels.host }}" in annotations["summary"], alert["alert"]
        assert "{{ $labels.host }}" in annotations["description"], alert["alert"]


def test_down_for_reaches_the_target_alerts() -> None:
    alerts = {a["alert"]: a for a in _alerts(rules.alert_rules(20, tls=False))}
    for name in ("VllmFleetInstanceDown", "VllmFleetTargetDown", "VllmFleetGatewayBackendOut"):
        assert alerts[name]["for"] == "20s"


@pytest.mark.parametrize("seconds, text", [(0, "0s"), (20, "20s"), (60, "1m"), (120, "2m"), (90, "1m30s"),
                                           (3600, "1h"), (5400, "1h30m"), (86461, "24h1m1s")])
def test_prometheus_duration(seconds: int, text: str) -> None:
    assert rules.prometheus_duration(seconds) == text


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2m"])
def test_prometheus_duration_refuses_what_is_no_whole_seconds(bad: object) -> None:
    with pytest.raises(ValueError):
        rules.prometheus_duration(bad)  # type: ignore[arg-type]


def test_alerts_fire_as_the_promtool_cases_expect(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(rules.alert_rules(120, tls=True))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    out = _promtool("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    assert "SUCCESS" in out


def test_every_alert_has_a_firing_case() -> None:
    cases = yaml.safe_load(ALERTS_TEST.read_text())["tests"]
    firing = {check["alertname"] for case in cases for check in case["alert_rule_test"] if check.get("exp_alerts")}
    quiet = {check["alertname"] for case in cases for check in case["alert_rule_test"] if not check.get("exp_alerts")}
    assert set(rules.RULE_NAMES) - firing == set(), "alerts no case sees fire"
    assert set(rules.RULE_NAMES) - quiet == set(), "alerts no case sees stay quiet"


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    broken = rules.alert_rules(120, tls=False).replace('up{job="vllm"} == 0', 'up{job="vllm"} == (0', 1)
    assert broken != rules.alert_rules(120, tls=False)
    path = tmp_path / "rules.yml"
    path.write_text(broken)
    result = promtool_tool.run("check", "rules", path)
    assert result.returncode != 0
    assert "VllmFleetInstanceDown" in result.stdout + result.stderr


def test_promtool_test_fails_when_an_alert_does_not_fire(tmp_path: Path) -> None:
    # The same cases against rules whose KV threshold is too high: the KV case must fail.
    (tmp_path / "rules.yml").write_text(rules.alert_rules(120, tls=True).replace("> 0.9", "> 0.99", 1))
    shutil.copy(ALERTS_TEST, tmp_path / ALERTS_TEST.name)
    result = promtool_tool.run("test", "rules", ALERTS_TEST.name, cwd=tmp_path)
    assert result.returncode != 0
    assert "VllmFleetKvCacheFull" in result.stdout + result.stderr


def test_dashboard_queries_parse(tmp_path: Path) -> None:
    """Every panel query and variable query of the dashboard is PromQL promtool accepts (checked as
    recording rules: promtool parses their expressions as Prometheus would)."""
    exprs = metric_names.dashboard_exprs(DASHBOARD.read_text())
    assert len(exprs) > 20
    recording = [{"record": f"dashboard:query_{i}", "expr": expr} for i, expr in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}))
    _promtool("check", "rules", path)


def test_dashboard_shape() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 39
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "label_values(" in variables["host"]["query"]["query"]
    assert "vllm_instance)" in variables["vllm_instance"]["query"]["query"]
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
