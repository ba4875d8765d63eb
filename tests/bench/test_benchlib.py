"""bench/benchlib.py, what the sandbox benches share, offline: the CPU hosts' sandbox, inventory
directories with the sandbox's group data, the deploy's environment, processes stopped by PID and a
bench run that reports what it measured however it ends."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import benchlib  # noqa: E402


def test_cpu_sandbox_is_the_three_cpu_hosts_of_the_sandbox_inventory():
    sandbox = benchlib.cpu_sandbox()
    assert [h.name for h in sandbox.hosts] == benchlib.CPU_HOSTS


def test_inventory_dir_links_the_group_data_once(tmp_path):
    d = benchlib.inventory_dir(tmp_path / "nested", "inv")
    assert d == tmp_path / "nested" / "inv"
    assert (d / "group_data").resolve() == benchlib.GROUP_DATA.resolve()
    assert (d / "group_data" / "sandbox.py").exists()  # the sandbox group's data applies to sandbox.py here
    assert benchlib.inventory_dir(tmp_path / "nested", "inv") == d  # again: the same directory, no error


def test_deploy_env_carries_the_key_and_the_wheelhouse_only_when_given(monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_WHEELHOUSE", "/from/the/caller")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    env = benchlib.deploy_env("sk-test", Path("/w"))
    assert env["VLLM_FLEET_API_KEY"] == "sk-test" and env["VLLM_FLEET_WHEELHOUSE"] == "/w"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert benchlib.deploy_env("sk-test")["VLLM_FLEET_WHEELHOUSE"] == "/from/the/caller"


def _started(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "ready\n"
    return proc


def test_stop_process_terminates_and_kills_what_ignores_sigterm():
    polite = _started("import sys, time; print('ready', flush=True); time.sleep(60)")
    benchlib.stop_process(polite, grace_s=5)
    assert polite.returncode == -signal.SIGTERM
    stubborn = _started("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                        "print('ready', flush=True); time.sleep(60)")
    benchlib.stop_process(stubborn, grace_s=0.3)
    assert stubborn.returncode == -signal.SIGKILL
    benchlib.stop_process(stubborn)  # already ended: nothing to do
    for proc in (polite, stubborn):
        proc.stdout.close()


class _Bench:
    def __init__(self, result):
        self.result, self.out, self.cleaned = result, io.StringIO(), 0

    def cleanup(self):
        self.cleaned += 1


def test_run_to_the_end_reports_what_was_measured_and_cleans_up_however_it_ends():
    previous = signal.getsignal(signal.SIGTERM)
    try:
        bench = _Bench({"scenarios": {"noop": 1}})
        reported = []

        def fails():
            raise RuntimeError("a host failed")

        with pytest.raises(RuntimeError, match="a host failed"):
            benchlib.run_to_the_end(bench, fails, reported.append, "hosts stopped")
        assert reported == [{"scenarios": {"noop": 1}}] and bench.cleaned == 1
        assert bench.out.getvalue().endswith("what it measured so far:\nhosts stopped\n")

        bench = _Bench(None)
        assert benchlib.run_to_the_end(bench, lambda: {"done": True}, reported.append, "hosts stopped") == {
            "done": True}
        assert len(reported) == 1 and bench.cleaned == 1 and bench.out.getvalue() == "hosts stopped\n"
    finally:
        signal.signal(signal.SIGTERM, previous)
