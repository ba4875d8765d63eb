"""docs/ci/check-rendered.sh, the CI check users copy, run as a team's CI runs it: on a copy of the
example inventory in a repository of its own, against the rendered files that team committed. It
passes while the inventory renders exactly those files, and fails, printing the diff, once an
engine argument changes without the committed files changing with it. Offline: nothing reaches a
host (plan and render never connect)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "docs" / "ci" / "check-rendered.sh"
# What a team's repository holds: its inventory, that inventory's group data, the fleet-wide defaults.
TEAM_FILES = ("inventory/prod.py", "inventory/group_data/prod.py", "group_data/all.py")
ENGINE_CONFIG = "rendered/gpu-mixed-01/etc/vllm-fleet/gemma-rtx-4090-d.yaml"
# Set in the job's environment as a deploy job would have it: render must not write it anywhere.
API_KEY = "sk-ci-3f9d2a71c0"


def check_rendered(team: Path, *args: str) -> subprocess.CompletedProcess:
    # This interpreter's bin/ first: vllm-fleet as the job's `pip install` puts it on PATH.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "VLLM_FLEET_API_KEY": API_KEY, "HF_TOKEN": API_KEY}
    return subprocess.run(["bash", str(CHECK), *args], cwd=team, env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """A copy of the example inventory with its rendered files committed, as check-rendered.sh --update
    leaves them."""
    for name in TEAM_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    updated = check_rendered(tmp_path, "--update", "inventory/prod.py", "rendered")
    assert updated.returncode == 0, updated.stdout + updated.stderr
    assert "max-num-seqs: 64\n" in (tmp_path / ENGINE_CONFIG).read_text()
    rendered = [path for path in (tmp_path / "rendered").rglob("*") if path.is_file()]
    assert "VLLM_API_KEY='<secret: filled in at deploy time>'" in (
        tmp_path / "rendered/gpu-a100-01/etc/vllm-fleet/qwen14b.env").read_text()
    assert rendered and not [path for path in rendered if API_KEY in path.read_text()]
    return tmp_path


def test_ci_check_passes_on_the_committed_render_and_fails_with_the_diff_after_an_engine_arg_changes(team):
    unchanged = check_rendered(team, "inventory/prod.py", "rendered")
    assert unchanged.returncode == 0, unchanged.stdout + unchanged.stderr
    assert "gpu-mixed-01" in unchanged.stdout  # the plan, printed for the job's log
    assert "rendered files match rendered/" in unchanged.stdout

    inventory = team / "inventory" / "prod.py"
    text = inventory.read_text()
    assert text.count('"max_num_seqs": 64') == 1
    inventory.write_text(text.replace('"max_num_seqs": 64', '"max_num_seqs": 32'))
    changed = check_rendered(team, "inventory/prod.py", "rendered")
    assert changed.returncode == 1, changed.stdout + changed.stderr
    assert f"--- committed/{ENGINE_CONFIG.removeprefix('rendered/')}" in changed.stdout
    assert "\n-max-num-seqs: 64\n+max-num-seqs: 32\n" in changed.stdout
    assert "the rendered files differ from rendered/" in changed.stderr
    assert "--update inventory/prod.py rendered" in changed.stderr
    # The committed copy is the team's to update: the check never writes to it.
    assert "max-num-seqs: 64\n" in (team / ENGINE_CONFIG).read_text()
