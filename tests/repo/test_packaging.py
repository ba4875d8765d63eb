"""The package works when installed (not only from a checkout): templates are package data and the
tiny-model dependencies are an extra. (Rollout runs the packaged deploy, not the checkout's deploy.py:
tests/input_boundary/test_refused_input_offline.py.)"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from vllm_fleet import templating

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_templates_are_package_data_and_the_root_folder_links_to_them():
    package = Path(templating.__file__).resolve().parent
    assert templating.TEMPLATES == package / "templates"
    names = sorted(p.name for p in templating.TEMPLATES.iterdir() if p.suffix == ".j2")
    assert {"vllm.service.j2", "vllm.env.j2"} <= set(names)
    for name in names:  # what an installed package reads
        assert resources.files("vllm_fleet").joinpath("templates", name).is_file()
    assert "templates/*.j2" in PYPROJECT["tool"]["setuptools"]["package-data"]["vllm_fleet"]
    root = ROOT / "templates"
    assert root.is_symlink() and root.resolve() == templating.TEMPLATES


def test_tiny_model_dependencies_are_an_extra():
    deps = " ".join(PYPROJECT["project"]["dependencies"])
    extras = PYPROJECT["project"]["optional-dependencies"]
    for name in ("numpy", "safetensors", "tokenizers"):
        assert name not in deps
        assert any(d.startswith(name) for d in extras["sandbox"])
    assert any(d.startswith("pytest") for d in extras["test"])


def test_the_deploy_steps_have_one_numbering_in_deploy_py_the_docs_and_the_code():
    """docs/deploy-steps.md's table, the root deploy.py's docstring and the packaged deploy's calls
    list the same steps in the same order, numbered alike."""
    import ast
    import re

    import vllm_fleet.deploy as deploy_package

    root = Path(__file__).resolve().parents[2]
    source = Path(deploy_package.__file__).read_text()
    function = next(node for node in ast.walk(ast.parse(source))
                    if isinstance(node, ast.FunctionDef) and node.name == "vllm_fleet_deploy")
    calls = [statement.value for statement in function.body
             if isinstance(statement, (ast.Expr, ast.Assign)) and isinstance(statement.value, ast.Call)]
    # (not logger's lines, nor install(): what the deploy changes in pyinfra, before the steps)
    called = [ast.unparse(call.func) for call in calls
              if not ast.unparse(call.func).startswith("logger.") and ast.unparse(call.func) != "install"]
    table = re.findall(r"^\| (\d+) \| [^|]+ \| `([\w.]+)`", (root / "docs" / "deploy-steps.md").read_text(), re.M)
    assert [name for _n, name in table] == called
    assert [int(n) for n, _name in table] == list(range(1, len(called) + 1))
    docstring = ast.get_docstring(ast.parse((root / "deploy.py").read_text()))
    steps = docstring.split("\n\n")[1]  # the numbered list, before the cost of a run
    assert [int(n) for n in re.findall(r"^\s*(\d+)\. ", steps, re.M)] == list(range(1, len(called) + 1))
    # Each step module's first line names the steps it holds ("Step 7", "Steps 2 to 6", "Step 1's
    # ... step 11"), and each step function's docstring starts with its number.
    owned: dict[str, list[int]] = {}
    for number, name in enumerate(called, 1):
        owned.setdefault(name.split(".")[0], []).append(number)
        module_name, function_name = name.split(".")
        function_doc = getattr(getattr(deploy_package, module_name), function_name).__doc__
        assert function_doc.startswith(f"{number}. "), (name, function_doc[:40])
    owned["access"].insert(0, 1)  # its lock is taken inside step 1 (prepare)
    owned["ray"] = [8, 9]  # its operations run within services (8) and verify (9)
    for module, numbers in owned.items():
        first_line = (root / "vllm_fleet" / "deploy" / f"{module}.py").read_text().split("\n", 1)[0]
        named = [int(n) for n in re.findall(r"\d+", first_line.split(":")[0])]
        assert named == ([min(numbers), max(numbers)] if len(numbers) > 1 else numbers), (module, first_line)
