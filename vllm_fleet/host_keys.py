"""Each host's own API key: what its vLLM instances require, and what its front sends them.

Clients never hold it. The front checks a client's key (vllm_api_clients) and passes the request on
with this one, so adding, rotating or revoking a client changes the front's key file only (an nginx
reload), never vLLM's environment (a restart). The host's verification and `vllm-fleet status` use it
on the host, read from an instance's root-only env file; it never leaves the host except in the
deploy's own upload.

It is derived, not stored per host: HMAC-SHA256 of the host's name under a seed the workstation keeps
(`<vllm_workstation_dir>/host-key-seed`, 0600, created by the first deploy). The same seed gives the
same keys on every deploy, so nothing restarts; a team that deploys one fleet from several
workstations shares that directory (as it shares the fleet CA next to it).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path

from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig
from vllm_fleet.workstation_files import SEED_MAX_BYTES, UnsafeFile, directory_problem, ensure_directory, read_file, shown

SEED_FILE = "host-key-seed"
_SEED_FIX = ("restore it from the workstation that made it; or remove it, and the next deploy makes a new one "
             "(every host gets a new key: each instance restarts once)")


def seed_path(config: HostConfig) -> Path:
    return Path(config.settings.vllm_workstation_dir).expanduser() / SEED_FILE


def workstation_dir_error(config: HostConfig, create: bool) -> ConfigError | None:
    """vllm_workstation_dir as it must be to hold keys: the user's, writable by no one else; made
    (0700) when missing if `create`. None when it serves."""
    directory = Path(config.settings.vllm_workstation_dir).expanduser()
    try:
        if create:
            ensure_directory(directory)
        else:
            problem = directory_problem(directory)
            if problem:
                raise UnsafeFile(*problem)
    except UnsafeFile as exc:
        return ConfigError(f"the workstation's directory {shown(directory)} {exc.problem}", host=config.name,
                           key="vllm_workstation_dir", fix=exc.fix)
    except OSError as exc:
        return ConfigError(f"the workstation's directory {shown(directory)} cannot be made ({exc.strerror})",
                           host=config.name, key="vllm_workstation_dir",
                           fix="point vllm_workstation_dir at a directory this user can create or write")
    return None


def read_seed(config: HostConfig, create: bool) -> bytes | None:
    """The seed (32 bytes), read safely (workstation_files.read_file: the user's own regular file,
    not a link, readable and writable by no other user). Missing: made once if `create` (O_EXCL: two
    deploys starting together agree on the first one), else None. ConfigErrors otherwise."""
    error = workstation_dir_error(config, create)
    if error:
        raise ConfigErrors([error])
    path = seed_path(config)
    if not os.path.lexists(path):
        if not create:
            return None
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigErrors([ConfigError(f"the seed of the hosts' keys cannot be made in {shown(path.parent)} "
                                            f"({exc.strerror})", host=config.name, key="vllm_workstation_dir",
                                            fix="make vllm_workstation_dir a directory this user can write")]) from None
        else:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
    try:
        text = read_file(path, limit=SEED_MAX_BYTES, private=True).decode("ascii").strip()
        seed = bytes.fromhex(text)
        if len(seed) != 32:
            raise ValueError
    except UnsafeFile as exc:
        raise ConfigErrors([ConfigError(f"the seed of the hosts' keys {shown(path)} {exc.problem}", host=config.name,
                                        key="vllm_workstation_dir", fix=exc.fix)]) from None
    except ValueError:  # UnicodeDecodeError included
        raise ConfigErrors([ConfigError(f"the seed of the hosts' keys {shown(path)} does not hold 64 hex digits",
                                        host=config.name, key="vllm_workstation_dir", fix=_SEED_FIX)]) from None
    return seed


def host_key(config: HostConfig) -> str:
    """The host's key: 64 hex digits (the same in any quoting: env file, nginx, HTTP). The seed is
    made on the first call (read_seed). ConfigErrors: the workstation's directory or seed refused."""
    digest = hmac.new(read_seed(config, create=True), b"vllm-fleet host key\0" + config.name.encode(), hashlib.sha256)
    return "vf-host-" + digest.hexdigest()
