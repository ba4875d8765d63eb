"""What a real GPU server does that a happy path never shows, on the sandbox: a driver too old for
the pinned vLLM (simulated GPUs: the stand-in nvidia-smi answers with an old driver) stops the run
before any change; an engine that cannot start, and a load that hangs, each end in a failed unit after
a bounded number of starts (not a restart every few seconds forever), `status` says why, and a fixed
deploy brings both back.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.fleet_helpers import API_KEY, CPU_HOSTS, FINGERPRINT, chat, pyinfra, variant_inventory, vllm_fleet
from vllm_fleet.sandbox import boot

OLD_DRIVER = "550.54.15"  # R550: CUDA 12.4; vLLM 0.33's torch is built for CUDA 13 (driver >= 580)
GPU_HOST = "sbx-a100x2"


def test_an_old_driver_stops_dry_and_real_runs_before_any_change(sandbox, deploy_env):
    layout_path = f"/{boot.GPU_LAYOUT_PATH}"
    layout = json.loads(sandbox.run(GPU_HOST, f"cat {layout_path}", check=True).stdout)
    old = {"driver_version": OLD_DRIVER, "gpus": layout}
    sandbox.run(GPU_HOST, f"cat > {layout_path} <<'EOF'\n{json.dumps(old)}\nEOF", check=True)
    try:
        assert OLD_DRIVER in sandbox.run(GPU_HOST, "nvidia-smi --query-gpu=driver_version --format=csv,noheader"
                                         ).stdout
        before = sandbox.run(GPU_HOST, FINGERPRINT).stdout
        for mode in (["--dry"], []):
            result = pyinfra(deploy_env, "--limit", GPU_HOST, *mode)
            out = result.stdout + result.stderr
            assert result.returncode != 0, out[-3000:]
            lines = [ln for ln in out.splitlines() if "error: host sbx-a100x2" in ln and OLD_DRIVER in ln]
            assert lines and "580" in lines[0], out[-3000:]
            assert "nothing was changed on any host" in out
            assert "Traceback" not in out
            assert "Starting operation" not in out  # not one operation ran
        assert sandbox.run(GPU_HOST, FINGERPRINT).stdout == before
    finally:
        sandbox.run(GPU_HOST, f"cat > {layout_path} <<'EOF'\n{json.dumps(layout)}\nEOF", check=True)


def _unit(sandbox, host: str) -> dict[str, str]:
    out = sandbox.run(host, "systemctl show -p ActiveState -p Result -p NRestarts vllm-tiny.service").stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _wait_until_failed(sandbox, host: str, timeout: float = 300) -> dict[str, str]:
    """The unit's state once systemd has given up on it (or when the time is up)."""
    deadline, unit = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        unit = _unit(sandbox, host)
        if unit.get("ActiveState") == "failed":
            break
        time.sleep(3)
    return unit


CRASH_HOST, HANG_HOST = "sbx-cpu2", "sbx-cpu3"
EMPTY_TOKENIZER = "/srv/empty-tokenizer"
# What the pinned vLLM's tokenizer loader (transformers) raises on a directory with no tokenizer in it.
EMPTY_TOKENIZER_ERROR = "Couldn't instantiate the backend tokenizer"
HANG_DROPIN = "/etc/systemd/system/vllm-tiny.service.d/hang.conf"


@pytest.fixture(scope="module")
def broken(sandbox, deploy_env, tmp_path_factory):
    """Two broken engines at once, each on its own host (both runs mostly wait on systemd's timers):
    on sbx-cpu2 a tokenizer directory that is there but empty (a copy that never finished: the deploy
    sees the path, and only vLLM's own start can tell it holds no tokenizer: it exits while loading),
    on sbx-cpu3 a load that never opens
    its port (a stand-in engine that sleeps; start_timeout_s 30, the smallest allowed). Each deploy
    runs, then its unit is watched until systemd gives up. {host: (inventory, result, unit, seconds)}"""
    crash = variant_inventory(tmp_path_factory.mktemp("crash"),
                              cpu2={"tokenizer": EMPTY_TOKENIZER})
    hanging = variant_inventory(tmp_path_factory.mktemp("hang"), every={"start_timeout_s": 30})
    sandbox.run(CRASH_HOST, f"mkdir -p {EMPTY_TOKENIZER}", check=True)
    # What a stuck load looks like from outside: an engine that never opens its port.
    sandbox.run(HANG_HOST, f"mkdir -p {HANG_DROPIN.rsplit('/', 1)[0]} && printf '[Service]\\nExecStart=\\n"
                           f"ExecStart=/bin/sleep infinity\\n' > {HANG_DROPIN}", check=True)

    def break_one(host: str, inventory: str):
        started = time.monotonic()
        result = pyinfra(deploy_env, "--limit", host, inventory=inventory)
        unit = _wait_until_failed(sandbox, host)
        # systemd's own account of each start, for the assertions' messages
        unit["journal"] = sandbox.run(host, "journalctl -u vllm-tiny.service -o short-precise --no-pager | grep -E "
                                            "'Start|Stopp|Schedul|repeated|Failed|reset' | tail -n 40").stdout
        return host, (inventory, result, unit, time.monotonic() - started)

    try:
        with ThreadPoolExecutor(2) as pool:
            yield dict(pool.map(lambda args: break_one(*args), [(CRASH_HOST, crash), (HANG_HOST, hanging)]))
    finally:
        sandbox.run(HANG_HOST, f"rm -f {HANG_DROPIN} && systemctl daemon-reload", check=True)
        sandbox.run(CRASH_HOST, f"rmdir {EMPTY_TOKENIZER}", check=True)


def test_an_engine_that_cannot_start_ends_failed_and_status_says_why(broken, sandbox, deploy_env):
    inventory, result, unit, _seconds = broken[CRASH_HOST]
    assert result.returncode != 0
    assert EMPTY_TOKENIZER_ERROR in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
    # Bounded: systemd stopped retrying after the unit's start limit (3 starts within the interval
    # sized to the load; systemd 252 leaves Result at the last start's, exit-code), not every 5 s forever.
    assert unit.get("ActiveState") == "failed", unit
    assert int(unit["NRestarts"]) <= 3, unit
    time.sleep(12)  # longer than the unit's RestartSec (10 s at least): systemd would have restarted it
    assert _unit(sandbox, CRASH_HOST)["ActiveState"] == "failed"  # and it stays down
    shown = vllm_fleet(deploy_env, "status", inventory, "--json", "--limit", CRASH_HOST)
    report = json.loads(shown.stdout)
    inst = report["hosts"][0]["instances"]["tiny"]
    assert inst["state"].startswith("failed"), inst
    assert EMPTY_TOKENIZER_ERROR in json.dumps(inst), inst
    table = vllm_fleet(deploy_env, "status", inventory, "--limit", CRASH_HOST)
    assert "failed" in table.stdout and EMPTY_TOKENIZER_ERROR in table.stdout, table.stdout[-2000:]


def test_a_load_that_hangs_is_stopped_at_its_start_timeout_and_reported(broken, deploy_env):
    inventory, result, unit, seconds = broken[HANG_HOST]
    out = result.stdout + result.stderr
    assert result.returncode != 0
    assert "did not answer 200 within 15 s" in out, out[-3000:]  # the unit's health wait, 30 - 15 s
    assert unit.get("ActiveState") == "failed" and int(unit["NRestarts"]) <= 3, unit
    print(f"hanging load: stopped and retried, failed after {seconds:.0f} s")
    table = vllm_fleet(deploy_env, "status", inventory, "--limit", HANG_HOST)
    assert "did not answer 200" in table.stdout or "hung" in table.stdout, table.stdout[-2000:]


def test_a_fixed_deploy_brings_both_back(broken, sandbox, deploy_env):
    """The inventory's own config again (and the hang's stand-in gone): both units had ended failed
    after their bounded starts; the deploy resets and starts them, and they serve."""
    sandbox.run(HANG_HOST, f"rm -f {HANG_DROPIN} && systemctl daemon-reload", check=True)
    fixed = pyinfra(deploy_env, "--limit", CRASH_HOST, "--limit", HANG_HOST)  # pyinfra splits no commas
    assert fixed.returncode == 0, (fixed.stdout + fixed.stderr)[-3000:]
    for host in (CRASH_HOST, HANG_HOST):
        assert chat(CPU_HOSTS[host], API_KEY)[0] == 200
        assert _unit(sandbox, host)["ActiveState"] == "active"
