"""The fleet gateway on the sandbox (vllm-router behind sbx-cpu1's front), with real vLLM backends
and the official `openai` client: routing by model, the key at the edge, a dead backend taken out.
(The rolling update under client load through the gateway is in test_rollout_sandbox.py.)

Two served names across the three CPU hosts: sbx-cpu3 serves "tiny-solo", sbx-cpu1 (the gateway's
own host) and sbx-cpu2 both serve "tiny-llama" (the gateway balances them). The name moves to sbx-cpu3
because the modules after this one restart sbx-cpu3's vLLM anyway, while sbx-cpu1 keeps the
inventory's own name to the end of the genuine vLLM's phase (tests/conftest.py: FLEET_ORDER). Traffic
goes only to the sandbox hosts.
"""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest

from support.fleet_helpers import API_KEY, CPU_HOSTS, post_json, pyinfra, variant_inventory, vllm_fleet

GATEWAY = f"http://{CPU_HOSTS['sbx-cpu1']}:9000/v1"
SOLO, POOL = "tiny-solo", "tiny-llama"


def _client(key: str = API_KEY, timeout: float = 60) -> openai.OpenAI:
    # trust_env=False: a proxy from this machine's environment must not carry sandbox traffic.
    return openai.OpenAI(base_url=GATEWAY, api_key=key, max_retries=0, timeout=timeout,
                         http_client=openai.DefaultHttpx2Client(trust_env=False))


def _successes(sandbox) -> dict[str, float]:
    """vllm:request_success_total of each host's vLLM (read on the host, from its loopback port)."""
    out = {}
    for host in CPU_HOSTS:
        text = sandbox.run(host, "curl -s 127.0.0.1:18000/metrics").stdout
        out[host] = sum(float(ln.split()[-1]) for ln in text.splitlines()
                        if ln.startswith("vllm:request_success_total"))
    return out


@pytest.fixture(scope="module")
def two_names(sandbox, deploy_env, tmp_path_factory):
    inventory = variant_inventory(tmp_path_factory.mktemp("gw"), instance={"sbx-cpu3": {"served_model_name": SOLO}})
    result = pyinfra(deploy_env, "--limit", "cpu_hosts", inventory=inventory)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "verified the gateway: 3 of 3 backend(s) registered, key required, models tiny-llama, tiny-solo" in out
    _wait_all_healthy(sandbox)
    return inventory


def _wait_all_healthy(sandbox, timeout: float = 60) -> None:
    """Until vllm-router's health checks have passed on every backend (a router just (re)started, or
    a backend just back, is checked every 2 s)."""
    deadline, workers = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        listing = sandbox.run("sbx-cpu1", "curl -s 127.0.0.1:19000/workers").stdout
        workers = json.loads(listing or "{}").get("workers", [])
        if len(workers) == 3 and all(w["is_healthy"] for w in workers):
            return
        time.sleep(1)
    raise AssertionError(f"the router's backends did not all become healthy: {workers}")


def test_openai_client_lists_each_name_once_and_requests_reach_only_their_instances(two_names, sandbox):
    client = _client()
    assert sorted(m.id for m in client.models.list()) == [POOL, SOLO]
    before = _successes(sandbox)
    for name in (SOLO, POOL):
        for _ in range(20):
            reply = client.completions.create(model=name, prompt="Hello", max_tokens=1)
            assert reply.model == name
    after = _successes(sandbox)
    delta = {h: after[h] - before[h] for h in CPU_HOSTS}
    print(f"requests per backend (20 per name): {delta}")
    assert delta["sbx-cpu3"] == 20  # tiny-solo only on its one instance
    assert delta["sbx-cpu1"] + delta["sbx-cpu2"] == 20  # tiny-llama only on its two...
    assert delta["sbx-cpu1"] > 0 and delta["sbx-cpu2"] > 0  # ...balanced across both


def test_a_wrong_or_missing_key_is_refused_at_the_gateway(two_names):
    for wrong in ("sk-wrong", API_KEY + "x", API_KEY.upper(), API_KEY[:-1]):
        with pytest.raises(openai.AuthenticationError):
            _client(wrong).models.list()
    status, _body = post_json(f"{GATEWAY}/completions", {"model": POOL, "prompt": "hi", "max_tokens": 1}, timeout=30)
    assert status == 401
    assert _client().completions.create(model=POOL, prompt="Hi", max_tokens=1).choices


def test_a_stopped_backend_is_taken_out_and_a_name_without_backends_fails_fast(two_names, sandbox, deploy_env):
    client = _client(timeout=30)
    sandbox.run("sbx-cpu2", "systemctl stop vllm-tiny.service", check=True)
    stopped, late_failures, early_failures, sent = time.monotonic(), [], 0, 0
    try:
        while time.monotonic() - stopped < 10:
            sent += 1
            try:
                client.completions.create(model=POOL, prompt="Hi", max_tokens=1)
            except openai.APIError as exc:
                if time.monotonic() - stopped > 5:
                    late_failures.append(repr(exc))
                else:
                    early_failures += 1
            time.sleep(0.1)
        print(f"sbx-cpu2 stopped: {sent} requests for {POOL} in 10 s, {early_failures} failed in the first "
              f"5 s, {len(late_failures)} after")
        assert not late_failures, late_failures[:3]
        # tiny-solo's only backend stopped: an error status, fast, once the router has seen it go.
        sandbox.run("sbx-cpu3", "systemctl stop vllm-tiny.service", check=True)
        time.sleep(6)
        started = time.monotonic()
        status, body = post_json(f"{GATEWAY}/completions", {"model": SOLO, "prompt": "hi", "max_tokens": 1},
                             API_KEY, timeout=30)
        took = time.monotonic() - started
        print(f"{SOLO} with no healthy backend: {status} in {took:.3f} s: {body[:120]}")
        assert status >= 500 and took < 1.0
        shown = json.loads(vllm_fleet(deploy_env, "status", two_names, "--json").stdout)
        (gateway,) = shown["gateways"]
        health = {b["host"]: b["healthy"] for b in gateway["backends"]}
        assert gateway["url"] == GATEWAY and health == {"sbx-cpu1": True, "sbx-cpu2": False, "sbx-cpu3": False}
    finally:  # both at once; each start blocks until its vLLM is healthy (ExecStartPost)
        starts = [threading.Thread(target=sandbox.run, args=(h, "systemctl start vllm-tiny.service"))
                  for h in ("sbx-cpu2", "sbx-cpu3")]
        for t in starts:
            t.start()
        for t in starts:
            t.join()
        for host in ("sbx-cpu2", "sbx-cpu3"):
            assert sandbox.run(host, "systemctl is-active vllm-tiny.service").stdout.strip() == "active"
        _wait_all_healthy(sandbox)


def _raw(host: str, port: int, request: bytes) -> bytes:
    """One request as bytes on a socket to a sandbox address: the Host header is the test's own."""
    import socket

    with socket.create_connection((host, port), timeout=30) as conn:
        conn.sendall(request)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def test_the_clients_host_header_reaches_no_backend_and_no_redirect(two_names):
    """nginx's own redirect ("/v1" -> "/v1/") names a path only, whatever Host the client sent, and
    requests with a crafted Host are served as any other, by the gateway and by an instance. (The
    installed vLLM is not one of those a Host let past the key, so what the front sends upstream
    in its place is asserted on the rendered config: test_input_boundary.py.)"""
    address = CPU_HOSTS["sbx-cpu1"]
    redirect = _raw(address, 9000, b"GET /v1 HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n").decode()
    assert redirect.startswith("HTTP/1.1 301") and "\r\nLocation: /v1/\r\n" in redirect, redirect
    assert "evil" not in redirect
    for port in (9000, 8000):  # the gateway, and sbx-cpu1's own instance behind the same front
        body = json.dumps({"model": POOL, "prompt": "hi", "max_tokens": 1}).encode()
        answer = _raw(address, port, b"POST /v1/completions HTTP/1.1\r\nHost: a@b#c?\r\nConnection: close\r\n"
                      b"Content-Type: application/json\r\nAuthorization: Bearer " + API_KEY.encode() +
                      b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body).decode()
        assert answer.startswith("HTTP/1.1 200"), (port, answer[:500])


def test_nginx_reads_the_key_pattern_up_to_the_limit_the_deploy_enforces(two_names, sandbox):
    """NGINX_MAX_PARAMETER_BYTES measured with the gateway host's own nginx: the longest key the
    deploy accepts makes a key file `nginx -t` takes, one character more one it refuses."""
    from vllm_fleet import gateway

    longest = "k" * 4081
    assert gateway.key_length_problem(longest) is None and gateway.key_length_problem(longest + "k")
    results = {}
    for key in (longest, longest + "k"):
        conf = ("pid /tmp/vllm-fleet-keytest/nginx.pid; error_log stderr;\nevents {}\n"
                "http {\n    map $http_authorization $k {\n        default 0;\n"
                f"        {gateway.key_pattern(key)} 1;\n    }}\n}}\n")
        script = (f"mkdir -p /tmp/vllm-fleet-keytest && cat > /tmp/vllm-fleet-keytest/t.conf <<'EOF'\n{conf}EOF\n"
                  "/usr/sbin/nginx -t -q -e stderr -c /tmp/vllm-fleet-keytest/t.conf; echo rc=$?")
        results[len(key)] = sandbox.run("sbx-cpu1", script)
    sandbox.run("sbx-cpu1", "rm -rf /tmp/vllm-fleet-keytest")
    assert "rc=0" in results[4081].stdout, results[4081].stderr
    assert "rc=1" in results[4082].stdout and "too long parameter" in results[4082].stderr
