"""The team's fleet monitored, on the sandbox with the genuine vLLM: vllm_metrics on every host, the
fleet's Prometheus (Debian's package) on sbx-cpu1, with the team service's HTTPS and clients
(test_team_service_sandbox.py's, which runs next and so converges from here: it turns monitoring
off). sbx-mixed (SIMULATED GPUs: a stand-in nvidia-smi, no instance) shows the GPU series.

Prometheus' own HTTP API, asked on sbx-cpu1, must list every target up; the metrics every rule and
the dashboard use must be among those the live vLLM, node exporter, vllm-router and host exporter
expose; an instance stopped must fire its alert, which the fleet's Alertmanager (beside Prometheus)
posts to a webhook on sbx-cpu1 itself (a small recorder, a transient unit of the test's), with the
bearer token from the workstation, and `vllm-fleet status` lists; started again, the alert resolves
and the webhook hears that too. Off-host, /metrics needs the metrics token. Traffic goes only to
the sandbox hosts.
"""

from __future__ import annotations

import json
import re
import runpy
import shlex
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from support.fleet_helpers import CPU_HOSTS, REPO, ROLLOUT_END_INSTANCES, pyinfra, variant_inventory, vllm_fleet
from vllm_fleet.monitoring import metric_names
from vllm_fleet.host_layout import ALERTMANAGER_UNIT, PROMETHEUS_UNIT
from vllm_fleet.monitoring.rules import alert_rules

GPU_HOST, GPU_HOST_ADDRESS, GPUS = "sbx-mixed", "10.213.7.21", 3
# The team service's clients and keys (test_team_service_sandbox.py), and the metrics token.
KEYS = {"ALICE_KEY": "sk-alice-7f3a0c5e91", "LIMITED_KEY": "sk-limited-91c2b8d4e6",
        "OTHER_KEY": "sk-other-44d0a9f3c1", "VLLM_FLEET_METRICS_TOKEN": "mt-prometheus-9b2c7e1f04",
        "SANDBOX_HOOK_TOKEN": "hook-token-3e7a91c5d2"}
CLIENTS = {"alice": {"key_env": "ALICE_KEY"},
           "limited": {"key_env": "LIMITED_KEY", "requests_per_minute": 6},
           "other": {"key_env": "OTHER_KEY", "models": ["tiny-llama"]}}
METRICS_PORT = 9410
PROMETHEUS = f"http://127.0.0.1:{METRICS_PORT + 4}/prometheus/api/v1"  # asked on sbx-cpu1 itself
MONITORED = {"vllm_tls": True, "vllm_api_clients": CLIENTS, "vllm_metrics": True,
             "vllm_monitoring_scrape_interval_s": 2, "vllm_monitoring_down_for_s": 6}
# The webhook the alerts reach: a recorder on the monitoring host's loopback (alert_hook, below),
# with the messages gathered and sent within seconds.
HOOK_PORT, HOOK_UNIT, HOOK_LOG = 9480, "vllm-fleet-test-alert-hook", "/var/tmp/vllm-fleet-test-alert-hook.jsonl"
ALERTING = {"vllm_alert_receivers": {"sandbox-hook": {"url": f"http://127.0.0.1:{HOOK_PORT}/alerts",
                                                      "token_env": "SANDBOX_HOOK_TOKEN"}},
            "vllm_alert_group_wait_s": 1, "vllm_alert_group_interval_s": 2}
# The recorder: each POST, its Authorization header and its JSON body, one line each.
HOOK_SCRIPT = f"""
import json, http.server
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with open({HOOK_LOG!r}, "a") as log:
            log.write(json.dumps({{"authorization": self.headers.get("Authorization"), "body": body}}) + "\\n")
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", {HOOK_PORT}), Hook).serve_forever()
"""


def _inventory(tmp_path) -> str:
    # sbx-mixed as inventory/sandbox.py declares it (its SIMULATED GPUs), without an instance.
    gpu_host = next(h for h in runpy.run_path(str(REPO / "inventory" / "sandbox.py"))["gpu_sim_hosts"]
                    if h[0] == GPU_HOST)
    host_data = {h: dict(MONITORED) for h in CPU_HOSTS}
    host_data["sbx-cpu1"].update(vllm_monitoring=True, **ALERTING)
    host_data[GPU_HOST] = dict(MONITORED, vllm_instances=[])
    # The instances as the rollout module left them: the monitoring settings restart no vLLM, so
    # neither does this deploy.
    return variant_inventory(tmp_path, host_data=host_data, extra_hosts=[gpu_host], instance=ROLLOUT_END_INSTANCES)


def _ask(sandbox, path: str, **params) -> dict:
    """Prometheus' HTTP API on the monitoring host (its loopback listener), as a JSON document."""
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    out = sandbox.run("sbx-cpu1", f"curl -sf '{PROMETHEUS}/{path}{query}'", check=True).stdout
    return json.loads(out)["data"]


def _wait(what: str, check, timeout_s: float = 90):
    deadline, last = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        last = check()
        if last[0]:
            return last[1]
        time.sleep(2)
    pytest.fail(f"{what}: not within {timeout_s:.0f} s; last seen: {last[1]}")


@pytest.fixture(scope="module")
def monitored(sandbox, deploy_env, tmp_path_factory):
    env = dict(deploy_env, **KEYS)
    inventory = _inventory(tmp_path_factory.mktemp("monitoring"))
    result = pyinfra(env, "--limit", "cpu_hosts", inventory=inventory)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    for secret in KEYS.values():  # no key and no token in what a deploy prints
        assert secret not in out
    ca = vllm_fleet(env, "tls", "ca", inventory).stdout.strip()
    return {"env": env, "inventory": inventory, "ca": ca}


def _targets(sandbox) -> list[dict]:
    return _ask(sandbox, "targets", state="active")["activeTargets"]


def test_prometheus_scrapes_every_target_of_the_fleet_up(monitored, sandbox):
    expected = ({("vllm", h) for h in CPU_HOSTS} | {("node", h) for h in [*CPU_HOSTS, GPU_HOST]}
                | {("front", h) for h in [*CPU_HOSTS, GPU_HOST]} | {("gpu", GPU_HOST), ("vllm-router", "sbx-cpu1"),
                                                                  ("prometheus", "sbx-cpu1")})

    def all_up():
        targets = _targets(sandbox)
        seen = {(t["labels"]["job"], t["labels"]["host"]): t["health"] for t in targets}
        return set(seen) == expected and set(seen.values()) == {"up"}, seen
    seen = _wait("every target up", all_up)
    assert len(seen) == len(expected)
    instances = {t["labels"]["host"]: t["labels"] for t in _targets(sandbox) if t["labels"]["job"] == "vllm"}
    assert {labels["vllm_instance"] for labels in instances.values()} == {"tiny"}
    assert {labels["served_model"] for labels in instances.values()} == {"tiny-llama"}
    assert all(t["scrapeUrl"].startswith("https://") for t in _targets(sandbox) if t["labels"]["job"] != "prometheus")


def test_a_vllm_series_per_instance_and_a_gpu_series_per_simulated_gpu(monitored, sandbox):
    def running():
        result = _ask(sandbox, "query", query="vllm:num_requests_running")["result"]
        return len(result) == len(CPU_HOSTS), result
    series = _wait("vllm:num_requests_running of every instance", running)
    assert {s["metric"]["host"] for s in series} == set(CPU_HOSTS)
    gpus = _ask(sandbox, "query", query="vllm_fleet_gpu_memory_total_bytes")["result"]
    assert sorted((s["metric"]["host"], s["metric"]["gpu"], s["metric"]["simulated"]) for s in gpus) == [
        (GPU_HOST, str(i), "true") for i in range(GPUS)]
    names = {s["metric"]["gpu"]: s["metric"]["gpu_name"] for s in gpus}
    assert names == {"0": "NVIDIA GeForce RTX 4090 D", "1": "NVIDIA A100-SXM4-40GB", "2": "NVIDIA A100-SXM4-40GB"}


def _get(url: str, ca: str, token: str | None) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=ca)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    try:
        with opener.open(urllib.request.Request(url, headers=headers), timeout=20) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read()


@pytest.mark.parametrize("url", [f"https://{CPU_HOSTS['sbx-cpu2']}:8000/metrics",
                                 f"https://{CPU_HOSTS['sbx-cpu2']}:{METRICS_PORT}/metrics/node",
                                 f"https://{GPU_HOST_ADDRESS}:{METRICS_PORT}/metrics/gpu",
                                 f"https://{CPU_HOSTS['sbx-cpu1']}:{METRICS_PORT}/metrics/router",
                                 f"https://{CPU_HOSTS['sbx-cpu1']}:{METRICS_PORT}/prometheus/api/v1/targets"],
                         ids=["vllm", "node", "gpu", "router", "prometheus"])
def test_off_host_metrics_need_the_metrics_token_and_no_api_key_is_one(monitored, url):
    ca, token = monitored["ca"], KEYS["VLLM_FLEET_METRICS_TOKEN"]
    assert _get(url, ca, None)[0] == 401
    assert _get(url, ca, KEYS["ALICE_KEY"])[0] == 401  # a client's API key reads no metric
    assert _get(url, ca, token.upper())[0] == 401  # compared exactly
    status, body = _get(url, ca, token)
    assert status == 200, body[:300]


def test_the_metrics_token_is_no_api_key(monitored):
    status, _ = _get(f"https://{CPU_HOSTS['sbx-cpu2']}:8000/v1/models", monitored["ca"],
                     KEYS["VLLM_FLEET_METRICS_TOKEN"])
    assert status == 401


@pytest.fixture
def alert_hook(sandbox):
    """The webhook recorder on sbx-cpu1, as a transient unit (stopped, and its log removed, after)."""
    sandbox.run("sbx-cpu1", f"systemctl stop {HOOK_UNIT} 2>/dev/null; rm -f {HOOK_LOG}")
    sandbox.run("sbx-cpu1", f"systemd-run --unit={HOOK_UNIT} --collect /usr/bin/python3 -I -c "
                            f"{shlex.quote(HOOK_SCRIPT)}", check=True)
    _wait("the webhook recorder listening", lambda: (sandbox.run(
        "sbx-cpu1", f"ss -Hltn 'sport = :{HOOK_PORT}'").stdout.strip() != "", None), timeout_s=20)
    yield
    sandbox.run("sbx-cpu1", f"systemctl stop {HOOK_UNIT}; rm -f {HOOK_LOG}")


def _hook_posts(sandbox) -> list[dict]:
    out = sandbox.run("sbx-cpu1", f"cat {HOOK_LOG} 2>/dev/null").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _instance_down_posts(sandbox, host: str, status: str) -> list[dict]:
    """The webhook's POSTs of `status` that carry VllmFleetInstanceDown for `host`."""
    return [post for post in _hook_posts(sandbox) if post["body"]["status"] == status
            and any(a["labels"].get("alertname") == "VllmFleetInstanceDown" and a["labels"].get("host") == host
                    for a in post["body"]["alerts"])]


def test_an_instance_stopped_fires_the_instance_down_alert(monitored, sandbox, alert_hook):
    host, unit = "sbx-cpu3", "vllm-tiny.service"
    sandbox.run(host, f"systemctl stop {unit}", check=True)
    try:
        def firing():
            alerts = _ask(sandbox, "alerts")["alerts"]
            mine = [a for a in alerts if a["labels"]["alertname"] == "VllmFleetInstanceDown"]
            return any(a["state"] == "firing" and a["labels"]["host"] == host for a in mine), mine
        alerts = _wait("VllmFleetInstanceDown for sbx-cpu3", firing, timeout_s=60)
        assert {a["labels"]["host"] for a in alerts if a["state"] == "firing"} == {host}

        # Alertmanager's POST reaches the webhook, naming the host and the instance.
        posts = _wait("the webhook's POST of the firing alert", lambda: (
            bool(found := _instance_down_posts(sandbox, host, "firing")), found or _hook_posts(sandbox)), timeout_s=60)
        post = posts[0]
        assert post["authorization"] == f"Bearer {KEYS['SANDBOX_HOOK_TOKEN']}"
        assert post["body"]["receiver"] == "sandbox-hook"
        (alert,) = [a for a in post["body"]["alerts"] if a["labels"]["host"] == host]
        assert alert["status"] == "firing" and alert["labels"]["vllm_instance"] == "tiny"
        assert alert["annotations"]["summary"] == "vLLM instance tiny (tiny-llama) on sbx-cpu3 is down"

        # `vllm-fleet status` lists it, from the monitoring host's Alertmanager.
        done = vllm_fleet(monitored["env"], "status", monitored["inventory"], "--limit", "sbx-cpu1", "--json")
        listed = json.loads(done.stdout)["alerts"]
        assert listed["source"] == "alertmanager on sbx-cpu1" and listed["errors"] == [], listed
        assert any(a["labels"]["alertname"] == "VllmFleetInstanceDown" and a["labels"]["host"] == host
                   and a["labels"]["vllm_instance"] == "tiny" and a["state"] == "firing" for a in listed["alerts"])
    finally:
        sandbox.run(host, f"systemctl start {unit}", check=True)  # the start job ends once vLLM is healthy
    resolved = _wait("the webhook's POST of the resolved alert", lambda: (
        bool(found := _instance_down_posts(sandbox, host, "resolved")), found or _hook_posts(sandbox)), timeout_s=90)
    (alert,) = [a for a in resolved[0]["body"]["alerts"] if a["labels"]["alertname"] == "VllmFleetInstanceDown"
                and a["labels"]["host"] == host]
    assert alert["status"] == "resolved" and alert["labels"]["vllm_instance"] == "tiny"


def _post(url: str, ca: str, key: str, body: dict) -> tuple[int, bytes]:
    context = ssl.create_default_context(cafile=ca)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with opener.open(request, timeout=120) as answer:
        return answer.status, answer.read()


def _exposition(url: str, ca: str) -> str:
    status, body = _get(url, ca, KEYS["VLLM_FLEET_METRICS_TOKEN"])
    assert status == 200, body[:300]
    return body.decode()


def test_every_metric_the_rules_and_the_dashboard_use_is_exposed_live(monitored):
    ca, cpu1 = monitored["ca"], CPU_HOSTS["sbx-cpu1"]
    # vllm-router names a counter only once it has counted: one completion through the gateway.
    status, body = _post(f"https://{cpu1}:9000/v1/chat/completions", ca, KEYS["ALICE_KEY"],
                         {"model": "tiny-llama", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200, body[:300]
    live = {"vllm": _exposition(f"https://{CPU_HOSTS['sbx-cpu2']}:8000/metrics", ca),
            "node": _exposition(f"https://{cpu1}:{METRICS_PORT}/metrics/node", ca),
            "router": _exposition(f"https://{cpu1}:{METRICS_PORT}/metrics/router", ca),
            "gpu": _exposition(f"https://{GPU_HOST_ADDRESS}:{METRICS_PORT}/metrics/gpu", ca),
            "front": _exposition(f"https://{cpu1}:{METRICS_PORT}/metrics/front", ca)}
    used = metric_names.used_names(alert_rules(120, tls=True), metric_names.dashboard_text())
    missing = metric_names.check_against(live, used)
    assert not any(missing.values()), missing


def test_prometheus_runs_as_its_user_and_only_the_front_listens_off_loopback(monitored, sandbox):
    user = sandbox.run("sbx-cpu1", f"systemctl show -p User --value {PROMETHEUS_UNIT}", check=True).stdout.strip()
    assert user == "prometheus"
    # Alertmanager: a user of its own (not Prometheus', which must not read the receivers' secrets),
    # and its root-only config reaches no one else.
    owner = sandbox.run("sbx-cpu1", f"ps -o user= -p $(systemctl show -p MainPID --value {ALERTMANAGER_UNIT})",
                        check=True).stdout.strip()
    assert owner not in ("", "root", "prometheus"), owner
    mode = sandbox.run("sbx-cpu1", "stat -c '%U %a' /etc/vllm-fleet-prometheus/alertmanager.yml", check=True)
    assert mode.stdout.split() == ["root", "600"]
    for host in ("sbx-cpu1", "sbx-cpu2", GPU_HOST):  # the monitor, a monitored host, one without vLLM
        listening = sandbox.run(host, "ss -Hltnp", check=True).stdout.splitlines()
        programs = {name for line in listening for name in re.findall(r'\(\("([^"]+)"', line)}
        assert {"prometheus-node", "python3"} <= programs, listening  # the node exporter, the host exporter
        outside = [line for line in listening if not re.search(r"\s(127\.0\.0\.1|\[::1\]):\d+\s", line)]
        assert all('"nginx"' in line or '"sshd"' in line for line in outside), (host, outside)


def test_status_usage_sums_each_clients_tokens_from_the_fleets_prometheus(monitored):
    """alice's completions through the gateway, then `status --usage --json`: asked of the fleet's
    Prometheus on sbx-cpu1 (scraping every 2 s), alice's prompt tokens over the last hour hold at
    least those her answers reported, and no query failed."""
    ca, sent = monitored["ca"], 0
    for words in ("hi", "hello there", "count to three"):
        status, body = _post(f"https://{CPU_HOSTS['sbx-cpu1']}:9000/v1/chat/completions", ca, KEYS["ALICE_KEY"],
                             {"model": "tiny-llama", "max_tokens": 3, "messages": [{"role": "user", "content": words}]})
        assert status == 200, body[:300]
        sent += json.loads(body)["usage"]["prompt_tokens"]

    def counted():
        done = vllm_fleet(monitored["env"], "status", monitored["inventory"], "--usage", "--since", "1h", "--json")
        usage = json.loads(done.stdout)["usage"]
        alice = sum(r["prompt_tokens"] for r in usage["clients"] if r["client"] == "alice")
        return usage["source"] == "prometheus on sbx-cpu1" and not usage["errors"] and alice >= sent, usage

    usage = _wait("alice's tokens in the fleet's Prometheus", counted, timeout_s=180)
    assert usage["since"] == "1h" and usage["vllm"]["prompt_tokens"] >= sent
    assert not any(key in json.dumps(usage) for key in KEYS.values())
