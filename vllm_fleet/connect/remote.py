"""How vllm-fleet runs its own commands on a host: always with the host's pyinfra connection arguments.

pyinfra applies `_sudo`, `_sudo_user`, `_sudo_password`, `_su_user`, `_doas`, `_shell_executable`, ...
(from the inventory's host or group data) to its operations and facts. Commands vllm-fleet runs itself
(the deploy lock, verification, `status`, rollout's snapshot and restore, `unlock`) go through here,
so they get exactly the same wrapping: pyinfra's own `pop_global_arguments` reads the host's data
and pyinfra's own `make_unix_command_for_host` builds the sudo/su/doas command line, as it does for
a fact. A login user that needs sudo (the usual production setup) then works everywhere or nowhere.
"""

from __future__ import annotations

import shlex
from typing import Any

from pyinfra.api import FileUploadCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.command import StringCommand
from pyinfra.connectors.util import make_unix_command_for_host

# Without privilege wrapping: as the login user itself. An upload goes over SFTP as the login user:
# with these, pyinfra sends it straight to the path given instead of to /tmp followed by a
# privileged copy (a second full write of a 600 MB tarball or a 10 GB shard, on a /tmp that may be
# too small; and a secret would sit in /tmp meanwhile).
AS_LOGIN_USER = {"_sudo": False, "_doas": False, "_dzdo": False, "_su_user": ""}

# Connector arguments that control the channel, not the command line: we set these per call.
_PER_CALL = {"_timeout", "_stdin", "_success_exit_codes", "_get_pty", "_retries", "_retry_delay",
             "_retry_until"}


def connection_arguments(host) -> dict[str, Any]:
    """The host's privilege and shell arguments (`_sudo`, `_su_user`, `_doas`, ...), as pyinfra's
    facts receive them: host data over config defaults, read by pyinfra's own code. Inside an
    operation (a python.call at execution) they are that operation's own, which include what its
    @deploy was called with (`vllm_fleet_deploy(_sudo=True)`): the deploy's context is gone by then."""
    arguments = getattr(host, "current_op_global_arguments", None)
    if not arguments:
        arguments, _found = pop_global_arguments(host.state, host, {})
    return {key: value for key, value in arguments.items()
            if key in CONNECTOR_ARGUMENT_KEYS and key not in _PER_CALL}


def run(host, command: str, timeout: int | None = None) -> tuple[bool, str, str]:
    """Run a shell command on a connected host with its connection arguments: (ok, stdout, stderr).
    Nothing is printed (the command may read a secret on the host; its output is ours to show)."""
    extra: dict[str, Any] = {"_timeout": timeout} if timeout else {}
    ok, output = host.run_shell_command(StringCommand(command), print_output=False, print_input=False,
                                        **connection_arguments(host), **extra)
    return ok, output.stdout, output.stderr


def wrapped_command(host, command: str) -> str:
    """The exact command line pyinfra would send for `command` on this host (sudo/su/doas applied),
    for the few places that need a channel of their own (the deploy lock holds one open)."""
    unix_command = make_unix_command_for_host(host.state, host, StringCommand(command),
                                              **connection_arguments(host))
    return unix_command.get_raw_value()


def privilege_check(host, command: str = "id -u", timeout: int = 60) -> tuple[bool, str]:
    """Run `command` wrapped exactly as pyinfra would (sudo/su/doas), but never let pyinfra stop to
    ask for a sudo password on the terminal (with no terminal that prompt dies in an EOFError, and
    a CI run or a 50-host deploy has no one to type it): (ok, its output and what sudo/su/doas said)."""
    marker = "vllm-fleet-exit="
    probe = (f"{{ {wrapped_command(host, command)}; echo {marker}$?; }} 2>&1 | "
             "sed 's/^/out: /'")  # prefixed: pyinfra's prompt trigger is an exact, unprefixed line
    _ok, output = host.run_shell_command(StringCommand(probe), print_output=False, print_input=False,
                                         _timeout=timeout, **AS_LOGIN_USER)
    lines = [ln.removeprefix("out: ") for ln in output.stdout.splitlines()]
    code = next((ln.removeprefix(marker) for ln in lines if ln.startswith(marker)), "")
    return code == "0", "\n".join(ln for ln in lines if not ln.startswith(marker))


def login_user(host) -> str | None:
    """Who the SSH connection logged in as: the transport's own answer (right under _su_user too,
    and when ssh_user comes from ~/.ssh/config), else the inventory's ssh_user."""
    client = getattr(getattr(host, "connector", None), "client", None)
    transport = client.get_transport() if client is not None else None
    name = transport.get_username() if transport is not None else None
    return name or host.data.get("ssh_user")


def login_owner(user: str | None) -> str:
    """The login user for a privileged `chown`/`install -o`: `user` (login_user()), else who
    sudo/doas says called it."""
    return shlex.quote(user) if user else '"${SUDO_USER:-${DOAS_USER:-$(id -un)}}"'


def upload_commands(host, src, staging_dir: str, name: str):
    """Commands that upload `src` (a workstation path or a file object) to STAGING_DIR/NAME.

    STAGING_DIR is created (with the host's privileges) as a 0700 directory owned by the login user,
    who then writes into it directly; put it on the same filesystem as the file's final place, so
    the caller's privileged `mv` into place is a rename. Yields the commands, returns the path.
    """
    path = f"{staging_dir}/{name}"
    yield (f"install -d -m 0700 -o {login_owner(login_user(host))} {shlex.quote(staging_dir)} "
           f"&& rm -f {shlex.quote(path)}")
    yield FileUploadCommand(src, path, remote_temp_filename=path, **AS_LOGIN_USER)
    return path
