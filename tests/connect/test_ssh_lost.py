"""A dropped SSH connection is that host's failure (an OSError pyinfra handles), not a crash."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from paramiko import SSHException
from pyinfra.connectors.ssh import SSHConnector

from vllm_fleet.connect import ssh_lost


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
        get_transport=lambda: SimpleNamespace(is_active=lambda: False, saved_exception=EOFError())))
    with pytest.raises(ConnectionResetError, match="the SSH connection to gpu1 was lost"):
        ssh_lost._converting(inactive)(dead, "true")
    alive = SimpleNamespace(host=dead.host, client=SimpleNamespace(
        get_transport=lambda: SimpleNamespace(is_active=lambda: True, saved_exception=None)))
    with pytest.raises(SSHException, match="not active"):  # a live transport: not ours to rename
        ssh_lost._converting(inactive)(alive, "true")
    ok = ssh_lost._converting(lambda self, command: (True, command))
    assert ok(SimpleNamespace(host=None), "x") == (True, "x")  # everything else passes through


def test_a_command_that_failed_because_the_connection_died_says_so():
    """sshd killed mid-command: paramiko closes the channel (no exit status, no exception), and the
    transport thread has recorded why just before. That failure names the lost connection; a plain
    failing command on a live connection stays a plain failure."""
    host = SimpleNamespace(name="gpu1")
    failing = ssh_lost._converting(lambda self, command: (False, "output"))
    uploading = ssh_lost._converting(lambda self, src, dest: False)
    # The channel closed, the transport still flagged active: saved_exception is already set.
    dying = SimpleNamespace(host=host, client=SimpleNamespace(
        get_transport=lambda: SimpleNamespace(is_active=lambda: True, saved_exception=EOFError())))
    with pytest.raises(ConnectionResetError, match="the SSH connection to gpu1 was lost"):
        failing(dying, "cp a b")
    with pytest.raises(ConnectionResetError, match="the SSH connection to gpu1 was lost"):
        uploading(dying, "a", "b")
    alive = SimpleNamespace(host=host, client=SimpleNamespace(
        get_transport=lambda: SimpleNamespace(is_active=lambda: True, saved_exception=None)))
    assert failing(alive, "false") == (False, "output")
    assert uploading(alive, "a", "b") is False


def test_install_wraps_each_ssh_method_once():
    ssh_lost.install()
    first = {name: getattr(SSHConnector, name) for name in ("run_shell_command", "put_file", "get_file")}
    ssh_lost.install()
    for name, method in first.items():
        assert getattr(SSHConnector, name) is method
        assert getattr(method, ssh_lost._MARK)
        assert not getattr(method.__wrapped__, ssh_lost._MARK, False)


def test_the_wrapper_sits_on_the_connector_pyinfras_registry_uses():
    """Fails when a pyinfra upgrade undoes the patch: another class for "ssh", or other signatures."""
    import inspect

    from pyinfra.api.connectors import get_execution_connector

    from vllm_fleet import deploy

    deploy.install()  # as deploy.py, rollout and the packaged deploy itself do
    cls = get_execution_connector("ssh")
    assert cls is SSHConnector and ssh_lost.ssh_connector() is cls
    assert ssh_lost.installed(cls)
    for name, params in ssh_lost.WRAPPED.items():
        method = cls.__dict__[name]
        assert getattr(method, ssh_lost._MARK)
        assert tuple(inspect.signature(method.__wrapped__).parameters) == params
        assert tuple(inspect.signature(method).parameters) == params  # the wrapper looks the same
    ssh_lost.check_pyinfra(cls)


def test_a_host_of_an_inventory_reports_a_lost_connection_by_name():
    """Through pyinfra's own Inventory -> Host -> connector: paramiko's EOFError names the host."""
    from pyinfra.api import Config, Inventory, State
    from pyinfra.api.command import StringCommand
    from pyinfra.context import ctx_state

    ssh_lost.install()
    inventory = Inventory((["gpu1"], {}))
    state = State(inventory, Config())
    host = inventory.get_host("gpu1")
    assert type(host.connector) is SSHConnector

    class DeadClient:
        def exec_command(self, *_args, **_kwargs):
            raise EOFError()

        def get_transport(self):
            return None

    host.connector.client = DeadClient()
    with ctx_state.use(state), pytest.raises(ConnectionResetError, match="connection to gpu1 was lost"):
        host.connector.run_shell_command(StringCommand("true"))


def test_check_pyinfra_refuses_a_connector_it_was_not_written_for():
    class Changed:
        def run_shell_command(self, command, *, timeout=None):
            pass

    with pytest.raises(RuntimeError, match="run_shell_command.*differs.*update it"):
        ssh_lost.check_pyinfra(Changed)

    class Missing:
        pass

    with pytest.raises(RuntimeError, match="no longer defines run_shell_command"):
        ssh_lost.check_pyinfra(Missing)
    assert not ssh_lost.installed(Missing)
