"""One sandbox session per host name on a machine (vllm_fleet/sandbox/session_lock.py): a second
`up` of the same names waits for the first and says whose it is; a `down` from another process is
refused while the first holds them; other names boot beside it. Runs no host: the locks live in a
directory of the test's own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from vllm_fleet.sandbox import session_lock
from vllm_fleet.sandbox.hosts import SandboxError


@pytest.fixture
def lock_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(session_lock, "LOCK_DIR", tmp_path)
    monkeypatch.setattr(session_lock, "_POLL_S", 0.05)
    yield tmp_path
    assert session_lock._held == {}, "a test left a lock held"


def _holder(lock_dir, *names: str) -> subprocess.Popen:
    """Another process that holds `names` until its stdin closes."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from vllm_fleet.sandbox import session_lock
        session_lock.LOCK_DIR = Path({str(lock_dir)!r})
        session_lock.take({list(names)!r})
        print("held", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _end(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_second_session_of_the_same_names_waits_and_says_whose(lock_dir):
    first = _holder(lock_dir, "sbx-cpu1", "sbx-cpu2")
    try:
        said: list[str] = []
        with pytest.raises(SandboxError) as info:
            session_lock.take(["sbx-cpu2", "sbx-cpu3"], said.append, limit_s=0.3)
        assert f"pid {first.pid}: " in str(info.value) and "sbx-cpu2" in str(info.value)
        assert len(said) == 1 and "waiting for it to end" in said[0] and f"pid {first.pid}" in said[0]
        assert session_lock._held == {}  # all or none: sbx-cpu3 was not kept
        with pytest.raises(SandboxError, match="let it end"):  # a down from another process
            session_lock.take(["sbx-cpu1"], wait=False)
        session_lock.take(["sbx-sigint"], wait=False)  # another name boots beside it
        session_lock.release(["sbx-sigint"])
    finally:
        _end(first)
    session_lock.take(["sbx-cpu2", "sbx-cpu3"], said.append, limit_s=5)  # once it ended: at once
    session_lock.release(["sbx-cpu2", "sbx-cpu3"])


def test_a_killed_session_leaves_no_lock_behind(lock_dir):
    first = _holder(lock_dir, "sbx-cpu1")
    first.kill()
    first.wait(timeout=30)
    session_lock.take(["sbx-cpu1"], wait=False)
    session_lock.release(["sbx-cpu1"])


def test_holds_are_counted_within_a_process(lock_dir):
    """A down of names this process holds gives up one hold (its up's); the lock goes with the last."""
    session_lock.take(["a"])
    session_lock.take(["a"])
    session_lock.release(["a"])
    probe = "from pathlib import Path; from vllm_fleet.sandbox import session_lock as s; " \
            f"s.LOCK_DIR = Path({str(lock_dir)!r}); s.take(['a'], wait=False)"
    still = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert still.returncode != 0 and "another sandbox session has a host named a" in still.stderr
    session_lock.release(["a"])
    free = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert free.returncode == 0, free.stderr


def test_a_planted_link_or_a_folder_others_may_write_is_refused(lock_dir, tmp_path_factory):
    """Root takes these locks: a link in their place would have it write through to another file."""
    victim = tmp_path_factory.mktemp("victim") / "shadow"
    victim.write_text("precious\n")
    session_lock.lock_path("sbx-link").symlink_to(victim)
    with pytest.raises(OSError):
        session_lock.take(["sbx-link"], wait=False)
    assert victim.read_text() == "precious\n" and session_lock._held == {}
    lock_dir.chmod(0o777)
    try:
        with pytest.raises(SandboxError, match="no one else may write"):
            session_lock.take(["sbx-other"], wait=False)
    finally:
        lock_dir.chmod(0o700)
