"""Rolling updates and fleet status on the sandbox, with the genuine vLLM on the CPU hosts: one
rollout under client load through two gateways behind a floating address, and `vllm-fleet status`
of what it left. (The rollout's failure, rollback, interruption and unreachable-host mechanics,
against the stand-in engine, are in test_rollout_standin.py.)

The fleet: sbx-cpu1 and sbx-cpu2 are both gateways, keepalived (from the sandbox's package mirror)
moving FLOATING between them on the sandbox's bridge; the clients' traffic goes to FLOATING. Runs
after test_deploy_sandbox.py in the same sandbox session; the fixture first deploys the two gateways
(the inventory's instances, whatever earlier modules left), then rolls the change out under load.
When the module ends keepalived is stopped on both (nothing else of the sandbox uses the address).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import urllib.error
import urllib.request

import pytest

from support.fleet_helpers import (API_KEY, KEY_MARK, CPU_HOSTS, ROLLOUT_END_INSTANCES, chat, pyinfra, rollout,
                                   variant_inventory, vllm_fleet)

# The gateways' floating address: free in the sandbox's /24 (the bridge holds .1, the hosts .11-.22).
FLOATING = "10.213.7.100"
GATEWAYS = ("sbx-cpu1", "sbx-cpu2")
FLOATING_DATA = {"vllm_gateway": True, "vllm_gateway_address": f"{FLOATING}/24", "vllm_gateway_interface": "eth0"}


@pytest.fixture(scope="module")
def two_gateways(sandbox, deploy_env, tmp_path_factory):
    """sbx-cpu1 and sbx-cpu2 both gateways behind FLOATING, deployed (the inventory's instances).
    When the module ends, keepalived is stopped on both and the fleet deployed as the later modules
    expect it (the inventory's one gateway, the rollout's instances: ROLLOUT_END_INSTANCES), so that
    sbx-cpu2 is no gateway any more and their deploys restart no vLLM for it."""
    result = pyinfra(deploy_env, inventory=gateways_inventory(tmp_path_factory.mktemp("gw")))
    assert result.returncode == 0, result.stderr[-3000:]
    try:
        yield
    finally:
        for name in GATEWAYS:
            sandbox.run(name, "systemctl disable --now keepalived", check=False)
        back = pyinfra(deploy_env, inventory=variant_inventory(tmp_path_factory.mktemp("one"),
                                                                instance=ROLLOUT_END_INSTANCES))
        assert back.returncode == 0, back.stderr[-3000:]


@pytest.fixture(scope="module")
def rolled(sandbox, deploy_env, two_gateways, tmp_path_factory):
    """A config change of sbx-cpu2 (a gateway) and sbx-cpu3, rolled over the 3 CPU hosts (all serving
    "tiny-llama"), two hosts a batch but one gateway a batch, while 4 clients send requests for it
    through the floating address: (rollout result, hosts, order, client load). sbx-cpu1 serves
    "tiny-llama" as the inventory has it (unchanged: its batch restarts nothing)."""
    inventory = rolled_inventory(tmp_path_factory.mktemp("r1"))
    deadline = time.monotonic() + 60
    while not holders(sandbox):  # keepalived's first election: a few adverts after the deploy
        assert time.monotonic() < deadline, "no gateway took the floating address after the deploy:\n" + "\n".join(
            sandbox.run(name, "journalctl -u keepalived --no-pager -n 30").stdout for name in GATEWAYS)
        time.sleep(1)
    held_before = holders(sandbox)
    # Each client pauses between requests: the three sandbox vLLMs share this machine's two cores,
    # and a load without pauses starved the instance that was starting past its 300 s start timeout
    # (seen in a full run), which a real server with its own CPUs does not see.
    load = GatewayLoad(clients=4)
    with load:
        result = rollout(deploy_env, inventory, "--batch", "2")
    return (*result, load, held_before)


# What the rollout converges to: max-num-seqs 16 on sbx-cpu2 and sbx-cpu3; sbx-cpu1 as the
# inventory has it. The team modules keep the same, so their deploys restart no vLLM.
SERVES = {"sbx-cpu1": "tiny-llama", "sbx-cpu2": "tiny-llama", "sbx-cpu3": "tiny-llama"}
ROLLED = tuple(ROLLOUT_END_INSTANCES)  # sbx-cpu2, sbx-cpu3


def gateways_inventory(tmp_path) -> str:
    return variant_inventory(tmp_path, host_data={name: FLOATING_DATA for name in GATEWAYS})


def rolled_inventory(tmp_path) -> str:
    return variant_inventory(tmp_path, instance=ROLLOUT_END_INSTANCES,
                             host_data={name: FLOATING_DATA for name in GATEWAYS})


def holders(sandbox) -> list[str]:
    return [name for name in GATEWAYS if f"inet {FLOATING}/" in sandbox.run(name, "ip -o -4 addr show dev eth0").stdout]


class GatewayLoad:
    """Client threads sending 2-token completions through the gateway until stopped; counts failures.

    They use the name every CPU host serves ("tiny-llama"): while one instance restarts, the others
    serve it. (A name with a single instance cannot be served while that
    instance restarts, drained or not.)"""

    URL = f"http://{FLOATING}:9000/v1/completions"

    def __init__(self, clients: int):
        self.sent, self.failures, self.clients = 0, [], clients
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop) for _ in range(clients)]
        self._lock = threading.Lock()

    def _loop(self) -> None:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        body = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 2}).encode()
        while not self._stop.is_set():
            req = urllib.request.Request(self.URL, data=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"})
            try:
                with opener.open(req, timeout=120) as resp:
                    resp.read()
                    failure = None if resp.status == 200 else f"HTTP {resp.status}"
            except urllib.error.HTTPError as exc:
                failure = f"HTTP {exc.code}: {exc.read()[:200]!r}"
            except OSError as exc:
                failure = repr(exc)
            with self._lock:
                self.sent += 1
                if failure:
                    self.failures.append(f"{time.strftime('%H:%M:%S')} {failure}")
            self._stop.wait(1.0)

    def __enter__(self):
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=180)


def test_rollout_drains_each_host_from_every_gateway_and_no_client_request_fails(rolled, sandbox):
    result, hosts, _order, load, _held = rolled
    assert result.returncode == 0, result.stderr
    print(f"rollout under load: {load.sent} requests through the floating address from {load.clients} clients, "
          f"{len(load.failures)} failed")
    # sbx-cpu2 and sbx-cpu3 are each drained from both routers while the others serve the clients' model.
    for name in ROLLED:
        assert f"{name}: drained from the gateway" in result.stderr, result.stderr[-3000:]
    for gateway in GATEWAYS:
        back = [int(ln.split()[3]) for ln in result.stderr.splitlines()
                if ln.startswith(f"gateway on {gateway}: ") and "backend(s) back in" in ln]
        assert len(back) == 3 and all(n >= 1 for n in back), result.stderr[-3000:]
    assert "errors:" not in result.stderr, result.stderr[-3000:]
    assert load.sent > 40 and load.failures == [], load.failures[:5]


def test_gateways_converge_one_at_a_time_the_address_moved_away_first(rolled, sandbox):
    result, _hosts, _order, _load, held_before = rolled
    assert result.returncode == 0, result.stderr
    # --batch 2 would take both gateways at once: each goes alone.
    batches = [ln for ln in result.stderr.splitlines() if ln.startswith("batch ")]
    assert batches == ["batch 1: sbx-cpu1", "batch 2: sbx-cpu2", "batch 3: sbx-cpu3"], batches
    # The holder's batch moves the address to the other gateway first: from sbx-cpu1 (the first
    # gateway's priority; it usually wins the first election) to sbx-cpu2, then back before sbx-cpu2
    # converges; each time keepalived returns as a backup.
    moves = [ln for ln in result.stderr.splitlines() if ln.startswith(f"floating address {FLOATING}: moved")]
    expected = (["sbx-cpu1>sbx-cpu2"] if held_before == ["sbx-cpu1"] else []) + ["sbx-cpu2>sbx-cpu1"]
    assert len(held_before) == 1 and [m.split()[5] + ">" + m.split()[7] for m in moves] == expected, moves
    for move in expected:  # the gateway the address left rejoined as a backup once converged
        assert f"gateway on {move.split('>')[0]}: keepalived started again, a backup" in result.stderr
    for gateway in GATEWAYS:
        assert sandbox.run(gateway, "systemctl is-active keepalived").stdout.strip() == "active"
    assert holders(sandbox) == ["sbx-cpu1"]


def test_rollout_goes_in_inventory_order_verifying_each_host(rolled, sandbox):
    result, hosts, order, _load, _held = rolled
    assert result.returncode == 0, result.stderr
    assert order == list(CPU_HOSTS)
    assert all(hosts[name]["state"] == "updated" for name in ROLLED)
    assert hosts["sbx-cpu1"]["state"] in ("unchanged", "updated")
    # Each host was verified (finished) before the next one started.
    for first, second in itertools.pairwise(order):
        assert hosts[first]["finished"] <= hosts[second]["started"]
    for name in ROLLED:
        assert "max-num-seqs: 16" in sandbox.run(name, "cat /etc/vllm-fleet/tiny.yaml").stdout
        assert chat(CPU_HOSTS[name], API_KEY)[0] == 200


def test_status_reports_health_kv_and_drift(rolled, sandbox, deploy_env, tmp_path):
    inventory = rolled_inventory(tmp_path)  # the fleet as the rollout left it, two gateways included
    result = vllm_fleet(deploy_env, "status", inventory, "--json")
    assert result.returncode == 0, result.stderr
    report = {h["name"]: h for h in json.loads(result.stdout)["hosts"]}
    for name in CPU_HOSTS:
        inst = report[name]["instances"]["tiny"]
        assert inst["health"] is True and inst["state"] == "active/running"
        assert inst["served_models"] == [SERVES[name]]
        assert "kv_cache_usage_perc" in inst["metrics"] and "num_requests_running" in inst["metrics"]
        assert inst["vllm_version"].startswith("0.32")
        assert inst["drift"] == []
    assert KEY_MARK not in result.stdout + result.stderr
    sandbox.run("sbx-cpu3", "sed -i 's/^TimeoutStopSec=90/TimeoutStopSec=91/' /etc/systemd/system/vllm-tiny.service")
    drifted = json.loads(vllm_fleet(deploy_env, "status", inventory, "--json").stdout)
    inst = {h["name"]: h for h in drifted["hosts"]}["sbx-cpu3"]["instances"]["tiny"]
    assert inst["drift"] == ["unit differs from the plan"]
    sandbox.run("sbx-cpu3", "sed -i 's/^TimeoutStopSec=91/TimeoutStopSec=90/' /etc/systemd/system/vllm-tiny.service")
