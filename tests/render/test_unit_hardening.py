"""The systemd units' hardening, offline: every kind of unit vllm-fleet renders (an instance's vLLM,
the front, the gateway, a Ray head and a Ray worker) goes through `systemd-analyze security
--offline=yes`, whose exposure scores are reported and held to a target per kind, and through
`systemd-analyze verify`, which must find nothing to say. systemd-analyze (systemd 252 on Debian 12)
is required, not optional: without it the hardening would go unchecked, so these tests fail, not skip."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from support.figures import report
from support.gateway_fleet import gateway_render
from support.planning_fixtures import rendered_fleet, two_servers
from vllm_fleet.host_layout import GATEWAY_UNIT
from vllm_fleet.host_layout import FRONT_UNIT, RAY_UNIT, UNIT_DIR

# The most exposure each kind of unit may score (0.0: fully sandboxed, 10.0: not at all). vLLM and
# Ray keep the GPUs, JIT-compiled code and the host's network; the front and the gateway need only
# the network.
# What each kind of unit may score at most: the units score 3.3 (vLLM), 3.2 (Ray), 1.4 (front) and
# 1.3 (gateway); a change that loosens one fails here, well inside the limits asked of them
# (vLLM and Ray <= 7.0, the front and the gateway <= 4.5).
EXPOSURE_TARGETS = {"vllm": 3.5, "ray": 3.5, "front": 1.6, "gateway": 1.6}
KIND_OF_UNIT = {FRONT_UNIT: "front", GATEWAY_UNIT: "gateway", RAY_UNIT: "ray"}
# The host units this module renders: the CPU host that is the fleet's gateway (its instance `a`,
# front and gateway) and both nodes of a multi-node instance (the head's vLLM, Ray head and front;
# the worker's Ray).
GATEWAY_HOST, HEAD, WORKER = "h1", "gpu-a", "gpu-b"
SYSTEM_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")
EXEC_COMMAND = re.compile(r"^Exec\w*=[-@:+!]*(\S+)", re.MULTILINE)
OVERALL_EXPOSURE = re.compile(r"Overall exposure level for \S+: (\d+\.\d+)")


def unit_kind(name: str) -> str:
    if name in KIND_OF_UNIT:
        return KIND_OF_UNIT[name]
    assert re.fullmatch(r"vllm-[\w.-]+\.service", name), f"{name}: a unit of no known kind"
    return "vllm"


def host_units() -> dict[str, dict[str, str]]:
    """{host: {unit file name: content}} of the hosts above."""
    files = {GATEWAY_HOST: {path: f.content for path, f in gateway_render().items()},
             **rendered_fleet(two_servers())}
    units = {host: {Path(path).name: content for path, content in host_files.items()
                    if path.startswith(UNIT_DIR + "/")}
             for host, host_files in files.items()}
    assert set(units) == {GATEWAY_HOST, HEAD, WORKER}
    return units


def system_unit_dir() -> Path:
    for candidate in SYSTEM_UNIT_DIRS:
        if (Path(candidate) / "multi-user.target").is_file():
            return Path(candidate)
    pytest.fail(f"no systemd system units on this machine (none of {', '.join(SYSTEM_UNIT_DIRS)} has "
                "multi-user.target): these tests need systemd's own units (Debian: apt-get install systemd)")


def host_root(root: Path, units: dict[str, str]) -> Path:
    """A file system root for systemd-analyze --root: this machine's system units (the targets the
    rendered units order after and are wanted by), the rendered units in /etc/systemd/system, and an
    empty executable at the path of every command they run (the hosts' environments and nginx are
    not on this machine; verify checks that each command is an executable there)."""
    shutil.copytree(system_unit_dir(), root / system_unit_dir().relative_to("/"), symlinks=True)
    unit_dir = root / UNIT_DIR.lstrip("/")
    unit_dir.mkdir(parents=True)
    for name, content in units.items():
        (unit_dir / name).write_text(content)
        for command in EXEC_COMMAND.findall(content):
            assert command.startswith("/"), f"{name}: {command} is not an absolute path"
            executable = root / command.lstrip("/")
            executable.parent.mkdir(parents=True, exist_ok=True)
            executable.write_text("#!/bin/sh\nexit 0\n")
            executable.chmod(0o755)
    return root


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    """{host: its root (host_root)}: one each, as hosts share unit names (the front, the Ray unit)."""
    return {host: host_root(tmp_path_factory.mktemp(host), units) for host, units in host_units().items()}


def systemd_analyze(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("systemd-analyze")
    if binary is None:
        pytest.fail("systemd-analyze is not on PATH: the units' hardening cannot be checked without it "
                    "(Debian and Ubuntu: apt-get install systemd)")
    return subprocess.run([binary, "--no-pager", *args], capture_output=True, text=True, timeout=60)


def unit_paths(root: Path) -> list[Path]:
    return sorted((root / UNIT_DIR.lstrip("/")).iterdir())


def exposure(root: Path, unit: Path) -> float:
    result = systemd_analyze("security", "--offline=yes", f"--root={root}", str(unit))
    found = OVERALL_EXPOSURE.search(result.stdout)
    assert result.returncode == 0 and found, f"systemd-analyze security {unit.name}:\n{result.stdout}{result.stderr}"
    return float(found.group(1))


def test_every_kind_of_unit_scores_within_its_exposure_target(roots):
    scores = {(host, unit.name): exposure(root, unit) for host, root in roots.items() for unit in unit_paths(root)}
    assert {unit_kind(name) for _, name in scores} == set(EXPOSURE_TARGETS), "a kind of unit was not rendered"
    report("systemd-analyze security --offline=yes, overall exposure of each rendered unit "
           "(0.0 sandboxed .. 10.0 not at all; the most allowed in brackets):")
    for (host, name), score in sorted(scores.items(), key=lambda item: (unit_kind(item[0][1]), item[0])):
        report(f"  {host:<6} {name:<28} {score:4.1f}  (<= {EXPOSURE_TARGETS[unit_kind(name)]})")
    over = {f"{host} {name}": score for (host, name), score in scores.items()
            if score > EXPOSURE_TARGETS[unit_kind(name)]}
    assert not over, f"units above their exposure target: {over}"


def verify_problems(root: Path, units: list[Path]) -> str:
    """What `systemd-analyze verify` says is wrong with these units ("" if nothing). Its exit status
    alone is not enough: systemd 252 reports an unknown directive or an unparsable value (which
    systemd then ignores) and still exits 0, so anything it prints is a problem."""
    result = systemd_analyze("verify", f"--root={root}", *map(str, units))
    if result.returncode == 0 and not (result.stdout + result.stderr).strip():
        return ""
    return f"exit status {result.returncode}\n{result.stdout}{result.stderr}"


def test_every_rendered_unit_passes_systemd_analyze_verify(roots):
    for host, root in roots.items():
        assert verify_problems(root, unit_paths(root)) == "", f"systemd-analyze verify on {host}'s units"


@pytest.mark.parametrize("change, words", [
    (lambda unit: unit.replace("\nProtectKernelTunables=yes\n", "\nProtectKernelTunabels=yes\n"),
     "Unknown key 'ProtectKernelTunabels'"),
    (lambda unit: unit.replace("\nUMask=0027\n", "\nUMask=rw-r-----\n"), "Failed to parse mode value"),
    (lambda unit: unit.replace("\nRestartSec=", "\nRestartSec=soon\nRestartSec="), "Failed to parse"),
], ids=["misspelt directive", "unparsable mode", "unparsable time span"])
def test_verify_catches_a_broken_unit(roots, tmp_path, change, words):
    """The verify test above would catch a broken unit: the head's vLLM unit, broken one way."""
    [unit] = [u for u in unit_paths(roots[HEAD]) if unit_kind(u.name) == "vllm"]
    broken = change(unit.read_text())
    assert broken != unit.read_text()
    root = host_root(tmp_path / "root", {unit.name: broken, RAY_UNIT: (unit.parent / RAY_UNIT).read_text()})
    assert words in verify_problems(root, [root / UNIT_DIR.lstrip("/") / unit.name])


def test_verify_catches_a_unit_whose_required_unit_is_missing(roots, tmp_path):
    """The head's vLLM unit requires its Ray unit: without it there, verify fails."""
    [unit] = [u for u in unit_paths(roots[HEAD]) if unit_kind(u.name) == "vllm"]
    root = host_root(tmp_path / "root", {unit.name: unit.read_text()})
    problems = verify_problems(root, [root / UNIT_DIR.lstrip("/") / unit.name])
    assert f"Unit {RAY_UNIT} not found" in problems and problems.startswith("exit status 1"), problems
