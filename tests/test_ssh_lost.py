"""A dropped SSH connection is that host's failure (an OSError pyinfra handles), not a crash."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from paramiko import SSHException
from pyinfra.connectors.ssh import SSHConnector

from vllm_fleet import ssh_lost


def test_eof_from_paramiko_becomes_a_connection_error_naming_the_host():
    def dropped(self, command):
        raise EOFError()  # what paramiko raises when the transport died under an open_session

    wrapped = ssh_lost._converting(dropped)
    with pytest.raises(ConnectionResetError, match="the SSH connection to gpu1 was lost") as info:
        wrapped(SimpleNamespace(host=SimpleNamespace(name="gpu1")), "true")
    assert isinstance(info.value, OSError)  # pyinfra fails the host on OSError, and goes on
    assert "run the deploy again" in str(info.value)
    for error in (ConnectionResetError(104, "Connection reset by peer"), BrokenPipeError()):
        def reset(self, command, error=error):
            raise error
        with pytest.raises(ConnectionResetError, match="the SSH connection to gpu1 was lost"):
            ssh_lost._converting(reset)(SimpleNamespace(host=SimpleNamespace(name="gpu1")), "true")

    def inactive(self, command):
        raise SSHException("SSH session not active")
    dead = SimpleNamespace(host=SimpleNamespace(name="gpu1"), client=SimpleNamespace(
        get_transport=lambda: SimpleNamespace(is_active=lambda: False)))
    with pytest.raises(ConnectionResetError, match="the SSH connection to gpu1 was lost"):
        ssh_lost._converting(inactive)(dead, "true")
    alive = SimpleNamespace(host=dead.host, client=SimpleNamespace(
        get_transport=lambda: SimpleNamespace(is_active=lambda: True)))
    with pytest.raises(SSHException, match="not active"):  # a live transport: not ours to rename
        ssh_lost._converting(inactive)(alive, "true")
    ok = ssh_lost._converting(lambda self, command: (True, command))
    assert ok(SimpleNamespace(host=None), "x") == (True, "x")  # everything else passes through


def test_install_wraps_each_ssh_method_once():
    ssh_lost.install()
    first = {name: getattr(SSHConnector, name) for name in ("run_shell_command", "put_file", "get_file")}
    ssh_lost.install()
    for name, method in first.items():
        assert getattr(SSHConnector, name) is method
        assert getattr(method, ssh_lost._MARK)
        assert not getattr(method.__wrapped__, ssh_lost._MARK, False)
