"""`vllm-fleet rollout --canary`, offline: --observe's parsing, the canary refused before any host
is reached (commands/canary.py plan), the PromQL it asks evaluated by Prometheus' own engine
(promtool), the probe that asks it (a real HTTP server answering as Prometheus' query API), and the
rollout's flow with pyinfra stubbed: a regression rolls the canary back alone, a healthy canary
lets the rest follow, a window without traffic stops it."""

from __future__ import annotations

import json

import pytest

from support import fake_prometheus
from support.payload_helpers import bundled_module
from support.planning_fixtures import host_data, instance
from vllm_fleet import payloads
from vllm_fleet.commands import canary
from vllm_fleet.config import ConfigError, ConfigErrors, parse_host
from vllm_fleet.config.settings import Settings
from vllm_fleet.monitoring import metric_names
from vllm_fleet.monitoring.canary_queries import canary_queries, side_figures
from vllm_fleet.rules.canary import PROCEED, ROLL_BACK, STOP

host_probe = bundled_module(payloads.PROBE, "host_probe")  # as the monitoring host runs it
MODEL = "gemma3-12b-q4"  # the planning fixtures' instance
KEYS = {"VLLM_FLEET_API_KEY": "sk-canary-5f0c1d9e2a7b", "VLLM_FLEET_METRICS_TOKEN": "mt-canary-3b8e6a0c41d2"}


# --- --observe ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text,seconds", [("30s", 30), ("10m", 600), ("1h", 3600), ("24h", 86400), ("10s", 10)])
def test_observe_takes_digits_and_one_unit(text, seconds):
    assert canary.parse_observe(text) == seconds


@pytest.mark.parametrize("text", ["0s", "0m", "9s", "-10m", "+10m", "10", "1.5m", "10 m", "10M", "1d", "25h",
                                  "9999999h", "", "10m\n", "１０m", "ten", "10m30s", None, 600])
def test_observe_refuses_zero_signs_fractions_other_units_and_absurd_windows(text):
    with pytest.raises(ValueError):
        canary.parse_observe(text)


def test_main_refuses_a_bad_observe_before_reading_the_inventory(tmp_path, capsys):
    from vllm_fleet.commands import rollout

    assert rollout.main([str(tmp_path / "nowhere.py"), "--canary", "a", "--observe", "0s"]) == 2
    err = capsys.readouterr().err
    assert "--observe '0s'" in err or "--observe 0s" in err
    assert "nowhere" not in err  # refused before the inventory was looked for


# --- the canary, checked before any host is reached ---------------------------------------------

def _fleet(**per_host):
    """Three hosts serving MODEL, scraped, box1 the monitoring host; per_host: host -> data changes."""
    configs = []
    for name in ("box1", "box2", "box3"):
        data = host_data(vllm_metrics=True, vllm_monitoring=name == "box1", vllm_monitoring_scrape_interval_s=5)
        data.update(per_host.get(name, {}))
        configs.append(parse_host(name, data))
    return configs


def _refused(request, everyone, selected=("box1", "box2", "box3")) -> list[ConfigError]:
    with pytest.raises((ConfigError, ConfigErrors)) as info:
        canary.plan(request, everyone, list(selected))
    return info.value.errors if isinstance(info.value, ConfigErrors) else [info.value]


def test_a_canary_plan_names_its_models_monitor_window_and_the_hosts_it_is_compared_with():
    plan = canary.plan(canary.CanaryRequest(["box2"], "30s"), _fleet(), ["box1", "box2", "box3"])
    assert (plan.hosts, plan.models, plan.monitor, plan.observe_s) == (["box2"], [MODEL], "box1", 30)
    assert plan.rest == {MODEL: ["box1", "box3"]}


def test_no_canary_asked_and_none_marked_is_no_canary_and_observe_alone_is_refused():
    assert canary.plan(canary.CanaryRequest(), _fleet(), ["box1", "box2", "box3"]) is None
    (err,) = _refused(canary.CanaryRequest(None, "30s"), _fleet())
    assert err.key == "--observe" and "--canary" in err.fix


def test_the_hosts_marked_in_their_data_are_the_canary_with_their_window():
    fleet = _fleet(box3={"vllm_rollout_canary": True, "vllm_canary_observe_s": 45})
    plan = canary.plan(None, fleet, ["box1", "box2", "box3"])
    assert plan.hosts == ["box3"] and plan.observe_s == 45
    # A marked host outside --limit is not converged by this rollout: no canary.
    assert canary.plan(None, fleet, ["box1", "box2"]) is None


def test_a_canary_host_not_in_the_inventory_or_outside_the_limit_is_refused():
    (unknown,) = _refused(canary.CanaryRequest(["ghost"]), _fleet())
    assert "'ghost'" in unknown.message and unknown.key == "--canary"
    (outside,) = _refused(canary.CanaryRequest(["box3"]), _fleet(), ["box1", "box2"])
    assert outside.host == "box3" and "--limit" in outside.fix


def test_without_the_fleets_prometheus_a_canary_is_refused_with_the_fix():
    errors = _refused(canary.CanaryRequest(["box2"]), _fleet(box1={"vllm_monitoring": False}))
    (err,) = [e for e in errors if e.key == "vllm_monitoring"]
    assert "has none" in err.message and "vllm_monitoring = True" in err.fix and "docs/monitoring.md" in err.fix


def test_a_canary_that_serves_nothing_or_is_not_scraped_is_refused():
    errors = _refused(canary.CanaryRequest(["box2"]), _fleet(box2={"vllm_instances": [], "vllm_metrics": False}))
    assert {(e.host, e.key) for e in errors} == {("box2", "--canary"), ("box2", "vllm_metrics")}
    assert any("serves no model" in e.message for e in errors)


def test_a_canary_of_every_host_of_its_model_has_nothing_to_compare_with():
    (err,) = _refused(canary.CanaryRequest(["box1", "box2", "box3"]), _fleet())
    assert "every host that serves gemma3-12b-q4" in err.message and "leave a host" in err.fix
    other = instance(served_model_name="other-model")
    (alone,) = _refused(canary.CanaryRequest(["box2"]), _fleet(box2={"vllm_instances": [other]}))
    assert "every host that serves other-model" in alone.message


def test_a_model_whose_other_hosts_are_not_scraped_is_refused():
    (err,) = _refused(canary.CanaryRequest(["box1"]),
                      _fleet(box2={"vllm_metrics": False}, box3={"vllm_metrics": False}))
    assert err.key == "vllm_metrics" and err.host == "box2" and "nothing to compare" in err.message


def test_canary_hosts_that_disagree_on_a_threshold_are_refused_naming_the_key():
    (err,) = _refused(canary.CanaryRequest(["box2", "box3"]), _fleet(box3={"vllm_canary_max_ttft_ratio": 1.5}))
    assert err.key == "vllm_canary_max_ttft_ratio" and "box2 1.2" in err.message and "box3 1.5" in err.message


def test_a_window_shorter_than_three_scrapes_is_refused():
    (err,) = _refused(canary.CanaryRequest(["box2"], "14s"), _fleet())  # scrapes every 5 s
    assert err.key == "--observe" and "--observe 15s" in err.fix
    assert canary.plan(canary.CanaryRequest(["box2"], "15s"), _fleet(), ["box1", "box2", "box3"]).observe_s == 15


@pytest.mark.parametrize("key,value", [
    ("vllm_canary_max_ttft_ratio", float("nan")), ("vllm_canary_max_ttft_ratio", float("inf")),
    ("vllm_canary_max_ttft_ratio", 0.5), ("vllm_canary_max_ttft_ratio", -1.2), ("vllm_canary_max_ttft_ratio", "1.2"),
    ("vllm_canary_max_itl_ratio", 1e308), ("vllm_canary_max_error_rate", -0.01), ("vllm_canary_max_error_rate", 1.5),
    ("vllm_canary_max_error_rate", True), ("vllm_canary_max_preemption_increase", float("-inf")),
    ("vllm_canary_min_requests", 0), ("vllm_canary_min_requests", 2 ** 64), ("vllm_canary_min_requests", 10.0),
    ("vllm_canary_observe_s", 0), ("vllm_canary_observe_s", -600), ("vllm_canary_observe_s", 86401),
    ("vllm_canary_observe_s", "10m"), ("vllm_rollout_canary", "yes"), ("vllm_rollout_canary", 1)])
def test_hostile_threshold_values_are_refused_naming_the_key_and_the_fix(key, value):
    message, fix = Settings.problem(key, value)
    assert "must be" in message and key in fix


# --- the queries, evaluated by Prometheus' own engine -------------------------------------------

def _series(name, labels, values):
    return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def test_the_queries_compare_the_canary_with_the_rest_in_prometheus_own_engine(tmp_path):
    """promtool's rule tests evaluate the very queries: a canary (named with a '.', which must not
    match another host as a regex would) whose first tokens land in (0.25, 0.5] s and whose clients
    abort 1 of 11; two other hosts in (0.08, 0.1] s. Samples every 15 s; the window 60 s."""
    from support import promtool_tool

    series = []
    for host, slow in (("gpu.01", True), ("gpuX01", False), ("gpu-02", False)):
        base = {"job": "vllm", "host": host, "served_model": "m", "vllm_instance": "m", "model_name": "m",
                "engine": "0"}
        series += [_series("vllm:request_success_total", {**base, "finished_reason": "length"}, "0+10x12"),
                   _series("vllm:request_success_total", {**base, "finished_reason": "abort"},
                           "0+1x12" if slow else "0x12"),
                   _series("vllm:num_preemptions_total", base, "0+2x12" if slow else "0x12"),
                   _series("http_requests_total", {"job": "vllm", "host": host, "served_model": "m",
                                                   "handler": "/v1/completions", "method": "POST",
                                                   "status": "5xx"}, "0x12")]
        for le in ("0.08", "0.1", "0.25", "0.5", "+Inf"):
            grows = le in ("0.5", "+Inf") if slow else le != "0.08"
            series.append(_series("vllm:time_to_first_token_seconds_bucket", {**base, "le": le},
                                  "0+10x12" if grows else "0x12"))
    # Prometheus 2.42 (Debian 12's) counts the sample at the window's start: 5 samples, 4 steps of 10.
    want = {"canary.requests": 44, "canary.aborted": 4, "canary.http_5xx": 0, "canary.preemptions": 8,
            "canary.ttft_p95": 0.4875, "rest.requests": 80, "rest.aborted": 0, "rest.http_5xx": 0,
            "rest.preemptions": 0, "rest.ttft_p95": 0.099}
    queries = canary_queries(["gpu.01"], 60)
    tests = [{"expr": expr, "eval_time": "3m",
              "exp_samples": [{"labels": '{served_model="m"}', "value": want[name]}] if name in want else []}
             for name, expr in queries.items()]
    (tmp_path / "rules.yml").write_text("groups: []\n")
    (tmp_path / "canary_test.yml").write_text(json.dumps({
        "rule_files": ["rules.yml"], "evaluation_interval": "15s",
        "tests": [{"interval": "15s", "input_series": series, "promql_expr_test": tests}]}))
    result = promtool_tool.run("test", "rules", "canary_test.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # No series of them: an empty answer (side_figures reads it as nothing counted, no quantile).
    assert {name for name in queries if name not in want} == {"canary.itl_p95", "rest.itl_p95", "canary.errored",
                                                               "rest.errored"}


def test_every_metric_the_queries_read_is_in_the_genuine_vllms_exposition():
    used = set().union(*map(metric_names.names_in_promql, canary_queries(["a"], 60).values()))
    assert used == {"vllm:request_success_total", "http_requests_total", "vllm:num_preemptions_total",
                    "vllm:time_to_first_token_seconds_bucket", "vllm:inter_token_latency_seconds_bucket"}
    from support.fleet_helpers import REPO

    exposed = metric_names.exposed_names((REPO / "tests/fixtures/metrics/vllm.prom").read_text())
    assert metric_names.missing(used, exposed) == set()


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "60"])
def test_a_window_is_a_positive_whole_number_of_seconds(window):
    with pytest.raises(ValueError):
        canary_queries(["a"], window)


def test_answers_become_figures_nan_and_garbage_included():
    answers = {"canary.requests": [{"metric": {"served_model": "m"}, "value": [1, "120.5"]},
                                   {"metric": {"served_model": "m"}, "value": [1, "3"]},
                                   {"metric": {}, "value": [1, "999"]}, {"metric": {"served_model": "x"}}],
               "canary.ttft_p95": [{"metric": {"served_model": "m"}, "value": [1, "NaN"]},
                                   {"metric": {"served_model": "n"}, "value": [1, "+Inf"]}],
               "canary.aborted": [{"metric": {"served_model": "m"}, "value": [1, "-Inf"]}]}
    figures = side_figures(answers, "canary")
    assert figures["m"]["requests"] == 123.5 and figures["m"]["ttft_p95"] is None and figures["m"]["aborted"] == 0
    assert figures["n"]["ttft_p95"] == float("inf") and figures["n"]["requests"] == 0
    assert side_figures(answers, "rest") == {}


def _answer(canary_requests=500, canary_ttft="0.0009", rest_requests=1000, rest_ttft="0.0009"):
    def vector(value):
        return [{"metric": {"served_model": MODEL}, "value": [1700000000, str(value)]}]
    return {"results": {"canary.requests": vector(canary_requests), "canary.ttft_p95": vector(canary_ttft),
                        "rest.requests": vector(rest_requests), "rest.ttft_p95": vector(rest_ttft),
                        "canary.itl_p95": vector("NaN"), "rest.itl_p95": vector("NaN")}, "errors": {}}


def test_decide_reports_each_models_figures_checks_and_the_decision():
    plan = canary.plan(canary.CanaryRequest(["box2"], "30s"), _fleet(), ["box1", "box2", "box3"])
    report = canary.decide(plan, _answer(canary_ttft="0.4875"))
    assert report["decision"] == ROLL_BACK and report["observe_s"] == 30 and report["monitor"] == "box1"
    (model,) = report["models"]
    assert model["canary"]["ttft_p95"] == 0.4875 and model["rest"]["total"] == 1000
    assert model["compared_with"] == ["box1", "box3"]
    assert "TTFT p95" in report["reasons"][0] and "541.67 x" in report["reasons"][0]
    assert canary.decide(plan, _answer())["decision"] == PROCEED
    assert canary.decide(plan, _answer(canary_requests=0))["decision"] == STOP
    failed = canary.decide(plan, {"results": {}, "errors": {"rest.requests": "HTTP 503 unavailable"}})
    assert failed["decision"] == STOP and "HTTP 503" in failed["reasons"][0]
    assert canary.decide(plan, None, "unreachable over SSH")["decision"] == STOP
    lines = canary.report_lines(report)
    assert any("TTFT p95" in ln and "487.5 ms" in ln and "BEYOND" in ln for ln in lines)
    assert lines[-1].startswith("canary decision: roll back")


# --- the probe that asks them ------------------------------------------------------------------

def _prometheus_answer(query: str) -> tuple[dict, int]:
    if "bad" in query:
        return fake_prometheus.bad_data()
    if "matrix" in query:
        return {"status": "success", "data": {"resultType": "matrix", "result": []}}, 200
    return fake_prometheus.vector([{"metric": {"served_model": "m"}, "value": [1, "NaN"]}])


def test_the_probe_asks_each_query_on_loopback_and_reports_each_failure_by_name():
    with fake_prometheus.serving(_prometheus_answer) as (port, asked):
        out = host_probe.instant_queries({"port": port, "prefix": "/prometheus",
                                          "queries": {"a": "good", "b": "bad(", "c": "matrix"}})
    assert out["results"] == {"a": [{"metric": {"served_model": "m"}, "value": [1, "NaN"]}]}
    assert set(out["errors"]) == {"b", "c"} and "parse error" in out["errors"]["b"]
    assert asked[0] == "/prometheus/api/v1/query good"
    too_many = host_probe.instant_queries({"port": 1, "prefix": "", "queries": {str(i): "x" for i in range(65)}})
    assert too_many["results"] == {} and too_many["errors"]
    assert host_probe.instant_queries({"port": 1, "prefix": "", "queries": {"a": "x"}})["errors"]["a"].startswith(
        "HTTP 0")  # nothing listening


# --- the rollout's flow, pyinfra stubbed ------------------------------------------------------

def _inventory(tmp_path) -> str:
    hosts = []
    for number, name in enumerate(("box1", "box2", "box3"), 1):
        data = host_data(vllm_metrics=True, vllm_monitoring=name == "box1", vllm_monitoring_scrape_interval_s=5,
                         ssh_hostname=f"10.0.0.{number}")
        hosts.append((name, data))
    path = tmp_path / "inv.py"
    path.write_text(f"box = {hosts!r}\n")
    return str(path)


def _rollout(monkeypatch, tmp_path, capsys, answer, *args, failing=()):
    """rollout.main with pyinfra stubbed: every host command succeeds, the monitoring host's probe
    answers `answer`; returns (exit code, JSON report, [(host, command kind)], the rolled-back hosts)."""
    from support.rollout_stubs import RolloutState, stub_pyinfra
    from vllm_fleet.commands import rollout
    from vllm_fleet.connect import remote
    from vllm_fleet.payloads.probe.host import RESULT_PREFIX

    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    state = RolloutState()
    hosts = stub_pyinfra(monkeypatch, state)

    def run_ops(_state):  # the deploy fails on the hosts named `failing`
        state.failed_hosts = {hosts[n] for n in failing if n in hosts}

    monkeypatch.setattr("pyinfra.api.operations.run_ops", run_ops)
    monkeypatch.setenv("VLLM_FLEET_API_KEY", KEYS["VLLM_FLEET_API_KEY"])
    ran, rolled, slept = [], [], []

    def run(host, command, **_kw):
        if "prometheus-query" in command:
            ran.append((host.name, "query"))
            return True, RESULT_PREFIX + json.dumps(answer) + "\n", ""
        ran.append((host.name, "other"))
        return True, "{}", ""

    monkeypatch.setattr(remote, "run", run)
    monkeypatch.setattr(rollout.rollback, "roll_back", lambda host, _c, _b: rolled.append(host.name) or (True, "ok"))
    monkeypatch.setattr(rollout, "changed_operations", lambda *_a: ["Config of gemma"])  # the release changes it
    monkeypatch.setattr(canary.time, "sleep", slept.append)
    code = rollout.main([_inventory(tmp_path), "--json", "--canary", "box2", "--observe", "30s", *args])
    out, err = capsys.readouterr()
    assert KEYS["VLLM_FLEET_METRICS_TOKEN"] not in out + err
    return code, json.loads(out), ran, rolled, slept, err


def test_a_canary_whose_first_tokens_are_slower_is_rolled_back_alone(monkeypatch, tmp_path, capsys):
    code, report, ran, rolled, slept, err = _rollout(monkeypatch, tmp_path, capsys, _answer(canary_ttft="0.4875"))
    assert code == 1 and slept == [30]
    assert {h["name"]: h["state"] for h in report["hosts"]} == {"box1": "untouched", "box2": "rolled back",
                                                                "box3": "untouched"}
    assert rolled == ["box2"] and ("box1", "query") in ran
    assert not any(name == "box3" for name, _kind in ran)  # never reached
    assert report["canary"]["decision"] == ROLL_BACK
    assert "TTFT p95" in next(h for h in report["hosts"] if h["name"] == "box2")["error"]
    assert "canary decision: roll back" in err  # the figures in the log too


def test_a_healthy_canary_lets_the_rest_follow(monkeypatch, tmp_path, capsys):
    code, report, _ran, rolled, _slept, _err = _rollout(monkeypatch, tmp_path, capsys, _answer(), "--batch", "2")
    assert code == 0 and rolled == []
    assert [h["state"] for h in report["hosts"]] == ["updated"] * 3
    assert report["canary"]["decision"] == PROCEED and report["canary"]["models"][0]["model"] == MODEL


def test_a_window_without_traffic_stops_the_rollout_saying_so(monkeypatch, tmp_path, capsys):
    code, report, _ran, rolled, _slept, err = _rollout(monkeypatch, tmp_path, capsys,
                                                       _answer(canary_requests=0, rest_requests=0))
    assert code == 1 and rolled == []
    assert {h["name"]: h["state"] for h in report["hosts"]} == {"box1": "untouched", "box2": "updated",
                                                                "box3": "untouched"}
    assert report["canary"]["decision"] == STOP
    assert "too little traffic" in report["canary"]["reasons"][0]
    assert "stopping after the canary" in err


def test_the_table_shows_the_figures_and_the_decision(monkeypatch, tmp_path, capsys):
    plan = canary.plan(canary.CanaryRequest(["box2"], "30s"), _fleet(), ["box1", "box2", "box3"])
    canary.print_report(canary.decide(plan, _answer(canary_ttft="0.4875")))
    out = capsys.readouterr().out
    assert "TTFT p95" in out and "487.5 ms" in out and "0.9 ms" in out and "beyond" in out
    assert "canary decision: roll back" in out and "not judged" in out  # the inter-token latency: no samples


def test_a_canary_that_fails_its_deploy_stops_the_rollout_whatever_max_fail_allows(monkeypatch, tmp_path, capsys):
    code, report, ran, rolled, slept, _err = _rollout(monkeypatch, tmp_path, capsys, _answer(), "--max-fail", "1",
                                                      failing=("box2",))
    assert code == 1 and slept == [] and not any(kind == "query" for _name, kind in ran)
    assert {h["name"]: h["state"] for h in report["hosts"]} == {"box1": "untouched", "box2": "rolled back",
                                                                "box3": "untouched"}
    assert rolled == ["box2"]  # by the rollout's own rollback of a failed host, once
    assert report["canary"]["decision"] == ROLL_BACK and "failed its deploy" in report["canary"]["reasons"][0]
