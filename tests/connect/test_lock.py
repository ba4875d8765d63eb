"""The deploy lock's shell, run for real here with flock (util-linux) in a temporary directory: the
same text the deploy runs on a host through its own SSH channel (see vllm_fleet/connect/lock.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from vllm_fleet.connect import lock


def hold(lock_dir, owner):
    """A holder as sshd would start it: its own session, stdin a pipe (the channel)."""
    proc = subprocess.Popen(["sh", "-c", lock.hold_command(owner, str(lock_dir))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    return proc, proc.stdout.readline().strip()


def try_hold(lock_dir, owner):
    out = subprocess.run(["sh", "-c", lock.hold_command(owner, str(lock_dir))], input="",
                         capture_output=True, text=True, timeout=10)
    return out.returncode, out.stdout.splitlines()


def wait_exit(proc, timeout=5.0):
    proc.wait(timeout=timeout)
    return proc.returncode


@pytest.fixture
def owner():
    return lock.this_owner("pyinfra -y inventory/prod.py deploy.py")


def test_second_holder_is_refused_and_told_who_holds(tmp_path, owner):
    first, answer = hold(tmp_path, owner)
    try:
        assert answer == f"LOCKED uid={os.getuid()}"
        code, lines = try_hold(tmp_path, dict(owner, pid=1))
        assert code == 3 and lines[0] == "BUSY"
        holder = lock.parse_busy(lines)
        assert holder == owner
        assert "pyinfra -y inventory/prod.py deploy.py" in lock.describe(holder)
    finally:
        first.stdin.close()  # the channel closes: the holder's cat sees end of input
        assert wait_exit(first) == 0
    code, lines = try_hold(tmp_path, owner)
    assert code == 0 and lines == [f"LOCKED uid={os.getuid()}"]
    assert not (tmp_path / "deploy.owner").exists()  # removed by the holder that ended


def test_a_killed_holder_releases_the_lock(tmp_path, owner):
    first, answer = hold(tmp_path, owner)
    assert answer == f"LOCKED uid={os.getuid()}"
    os.killpg(first.pid, signal.SIGKILL)  # what sshd's end of a killed deploy amounts to
    first.wait(timeout=5)
    deadline = time.time() + 5
    while time.time() < deadline:
        code, lines = try_hold(tmp_path, owner)
        if code == 0:
            break
        time.sleep(0.1)
    assert (code, lines) == (0, [f"LOCKED uid={os.getuid()}"])


def test_break_ends_a_live_holder_and_frees_the_lock(tmp_path, owner):
    first, answer = hold(tmp_path, owner)
    assert answer == f"LOCKED uid={os.getuid()}"
    recorded = (tmp_path / "deploy.owner").read_text().splitlines()
    assert json.loads(recorded[0]) == owner and int(recorded[1]) == os.getpgid(first.pid)
    out = subprocess.run(["sh", "-c", lock.break_command(str(tmp_path))], capture_output=True, text=True,
                         timeout=20)
    assert out.returncode == 0 and out.stdout.strip() == "FREE", out.stderr
    assert wait_exit(first) != 0  # terminated, not a clean end
    assert try_hold(tmp_path, owner)[0] == 0


def test_break_of_a_free_lock_kills_nothing(tmp_path, owner):
    # A stale owner file naming a live, unrelated process group: the lock is free, so no kill.
    bystander = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (tmp_path / "deploy.owner").write_text(json.dumps(owner) + f"\n{bystander.pid}\n")
        out = subprocess.run(["sh", "-c", lock.break_command(str(tmp_path))], capture_output=True,
                             text=True, timeout=20)
        assert out.stdout.strip() == "FREE"
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_only_a_dead_process_of_this_workstation_counts_as_gone(owner):
    assert not lock.owner_is_gone(owner)  # this very process
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert lock.owner_is_gone(dict(owner, pid=dead.pid, pid_start=None))
    assert not lock.owner_is_gone(dict(owner, pid=dead.pid, workstation="another-workstation"))
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        alive = lock.this_owner("pyinfra -y inventory/prod.py deploy.py")
        alive.update(pid=sleeper.pid, pid_start=lock._process_start(sleeper.pid))
        assert not lock.owner_is_gone(alive)
        assert lock.owner_is_gone(dict(alive, pid_start="1"))  # same pid, another process: reused
    finally:
        sleeper.kill()
        sleeper.wait()
    assert not lock.owner_is_gone({})


def test_the_owner_record_hides_passwords_from_the_command_line():
    from vllm_fleet.connect.lock import hold_command, redacted

    argv = ["-y", "inventory/prod.py", "deploy.py", "--ssh-password", "pw1", "--data", "_sudo_password=pw2",
            "--sudo-password=pw3", "--limit", "gpu-a100-01"]
    shown = " ".join(redacted(argv))
    assert not any(secret in shown for secret in ("pw1", "pw2", "pw3"))
    assert "inventory/prod.py deploy.py" in shown and "--limit gpu-a100-01" in shown
    command = hold_command({"pid": 1})
    # Not root: nothing is written. Root: the lock and owner files are root's only.
    assert command.index("NOTROOT") < command.index("umask 077;") < command.index("mkdir")


class _Channel:
    """A paramiko channel as acquire() uses it: the host's answer on stdout, sudo's words on stderr."""

    def __init__(self, out: bytes, err: bytes = b""):
        self.out, self.err, self.closed, self.command = out, err, False, None

    def exec_command(self, command):
        self.command = command

    def settimeout(self, timeout):
        pass

    def recv(self, size):
        chunk, self.out = self.out[:size], self.out[size:]
        return chunk

    def exit_status_ready(self):
        return True

    def recv_stderr_ready(self):
        return bool(self.err)

    def recv_stderr(self, size):
        return self.err

    def close(self):
        self.closed = True


def _host_answering(monkeypatch, channel):
    from types import SimpleNamespace

    monkeypatch.setattr(lock.remote, "wrapped_command", lambda host, command: f"sudo -H -n sh -c {command!r}")
    transport = SimpleNamespace(open_session=lambda: channel)
    client = SimpleNamespace(get_transport=lambda: transport)
    return SimpleNamespace(name="box", connector=SimpleNamespace(client=client))


def test_the_lock_is_the_root_check_a_holder_that_is_not_root_lets_go_and_fails(monkeypatch):
    channel = _Channel(b"LOCKED uid=1000\n")
    host = _host_answering(monkeypatch, channel)
    with pytest.raises(lock.LockFailed, match="the deploy lock's command ran as uid=1000, not root"):
        lock.acquire(host, {"pid": 1})
    assert channel.closed and "box" not in lock._HELD  # the lock it took is let go at once
    assert channel.command.startswith("sudo -H -n sh -c ")  # wrapped like every command of ours


def test_a_refused_sudo_is_a_failed_lock_with_sudos_words_and_a_root_lock_is_held(monkeypatch):
    refused = _Channel(b"", b"sudo: a password is required\n")
    with pytest.raises(lock.LockFailed, match="could not take the deploy lock .*sudo: a password is required"):
        lock.acquire(_host_answering(monkeypatch, refused), {"pid": 1})
    held = _Channel(b"LOCKED uid=0\n")
    host = _host_answering(monkeypatch, held)
    assert lock.acquire(host, {"pid": 1}) == f"deploy lock {lock.LOCK_FILE} taken"
    assert lock._HELD.pop("box") is held and not held.closed


def test_a_user_other_than_root_takes_no_lock_and_writes_nothing(tmp_path):
    """Run as nobody where it could write the lock dir: the answer is NOTROOT and no file is made."""
    lock_dir = tmp_path / "run"
    lock_dir.mkdir(mode=0o777)
    lock_dir.chmod(0o777)
    tmp_path.chmod(0o755)
    if os.getuid() != 0:
        pytest.skip("needs root to run the command as another user")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                          lock.hold_command({"pid": 1}, str(lock_dir))],
                         input="", capture_output=True, text=True, timeout=10)
    assert (out.returncode, out.stdout.split()) == (5, ["NOTROOT", "uid=65534"])
    assert list(lock_dir.iterdir()) == []
    assert lock.answer_of(["Welcome to box", "LOCKED uid=0"]) == ["LOCKED", "uid=0"]  # a banner first


def test_the_lock_names_the_command_the_deploy_was_given_without_its_secrets(monkeypatch):
    from types import SimpleNamespace

    import pyinfra

    from vllm_fleet.deploy import RunOptions

    monkeypatch.setattr(pyinfra, "is_cli", True)  # the command line is pyinfra's
    argv = ["-y", "inventory/prod.py", "deploy.py", "--ssh-password", "pw1", "--limit", "gpu-a100-01"]
    options = RunOptions.from_pyinfra_cli(argv, SimpleNamespace(limit_hosts=None))
    assert options.command == "pyinfra -y inventory/prod.py deploy.py --ssh-password <hidden> --limit gpu-a100-01"
    assert lock.this_owner(options.command)["command"] == options.command
