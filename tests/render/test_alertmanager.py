"""The fleet's Alertmanager offline: alertmanager.yml and its unit as render writes them, checked by
Debian's own amtool (`check-config`, `config routes test`), and the real Alertmanager started on the
loopback with that config: a host down holds back its instances' alerts, another host's go out to a
webhook (here, in the test), with the bearer token from the workstation; the status probe reads
them back. (On the sandbox, fired by a stopped vLLM: tests/sandbox/test_team_monitoring_sandbox.py.)"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from support import alertmanager_tool
from support.planning_fixtures import free_port, host_data
from vllm_fleet.config import parse_host
from vllm_fleet.monitoring import alerting
from vllm_fleet.monitoring.files import monitoring_paths
from vllm_fleet.payloads.probe.alerts import firing_alerts
from vllm_fleet.plan import plan_host
from vllm_fleet.render import Secrets, render_host

TOKEN = "mt-" + "ab" * 16
HOOK_TOKEN = "hook-token-5f2c9e8a71d3"
SMTP_PASSWORD = "smtp pass-4b7d1e9c"  # a space inside is a password's own business
SECRET_URL = "https://chat.example.org/hooks/T0K3N-9a8b7c6d5e"
RECEIVERS = {"ops-hook": {"url": "https://hooks.example.org/alertmanager", "token_env": "OPS_HOOK_TOKEN"},
             "chat": {"url_env": "CHAT_WEBHOOK_URL"},
             "oncall-mail": {"to": "oncall@example.org", "from": "alerts@example.org",
                             "smarthost": "mail.example.org:587", "auth_username": "alerts",
                             "password_env": "SMTP_PASSWORD"}}
SECRETS = {("ops-hook", "token_env"): HOOK_TOKEN, ("chat", "url_env"): SECRET_URL,
           ("oncall-mail", "password_env"): SMTP_PASSWORD}


def _monitor(receivers=RECEIVERS, **knobs):
    return parse_host("mon", host_data(placement="single-instance", vllm_metrics=True, vllm_monitoring=True,
                                       vllm_alert_receivers=receivers, **knobs))


def _files(host, secrets: Secrets | None):
    return {f.path: f for f in render_host(host, plan_host(host), secrets, targets=[])}


def _secrets(alert_secrets=SECRETS) -> Secrets:
    return Secrets("sk-k", host_key="hk-1", metrics_token=TOKEN, alert_secrets=tuple(alert_secrets.items()))


def _amtool(*args) -> str:
    try:
        result = alertmanager_tool.run(*args)
    except alertmanager_tool.AlertmanagerUnavailable as exc:
        pytest.skip(str(exc))
    assert result.returncode == 0, f"amtool {' '.join(map(str, args))}:\n{result.stdout}{result.stderr}"
    return result.stdout


@pytest.mark.parametrize("with_secrets", [True, False], ids=["deployed", "rendered"])
def test_the_config_passes_amtool_check_config(tmp_path: Path, with_secrets: bool) -> None:
    host = _monitor()
    text = _files(host, _secrets() if with_secrets else None)[monitoring_paths(host)["alertmanager_config"]].content
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    out = _amtool("check-config", path)
    assert "SUCCESS" in out and "1 inhibit rules" in out and "4 receivers" in out


def test_a_broken_config_fails_amtool_so_a_pass_means_something(tmp_path: Path) -> None:
    host = _monitor()
    document = yaml.safe_load(alerting.alertmanager_config(host, None))
    document["route"]["routes"].append({"receiver": "nobody-declared-this"})
    path = tmp_path / "alertmanager.yml"
    path.write_text(yaml.safe_dump(document))
    try:
        result = alertmanager_tool.run("check-config", path)
    except alertmanager_tool.AlertmanagerUnavailable as exc:
        pytest.skip(str(exc))
    assert result.returncode != 0 and "nobody-declared-this" in result.stdout + result.stderr


@pytest.mark.parametrize("receivers, expected", [
    (RECEIVERS, "chat,oncall-mail,ops-hook"),
    ({}, alerting.NO_RECEIVER),
], ids=["every-receiver", "none"])
def test_every_alert_is_routed_to_every_receiver(tmp_path: Path, receivers, expected: str) -> None:
    path = tmp_path / "alertmanager.yml"
    path.write_text(alerting.alertmanager_config(_monitor(receivers), None))
    for labels in (["alertname=VllmFleetInstanceDown", "host=gpu-01", "vllm_instance=qwen"],
                   ["alertname=VllmFleetHostDown", "host=gpu-02"], ["alertname=SomethingElse"]):
        _amtool("config", "routes", "test", f"--config.file={path}", f"--verify.receivers={expected}", *labels)


def test_grouping_timing_and_inhibition_are_the_knobs_and_the_host_label() -> None:
    host = _monitor(vllm_alert_group_wait_s=0, vllm_alert_group_interval_s=90, vllm_alert_repeat_interval_s=7200)
    document = yaml.safe_load(alerting.alertmanager_config(host, None))
    route = document["route"]
    assert (route["group_by"], route["group_wait"], route["group_interval"], route["repeat_interval"]) == (
        ["alertname", "host"], "0s", "1m30s", "2h")
    (rule,) = document["inhibit_rules"]
    assert rule == {"source_matchers": ['alertname="VllmFleetHostDown"'],
                    "target_matchers": ['alertname!="VllmFleetHostDown"'], "equal": ["host"]}


def test_secrets_reach_only_alertmanagers_root_only_config() -> None:
    host = _monitor()
    paths = monitoring_paths(host)
    deployed = _files(host, _secrets())
    config = deployed[paths["alertmanager_config"]]
    assert (config.owner, config.group, config.mode, config.secret) == ("root", "root", "0600", True)
    document = yaml.safe_load(config.content)
    receivers = {r["name"]: r for r in document["receivers"]}
    assert receivers["ops-hook"]["webhook_configs"][0]["http_config"]["authorization"] == {
        "type": "Bearer", "credentials": HOOK_TOKEN}
    assert receivers["chat"]["webhook_configs"][0]["url"] == SECRET_URL
    assert receivers["oncall-mail"]["email_configs"][0]["auth_password"] == SMTP_PASSWORD
    for path, rendered in deployed.items():
        if path != paths["alertmanager_config"]:
            for secret in SECRETS.values():
                assert secret not in rendered.content, path
    # `vllm-fleet render` knows no secret: placeholders, and a file it may show.
    shown = _files(host, None)[paths["alertmanager_config"]]
    assert not shown.secret and not any(secret in shown.content for secret in SECRETS.values())
    assert alerting.PLACEHOLDER_URL in shown.content and alerting.PLACEHOLDER_SECRET in shown.content


def test_the_unit_runs_alertmanager_alone_on_the_loopback_with_its_config_as_a_credential() -> None:
    host = _monitor()
    paths = monitoring_paths(host)
    files = _files(host, _secrets())
    unit = files[paths["alertmanager_unit"]].content
    assert "DynamicUser=yes" in unit and "StateDirectory=vllm-fleet-alertmanager" in unit
    assert f"LoadCredential=alertmanager.yml:{paths['alertmanager_config']}" in unit
    command = next(line for line in unit.splitlines() if line.startswith("ExecStart=")).split()
    # The cluster listener off (empty): by default it gossips on every interface.
    assert {"--web.listen-address=127.0.0.1:9415", "--cluster.listen-address=",
            "--config.file=%d/alertmanager.yml"} <= set(command)
    for secret in SECRETS.values():
        assert secret not in unit
    prometheus = yaml.safe_load(files[paths["config"]].content)
    assert prometheus["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:9415"]}]}]}


def test_the_units_flags_are_alertmanagers_own() -> None:
    try:
        help_text = subprocess.run([str(alertmanager_tool.alertmanager()), "--help"], capture_output=True,
                                   text=True, timeout=30)
    except alertmanager_tool.AlertmanagerUnavailable as exc:
        pytest.skip(str(exc))
    unit = alerting.alertmanager_unit(_monitor(), "/etc/x/alertmanager.yml")
    command = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    flags = [part.split("=", 1)[0] for part in command.split()[1:]]
    assert flags and all(f"{flag}=" in help_text.stdout + help_text.stderr for flag in flags), flags


# --- the real Alertmanager, on the loopback -------------------------------------------------------

class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.received.append({"authorization": self.headers.get("Authorization"), "body": body})
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


def _post_alerts(port: int, alerts: list[dict]) -> None:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/api/v2/alerts", data=json.dumps(alerts).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status == 200


def _wait_ready(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    pytest.fail("Alertmanager did not become ready in 30 s")


def test_a_host_down_holds_back_its_instances_alerts_and_the_rest_reach_the_webhook(tmp_path: Path) -> None:
    hook = ThreadingHTTPServer(("127.0.0.1", 0), _Hook)
    _Hook.received = []
    threading.Thread(target=hook.serve_forever, daemon=True).start()
    receivers = {"test-hook": {"url": f"http://127.0.0.1:{hook.server_address[1]}/alerts", "token_env": "HOOK_TOKEN"}}
    host = _monitor(receivers, vllm_alert_group_wait_s=0, vllm_alert_group_interval_s=1)
    config = tmp_path / "alertmanager.yml"
    config.write_text(alerting.alertmanager_config(host, {("test-hook", "token_env"): HOOK_TOKEN}))
    port = free_port()
    try:
        process = alertmanager_tool.start([f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
                                           f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                                          tmp_path)
    except alertmanager_tool.AlertmanagerUnavailable as exc:
        hook.shutdown()
        pytest.skip(str(exc))
    try:
        _wait_ready(port, process)
        down = {"alertname": "VllmFleetInstanceDown", "severity": "critical", "job": "vllm"}
        _post_alerts(port, [
            {"labels": {"alertname": "VllmFleetHostDown", "severity": "critical", "host": "gpu-01"},
             "annotations": {"summary": "Host gpu-01 is down"}},
            {"labels": {**down, "host": "gpu-01", "vllm_instance": "qwen"}, "annotations": {"summary": "qwen down"}},
            {"labels": {**down, "host": "gpu-02", "vllm_instance": "llama"}, "annotations": {"summary": "llama down"}},
        ])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(_Hook.received) < 2:
            time.sleep(0.2)
        time.sleep(2)  # a group that should not come has had its chance
        sent = {(a["labels"]["alertname"], a["labels"]["host"])
                for post in _Hook.received for a in post["body"]["alerts"]}
        assert sent == {("VllmFleetHostDown", "gpu-01"), ("VllmFleetInstanceDown", "gpu-02")}, _Hook.received
        assert {post["authorization"] for post in _Hook.received} == {f"Bearer {HOOK_TOKEN}"}
        assert {post["body"]["status"] for post in _Hook.received} == {"firing"}
        # What `vllm-fleet status` shows: the probe's own reading of this Alertmanager.
        read = firing_alerts({"port": port})
        assert read["errors"] == []
        rows = {(a["labels"]["alertname"], a["labels"]["host"]): a for a in read["alerts"]}
        assert set(rows) == {("VllmFleetHostDown", "gpu-01"), ("VllmFleetInstanceDown", "gpu-01"),
                             ("VllmFleetInstanceDown", "gpu-02")}
        held = rows[("VllmFleetInstanceDown", "gpu-01")]
        assert held["state"] == "suppressed" and held["inhibited_by"] == 1
        assert rows[("VllmFleetInstanceDown", "gpu-02")]["state"] == "firing"
        assert rows[("VllmFleetInstanceDown", "gpu-02")]["labels"]["vllm_instance"] == "llama"
    finally:
        process.terminate()
        process.wait(timeout=20)
        hook.shutdown()
