"""`vllm-fleet status --usage`: tokens by client summed from each instance's /metrics (the probe's
reading, as the host runs it) or from the fleet's Prometheus (asked on its host's loopback: a real
HTTP server here answering as Prometheus' query API does), the table and the JSON. No host."""

from __future__ import annotations

import json
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from support import fake_prometheus
from support.payload_helpers import bundled_module
from vllm_fleet import payloads
from vllm_fleet.commands import status

host_probe = bundled_module(payloads.PROBE, "host_probe")  # as the host runs it: one namespace

# vLLM's /metrics as prometheus_client writes it: HELP/TYPE lines, _total and _created samples,
# label values escaped; vLLM's own counters by engine.
EXPOSITION = r'''# HELP vllm_fleet_client_prompt_tokens_total Prompt tokens of the requests answered, by client and model.
# TYPE vllm_fleet_client_prompt_tokens_total counter
vllm_fleet_client_prompt_tokens_total{client="alice",model="tiny-llama"} 120.0
vllm_fleet_client_prompt_tokens_total{client="OnlyB",model="tiny-llama"} 30.0
vllm_fleet_client_prompt_tokens_total{client="(none)",model="tiny-llama"} 5.0
vllm_fleet_client_prompt_tokens_total{client="alice",model="we\"ird\\name"} 1.0
# HELP vllm_fleet_client_prompt_tokens_created Prompt tokens of the requests answered, by client and model.
# TYPE vllm_fleet_client_prompt_tokens_created gauge
vllm_fleet_client_prompt_tokens_created{client="alice",model="tiny-llama"} 1.7650e+09
vllm_fleet_client_cached_prompt_tokens_total{client="alice",model="tiny-llama"} 64.0
vllm_fleet_client_cached_prompt_tokens_total{client="OnlyB",model="tiny-llama"} 0.0
vllm_fleet_client_completion_tokens_total{client="alice",model="tiny-llama"} 40.0
vllm_fleet_client_completion_tokens_total{client="OnlyB",model="tiny-llama"} 8.0
vllm_fleet_client_completion_tokens_total{client="(none)",model="tiny-llama"} 1.0
vllm_fleet_client_usage_requests_total{client="alice",model="tiny-llama"} 6.0
vllm_fleet_client_usage_requests_total{client="OnlyB",model="tiny-llama"} 2.0
vllm_fleet_client_usage_requests_total{client="(none)",model="tiny-llama"} 1.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 156.0
vllm:prompt_tokens_created{engine="0",model_name="tiny-llama"} 1.7650e+09
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 49.0
vllm:prompt_tokens_cached_total{engine="0",model_name="tiny-llama"} 64.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny-llama",source="local_compute"} 92.0
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 0.0
'''


def test_the_probe_reads_each_clients_counters_and_vllms_own_from_metrics():
    usage = host_probe.usage_from_exposition(EXPOSITION)
    assert usage["clients"]["alice"]["tiny-llama"] == {"prompt": 120, "cached": 64, "completion": 40, "requests": 6}
    assert usage["clients"]["OnlyB"]["tiny-llama"] == {"prompt": 30, "cached": 0, "completion": 8, "requests": 2}
    assert usage["clients"]["alice"]['we"ird\\name']["prompt"] == 1
    assert usage["vllm"] == {"prompt": 156, "generation": 49, "cached": 64}
    assert host_probe.usage_from_exposition("") == {"clients": {}, "vllm": {}}
    assert host_probe.usage_from_exposition("garbage {\nvllm:prompt_tokens_total{x=\"1\"} NaNx\n") == {"clients": {}, "vllm": {}}


def _report():
    usage = host_probe.usage_from_exposition(EXPOSITION)
    return [{"name": "cpu1", "instances": {"tiny": {"usage": usage, "health": True},
                                           "down": {"state": "failed/failed", "health": False}}},
            {"name": "cpu2", "instances": {"tiny": {"usage": usage, "health": True}}},
            {"name": "cpu3", "reachable": False, "error": "unreachable over SSH"}]


def test_instances_usage_sums_every_instance_and_says_what_it_could_not_count():
    usage = status.instances_usage(_report())
    assert usage["source"] == "instances" and usage["since"] is None
    rows = {(r["client"], r["model"]): r for r in usage["clients"]}
    assert rows[("alice", "tiny-llama")] == {"client": "alice", "model": "tiny-llama", "prompt_tokens": 240,
                                             "cached_prompt_tokens": 128, "completion_tokens": 80, "requests": 12}
    assert usage["totals"] == {"prompt_tokens": 312, "cached_prompt_tokens": 128, "completion_tokens": 98,
                               "requests": 18}
    # What reconciles: the clients' prompt tokens with vLLM's own (here the recorded figures do).
    assert usage["vllm"] == {"prompt_tokens": 312, "generation_tokens": 98, "cached_prompt_tokens": 128}
    assert usage["errors"] == ["cpu3: unreachable over SSH",
                               "cpu1/down: no /metrics (not healthy): its tokens are not counted"]


def test_the_probe_asks_prometheus_for_each_counters_increase_over_the_window():
    def series(client, value):
        return {"metric": {"client": client, "model": "tiny-llama"}, "value": [1765000000.0, str(value)]}

    answers = {
        "vllm_fleet_client_prompt_tokens_total": [series("alice", 99.6), series("OnlyB", 10)],
        "vllm_fleet_client_completion_tokens_total": [series("alice", 7)],
        "vllm:prompt_tokens_total": [{"metric": {}, "value": [1765000000.0, "109.7"]}],
    }
    failing = False

    def answer(query: str) -> tuple[dict, int]:
        # the sum-by-client queries, answered by the counter they ask the increase of
        if failing:
            return fake_prometheus.bad_data()
        return fake_prometheus.vector(answers.get(query.split("increase(")[-1].split("[")[0], []))

    with fake_prometheus.serving(answer) as (port, requests):
        usage = host_probe.prometheus_usage({"port": port, "prefix": "/prometheus", "since": "7d"})
        asked = list(requests)
        failing = True
        failed = host_probe.prometheus_usage({"port": port, "prefix": "/prometheus", "since": "24h"})
    prompt = "vllm_fleet_client_prompt_tokens_total"
    assert (f"/prometheus/api/v1/query sum by (client, model) ((last_over_time({prompt}[7d]) unless {prompt} "
            f"offset 7d) or increase({prompt}[7d]))") in asked
    assert any(q.startswith("/prometheus/api/v1/query sum((last_over_time(vllm:generation_tokens_total[7d])")
               for q in asked)
    assert len(asked) == 7
    assert usage["clients"]["alice"]["tiny-llama"] == {"prompt": 100, "cached": 0, "completion": 7, "requests": 0}
    assert usage["vllm"] == {"prompt": 110} and usage["errors"] == []
    assert failed["clients"] == {} and len(failed["errors"]) == 7 and "parse error" in failed["errors"][0]
    with pytest.raises(ValueError):  # a window is never pasted into a query unchecked
        host_probe.prometheus_usage({"port": port, "prefix": "/prometheus", "since": "1h]) or vector(1"})


def test_collect_asks_the_monitoring_hosts_prometheus_when_status_reaches_it(tmp_path, monkeypatch):
    from vllm_fleet.commands import connection

    (tmp_path / "inv.py").write_text(
        "hosts = [('cpu1', {'vllm_target': 'cpu', 'vllm_metrics': True, 'vllm_monitoring': True,"
        " 'vllm_metrics_token_env': 'T'}), ('cpu2', {'vllm_target': 'cpu', 'vllm_metrics': True,"
        " 'vllm_metrics_token_env': 'T'})]\n")
    monkeypatch.setenv("T", "metrics-token-0123456789abcdef")
    monkeypatch.chdir(tmp_path)

    @contextmanager
    def reachable(inventory, hosts, **_kw):
        in_order = SimpleNamespace(map=lambda fn, items: [fn(i) for i in items])
        yield SimpleNamespace(pool=in_order), {n: SimpleNamespace(name=n) for n in hosts}

    asked = []
    monkeypatch.setattr(connection, "connected", reachable)
    monkeypatch.setattr(status, "host_status", lambda name, host, config, fleet: _report()[0] | {"name": name})
    monkeypatch.setattr(status, "prometheus_usage",
                        lambda name, host, config, since: asked.append((name, since)) or {"source": name})
    assert status.collect("inv.py", None, "")[3] == {"source": "cpu1"} and asked == [("cpu1", "24h")]
    assert status.collect("inv.py", None, "7d")[3] == {"source": "cpu1"} and asked[-1] == ("cpu1", "7d")
    # Outside --limit the monitoring host is not reached: each instance's /metrics is summed.
    usage = status.collect("inv.py", ["cpu2"], "")[3]
    assert usage["source"] == "instances" and usage["totals"]["prompt_tokens"] == 156
    # Without --usage no usage is read, and the monitoring host's entry carries the alerts instead.
    monkeypatch.setattr(status, "fleet_alerts", lambda name, host, config: asked.append((name, "alerts"))
                        or {"source": f"alertmanager on {name}", "alerts": [], "errors": []})
    report, _gateways, _ray, usage = status.collect("inv.py", None, None)
    assert usage is None and asked[-1] == ("cpu1", "alerts")
    assert [h["name"] for h in report if "alerts" in h] == ["cpu1"]
    before = len(asked)
    report = status.collect("inv.py", ["cpu2"], None)[0]  # the monitoring host outside --limit: no alerts asked
    assert len(asked) == before and not any("alerts" in h for h in report)


def test_main_prints_the_usage_table_and_json_and_refuses_a_bad_window(monkeypatch, capsys):
    usage = status.instances_usage(_report())
    monkeypatch.setattr(status, "collect", lambda inventory, limit, since: ([], [], [], usage))
    assert status.main(["inv.py", "--usage", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"usage": usage}
    assert status.main(["inv.py", "--usage"]) == 0
    out = capsys.readouterr().out
    assert "alice" in out and "240" in out and "since each instance's vLLM started" in out
    assert "vLLM's own counters: prompt 312, generation 98" in out and "not counted: cpu3" in out
    for bad in (["--usage", "--since", "1y"], ["--usage", "--since", "24h) or vector(1"], ["--since", "24h"],
                ["--usage", "--since", ""]):
        assert status.main(["inv.py", *bad]) == 2
        assert "--since" in capsys.readouterr().err


def test_main_lists_the_alerts_apart_from_the_hosts_as_a_table_and_as_json(monkeypatch, capsys):
    alerts = {"source": "alertmanager on cpu1", "errors": [], "alerts": [
        {"labels": {"alertname": "VllmFleetInstanceDown", "severity": "critical", "host": "cpu3",
                    "vllm_instance": "tiny"}, "summary": "vLLM instance tiny [bold]down[/bold]",
         "starts_at": "2026-12-05T02:59:01.1Z", "state": "firing", "inhibited_by": 0, "silenced_by": 0},
        {"labels": {"alertname": "VllmFleetTargetDown", "host": "cpu2", "job": "node"}, "summary": "node down",
         "starts_at": None, "state": "suppressed", "inhibited_by": 1, "silenced_by": 0}]}

    def collected(inventory, limit, since):
        report = _report()
        report[0] = dict(report[0], alerts=json.loads(json.dumps(alerts)))
        return report, [], [], None
    monkeypatch.setattr(status, "collect", collected)
    status.main(["inv.py", "--json"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["alerts"] == alerts and not any("alerts" in h for h in printed["hosts"])
    status.main(["inv.py"])
    out = capsys.readouterr().out
    table = out[out.index("alerts (alertmanager on cpu1)"):]
    assert "VllmFleetInstanceDown" in table and "cpu3" in table and "tiny" in table and "firing" in table
    assert "[bold]down[/bold]" in table  # an alert's text is shown as it is, never read as markup
    assert "held back: its host is down" in table


def test_the_window_query_counts_a_series_that_began_inside_the_window_whole(tmp_path):
    """Against Prometheus' own engine (promtool's rule tests): a client first seen 40 tokens in,
    then at 100, is counted 100 over a window holding all of it (increase() alone says 70: it drops
    the first sample and extrapolates); one counted since before the window, its increase."""
    from support import promtool_tool
    expr = f"sum by (client, model) ({host_probe.window_increase('c_total', '20m')})"
    (tmp_path / "rules.yml").write_text("groups: []\n")
    (tmp_path / "usage_test.yml").write_text(json.dumps({
        "rule_files": ["rules.yml"], "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": [
            {"series": 'c_total{client="new",model="m",host="a"}', "values": "_x30 40 50 60 100"},
            {"series": 'c_total{client="old",model="m",host="a"}', "values": "1000+0x29 1000 1020 1050 1100"}],
            "promql_expr_test": [{"expr": expr, "eval_time": "33m", "exp_samples": [
                {"labels": '{client="new",model="m"}', "value": 100},
                {"labels": '{client="old",model="m"}', "value": 100}]}]}]}))
    result = promtool_tool.run("test", "rules", "usage_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
