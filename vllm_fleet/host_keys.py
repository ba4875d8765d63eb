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

from vllm_fleet.config import HostConfig

SEED_FILE = "host-key-seed"


def seed_path(config: HostConfig) -> Path:
    return Path(config.settings.vllm_workstation_dir).expanduser() / SEED_FILE


def _seed(path: Path) -> bytes:
    """The seed, created once (O_EXCL: two deploys starting together agree on the first one)."""
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return bytes.fromhex(path.read_text().strip())
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return bytes.fromhex(path.read_text().strip())


def host_key(config: HostConfig) -> str:
    """The host's key: 64 hex digits (the same in any quoting: env file, nginx, HTTP)."""
    digest = hmac.new(_seed(seed_path(config)), b"vllm-fleet host key\0" + config.name.encode(), hashlib.sha256)
    return "vf-host-" + digest.hexdigest()
