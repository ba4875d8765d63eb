"""README.md's set-up lines work as written: run verbatim, in a fresh clone, with nothing but the OS's
PATH; and bin/setup tells a venv it finished from one an interrupted run left behind."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
READY = ".vllm-fleet-setup-done"  # bin/setup's marker, written last


def readme_setup_lines() -> str:
    """README.md's shell block that starts with `bin/setup`, as it is written there."""
    blocks = re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    matching = [block for block in blocks if block.startswith("bin/setup")]
    assert len(matching) == 1, "README.md has one ```sh block that starts with bin/setup"
    return matching[0]


def test_readme_names_the_commands_its_setup_promises() -> None:
    commands = [line.split("#")[0].strip() for line in readme_setup_lines().splitlines()]
    assert commands == ["bin/setup", ". .venv/bin/activate", "vllm-fleet --help", "pyinfra --version"]


def test_readme_setup_lines_run_verbatim_in_a_fresh_clone(tmp_path: Path) -> None:
    """A new user's clone (HEAD's committed files), the README's lines in one shell with only the
    OS's PATH: every line succeeds, and `vllm-fleet` and `pyinfra` come from the clone's own .venv,
    whose `activate` and scripts name the path it lives at."""
    clone = tmp_path / "vllm-fleet"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, capture_output=True,
                   timeout=120)
    # Nothing of a venv comes with the clone (a committed .venv link would name someone else's).
    assert not (clone / ".venv").exists() and not (clone / ".venv").is_symlink()
    lines = readme_setup_lines()
    script = lines + 'echo "@@which"; command -v vllm-fleet pyinfra\n'
    try:
        # HOME as it is (pip's own download cache, pip.conf), nothing else from this environment.
        proc = subprocess.run(["bash", "-e", "-c", script], cwd=clone, capture_output=True, text=True,
                              timeout=600, env={"HOME": os.environ.get("HOME", "/root"), "PATH": OS_PATH})
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"README.md's set-up lines failed ({proc.returncode}):\n{lines}\n{output[-4000:]}"
        assert re.search(r"^usage: vllm-fleet ", proc.stdout, re.M), output[-2000:]
        assert re.search(r"^pyinfra: v\d+\.\d+", proc.stdout, re.M), output[-2000:]
        venv = clone / ".venv"
        assert proc.stdout.split("@@which\n", 1)[1].split() == [str(venv / "bin" / "vllm-fleet"),
                                                               str(venv / "bin" / "pyinfra")]
        assert f"VIRTUAL_ENV={venv}\n" in (venv / "bin" / "activate").read_text() \
            or f"VIRTUAL_ENV='{venv}'\n" in (venv / "bin" / "activate").read_text()
        shebangs = {path.name: path.read_bytes().split(b"\n", 1)[0].decode()
                    for path in (venv / "bin").iterdir() if path.is_file() and path.read_bytes()[:2] == b"#!"}
        assert shebangs and all(line.startswith(f"#!{venv}/bin/python") for line in shebangs.values()), shebangs
        assert (venv / READY).exists()
    finally:
        shutil.rmtree(tmp_path / "vllm-fleet", ignore_errors=True)


STAND_IN_PYTHON = r"""#!/bin/bash
# Stands in for python3 (and, once copied into a venv, for its python): answers what bin/setup asks
# and records each pip install in $STANDIN_LOG; VENV_STANDIN_FAIL_PIP=1 makes the install fail.
case "$*" in
  --version) echo "Python 3.11.2" ;;
  "-c import ensurepip, venv") ;;
  "-m venv "*) mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && echo "home = stand-in" > "$3/pyvenv.cfg" ;;
  "-m pip config list") ;;
  "-m pip install"*) echo "pip install" >> "$STANDIN_LOG"; [ "${VENV_STANDIN_FAIL_PIP:-}" != 1 ] ;;
  *) echo "unexpected: $*" >&2; exit 3 ;;
esac
"""


def _setup(venv: Path, python: Path, log: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(ROOT / "bin" / "setup")], capture_output=True, text=True, timeout=60,
        env={"HOME": os.environ.get("HOME", "/root"), "PATH": OS_PATH, "VLLM_FLEET_VENV": str(venv),
             "VLLM_FLEET_PYTHON": str(python), "STANDIN_LOG": str(log), **env})


def test_setup_remakes_a_venv_an_interrupted_run_left_and_keeps_a_finished_one(tmp_path: Path) -> None:
    """bin/setup with a stand-in python (no real venv or pip): a venv without the marker (here: what
    a run stopped during its install leaves) is removed and made again; the marker is written only
    once the install succeeded; a finished venv is kept and only reinstalled into."""
    python = tmp_path / "python3"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    venv, log = tmp_path / "venv", tmp_path / "pip.log"
    venv.mkdir()
    (venv / "bin").mkdir()
    (venv / "bin" / "python").symlink_to(python)
    (venv / "left-by-an-interrupted-run").write_text("")

    failed = _setup(venv, python, log, VENV_STANDIN_FAIL_PIP="1")
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert "did not finish" in failed.stdout and not (venv / "left-by-an-interrupted-run").exists()
    assert not (venv / READY).exists(), "a failed install must not look finished"

    done = _setup(venv, python, log)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "did not finish" in done.stdout and "creating the virtual environment" in done.stdout
    assert (venv / READY).exists()

    (venv / "kept").write_text("")
    again = _setup(venv, python, log)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "did not finish" not in again.stdout and "creating" not in again.stdout
    assert (venv / "kept").exists() and (venv / READY).exists()
    assert log.read_text().splitlines() == ["pip install"] * 3


def test_setup_replaces_a_venv_that_is_a_link_to_elsewhere(tmp_path: Path) -> None:
    """A .venv that is a symbolic link (to another checkout's venv, or to nothing) is not this
    checkout's: bin/setup removes the link, never what it points to, and makes the venv in its place."""
    python = tmp_path / "python3"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "theirs").write_text("")
    for target in (elsewhere, tmp_path / "nothing-here"):
        venv, log = tmp_path / "venv", tmp_path / "pip.log"
        venv.symlink_to(target)
        done = _setup(venv, python, log)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "did not finish" in done.stdout and "creating the virtual environment" in done.stdout
        assert not venv.is_symlink() and (venv / READY).exists()
        assert (elsewhere / "theirs").exists() and not (elsewhere / READY).exists()
        shutil.rmtree(venv)
