"""A sandbox's teardown finishes on a busy machine: every core kept busy, hosts whose processes take
the kernel time to tear down are stopped and removed many times over; each `down` waits until the
kernel has let go of their cgroups, exits clean and leaves nothing behind. And the waiting itself,
without hosts: every thread found, rmdir retried on EBUSY, a cgroup that stays busy named."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.figures import report
from vllm_fleet.sandbox import harness, hosts, teardown

RUNS = 5
HOSTS = {"sbx-busy1": "10.213.250.11", "sbx-busy2": "10.213.250.12"}  # a bridge and /24 of their own
LOAD_MIB = 512
# In each host, what makes its teardown take the kernel time, as a vLLM does: a service with 16
# threads and LOAD_MIB of memory written, SIGKILLed with the rest of the host. Prints its RSS and
# thread count once ready.
LOAD = ("systemd-run --quiet --unit=busy-load python3 -c '"
        "import threading, time\n"
        f"memory = bytearray({LOAD_MIB} << 20)\n"
        "for i in range(0, len(memory), 4096): memory[i] = 1\n"
        "for _ in range(16): threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n"
        "open(\"/run/busy-load.ready\", \"w\").close()\n"
        "time.sleep(3600)' && "
        "until [ -e /run/busy-load.ready ]; do sleep 0.1; done && ps -o rss=,nlwp= -C python3")


def _busy_sandbox(tmp_path: Path) -> hosts.Sandbox:
    """Two hosts beside the session's sandbox (own names, bridge and /24), with the cache's SSH keys."""
    ssh = hosts.cache_dir() / "sandbox" / "ssh"
    data = {"ssh_user": "root", "ssh_key": str(ssh / "id_ed25519"),
            "ssh_known_hosts_file": str(ssh / "known_hosts"), "ssh_strict_host_key_checking": "yes"}
    inventory = tmp_path / "inventory" / "busy.py"
    inventory.parent.mkdir()
    inventory.write_text("busy_hosts = [\n" + "".join(
        f"    ({name!r}, {dict(data, ssh_hostname=address)!r}),\n" for name, address in HOSTS.items()) + "]\n")
    return hosts.load(inventory)


@pytest.mark.sandbox
def test_teardown_with_every_core_busy_finishes_clean_every_time(tmp_path: Path) -> None:
    sandbox = _busy_sandbox(tmp_path)
    # One CPU hog per core, each in a session of its own: the scheduler shares the cores between
    # sessions first (autogroups), so each weighs as another user's job would.
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True)
            for _ in range(os.cpu_count() or 1)]
    slowest = 0.0
    try:
        for run in range(1, RUNS + 1):
            harness.up(sandbox, log=print)
            with ThreadPoolExecutor(len(sandbox.hosts)) as pool:
                loads = list(pool.map(lambda host: sandbox.run(host, LOAD, timeout=120, check=True), sandbox.hosts))
            for host, load in zip(sandbox.hosts, loads, strict=True):
                rss_kib, threads = (int(v) for v in load.stdout.split())
                assert rss_kib >= LOAD_MIB * 1024 and threads >= 17, (host.name, rss_kib, threads)
            started = time.monotonic()
            harness.down(sandbox)  # raises, naming the host and what is left, if it cannot finish
            slowest = max(slowest, time.monotonic() - started)
            left = teardown.leftovers(sandbox)
            assert left == [], f"run {run} of {RUNS}: {left}"
        assert all(hog.poll() is None for hog in hogs), "a CPU hog stopped: the cores were not kept busy"
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        harness.down(sandbox)
    report(f"sandbox teardown with every core busy ({len(hogs)} CPU hogs): {RUNS} of {RUNS} runs of 2 hosts "
           f"(each with a {LOAD_MIB} MiB, 17-thread service) down clean, nothing left; slowest down {slowest:.1f} s")


# --- the waiting, without hosts ----------------------------------------------------------------


def test_threads_are_read_from_every_level_of_v1_and_v2_cgroups(tmp_path: Path) -> None:
    """v1 lists threads in `tasks`, v2 in `cgroup.threads`; children count; cgroup.procs does not
    (v2 leaves out a process whose main thread has exited while another still exits)."""
    v1 = tmp_path / "memory" / "host"
    (v1 / "child").mkdir(parents=True)
    (v1 / "tasks").write_text("10\n11\n")
    (v1 / "cgroup.procs").write_text("10\n")
    (v1 / "child" / "tasks").write_text("12\n")
    v2 = tmp_path / "unified" / "host"
    (v2 / "system.slice" / "vllm.service").mkdir(parents=True)
    (v2 / "cgroup.threads").write_text("")
    (v2 / "cgroup.procs").write_text("")
    (v2 / "system.slice" / "vllm.service" / "cgroup.threads").write_text("20\n21\n")
    (v2 / "system.slice" / "vllm.service" / "cgroup.procs").write_text("")
    assert teardown._threads(v1) == {10, 11, 12}
    assert teardown._threads(v2) == {20, 21}
    assert teardown._threads(tmp_path / "gone") == set()
    (v2 / "cgroup.events").write_text("populated 1\nfrozen 0\n")
    assert teardown._populated(v2) and not teardown._populated(v1)


def test_rmdir_is_retried_on_ebusy_until_the_cgroup_empties(tmp_path: Path, monkeypatch) -> None:
    cgroup = tmp_path / "host"
    (cgroup / "payload").mkdir(parents=True)
    busy = {"left": 3}
    real_rmdir = Path.rmdir

    def rmdir(path: Path) -> None:
        if path == cgroup and busy["left"]:  # the kernel still unlinking the last exited thread
            busy["left"] -= 1
            raise OSError(errno.EBUSY, "Device or resource busy", str(path))
        real_rmdir(path)

    monkeypatch.setattr(Path, "rmdir", rmdir)
    monkeypatch.setattr(teardown, "POLL_S", 0.001)
    teardown._remove_cgroup(cgroup, deadline=time.monotonic() + 30)
    assert not cgroup.exists() and busy["left"] == 0


def test_a_cgroup_that_stays_busy_is_reported_with_what_is_in_it(tmp_path: Path, monkeypatch) -> None:
    cgroup = tmp_path / "host"
    cgroup.mkdir()
    (cgroup / "tasks").write_text(f"{os.getpid()}\n")

    def rmdir(path: Path) -> None:
        raise OSError(errno.EBUSY, "Device or resource busy", str(path))

    monkeypatch.setattr(Path, "rmdir", rmdir)
    monkeypatch.setattr(teardown, "POLL_S", 0.001)
    with pytest.raises(hosts.SandboxError) as raised:
        teardown._remove_cgroup(cgroup, deadline=time.monotonic() + 0.05)
    message = str(raised.value)
    assert f"cgroup {cgroup} still busy" in message
    assert f"{os.getpid()} " in message and "(R)" in message  # this test's own thread, running
