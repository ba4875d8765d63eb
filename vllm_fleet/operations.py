"""pyinfra operations of vllm-fleet: the Python environment and the secret env file.

Everything else the deploy does uses pyinfra's own operations (files, server, systemd).
"""

from __future__ import annotations

import hashlib
import io
import shlex
import tarfile
import tempfile
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FileUploadCommand, operation

from vllm_fleet import envbuild
from vllm_fleet.facts import FileSha256, LinkTarget, PathsPresent


@operation()
def secret_file(dest: str, content: str, staging_dir: str):
    """
    Write a root-only (0600) file whose contents are secret. Unlike ``files.put``, it never shows
    the contents: not in ``--diff``, not in ``--debug``; the change is detected by sha256.

    + dest: path on the host
    + content: the file's text
    + staging_dir: a root-only (0700) directory on the same filesystem for the upload

    **Example:**

    .. code:: python

        secret_file(name="API key", dest="/etc/vllm-fleet/gemma.env",
                    content="VLLM_API_KEY=...\\n", staging_dir="/etc/vllm-fleet/.staging")
    """
    wanted = hashlib.sha256(content.encode()).hexdigest()
    if host.get_fact(FileSha256, path=dest) == wanted:
        host.noop(f"{dest} is up to date")
        return
    logger.info(f"{host.print_prefix}Will write {dest} (secret: contents not shown)")
    staged = f"{staging_dir}/{Path(dest).name}.upload"
    q = shlex.quote
    yield f"install -d -m 0700 -o root -g root {q(staging_dir)} && rm -f {q(staged)}"
    yield FileUploadCommand(io.BytesIO(content.encode()), staged, remote_temp_filename=staged + ".tmp")
    yield f"chown root:root {q(staged)} && chmod 0600 {q(staged)} && mv -f {q(staged)} {q(dest)}"


def wheelhouse_tarball(wheelhouse: Path) -> Path:
    """One uncompressed tar of a wheelhouse (wheels are zips already), cached beside it."""
    target = wheelhouse.parent / f"{wheelhouse.name}.tar"
    if not target.exists():
        with tempfile.NamedTemporaryFile(dir=wheelhouse.parent, delete=False, suffix=".part") as tmp:
            with tarfile.open(fileobj=tmp, mode="w") as tar:
                for path in sorted(wheelhouse.iterdir()):
                    tar.add(path, arcname=path.name)
        Path(tmp.name).rename(target)
    return target


@operation()
def vllm_environment(spec: envbuild.EnvSpec, root: str, wheelhouse: str | None):
    """
    Build the Python environment for ``spec`` aside, from a pushed wheelhouse, then switch the
    ``current`` link to it atomically. An existing complete environment is never rebuilt; the one
    ``current`` pointed to before becomes ``previous`` (for rollback).

    + spec: the environment spec (target, vLLM version, extra packages, Python)
    + root: vllm-fleet's root on the host (envs/ and wheelhouse/ live under it)
    + wheelhouse: a `vllm-fleet bundle` directory on the workstation

    **Example:**

    .. code:: python

        vllm_environment(name="vLLM environment", spec=EnvSpec("cpu", "0.32.0"),
                         root="/opt/vllm-fleet", wheelhouse="~/.cache/vllm-fleet/wheelhouse/cpu-...")
    """
    final = envbuild.env_dir(spec, root)
    marker = f"{final}/{envbuild.ENV_MARKER}"
    current = envbuild.current_link(root)
    present = host.get_fact(PathsPresent, paths=(marker,))
    if not present.get(marker):
        if not wheelhouse:
            raise ValueError(
                f"host {host.name}: the environment {final} must be built but vllm_wheelhouse is "
                "not set; build one with `vllm-fleet bundle` and set vllm_wheelhouse to its path")
        local = Path(wheelhouse).expanduser()
        dest = envbuild.wheelhouse_dest(local.name, root)
        q = shlex.quote
        tarball = wheelhouse_tarball(local)
        remote_tar = f"{root}/wheelhouse/.{local.name}.tar"
        yield f"mkdir -p {q(root + '/wheelhouse')} {q(envbuild.envs_root(root))}"
        yield FileUploadCommand(str(tarball), remote_tar, remote_temp_filename=remote_tar + ".part")
        yield (f"rm -rf {q(dest)}.part && mkdir -p {q(dest)}.part && tar -xf {q(remote_tar)} -C "
               f"{q(dest)}.part && rm -rf {q(dest)} && mv -T {q(dest)}.part {q(dest)} && rm -f {q(remote_tar)}")
        yield from envbuild.build_env_commands(spec, dest, root)
    if host.get_fact(LinkTarget, path=current) != spec.name or not present.get(marker):
        yield from envbuild.switch_current_commands(spec, root)

