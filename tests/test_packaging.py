"""The package works when installed (not only from a checkout): templates are package data, the
tiny-model dependencies are an extra, and rollout says clearly where deploy.py must come from."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

import pytest

from vllm_fleet import render
from vllm_fleet.commands import rollout
from vllm_fleet.config import ConfigError

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_templates_are_package_data_and_the_root_folder_links_to_them():
    package = Path(render.__file__).resolve().parent
    assert render.TEMPLATES == package / "templates"
    names = sorted(p.name for p in render.TEMPLATES.iterdir() if p.suffix == ".j2")
    assert {"vllm.service.j2", "vllm.env.j2"} <= set(names)
    for name in names:  # what an installed package reads
        assert resources.files("vllm_fleet").joinpath("templates", name).is_file()
    assert "templates/*.j2" in PYPROJECT["tool"]["setuptools"]["package-data"]["vllm_fleet"]
    root = ROOT / "templates"
    assert root.is_symlink() and root.resolve() == render.TEMPLATES


def test_tiny_model_dependencies_are_an_extra():
    deps = " ".join(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    for name in ("numpy", "safetensors", "tokenizers"):
        assert name not in deps
        assert any(d.startswith(name) for d in extras["sandbox"])
    assert any(d.startswith("pytest") for d in extras["test"])


def test_rollout_without_a_checkout_says_where_deploy_py_must_come_from(monkeypatch, tmp_path):
    monkeypatch.setattr(rollout, "REPO", tmp_path / "site-packages")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="deploy.py not found") as info:
        rollout.deploy_file()
    assert "run `vllm-fleet rollout` from a vllm-fleet checkout" in info.value.located()
    (tmp_path / "deploy.py").write_text("")
    assert rollout.deploy_file() == tmp_path / "deploy.py"


def test_rollout_finds_the_checkouts_deploy_py():
    assert rollout.deploy_file() == ROOT / "deploy.py"
