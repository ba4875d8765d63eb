"""The gateway bench's offline parts: the stand-in backend (on loopback ports these tests start and
stop), the client's measurement and percentile math, and the bench's commands and checks against a
fake or local "sandbox" (no sandbox host is booted here)."""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.planning_fixtures import free_port

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import gateway_bench as gb  # noqa: E402
import gateway_bench_standins as gs  # noqa: E402
import gateway_standin as si  # noqa: E402

AUTH = {"authorization": f"Bearer {si.API_KEY}"}
BODY = json.dumps({"model": si.MODEL, "prompt": "Hello", "max_tokens": 1}).encode()


# --- percentiles ----------------------------------------------------------------------------------

def test_percentile_interpolates_between_ranks_like_numpy():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert si.percentile(values, 50) == pytest.approx(50.5)
    assert si.percentile(values, 99) == pytest.approx(99.01)
    assert si.percentile(values, 0) == 1.0 and si.percentile(values, 100) == 100.0
    assert si.percentile([3.0, 1.0, 2.0], 50) == 2.0  # input order does not matter
    assert si.percentile([7.0], 99) == 7.0
    assert si.percentile([], 50) is None


def test_summary_and_added():
    direct, gateway = si.summary([1.0, 2.0, 3.0]), si.summary([2.0, 3.5, 4.0])
    assert direct == {"n": 3, "p50": 2.0, "p90": pytest.approx(2.8), "p99": pytest.approx(2.98), "mean": 2.0}
    added = si.added(direct, gateway, [1.0, 2.0, 4.0])
    assert added["p50"] == pytest.approx(1.5) and added["paired_p50"] == 2.0 and added["pairs"] == 3
    empty = si.added(si.summary([]), gateway, [])
    assert empty["p50"] is None and empty["paired_p50"] is None and empty["pairs"] == 0


# --- the stand-in, without sockets ------------------------------------------------------------

def test_standin_answers_like_a_vllm_backend():
    app = si.StandIn("tiny-llama", "sbx-cpu2")
    assert app.respond("GET", "/health", {}, b"") == (200, b"")
    status, body = app.respond("GET", "/v1/models", AUTH, b"")
    models = json.loads(body)
    assert status == 200 and models["object"] == "list" and [m["id"] for m in models["data"]] == ["tiny-llama"]
    status, body = app.respond("POST", "/v1/completions?x=1", AUTH, BODY)
    completion = json.loads(body)
    assert status == 200 and completion["model"] == "tiny-llama"
    assert completion["usage"]["completion_tokens"] == 1 and len(completion["choices"]) == 1
    assert si.fingerprint_of(body) == "vllm-fleet-stand-in sbx-cpu2"
    assert app.respond("POST", "/v1/completions", {}, BODY)[0] == 401  # no key: vLLM's 401
    assert app.respond("POST", "/v1/completions", {"authorization": "Bearer wrong"}, BODY)[0] == 401
    assert app.respond("GET", "/v1/models", {}, b"")[0] == 401
    other = json.dumps({"model": "beta", "prompt": "x"}).encode()
    assert app.respond("POST", "/v1/completions", AUTH, other)[0] == 404
    assert app.respond("POST", "/v1/completions", AUTH, b"{not json")[0] == 400
    assert app.respond("GET", "/metrics", AUTH, b"")[0] == 404
    assert app.counts["POST /v1/completions 200"] == 1 and app.counts["POST /v1/completions 401"] == 2


def test_fingerprint_of_other_bodies():
    assert si.fingerprint_of(b'{"id":"x","system_fingerprint":null}') == "-"  # vLLM's
    assert si.fingerprint_of(b'{"id":"x"}') == "-"
    assert si.fingerprint_of(b'{"system_fingerprint": "a b"}') == "a b"


def test_parse_head_and_keep_alive():
    method, target, version, headers = si.parse_head(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nConnection: Keep-Alive\r\n\r\n")
    assert (method, target, version) == ("POST", "/v1/completions", "HTTP/1.1")
    assert headers == {"host": "x", "content-length": "3", "connection": "Keep-Alive"}
    assert si.wants_keep_alive("HTTP/1.1", {}) and not si.wants_keep_alive("HTTP/1.1", {"connection": "close"})
    assert not si.wants_keep_alive("HTTP/1.0", {}) and si.wants_keep_alive("HTTP/1.0", {"connection": "keep-alive"})


def test_parse_target():
    assert si.parse_target("10.213.7.11:9000") == ("10.213.7.11", 9000)
    assert si.parse_target("[::1]:8800") == ("::1", 8800)
    with pytest.raises(ValueError):
        si.parse_target("10.213.7.11")


# --- the stand-in as a process on a loopback port ------------------------------------------

class StandInProcess:
    """`gateway_standin.py serve` on 127.0.0.1 (any free port), stopped by its PID."""

    def __init__(self, label: str, lifetime_s: float | None = None) -> None:
        argv = [sys.executable, "-I", str(BENCH / "gateway_standin.py"), "serve", "--port", "0", "--label", label]
        if lifetime_s is not None:
            argv += ["--lifetime-s", str(lifetime_s)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        assert ready["ready"] and ready["pid"] == self.proc.pid
        self.port = ready["port"]
        self.target = ("127.0.0.1", self.port)

    def stop(self) -> dict:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=10)
        assert self.proc.returncode == 0, err
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def standins():
    started: list[StandInProcess] = []

    def start(label: str, **kwargs) -> StandInProcess:
        started.append(StandInProcess(label, **kwargs))
        return started[-1]

    yield start
    for s in started:
        s.kill()


def test_standin_process_keeps_connections_open_and_reports_on_sigterm(standins):
    s = standins("one")
    conn = http.client.HTTPConnection(*s.target, timeout=5)
    conn.request("GET", "/health")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.read() == b""
    sock = conn.sock
    for _ in range(3):
        conn.request("POST", "/v1/completions", BODY, {"Content-Type": "application/json",
                                                       "Authorization": AUTH["authorization"]})
        resp = conn.getresponse()
        assert resp.status == 200 and si.fingerprint_of(resp.read()) == "vllm-fleet-stand-in one"
    assert conn.sock is sock  # one connection for all four
    conn.close()
    # A chunked request body (what a proxy may send), then Connection: close.
    raw = socket.create_connection(s.target, timeout=5)
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    raw.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: " + AUTH["authorization"].encode()
                + b"\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" + chunked)
    answer = b""
    while chunk := raw.recv(65536):
        answer += chunk
    raw.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and b"connection: close" in answer
    stopped = s.stop()
    assert stopped["stopped"] and stopped["counts"] == {"GET /health 200": 1, "POST /v1/completions 200": 4}


def test_standin_exits_after_its_lifetime(standins):
    s = standins("brief", lifetime_s=0.3)
    s.proc.wait(timeout=10)
    assert json.loads(s.proc.stdout.read().strip().splitlines()[-1])["stopped"]


def test_measure_alternates_blocks_and_counts_who_answered(standins):
    a, b, gw = standins("a"), standins("b"), standins("gw")  # "gw" plays the gateway's part
    result = si.measure([a.target, b.target], gw.target, concurrency=2, total=80, block=10)
    assert result["errors"] == 0 and result["concurrency"] == 2
    assert result["requests_per_kind"] == 80 and result["direct"]["n"] == 80 and result["gateway"]["n"] == 80
    fp = si.FINGERPRINT
    assert result["served_by"] == {"direct": {f"{fp} a": 40, f"{fp} b": 40}, "gateway": {f"{fp} gw": 80}}
    assert result["added"]["pairs"] == 8  # 2 threads x 4 rounds
    for q in ("p50", "p99", "paired_p50"):
        assert isinstance(result["added"][q], float)
    assert result["direct"]["p50"] <= result["direct"]["p99"]
    assert a.stop()["counts"]["POST /v1/completions 200"] == 40


def test_measure_counts_errors_and_keeps_going(standins):
    a = standins("a")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = closed.getsockname()
    result = si.measure([a.target], dead, concurrency=1, total=20, block=10, timeout=2)
    assert result["direct"]["n"] == 20 and result["gateway"]["n"] == 0 and result["errors"] == 20
    assert result["added"]["p50"] is None and "Connection refused" in result["error_examples"][0]


def test_measure_command_line_prints_one_json_document(standins):
    a, gw = standins("a"), standins("gw")
    proc = subprocess.run([sys.executable, "-I", str(BENCH / "gateway_standin.py"), "measure", "--direct",
                           gs.target_text(a.target), "--gateway", gs.target_text(gw.target), "--concurrency", "1",
                           "--requests", "40", "--warmup", "20"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    result = gs.last_json_line(proc.stdout)
    assert result["direct"]["n"] == 40 and result["gateway"]["n"] == 40 and result["errors"] == 0
    assert si.API_KEY not in proc.stdout + proc.stderr


def test_measure_sends_the_chat_route_a_conversation_the_keyer_reads(standins):
    a, gw = standins("a"), standins("gw")
    result = si.measure([a.target], gw.target, concurrency=1, total=20, block=10, route="chat")
    assert result["errors"] == 0 and result["route"] == "chat" and result["gateway"]["n"] == 20
    assert a.stop()["counts"] == {"POST /v1/chat/completions 200": 20}
    body = json.loads(si.request_body("tiny-llama", "chat"))
    roles = [m["role"] for m in body["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert len(body["messages"][0]["content"]) >= 2000 and len(si.request_body(route="chat")) > 2500
    assert si.request_path("completions") == "/v1/completions"
    # Each thread is a conversation of its own: its first question differs, so the keyer spreads them.
    other = json.loads(si.request_body("tiny-llama", "chat", 1))["messages"]
    assert other[0] == body["messages"][0] and other[1] != body["messages"][1] and other[2:] == body["messages"][2:]


def test_wrong_key_is_an_error_not_a_sample(standins):
    a = standins("a")
    result = si.measure([a.target], a.target, concurrency=1, total=10, block=5, api_key="sk-wrong")
    assert result["errors"] == 20 and "HTTP 401" in result["error_examples"][0]


# --- the bench's side: commands, checks, output ---------------------------------------------

FLEET = gs.Fleet(gateway_host="sbx-cpu1", gateway=("10.213.7.11", 9000), router="http://127.0.0.1:19000",
                 unit="vllm-fleet-gateway.service", workers_file="/etc/vllm-fleet/gateway-workers.json",
                 register_script="/etc/vllm-fleet/gateway-register.py", model="tiny-llama",
                 backends={"sbx-cpu1": ("10.213.7.11", 8000), "sbx-cpu2": ("10.213.7.12", 8000),
                           "sbx-cpu3": ("10.213.7.13", 8000)})


def test_load_fleet_reads_the_sandbox_plan():
    fleet = gb.load_fleet(["sbx-cpu1", "sbx-cpu2", "sbx-cpu3"])
    assert fleet == FLEET
    assert fleet.standins() == {"sbx-cpu1": ("10.213.7.11", 8800), "sbx-cpu2": ("10.213.7.12", 8800),
                                "sbx-cpu3": ("10.213.7.13", 8800)}


def test_workers_json_is_what_the_registration_script_reads():
    workers = json.loads(gs.workers_json(FLEET.standins(), "tiny-llama"))
    assert {w["url"]: w["model_id"] for w in workers} == {
        "http://10.213.7.11:8800": "tiny-llama", "http://10.213.7.12:8800": "tiny-llama",
        "http://10.213.7.13:8800": "tiny-llama"}


# vllm-router 0.1.17's GET /workers, as it answered with two stand-ins registered.
ROUTER_LISTING = json.dumps({"workers": [
    {"id": "0b06", "url": "http://10.213.7.12:8800", "model_id": "tiny-llama", "worker_type": "regular",
     "is_healthy": True, "load": 0},
    {"id": "7706", "url": "http://10.213.7.11:8800", "model_id": "tiny-llama", "worker_type": "regular",
     "is_healthy": False, "load": 0}], "total": 2})


def test_router_workers_parses_the_listing():
    assert gs.router_workers(ROUTER_LISTING) == {"http://10.213.7.12:8800": ("tiny-llama", True),
                                                 "http://10.213.7.11:8800": ("tiny-llama", False)}


def test_commands_carry_no_key():
    cmd = gs.standin_command("10.213.7.12", 8800, "tiny-llama", "sbx-cpu2", "/run/x.log")
    assert si.API_KEY not in cmd and si.API_KEY not in gs.stop_command(1, "/run/x.log")
    assert cmd.endswith("& echo $!") and "--host 10.213.7.12 --port 8800" in cmd


def _run_json(backend="stand-in", other=0, errors=0, added_p50=0.5):
    served = {"direct": {f"{si.FINGERPRINT} sbx-cpu2": 10}, "gateway": {f"{si.FINGERPRINT} sbx-cpu3": 10}}
    if other:
        served["gateway"]["-"] = other
    summary = {"n": 10, "p50": 1.0, "p90": 1.5, "p99": 2.0, "mean": 1.1}
    return {"backend": backend, "client": "workstation", "concurrency": 1, "direct": summary,
            "gateway": dict(summary, p50=1.0 + added_p50),
            "added": {"p50": added_p50, "p99": 0.7, "paired_p50": 0.4, "paired_p10": 0.1, "paired_p90": 0.9,
                      "pairs": 3},
            "errors": errors, "error_examples": ["x: HTTP 502"] if errors else [], "served_by": served}


def test_judge_and_table():
    ok = gb.judge(_run_json(), "stand-in")
    assert ok["target_met"] and ok["valid"] and ok["answered_by_other_than_stand_ins"] == 0
    lines = gb.table_rows(ok)
    assert len(lines) == 3 and "<= 2 ms at p50: met" in lines[2] and "paired p50 0.40 [0.10, 0.90]" in lines[2]
    slow = gb.judge(_run_json(added_p50=2.5), "stand-in")
    assert not slow["target_met"] and "NOT met" in gb.table_rows(slow)[2]
    stray = gb.judge(_run_json(other=4), "stand-in")
    assert not stray["valid"] and "INVALID: 4 answers not from a stand-in" in gb.table_rows(stray)[2]
    real = gb.judge(_run_json("vllm", other=4), "vllm")
    assert real["valid"] and "answered_by_other_than_stand_ins" not in real
    assert not gb.judge(_run_json(errors=2), "stand-in")["valid"]


def test_parse_args_defaults_and_choices():
    args = gb.parse_args([])
    assert (args.backends, args.clients, args.concurrencies, args.requests) == (
        ["stand-in"], ["workstation", "gateway-host"], [1, 16], None)
    assert (args.policies, args.rounds, args.route) == ([None], 1, "completions")
    args = gb.parse_args(["--policy", "round_robin, prefix", "--rounds", "2", "--route", "chat"])
    assert (args.policies, args.rounds, args.route) == (["round_robin", "prefix"], 2, "chat")
    for bad in (["--policy", "kv_aware"], ["--policy", "prefix,prefix"], ["--rounds", "0"], ["--route", "x"]):
        with pytest.raises(SystemExit):
            gb.parse_args(bad)
    args = gb.parse_args(["--backend", "both", "--client", "workstation", "--concurrency", "4", "--requests", "9"])
    assert (args.backends, args.clients, args.concurrencies, args.requests) == (
        ["stand-in", "vllm"], ["workstation"], [4], 9)
    with pytest.raises(SystemExit):
        gb.parse_args(["--concurrency", "0"])


def _policy_run(policy, paired, concurrency=1, client="gateway-host", valid=True):
    return {"backend": "stand-in", "client": client, "concurrency": concurrency, "policy": policy,
            "valid": valid, "added": {"paired_p50": paired}}


def test_routing_costs_are_each_policys_median_minus_round_robins():
    runs = [_policy_run("round_robin", 0.40), _policy_run("prefix", 0.55), _policy_run("round_robin", 0.44),
            _policy_run("prefix", 0.65), _policy_run("prefix", 9.0, valid=False),  # an invalid run: left out
            _policy_run("round_robin", 0.5, concurrency=16), _policy_run("prefix", 1.3, concurrency=16)]
    costs = gb.routing_costs(runs)
    assert [(c["concurrency"], c["policy"], c["rounds"]) for c in costs] == [(1, "prefix", 2), (16, "prefix", 1)]
    one, sixteen = costs
    assert one["added_p50"] == pytest.approx(0.60) and one["round_robin_added_p50"] == pytest.approx(0.42)
    assert one["routing_cost_p50"] == pytest.approx(0.18) and one["target_met"] is True
    assert sixteen["routing_cost_p50"] == pytest.approx(0.8) and sixteen["target_met"] is None  # judged at 1
    assert gb.routing_costs([_policy_run("round_robin", 0.4), _policy_run("prefix", 1.0)])[0]["target_met"] is False
    assert gb.routing_costs([_policy_run("prefix", 0.5)]) == []  # nothing to compare with
    rows = gb.cost_rows(costs)
    assert "0.18" in rows[1] and "<= 0.5 ms: met" in rows[1] and "met" not in rows[2]


class FakeSandbox:
    """Answers each command with the first canned reply whose key it contains; records the commands."""

    def __init__(self, replies: list[tuple[str, int, str, str]]) -> None:
        self.replies, self.commands = replies, []

    def run(self, host, command, timeout=120, check=False):
        self.commands.append((host, command))
        for key, rc, out, err in self.replies:
            if key in command:
                return subprocess.CompletedProcess(command, rc, out, err)
        return subprocess.CompletedProcess(command, 0, "", "")


DEPLOYED = json.dumps([{"url": "http://10.213.7.11:8000", "model_id": "tiny-llama"},
                       {"url": "http://10.213.7.21:8000", "model_id": "tiny-llama"}])
DEPLOYED_LISTING = json.dumps({"workers": [{"url": "http://10.213.7.11:8000", "model_id": "tiny-llama"},
                                           {"url": "http://10.213.7.21:8000", "model_id": "tiny-llama",
                                            "is_healthy": False}]})


def test_restore_reloads_the_gateway_unit_and_checks_the_workers():
    fake = FakeSandbox([("cat /etc/vllm-fleet/gateway-workers.json", 0, f"{DEPLOYED}\n@@\n{DEPLOYED_LISTING}", "")])
    s = gs.StandIns(fake, FLEET, log=lambda line: None)
    s.restore()
    assert fake.commands == []  # nothing swapped: nothing to restore
    s.swapped = True
    s.restore()
    assert fake.commands[0] == ("sbx-cpu1", "systemctl reload vllm-fleet-gateway.service")
    assert s.report["restored"]["by"] == "systemctl reload vllm-fleet-gateway.service" and not s.swapped


def test_restore_falls_back_to_a_restart():
    class Fake(FakeSandbox):
        def run(self, host, command, timeout=120, check=False):
            self.commands.append((host, command))
            restarted = any("restart" in c for _h, c in self.commands)
            listing = DEPLOYED_LISTING if restarted else ROUTER_LISTING  # the reload left the stand-ins
            out = f"{DEPLOYED}\n@@\n{listing}" if command.startswith("cat ") else ""
            return subprocess.CompletedProcess(command, 0, out, "")

    fake, lines = Fake([]), []
    s = gs.StandIns(fake, FLEET, log=lines.append)
    s.swapped = True
    s.restore()
    assert [c for _h, c in fake.commands if c.startswith("systemctl")] == [
        "systemctl reload vllm-fleet-gateway.service", "systemctl restart vllm-fleet-gateway.service"]
    assert s.report["restored"]["by"] == "systemctl restart vllm-fleet-gateway.service"
    assert "not restored by reload" in lines[0]


def test_route_to_standins_refuses_a_router_that_kept_other_workers(monkeypatch):
    monkeypatch.setattr(gs, "push", lambda *args: None)
    listing = json.dumps({"workers": [{"url": f"http://{a}:{p}", "model_id": "tiny-llama", "is_healthy": True}
                                      for a, p in FLEET.standins().values()]})
    fake = FakeSandbox([("gateway-register.py", 0, "3 backend(s) registered", ""), ("/workers", 0, listing, "")])
    s = gs.StandIns(fake, FLEET, log=lambda line: None)
    s.route_to_standins()
    assert s.swapped
    assert fake.commands[0] == ("sbx-cpu1", "python3 -I /etc/vllm-fleet/gateway-register.py http://127.0.0.1:19000 "
                                            "/run/vllm-fleet-bench/standin-workers.json 30")
    fake = FakeSandbox([("/workers", 0, ROUTER_LISTING, "")])
    s = gs.StandIns(fake, FLEET, log=lambda line: None)
    with pytest.raises(gs.BenchError, match="not the healthy stand-ins"):
        s.route_to_standins()
    assert s.swapped  # so the teardown restores the router


class LocalSandbox:
    """Runs the bench's host commands on this machine (bash), as root would run them on a host."""

    def run(self, host, command, timeout=120, check=False):
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def python3_is_this_interpreter(tmp_path_factory, monkeypatch):
    """`python3` on PATH runs this interpreter, whatever its own name: the bench's host commands run
    `python3`, as a host's shell would find it."""
    bin_dir = tmp_path_factory.mktemp("python3-bin")
    wrapper = bin_dir / "python3"
    wrapper.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")


def test_standins_start_and_stop_by_pid_with_the_hosts_commands(tmp_path, monkeypatch, python3_is_this_interpreter):
    monkeypatch.setattr(gs, "REMOTE_DIR", str(tmp_path))
    monkeypatch.setattr(gs, "REMOTE_SCRIPT", str(BENCH / "gateway_standin.py"))
    monkeypatch.setattr(gs, "STANDIN_PORT", free_port())
    fleet = gs.Fleet(gateway_host="h1", gateway=("127.0.0.1", 1), router="http://127.0.0.1:1", unit="u",
                     workers_file="w", register_script="r", model="tiny-llama",
                     backends={"h1": ("127.0.0.1", 8000), "h2": ("127.0.0.2", 8000)})
    s = gs.StandIns(LocalSandbox(), fleet, log=lambda line: None)
    try:
        s.start()
        pids = dict(s.pids)
        assert set(pids) == {"h1", "h2"}
        result = si.measure([fleet.standins()["h1"]], fleet.standins()["h2"], 1, 10, block=5)
        assert result["errors"] == 0
        assert result["served_by"]["gateway"] == {f"{si.FINGERPRINT} h2": 10}
    finally:
        s.stop()
    for host, pid in pids.items():
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
        report = s.report["stand_ins"][host]
        assert report["pid"] == pid and not report["killed"]
        assert report["counts"]["POST /v1/completions 200"] == 10
    assert not list(tmp_path.glob("standin-*"))  # the logs are gone
    assert s.pids == {}


def test_stop_command_leaves_a_pid_that_is_no_stand_in_alone():
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        proc = subprocess.run(["bash", "-c", gs.stop_command(sleeper.pid, "/nonexistent.log")],
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0 and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_measure_on_runs_the_client_as_a_process_here_and_on_a_host(standins, monkeypatch,
                                                                   python3_is_this_interpreter):
    a, gw = standins("a"), standins("gw")
    here = gb.measure_on(None, None, [a.target], gw.target, 2, 40, 8, "tiny-llama")
    assert here["direct"]["n"] == 40 and here["gateway"]["n"] == 40 and here["errors"] == 0
    monkeypatch.setattr(gb, "REMOTE_SCRIPT", str(BENCH / "gateway_standin.py"))
    there = gb.measure_on(LocalSandbox(), "h1", [a.target], gw.target, 1, 20, 0, "tiny-llama")
    assert there["gateway"]["n"] == 20 and there["served_by"]["gateway"] == {f"{si.FINGERPRINT} gw": 20}
    # The arguments are quoted for the host's shell: this is one (unknown) model name, not a command.
    odd = gb.measure_on(LocalSandbox(), "h1", [a.target], gw.target, 1, 20, 0, "tiny-llama'; exit 3; '")
    assert odd["errors"] == 40 and "HTTP 404" in odd["error_examples"][0]
    monkeypatch.setattr(gb, "REMOTE_SCRIPT", "/nonexistent/gateway_standin.py")
    with pytest.raises(gs.BenchError, match="the client on the gateway host failed"):
        gb.measure_on(LocalSandbox(), "h1", [a.target], gw.target, 1, 20, 0, "tiny-llama")
