"""A dropped SSH connection fails that host, with a message, instead of stopping the whole run.

pyinfra 3.10 counts an OSError or SSHException from an SSH command as that host's failure (the host
is reported failed, the other hosts go on). But paramiko reports a connection that died under it
(sshd killed, the host rebooted, the network reset) as a bare EOFError, which pyinfra does not catch:
the run ends with "An internal exception occurred" and no host named. `install()` wraps the SSH
connector's three ways of reaching a host so that a lost connection (EOFError, a reset or broken
socket, an SSHException from a transport that is no longer active) becomes one ConnectionResetError
(an OSError) that names the host and says what to do. Imported by vllm_fleet.deploy, so every run of
deploy.py (pyinfra's CLI, `vllm-fleet rollout`) has it.
"""

from __future__ import annotations

import functools

from paramiko import SSHException
from pyinfra.connectors.ssh import SSHConnector

_MARK = "_vllm_fleet_converts_eof"


def _lost(host_name: str) -> ConnectionResetError:
    return ConnectionResetError(
        f"the SSH connection to {host_name} was lost (sshd ended the session, the host rebooted or "
        "the network dropped); what ran before stays, the rest did not run: run the deploy again "
        "once the host is reachable, it converges from there")


def _converting(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except (EOFError, ConnectionError) as exc:  # EOF, or a reset/broken pipe on the socket
            raise _lost(self.host.name) from exc
        except SSHException as exc:  # "SSH session not active": the transport died before
            client = getattr(self, "client", None)
            transport = client.get_transport() if client is not None else None
            if transport is None or not transport.is_active():
                raise _lost(self.host.name) from exc
            raise

    setattr(wrapper, _MARK, True)
    return wrapper


def install() -> None:
    """Idempotent: wraps SSHConnector.run_shell_command, put_file and get_file once."""
    for name in ("run_shell_command", "put_file", "get_file"):
        method = getattr(SSHConnector, name)
        if not getattr(method, _MARK, False):
            setattr(SSHConnector, name, _converting(method))
