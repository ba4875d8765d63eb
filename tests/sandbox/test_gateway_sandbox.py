"""The fleet gateway on the sandbox (vllm-router behind sbx-cpu1's front), with real vLLM backends
and the official `openai` client: routing by model, the key at the edge, a dead backend taken out.
(The rolling update under client load through the gateway is in test_rollout_sandbox.py.)

Two served names across the three CPU hosts: sbx-cpu3 serves "tiny-solo", sbx-cpu1 (the gateway's
own host) and sbx-cpu2 both serve "tiny-llama" (the gateway spreads conversations over them). The name moves to sbx-cpu3
because the modules after this one restart sbx-cpu3's vLLM anyway, while sbx-cpu1 keeps the
inventory's own name to the end of the genuine vLLM's phase (tests/conftest.py: FLEET_ORDER). Traffic
goes only to the sandbox hosts.
"""

from __future__ import annotations

import json
import re
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
        for i in range(20):  # prompts of their own: the default policy keys each by its prompt
            reply = client.completions.create(model=name, prompt=f"Hello {i}", max_tokens=1)
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
    """A backend whose front stops answering (its host's nginx stopped: connections refused, as from a
    host that went down) gets no more requests within seconds; a name whose only backend is gone fails
    fast. (A backend whose vLLM dies while its front answers 502 is test_killing_an_instance_....)
    The fronts start again at once, so the test does not wait for a vLLM to start."""
    client = _client(timeout=30)
    front = "vllm-fleet-front.service"
    sandbox.run("sbx-cpu2", f"systemctl stop {front}", check=True)
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
        sandbox.run("sbx-cpu3", f"systemctl stop {front}", check=True)
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
    finally:
        for host in ("sbx-cpu2", "sbx-cpu3"):
            sandbox.run(host, f"systemctl start {front}")
            assert sandbox.run(host, f"systemctl is-active {front} vllm-tiny.service").stdout.split() == ["active"] * 2
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


# --- vllm_gateway_policy = "prefix": routing by the prompt's leading messages -----------------------------

#: vllm-router 0.1.17's INFO line for each request consistent_hash routes; a header's key is logged as
#: "header:x-session-id:<value>".
ROUTED = re.compile(r"Consistent hash routing: key='(?:header:x-session-id:)?([^']*)' -> worker='([^']*)'")
BACKEND_HOST = {f"http://{address}:8000": name for name, address in CPU_HOSTS.items()}
SYSTEM = ("You are the support assistant of a small bakery. Answer in one short sentence, politely, and never "
          "invent prices; when unsure, ask the customer to call the shop. ") * 2


@pytest.fixture(scope="module")
def prefix_policy(two_names, sandbox):
    """The module's fleet, whose gateway runs the default policy, "prefix": the deploy installed Debian's
    njs module from the sandbox's mirror, wrote the keyer into the front and runs the router on
    consistent_hash."""
    unit = sandbox.run("sbx-cpu1", "systemctl cat vllm-fleet-gateway.service").stdout
    assert "--policy consistent_hash " in unit
    front = sandbox.run("sbx-cpu1", "cat /etc/vllm-fleet/front-prefix-key.js").stdout
    assert "function prefixKey(" in front, front[:500]
    _wait_all_healthy(sandbox)
    return two_names


def _routed(sandbox) -> list[tuple[str, str]]:
    """(key, backend host) of each request vllm-router routed by a key, in order (its journal:
    consistent_hash logs each request's key at INFO)."""
    text = sandbox.run("sbx-cpu1", "journalctl -u vllm-fleet-gateway.service --no-pager -o cat").stdout
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    return [(key, BACKEND_HOST.get(worker, worker)) for key, worker in ROUTED.findall(text)]


def _conversation(first: str, turns: int) -> list[dict]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
    for n in range(1, turns):
        messages += [{"role": "assistant", "content": f"Answer {n}."}, {"role": "user", "content": f"And question {n}?"}]
    return messages


def _prefix_hits(sandbox) -> dict[str, float]:
    """vllm:prefix_cache_hits_total of each tiny-llama host's vLLM."""
    out = {}
    for host in ("sbx-cpu1", "sbx-cpu2"):
        text = sandbox.run(host, "curl -s 127.0.0.1:18000/metrics").stdout
        out[host] = sum(float(ln.split()[-1]) for ln in text.splitlines() if ln.startswith("vllm:prefix_cache_hits_total"))
    return out


def test_prefix_policy_keeps_a_conversation_on_one_instance_and_spreads_conversations(prefix_policy, sandbox):
    """Without any session header: every turn of one conversation (same system prompt and first message,
    a growing history) is routed with one key to one instance, whose prefix cache then hits; other
    conversations over the same system prompt get keys of their own and land on both instances. A
    client's own X-Session-ID reaches the router as it sent it."""
    client = _client()
    before = len(_routed(sandbox))
    hits_before = _prefix_hits(sandbox)
    for turns in range(1, 6):
        client.chat.completions.create(model=POOL, max_tokens=2, messages=_conversation("Do you bake rye bread?", turns))
    conversation = _routed(sandbox)[before:]
    assert len(conversation) == 5 and len(set(conversation)) == 1, conversation
    (key, host), = set(conversation)
    assert key.startswith("p-") and len(key) == 34
    hits = {h: n - hits_before[h] for h, n in _prefix_hits(sandbox).items()}
    print(f"one conversation, 5 turns: key {key} -> {host}; prefix cache hits since: {hits}")
    assert hits[host] > 0
    before = len(_routed(sandbox))
    for n in range(12):
        client.chat.completions.create(model=POOL, max_tokens=2, messages=_conversation(f"Question number {n}?", 1))
    client.with_options(default_headers={"X-Session-ID": "bakery-customer-7"}).chat.completions.create(
        model=POOL, max_tokens=2, messages=_conversation("Do you bake rye bread?", 1))
    routed = _routed(sandbox)[before:]
    print(f"12 conversations over one system prompt: {sorted(h for _, h in routed[:12])}")
    assert len(routed) == 13 and len({k for k, _ in routed[:12]}) == 12
    assert {h for _, h in routed[:12]} == {"sbx-cpu1", "sbx-cpu2"}
    assert routed[12][0] == "bakery-customer-7"


def test_killing_an_instance_under_prefix_routed_traffic_fails_only_requests_it_held(prefix_policy, sandbox):
    """Four clients (the official openai client, no retries), each a conversation of its own, two of
    them keyed to sbx-cpu2, one of each pair streaming: sbx-cpu2's vLLM is killed (SIGKILL) mid-traffic.
    No more requests fail than were in flight to sbx-cpu2 at the kill (a count: one sent in the moment
    after the kill may be among them), all of them its conversations', and every request sent a few
    seconds later succeeds, the conversations of sbx-cpu2 on sbx-cpu1.
    systemd starts the killed vLLM again (Restart=always); the test waits until the router has it back."""
    client = _client(timeout=60)
    # Pick two conversations the ring puts on each instance (their first turn, routed as any other).
    before = len(_routed(sandbox))
    candidates = [f"Customer {n}: do you deliver?" for n in range(16)]
    for first in candidates:
        client.chat.completions.create(model=POOL, max_tokens=2, messages=_conversation(first, 1))
    placed = dict(zip(candidates, [h for _, h in _routed(sandbox)[before:]], strict=True))
    chosen = ([c for c in candidates if placed[c] == "sbx-cpu2"][:2] + [c for c in candidates if placed[c] == "sbx-cpu1"][:2])
    assert len(chosen) == 4, placed
    records: list[tuple[str, float, float, str | None]] = []  # (first message, start, end, error)
    stop = threading.Event()

    def converse(first: str, stream: bool) -> None:
        turns = 1
        while not stop.is_set():
            start = time.monotonic()
            try:
                if stream:
                    # Long enough (128 tokens, EOS ignored) that a stream is likely running at the kill.
                    chunks = client.chat.completions.create(model=POOL, max_tokens=128, stream=True,
                                                            extra_body={"ignore_eos": True},
                                                            messages=_conversation(first, turns))
                    assert list(chunks)
                else:
                    client.chat.completions.create(model=POOL, max_tokens=8, messages=_conversation(first, turns))
                error = None
            except Exception as exc:  # a stream cut mid-way is httpx's error, not openai's
                error = repr(exc)[:200]
            records.append((first, start, time.monotonic(), error))
            turns = turns % 6 + 1
    threads = [threading.Thread(target=converse, args=(c, i % 2 == 0)) for i, c in enumerate(chosen)]
    for t in threads:
        t.start()
    try:
        time.sleep(5)
        killed = time.monotonic()
        sandbox.run("sbx-cpu2", "systemctl kill --signal=KILL vllm-tiny.service", check=True)
        time.sleep(15)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=90)
    in_flight = [r for r in records if r[1] <= killed <= r[2]]
    in_flight_victim = [r for r in in_flight if placed[r[0]] == "sbx-cpu2"]
    failed = [r for r in records if r[3]]
    late = [r for r in records if r[1] > killed + 8]
    print(f"killed sbx-cpu2's vLLM under {len(threads)} prefix-routed clients: {len(records)} requests, "
          f"{len(in_flight)} in flight at the kill ({len(in_flight_victim)} to sbx-cpu2), {len(failed)} failed "
          f"({[round(r[1] - killed, 2) for r in failed]} s after the kill, by start: {[r[3][:60] for r in failed]}), "
          f"{len(late)} started 8 s or more after it, {sum(1 for r in late if r[3])} of them failed")
    try:
        assert all(placed[r[0]] == "sbx-cpu2" for r in failed), failed
        assert not [r for r in late if r[3]], late
        assert late and {placed[r[0]] for r in late} == {"sbx-cpu1", "sbx-cpu2"}
        assert in_flight_victim and len(failed) <= len(in_flight_victim), (failed, in_flight_victim)
    finally:
        deadline = time.monotonic() + 300
        while sandbox.run("sbx-cpu2", "systemctl is-active vllm-tiny.service").stdout.strip() != "active":
            assert time.monotonic() < deadline, "sbx-cpu2's vLLM did not come back"
            time.sleep(2)
        _wait_all_healthy(sandbox, timeout=120)
