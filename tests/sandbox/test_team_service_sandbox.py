"""The fleet as a team shares it, on the sandbox's CPU hosts with the genuine vLLM: HTTPS on every
listener clients reach (the fleet CA's certificates), a key per client with its models and limit,
JSON access logs, a client revoked without a vLLM restart, and a streamed completion that a deploy's
restart lets finish; each service's secrets out of vLLM's reach. The official `openai` client trusts
only the file `vllm-fleet tls ca` prints.

Three clients: "alice" (every model), "limited" (6 requests a minute), "OnlyB" (only tiny-b; a name in
mixed case, which nginx would fold were it a map key). sbx-cpu1 is the gateway and serves tiny-llama
with sbx-cpu2; sbx-cpu3 serves the same model as tiny-b. sbx-cpu1 and sbx-cpu3 take /v1/ from the
gateway host only (the fleet's default); sbx-cpu2 opens its port to every client (vllm_direct_access),
where the instance-port tests reach it. Traffic goes only to the sandbox hosts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from support.fleet_helpers import CPU_HOSTS, ROLLOUT_END_INSTANCES, pyinfra, variant_inventory, vllm_fleet

GATEWAY = f"https://{CPU_HOSTS['sbx-cpu1']}:9000/v1"
INSTANCE = f"https://{CPU_HOSTS['sbx-cpu2']}:8000/v1"
CLOSED = f"https://{CPU_HOSTS['sbx-cpu3']}:8000/v1"  # tiny-b, from the gateway host only
KEYS = {"ALICE_KEY": "sk-alice-7f3a19d0c4e8", "LIMITED_KEY": "sk-limited-91c2b7e05a3f",
        "ONLYB_KEY": "sk-onlyb-44d0e6a1f92c"}
CLIENTS = {"alice": {"key_env": "ALICE_KEY"},
           "limited": {"key_env": "LIMITED_KEY", "requests_per_minute": 6},
           "OnlyB": {"key_env": "ONLYB_KEY", "models": ["tiny-b"]}}


def _inventory(tmp_path, clients=CLIENTS, cpu2_instance=None) -> str:
    data = {"vllm_tls": True, "vllm_api_clients": clients, "vllm_direct_access": False}
    return variant_inventory(tmp_path, host_data={h: dict(data, vllm_direct_access=h == "sbx-cpu2") for h in CPU_HOSTS},
                             instance={"sbx-cpu3": {"served_model_name": "tiny-b"},
                                       # as the modules before left it (no restart), unless a test changes it
                                       "sbx-cpu2": cpu2_instance or ROLLOUT_END_INSTANCES["sbx-cpu2"]})


def _client(base: str, key: str, ca: str) -> openai.OpenAI:
    # verify=ca: only the fleet CA's file is trusted; trust_env=False: no proxy from this machine.
    return openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpx2Client(verify=ca, trust_env=False))


def _from_gateway_host(sandbox, ca: str, url: str, key: str, model: str | None = None) -> tuple[int, dict]:
    """A request from inside the gateway host's network namespace (its address: what the closed
    instance ports let in), by this machine's Python: GET url, or a 1-token chat for `model`. The
    key goes in on stdin, never on a command line. (status, JSON body)."""
    script = """
import json, ssl, sys, urllib.error, urllib.request
p = json.load(sys.stdin)
body = json.dumps({"model": p["model"], "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}).encode()
req = urllib.request.Request(p["url"], data=body if p["model"] else None,
                             headers={"Authorization": "Bearer " + p["key"], "Content-Type": "application/json"})
ctx = ssl.create_default_context(cafile=p["ca"])
try:
    with urllib.request.urlopen(req, timeout=60, context=ctx) as resp:
        print(json.dumps([resp.status, json.load(resp)]))
except urllib.error.HTTPError as exc:
    print(json.dumps([exc.code, json.load(exc)]))
"""
    done = subprocess.run(["ip", "netns", "exec", sandbox.host("sbx-cpu1").netns, sys.executable, "-I", "-c", script],
                          input=json.dumps({"url": url, "key": key, "model": model, "ca": ca}),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    status, body = json.loads(done.stdout)
    return status, body


def _main_pids(sandbox) -> dict[str, str]:
    return {h: sandbox.run(h, "systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
            for h in CPU_HOSTS}


@pytest.fixture(scope="module")
def team(sandbox, deploy_env, tmp_path_factory):
    env = dict(deploy_env, **KEYS)
    inventory = _inventory(tmp_path_factory.mktemp("team"))
    result = pyinfra(env, "--limit", "cpu_hosts", inventory=inventory)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "verified the gateway: 3 of 3 backend(s) registered" in out
    for key in KEYS.values():  # no client key in what a deploy prints
        assert key not in out
    ca = vllm_fleet(env, "tls", "ca", inventory).stdout.strip()
    assert ca.endswith("/tls/ca.pem")
    return {"env": env, "inventory": inventory, "ca": ca}


@pytest.mark.parametrize("base, kind", [(GATEWAY, "gateway"), (INSTANCE, "instance")], ids=["gateway", "instance"])
def test_openai_client_over_https_models_chat_and_stream(team, base, kind):
    client = _client(base, KEYS["ALICE_KEY"], team["ca"])
    # The gateway lists every served name; an instance's port its own.
    assert sorted(m.id for m in client.models.list()) == (["tiny-b", "tiny-llama"] if kind == "gateway" else ["tiny-llama"])
    reply = client.chat.completions.create(model="tiny-llama", max_tokens=4,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].finish_reason in ("length", "stop")
    chunks = list(client.chat.completions.create(model="tiny-llama", max_tokens=4, stream=True,
                                                 messages=[{"role": "user", "content": "hi"}]))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")


@pytest.mark.parametrize("base", [GATEWAY, INSTANCE], ids=["gateway", "instance"])
def test_no_key_401_wrong_model_403_over_the_limit_429(team, base):
    ca = team["ca"]
    with pytest.raises(openai.AuthenticationError):
        _client(base, "sk-nobody", ca).models.list()
    with pytest.raises(openai.PermissionDeniedError) as denied:
        _client(base, KEYS["ONLYB_KEY"], ca).chat.completions.create(
            model="tiny-llama", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    # The client by its name as written (never folded onto another's), refused before vLLM.
    assert denied.value.body["code"] == "model_not_allowed" and "client OnlyB " in denied.value.body["message"]
    limited, passed, start = _client(base, KEYS["LIMITED_KEY"], ca), 0, time.monotonic()
    with pytest.raises(openai.RateLimitError) as over:
        for _ in range(30):
            limited.models.list()
            passed += 1
    # nginx's limit_req: the minute's 6 at once, then one more each 10 s that has passed.
    assert 6 <= passed <= 6 + int((time.monotonic() - start) // 10)
    assert over.value.response.headers["retry-after"] == "10"


def test_the_gateway_lists_a_client_only_its_models_and_routes_it_there(team):
    client = _client(GATEWAY, KEYS["ONLYB_KEY"], team["ca"])
    assert [m.id for m in client.models.list()] == ["tiny-b"]
    reply = client.chat.completions.create(model="tiny-b", max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    assert reply.model == "tiny-b"
    assert sorted(m.id for m in _client(GATEWAY, KEYS["ALICE_KEY"], team["ca"]).models.list()) == ["tiny-b", "tiny-llama"]


def test_a_closed_instance_port_takes_v1_from_the_gateway_host_only(team, sandbox):
    """sbx-cpu3's port takes /v1/ from the gateway host alone: from this machine, even a valid key gets 403
    naming the gateway (so `limited`, over its limit at the gateway, cannot get its minute again
    there), while from the gateway host the front checks the client as ever: OnlyB gets tiny-b, and
    403 for tiny-llama on sbx-cpu1's own closed port."""
    ca = team["ca"]
    for key in (KEYS["ALICE_KEY"], KEYS["LIMITED_KEY"]):
        with pytest.raises(openai.PermissionDeniedError) as denied:
            _client(CLOSED, key, ca).models.list()
        assert denied.value.body["code"] == "gateway_only" and GATEWAY in denied.value.body["message"]
    status, body = _from_gateway_host(sandbox, ca, f"{CLOSED}/chat/completions", KEYS["ONLYB_KEY"], "tiny-b")
    assert status == 200 and body["model"] == "tiny-b"
    own = f"https://{CPU_HOSTS['sbx-cpu1']}:8000/v1/chat/completions"
    status, body = _from_gateway_host(sandbox, ca, own, KEYS["ONLYB_KEY"], "tiny-llama")
    assert status == 403 and body["error"]["code"] == "model_not_allowed" and "OnlyB" in body["error"]["message"]
    status, _body = _from_gateway_host(sandbox, ca, f"{CLOSED}/models", "sk-nobody")
    assert status == 401


def test_vllms_user_cannot_read_the_fronts_secrets(team, sandbox):
    """The clients' keys, the metrics token and the TLS key are the front's user's alone: vLLM's user
    cannot read them, and inside vLLM's own unit (where a model's code runs) they are not even there."""
    host = "sbx-cpu2"
    for path in ("/etc/vllm-fleet/front-secrets/keys.conf", "/etc/vllm-fleet/front-secrets/tls-key.pem"):
        assert sandbox.run(host, f"runuser -u vllm-front -- test -r {path}").returncode == 0, path
        denied = sandbox.run(host, f"runuser -u vllm -- cat {path}")
        assert denied.returncode != 0 and "Permission denied" in denied.stderr, (path, denied.stdout[:40])
        assert sandbox.run(host, f"runuser -u vllm-router -- cat {path}").returncode != 0, path
    pid = sandbox.run(host, "systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
    # Inside vLLM's unit (its mount namespace) the directory is an empty one no user may enter; root
    # sees it empty, while outside it holds the keys file.
    inside = sandbox.run(host, f"nsenter -t {pid} -m -- runuser -u vllm -- ls /etc/vllm-fleet/front-secrets")
    assert inside.returncode != 0 and "Permission denied" in inside.stderr, inside
    assert sandbox.run(host, f"nsenter -t {pid} -m -- ls -A /etc/vllm-fleet/front-secrets").stdout == ""
    assert "keys.conf" in sandbox.run(host, "ls -A /etc/vllm-fleet/front-secrets").stdout
    # Each service as its own user (ps cuts names past 8 characters unless told the width).
    front = sandbox.run(host, "systemctl show -p MainPID --value vllm-fleet-front.service").stdout.strip()
    assert set(sandbox.run(host, f"ps -o user:32= -p {front} --ppid {front}").stdout.split()) == {"vllm-front"}
    assert set(sandbox.run(host, f"ps -o user:32= -p {pid}").stdout.split()) == {"vllm"}


@pytest.mark.parametrize("port", [8000, 9000])
def test_plain_http_to_a_tls_port_is_not_served(team, port):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    request = urllib.request.Request(f"http://{CPU_HOSTS['sbx-cpu1']}:{port}/v1/models",
                                     headers={"Authorization": f"Bearer {KEYS['ALICE_KEY']}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        opener.open(request, timeout=10)
    assert refused.value.code == 400 and b"HTTPS only" in refused.value.read()


def test_a_certificate_from_another_ca_is_refused(team, tmp_path):
    from vllm_fleet import tls

    other = tls.ensure_ca(tmp_path / "other-ca")
    with pytest.raises(openai.APIConnectionError):
        _client(GATEWAY, KEYS["ALICE_KEY"], str(other)).models.list()


def test_access_log_names_the_client_never_the_key(team, sandbox):
    since = int(time.time()) - 1
    _client(INSTANCE, KEYS["ALICE_KEY"], team["ca"]).models.list()
    deadline, lines = time.monotonic() + 10, []
    while time.monotonic() < deadline and not lines:
        text = sandbox.run("sbx-cpu2", f"journalctl -t vllm_fleet_access --since @{since} -o cat").stdout
        lines = [json.loads(ln) for ln in text.splitlines() if ln.startswith("{")]
        time.sleep(0.5)
    mine = [ln for ln in lines if ln["client"] == "alice" and ln["path"] == "/v1/models"]
    assert mine and mine[-1]["status"] == 200 and mine[-1]["model"] == "tiny-llama"
    assert {"time", "method", "duration_s", "bytes_sent"} <= set(mine[-1])
    everything = sandbox.run("sbx-cpu2", "journalctl -u vllm-fleet-front.service -o cat").stdout
    assert not any(key in everything for key in KEYS.values())


def test_status_counts_each_clients_requests_of_the_last_hour(team):
    """After the tests above: alice's answered requests and limited's 429s on sbx-cpu2's front."""
    report = json.loads(vllm_fleet(team["env"], "status", team["inventory"], "--json", "--limit", "sbx-cpu2").stdout)
    front = report["hosts"][0]["front"]
    assert front["tls"] is True
    counts = front["requests_last_hour"]
    assert counts["alice"]["2xx"] >= 3 and counts["limited"]["4xx"] >= 1 and counts["OnlyB"]["4xx"] >= 1
    assert not any(key in json.dumps(report) for key in KEYS.values())


def _usage(team) -> dict:
    """`vllm-fleet status --usage --json`: every instance's counters since its vLLM started (this
    fleet has no Prometheus), summed, with vLLM's own."""
    done = vllm_fleet(team["env"], "status", team["inventory"], "--usage", "--json")
    return json.loads(done.stdout)["usage"]


def _by_client(usage: dict) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for row in usage["clients"]:
        mine = out.setdefault(row["client"], {"prompt": 0, "cached": 0, "completion": 0, "requests": 0})
        for kind, key in (("prompt", "prompt_tokens"), ("cached", "cached_prompt_tokens"),
                          ("completion", "completion_tokens"), ("requests", "requests")):
            mine[kind] += row[key]
    return out


def _within(counted: int, own: int, tolerance: float = 0.001) -> bool:
    return abs(counted - own) <= tolerance * max(own, 1)


def test_each_clients_tokens_are_counted_under_its_name_and_sum_to_vllms_own(team):
    """alice (through the gateway and on sbx-cpu2's port) and OnlyB (tiny-b, through the gateway),
    each with chat and completions, streamed (without asking for usage: the fleet's vLLM adds it) and
    not, and a prompt repeated so that its prefix is cached. Each sends a forged X-Vllm-Fleet-Client
    naming the other: the fronts replace it, so every token lands under the sender's own name. Each
    client's counted tokens are exactly the usage its answers reported, and the clients' sums are
    vLLM's own vllm:prompt_tokens_total and vllm:generation_tokens_total (within 0.1 %), over this
    traffic and since each vLLM started."""
    ca, before = team["ca"], _usage(team)
    long_prompt = "Count the sheep in the field one by one, slowly, and tell me their names. " * 6
    received: dict[str, dict[str, int]] = {}

    def add(client: str, usage) -> None:
        mine = received.setdefault(client, {"prompt": 0, "cached": 0, "completion": 0, "requests": 0})
        details = getattr(usage, "prompt_tokens_details", None)
        mine["prompt"] += usage.prompt_tokens
        mine["cached"] += (details.cached_tokens or 0) if details else 0
        mine["completion"] += usage.completion_tokens
        mine["requests"] += 1

    plan = [("alice", KEYS["ALICE_KEY"], GATEWAY, "tiny-llama", "OnlyB"),
            ("alice", KEYS["ALICE_KEY"], INSTANCE, "tiny-llama", "OnlyB"),
            ("OnlyB", KEYS["ONLYB_KEY"], GATEWAY, "tiny-b", "alice")]
    for name, key, base, model, forged in plan:
        client = openai.OpenAI(base_url=base, api_key=key, max_retries=0, timeout=120,
                               default_headers={"X-Vllm-Fleet-Client": forged},
                               http_client=openai.DefaultHttpx2Client(verify=ca, trust_env=False))
        for round_ in range(2):
            prompt = long_prompt if round_ else f"hi {name} {base}"
            reply = client.chat.completions.create(model=model, max_tokens=12,
                                                   messages=[{"role": "user", "content": prompt}])
            add(name, reply.usage)
            reply = client.completions.create(model=model, prompt=prompt, max_tokens=9)
            add(name, reply.usage)
            last = None
            for chunk in client.chat.completions.create(model=model, max_tokens=15, stream=True,
                                                        messages=[{"role": "user", "content": prompt}]):
                last = chunk.usage or last
            assert last is not None, "the stream ended without its usage"
            add(name, last)
            last = None
            for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=11, stream=True,
                                                   extra_body={"ignore_eos": True}):
                last = chunk.usage or last
            assert last is not None and last.completion_tokens == 11
            add(name, last)
    after = _usage(team)
    assert not after["errors"], after["errors"]
    was, now = _by_client(before), _by_client(after)
    zero = {"prompt": 0, "cached": 0, "completion": 0, "requests": 0}
    for name, got in received.items():
        counted = {kind: now[name][kind] - was.get(name, zero)[kind] for kind in zero}
        assert counted == got, (name, counted, got)
    # No forged or invalid name among those this traffic counted under (the vLLMs keep the names the
    # modules before this one counted under, such as the monitoring module's clients, until they restart).
    changed = {name for name in now if now[name] != was.get(name)}
    assert changed <= {"alice", "OnlyB", "limited", "vllm-fleet", "(none)"}, (changed, now)
    own_before, own_after = before["vllm"], after["vllm"]
    delta_prompt = after["totals"]["prompt_tokens"] - before["totals"]["prompt_tokens"]
    delta_completion = after["totals"]["completion_tokens"] - before["totals"]["completion_tokens"]
    own_prompt = own_after["prompt_tokens"] - own_before["prompt_tokens"]
    own_generation = own_after["generation_tokens"] - own_before["generation_tokens"]
    figures = (f"tokens by client vs vLLM's own: this traffic prompt {delta_prompt} vs {own_prompt}, completion "
               f"{delta_completion} vs {own_generation}; since start prompt {after['totals']['prompt_tokens']} vs "
               f"{own_after['prompt_tokens']}, completion {after['totals']['completion_tokens']} vs "
               f"{own_after['generation_tokens']}; cached {after['totals']['cached_prompt_tokens']} vs "
               f"{own_after['cached_prompt_tokens']}")
    print(figures)
    assert delta_prompt == sum(r["prompt"] for r in received.values()) and delta_prompt > 0
    assert _within(delta_prompt, own_prompt) and _within(delta_completion, own_generation), figures
    assert _within(after["totals"]["prompt_tokens"], own_after["prompt_tokens"]), figures
    assert _within(after["totals"]["completion_tokens"], own_after["generation_tokens"]), figures


def test_a_stream_in_flight_across_a_deploys_restart_ends_with_its_last_token(team, sandbox, tmp_path):
    """Streams run through sbx-cpu2's front while a deploy changes its engine args and so restarts
    vLLM: the one in flight when systemd stops vLLM finishes (--shutdown-timeout), all 400 tokens, no
    reset. A stream is in flight once vLLM has sent its first chunk: one whose request was still on
    its way when the stop began may be refused (the instance is going away; on a loaded machine that
    way takes a while), but none that vLLM had begun answering may be cut.

    Each stream starts the next one once it has its first HANDOVER_CHUNKS chunks, so streams overlap:
    the next one has its first chunk within a decode step or two of vLLM, while the one handing over
    still has hundreds of tokens to go. Whenever the stop comes, one of them is past its first chunk;
    back to back, the stop could fall in the gap between one stream's end and the next one's start."""
    client = _client(INSTANCE, KEYS["ALICE_KEY"], team["ca"])
    done, results, streams = threading.Event(), [], []
    handover_chunks = 20

    def one_stream(handed_over: threading.Event):
        started, first, chunks, tokens, finish, error = time.time(), None, 0, 0, None, None
        try:
            # vLLM may send several tokens in one chunk: the count is the usage it reports last.
            for chunk in client.completions.create(model="tiny-llama", prompt="hi", max_tokens=400,
                                                   stream=True, stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}):
                first = first or time.time()
                chunks += 1
                if chunks == handover_chunks:
                    handed_over.set()
                if chunk.choices:
                    finish = chunk.choices[0].finish_reason or finish
                if chunk.usage:
                    tokens = chunk.usage.completion_tokens
        except openai.APIError as exc:
            error = repr(exc)
            time.sleep(0.5)
        results.append({"started": started, "first": first, "ended": time.time(), "tokens": tokens,
                        "finish": finish, "error": error})
        handed_over.set()

    def stream_chain():
        while not done.is_set():
            handed_over = threading.Event()
            stream = threading.Thread(target=one_stream, args=(handed_over,), daemon=True)
            stream.start()
            streams.append(stream)
            handed_over.wait()

    before = sandbox.run("sbx-cpu2", "systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
    chain = threading.Thread(target=stream_chain, daemon=True)
    chain.start()
    try:
        inventory = _inventory(tmp_path, cpu2_instance={"max_num_seqs": 8})
        result = pyinfra(team["env"], "--limit", "sbx-cpu2", inventory=inventory)
    finally:
        done.set()
        chain.join(timeout=180)
        for stream in list(streams):
            stream.join(timeout=180)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    after = sandbox.run("sbx-cpu2", "systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
    assert after != before, "the deploy did not restart vLLM"
    stop = sandbox.run("sbx-cpu2", "journalctl -u vllm-tiny.service -o short-unix --no-pager | "
                                   "grep 'Stopping vllm-tiny.service' | tail -1").stdout.split()
    assert stop, "no stop of vllm-tiny.service in the journal"
    stopped_at = float(stop[0])
    before_stop = [r for r in results if r["first"] is not None and r["first"] < stopped_at]
    assert all(r["error"] is None and r["tokens"] == 400 and r["finish"] == "length" for r in before_stop), before_stop
    assert any(r["ended"] > stopped_at for r in before_stop), (
        f"no stream was in flight when vLLM was stopped at {stopped_at}: {results}")


def test_revoking_a_client_makes_its_key_401_and_restarts_no_vllm(team, sandbox, tmp_path):
    pids = _main_pids(sandbox)
    remaining = {name: spec for name, spec in CLIENTS.items() if name != "OnlyB"}
    inventory = _inventory(tmp_path, clients=remaining, cpu2_instance={"max_num_seqs": 8})
    result = pyinfra(team["env"], "--limit", "cpu_hosts", inventory=inventory)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert "Reload vllm-fleet-front.service" in out
    assert _main_pids(sandbox) == pids
    for base in (GATEWAY, INSTANCE):
        with pytest.raises(openai.AuthenticationError):
            _client(base, KEYS["ONLYB_KEY"], team["ca"]).models.list()
    assert sorted(m.id for m in _client(GATEWAY, KEYS["ALICE_KEY"], team["ca"]).models.list()) == ["tiny-b", "tiny-llama"]
    assert [m.id for m in _client(INSTANCE, KEYS["ALICE_KEY"], team["ca"]).models.list()] == ["tiny-llama"]
