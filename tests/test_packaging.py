"""The package works when installed (not only from a checkout): templates are package data and the
tiny-model dependencies are an extra. (Rollout runs the packaged deploy, not the checkout's deploy.py:
tests/test_refused_input_offline.py.)"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from vllm_fleet import render

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
