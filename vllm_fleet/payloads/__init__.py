"""Payloads: the Python scripts vllm-fleet runs ON the hosts, kept here as modules and bundled into
one script text when a command or a file needs them. Nothing of vllm-fleet is installed on a host.

    PROBE          python3 -c TEXT MODE JSON        instance and gateway checks for verify and status
                                                    (vllm_fleet.facts.verify sends it)
    EXPORTER       <vllm_config_dir>/host-exporter.py, run by its systemd unit with the host's python3:
                                                    GPUs and the front for Prometheus
                                                    (vllm_fleet.monitoring.files writes it)
    GPU_TOPOLOGY   <env>/bin/python -c TEXT          NVML's view of the GPUs, with the vLLM environment's
                                                    python (vllm_fleet.facts.gpus sends it)
    CUDA_MEMORY    python3 -c TEXT                   CUDA's total memory per GPU, what vLLM budgets from
                                                    (ctypes on libcuda.so.1, no torch; facts.gpus sends it)

Each payload is a list of modules in dependency order (a module imports only from those before it).
What a payload module may do, so that `bundle` can join it with the others:

- import the standard library (each module its own imports: it is importable here as it is, and the
  tests call its functions in-process), and nothing else of vllm_fleet but earlier modules of its
  payload, in ONE form: `from vllm_fleet.payloads.<...> import name, ...` at the module's top level,
  no `as`, no `*`. The bundle drops these lines: in one script every name is already there;
- run on the hosts' python3: Python 3.9 (Debian 11's), the standard library alone; no
  `from __future__` (it must be a script's first statement);
- bind no top-level name another module of its payload binds otherwise (one namespace once bundled);
- keep `if __name__ == "__main__":` to the payload's last module.

A payload package's `__init__` holds its docstring only (what runs where, how it is called) and comes
first: it is the bundled script's docstring. `bundle` refuses a module that breaks a rule, so a
payload that bundles is one these rules hold for.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from importlib import resources
from typing import Sequence

#: Payload modules import each other as `from vllm_fleet.payloads.<...> import name`.
PACKAGE = __name__

PROBE = (f"{PACKAGE}.probe", f"{PACKAGE}.probe.host", f"{PACKAGE}.probe.journal", f"{PACKAGE}.probe.instances",
         f"{PACKAGE}.probe.gateway", f"{PACKAGE}.probe.usage", f"{PACKAGE}.probe.prometheus",
         f"{PACKAGE}.probe.alerts", f"{PACKAGE}.probe.status", f"{PACKAGE}.probe.main")
EXPORTER = (f"{PACKAGE}.exporter", f"{PACKAGE}.exporter.exposition", f"{PACKAGE}.nvidia", f"{PACKAGE}.exporter.gpus",
            f"{PACKAGE}.exporter.nvml", f"{PACKAGE}.exporter.nvidia_smi", f"{PACKAGE}.exporter.front",
            f"{PACKAGE}.exporter.server")
GPU_TOPOLOGY = (f"{PACKAGE}.gpu_topology", f"{PACKAGE}.nvidia", f"{PACKAGE}.gpu_topology.probe")
CUDA_MEMORY = (f"{PACKAGE}.cuda_memory", f"{PACKAGE}.nvidia", f"{PACKAGE}.cuda_memory.probe")
PAYLOADS = {"probe": PROBE, "exporter": EXPORTER, "gpu_topology": GPU_TOPOLOGY, "cuda_memory": CUDA_MEMORY}


class PayloadError(ValueError):
    """A payload module that breaks a rule of the module docstring."""


def module_text(module: str) -> str:
    """A payload module's source, read from the installed package (a package by its __init__.py)."""
    node = resources.files(PACKAGE)
    for part in module[len(PACKAGE):].split(".")[1:]:
        node = node.joinpath(part) if node.joinpath(part).is_dir() else node.joinpath(part + ".py")
    return (node.joinpath("__init__.py") if node.is_dir() else node).read_text(encoding="utf-8")


@lru_cache(maxsize=None)
def script(payload: tuple[str, ...]) -> str:
    """The payload as the host gets it: its modules' texts bundled into one script."""
    return bundle([(module, module_text(module)) for module in payload])


def bundle(modules: Sequence[tuple[str, str]]) -> str:
    """One script from (module name, source text) pairs in dependency order: the texts in that order,
    each but the first after a comment naming its module, with the imports between them dropped.
    Pure and deterministic: the same texts give the same bytes (the exporter's file restarts its unit
    when they change). Raises PayloadError for a module that breaks a rule of the module docstring."""
    seen: list[str] = []
    bound: dict[str, tuple[str, str]] = {}  # top-level name -> (what binds it, the module that binds it)
    parts: list[str] = []
    for position, (module, text) in enumerate(modules):
        tree = ast.parse(text, filename=module)
        dropped = _payload_imports(module, tree, seen)
        if position < len(modules) - 1 and _runs_as_main(tree):
            raise PayloadError(f"{module}: `if __name__ == '__main__'` belongs in the payload's last module")
        for name, origin in _top_level_bindings(module, tree):
            if name in bound and bound[name][0] != origin:
                raise PayloadError(f"{module} binds {name!r}, which {bound[name][1]} binds too: "
                                   "a bundled payload has one namespace")
            bound.setdefault(name, (origin, module))
        lines = text.splitlines(keepends=True)
        kept = "".join(line for number, line in enumerate(lines, start=1) if number not in dropped)
        kept = kept if kept.endswith("\n") else kept + "\n"
        parts.append(kept if position == 0 else f"\n\n# --- {module.replace('.', '/')}.py\n{kept}")
        seen.append(module)
    text = "".join(parts)
    compile(text, "<bundled payload>", "exec")  # one namespace may still read wrong: fail here, not on a host
    return text


def _payload_imports(module: str, tree: ast.Module, earlier: list[str]) -> set[int]:
    """The line numbers of `module`'s imports of earlier payload modules, checked against the rules."""
    top_level = set(map(id, tree.body))
    dropped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            raise PayloadError(f"{module}: line {node.lineno}: no `from __future__` in a payload module")
        if isinstance(node, ast.Import) and any(_ours(alias.name) for alias in node.names):
            raise PayloadError(f"{module}: line {node.lineno}: import a payload module's names with "
                               f"`from {PACKAGE}.<...> import name`")
        if not isinstance(node, ast.ImportFrom) or not (node.level or _ours(node.module or "")):
            continue
        where = f"{module}: line {node.lineno}"
        if node.level or not (node.module or "").startswith(PACKAGE + "."):
            raise PayloadError(f"{where}: a payload module imports only the standard library and "
                               f"`from {PACKAGE}.<...> import name`")
        if id(node) not in top_level:
            raise PayloadError(f"{where}: an import of a payload module belongs at the module's top level")
        if node.module not in earlier:
            raise PayloadError(f"{where}: {node.module} is not an earlier module of this payload")
        if any(alias.name == "*" or alias.asname for alias in node.names):
            raise PayloadError(f"{where}: no `*` and no `as` in an import of a payload module")
        dropped.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return dropped


def _ours(name: str) -> bool:
    return name == "vllm_fleet" or name.startswith("vllm_fleet.")


def _runs_as_main(tree: ast.Module) -> bool:
    return any(isinstance(node, ast.If) and "__main__" in ast.dump(node.test) for node in tree.body)


def _top_level_bindings(module: str, tree: ast.Module) -> list[tuple[str, str]]:
    """(name, what binds it) for every name `module` binds at its top level: an import by what it
    imports (two modules may import the same thing), anything else by the module itself. The
    imports of earlier payload modules are left out: they bind what that module bound."""
    out: list[tuple[str, str]] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            out += [(alias.asname or alias.name.split(".")[0], alias.name if alias.asname else alias.name.split(".")[0])
                    for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if not _ours(node.module or ""):
                out += [(alias.asname or alias.name, f"{node.module}.{alias.name}") for alias in node.names]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append((node.name, module))
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [(name.id, module) for target in targets for name in ast.walk(target)
                    if isinstance(name, ast.Name)]
    return out
