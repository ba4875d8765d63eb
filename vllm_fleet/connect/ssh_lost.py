"""A dropped SSH connection fails that host, with a message, instead of stopping the whole run.

pyinfra 3.10 counts an OSError or SSHException from an SSH command as that host's failure (the host
is reported failed, the other hosts go on). But paramiko reports a connection that died under it
(sshd killed, the host rebooted, the network reset) as a bare EOFError, which pyinfra does not catch:
the run ends with "An internal exception occurred" and no host named. `install()` wraps the SSH
connector's three ways of reaching a host so that a lost connection (EOFError, a reset or broken
socket, an SSHException from a transport that is no longer active) becomes one ConnectionResetError
(an OSError) that names the host and says what to do. Importing this changes nothing:
vllm_fleet.deploy.install() calls install(), and the packaged deploy calls that as it runs, so every
run of it (the root deploy.py, a team's own deploy file, `vllm-fleet rollout`) has it.
"""

from __future__ import annotations

import functools
import inspect

from paramiko import SSHException
from pyinfra.api.connectors import get_execution_connector

_MARK = "_vllm_fleet_converts_eof"
# The SSH connector methods wrapped, with the parameters pyinfra 3.10 gives them. pyinfra offers no
# hook for a connector's errors (a connector is chosen by name from the `pyinfra.connectors` entry
# points; a subclass would need its own `@name/` in every inventory), so this is a patch, the only one,
# kept here. install() refuses a pyinfra whose methods differ, and tests/connect/test_ssh_lost.py checks the
# wrapper sits on the class pyinfra's registry returns for "ssh": an upgrade cannot undo it silently.
WRAPPED = {
    "run_shell_command": ("self", "command", "print_output", "print_input", "arguments"),
    "put_file": ("self", "filename_or_io", "remote_filename", "remote_temp_filename", "print_output",
                 "print_input", "arguments"),
    "get_file": ("self", "remote_filename", "filename_or_io", "remote_temp_filename", "print_output",
                 "print_input", "arguments"),
}


def ssh_connector() -> type:
    """The class pyinfra connects a plain host name (and `@ssh/...`) with: its registry's "ssh"."""
    return get_execution_connector("ssh")


def _lost(host_name: str) -> ConnectionResetError:
    return ConnectionResetError(
        f"the SSH connection to {host_name} was lost (sshd ended the session, the host rebooted or "
        "the network dropped); what ran before stays, the rest did not run: run the deploy again "
        "once the host is reachable, it converges from there")


def transport_gone(connector) -> bool:
    """The connection under this connector is dead. paramiko records why (saved_exception) BEFORE it
    closes the channels, so a command that just failed because its channel closed sees it set."""
    client = getattr(connector, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is None or not transport.is_active() or transport.saved_exception is not None


def _failed(result) -> bool:
    """run_shell_command returns (ok, output); put_file and get_file return ok."""
    return result is False or (isinstance(result, tuple) and bool(result) and result[0] is False)


def _converting(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            result = method(self, *args, **kwargs)
        except (EOFError, ConnectionError) as exc:  # EOF, or a reset/broken pipe on the socket
            raise _lost(self.host.name) from exc
        except SSHException as exc:  # "SSH session not active": the transport died before
            if transport_gone(self):
                raise _lost(self.host.name) from exc
            raise
        # A command whose channel closed because sshd went away comes back as a plain failure (no
        # exit status, no exception): without this the host fails with no word of why.
        if _failed(result) and getattr(self, "client", None) is not None and transport_gone(self):
            raise _lost(self.host.name)
        return result

    setattr(wrapper, _MARK, True)
    return wrapper


def _unwrapped(method):
    return method.__wrapped__ if getattr(method, _MARK, False) else method


def check_pyinfra(cls: type | None = None) -> None:
    """Raise RuntimeError when pyinfra's SSH connector is not the one this patch was written for."""
    cls = cls or ssh_connector()
    for name, params in WRAPPED.items():
        method = cls.__dict__.get(name)
        if method is None:
            raise RuntimeError(f"pyinfra's SSH connector {cls.__module__}.{cls.__qualname__} no longer "
                               f"defines {name}: update vllm_fleet/connect/ssh_lost.py for this pyinfra")
        found = tuple(inspect.signature(_unwrapped(method)).parameters)
        if found != params:
            raise RuntimeError(f"pyinfra's {cls.__qualname__}.{name}{found} differs from what "
                               f"vllm_fleet/connect/ssh_lost.py wraps {params}: update it for this pyinfra")


def installed(cls: type | None = None) -> bool:
    """Whether every wrapped method of the connector pyinfra uses for SSH carries the wrapper."""
    cls = cls or ssh_connector()
    return all(getattr(cls.__dict__.get(name), _MARK, False) for name in WRAPPED)


def install() -> None:
    """Idempotent: wraps run_shell_command, put_file and get_file of pyinfra's SSH connector once,
    for the whole process (vllm_fleet.deploy.install)."""
    cls = ssh_connector()
    check_pyinfra(cls)
    for name in WRAPPED:
        method = cls.__dict__[name]
        if not getattr(method, _MARK, False):
            setattr(cls, name, _converting(method))
