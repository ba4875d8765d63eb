"""The import rules of the package and of its tests, read from the source with `ast` (every import:
at module level, inside functions, under TYPE_CHECKING):

- the pure core (CORE: config -> fleet -> plan -> render, and what they stand on) imports only the
  core: it reaches no host, runs no command and knows no test sandbox;
- the package layers (LAYERS: the core < the workstation < connect < facts < operations < the deploy
  < the commands < the sandbox < the CLI): nothing imports from a higher layer, and no two packages
  import each other;
- no circle among vllm_fleet's modules, an import inside a function included (it hides a circle, it
  does not remove it).
- no test module imports another test module (a `test_*` module, at any depth of the file): what
  tests share lives in the package tests/support/, imported as `support.<module>`; a helper
  imported from another test module would tie a test to that module's fixtures and collection.

Every top-level module of vllm_fleet is in a layer, named here: a new one fails
test_every_top_level_module_is_in_a_layer until it is put in CORE or in another layer on purpose.
The modules of a core package (vllm_fleet.config) are each listed in CORE as well.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "vllm_fleet"
TESTS = PACKAGE.parent / "tests"

CORE = frozenset({
    "vllm_fleet",  # the package itself: __version__
    "vllm_fleet.catalog",
    "vllm_fleet.config",
    "vllm_fleet.config.alert_receivers",
    "vllm_fleet.config.clients",
    "vllm_fleet.config.errors",
    "vllm_fleet.config.fleet_checks",
    "vllm_fleet.config.node_groups",
    "vllm_fleet.config.gpus",
    "vllm_fleet.config.host",
    "vllm_fleet.config.host_checks",
    "vllm_fleet.config.instance",
    "vllm_fleet.config.instance_parsers",
    "vllm_fleet.config.inventory",
    "vllm_fleet.config.knobs",
    "vllm_fleet.config.knobs.common",
    "vllm_fleet.config.knobs.environment",
    "vllm_fleet.config.knobs.files",
    "vllm_fleet.config.knobs.gateway",
    "vllm_fleet.config.knobs.monitoring",
    "vllm_fleet.config.knobs.multinode",
    "vllm_fleet.config.knobs.planner",
    "vllm_fleet.config.knobs.rollout",
    "vllm_fleet.config.knobs.secrets",
    "vllm_fleet.config.knobs.serve",
    "vllm_fleet.config.knobs.ssh",
    "vllm_fleet.config.knobs.tls",
    "vllm_fleet.config.knobs.verification",
    "vllm_fleet.config.model_files",
    "vllm_fleet.config.adapters",
    "vllm_fleet.config.model_info",
    "vllm_fleet.config.ports",
    "vllm_fleet.config.reference",
    "vllm_fleet.config.runner",
    "vllm_fleet.config.schema",
    "vllm_fleet.config.settings",
    "vllm_fleet.data",
    "vllm_fleet.environment",
    "vllm_fleet.fleet",
    "vllm_fleet.fleet_summary",
    "vllm_fleet.gateway",
    "vllm_fleet.kv_events",
    "vllm_fleet.gpu_models",
    "vllm_fleet.gpu_support",
    "vllm_fleet.host_layout",
    "vllm_fleet.path_writers",
    "vllm_fleet.kinds",
    "vllm_fleet.kv_cache_groups",
    "vllm_fleet.model_shape",
    "vllm_fleet.model_source",  # the workstation's model directory, read and hashed (no host)
    "vllm_fleet.monitoring",
    "vllm_fleet.monitoring.canary_queries",
    "vllm_fleet.monitoring.alerting",
    "vllm_fleet.monitoring.files",
    "vllm_fleet.monitoring.metric_names",
    "vllm_fleet.monitoring.rules",
    "vllm_fleet.monitoring.targets",
    "vllm_fleet.payloads",  # the scripts that run on the hosts (stdlib alone, tests/payloads/test_payloads.py)
    "vllm_fleet.payloads.exporter",
    "vllm_fleet.payloads.exporter.exposition",
    "vllm_fleet.payloads.exporter.front",
    "vllm_fleet.payloads.exporter.gpus",
    "vllm_fleet.payloads.exporter.nvidia_smi",
    "vllm_fleet.payloads.exporter.nvml",
    "vllm_fleet.payloads.exporter.server",
    "vllm_fleet.payloads.cuda_memory",
    "vllm_fleet.payloads.cuda_memory.probe",
    "vllm_fleet.payloads.gpu_topology",
    "vllm_fleet.payloads.gpu_topology.probe",
    "vllm_fleet.payloads.nvidia",
    "vllm_fleet.payloads.probe",
    "vllm_fleet.payloads.probe.alerts",
    "vllm_fleet.payloads.probe.gateway",
    "vllm_fleet.payloads.probe.host",
    "vllm_fleet.payloads.probe.instances",
    "vllm_fleet.payloads.probe.journal",
    "vllm_fleet.payloads.probe.main",
    "vllm_fleet.payloads.probe.prometheus",
    "vllm_fleet.payloads.probe.status",
    "vllm_fleet.payloads.probe.usage",
    "vllm_fleet.plan",
    "vllm_fleet.plan.engine_args",
    "vllm_fleet.plan.fleet",
    "vllm_fleet.plan.layouts",
    "vllm_fleet.plan.memory",
    "vllm_fleet.plan.multinode",
    "vllm_fleet.plan.objective",
    "vllm_fleet.plan.placement",
    "vllm_fleet.plan.reasons",
    "vllm_fleet.plan.rules",
    "vllm_fleet.plan.shared_gpus",
    "vllm_fleet.plan.types",
    "vllm_fleet.prepared",
    "vllm_fleet.render",
    "vllm_fleet.render_front",
    "vllm_fleet.rules",  # what facts read, judged on the workstation
    "vllm_fleet.rules.canary",
    "vllm_fleet.rules.cuda_memory",
    "vllm_fleet.rules.gpu_topology",
    "vllm_fleet.rules.host_packages",
    "vllm_fleet.rules.hub",
    "vllm_fleet.rules.model_sync",
    "vllm_fleet.rules.ownership",
    "vllm_fleet.templating",
    "vllm_fleet.vllm_flags",
})
# The package layers, lowest first: a module imports from its own layer or a lower one, never a
# higher one (pyinfra's shape: facts read, operations change, a deploy runs them, commands and the
# CLI drive it all). Above the core, a layer holds top-level modules and packages.
LAYERS = (
    ("the core", CORE),
    # The workstation's own files and checks: its secrets, keys and certificates (fleet_secrets,
    # workstation_files, host_keys, tls), package indexes and wheelhouses (package_sources,
    # wheelhouses), the check of a fleet before a host is reached (fleet_check).
    ("the workstation", frozenset({"vllm_fleet.fleet_check", "vllm_fleet.fleet_secrets", "vllm_fleet.host_keys",
                                   "vllm_fleet.package_sources", "vllm_fleet.tls", "vllm_fleet.wheelhouses",
                                   "vllm_fleet.workstation_files"})),
    ("connect", frozenset({"vllm_fleet.connect"})),  # how a host is reached
    ("facts", frozenset({"vllm_fleet.facts"})),
    ("operations", frozenset({"vllm_fleet.operations"})),
    ("the deploy", frozenset({"vllm_fleet.deploy"})),
    ("the commands", frozenset({"vllm_fleet.commands"})),
    ("the sandbox", frozenset({"vllm_fleet.sandbox"})),  # for tests and rehearsal: no production module imports it
    ("the CLI", frozenset({"vllm_fleet.cli"})),
)


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by its dotted name (a package by its __init__.py)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_modules(name: str, source: str, known: set[str] | dict[str, Path]) -> dict[str, int]:
    """{vllm_fleet module: the first line importing it} for every import statement anywhere in
    `source` (ast.walk: module level, functions, classes, if-blocks). `from P import X` imports P.X
    when that is a module, else P; importing P.Q also runs P's __init__ (P counts as imported),
    unless P is a package of `name` itself: P's __init__ is already running when `name` runs, so
    vllm_fleet.config.host importing vllm_fleet.config.gpus is no import of vllm_fleet.config
    (`from vllm_fleet.config import X` in it is, and a circle)."""
    is_package = name not in ("",) and any(k.startswith(name + ".") for k in known)
    own_packages = {".".join(name.split(".")[:depth]) for depth in range(1, name.count(".") + 1)}
    found: dict[str, int] = {}

    def add(module: str, line: int) -> None:
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):  # the parent packages run first
            prefix = ".".join(parts[:depth])
            if prefix in known and prefix != name and (prefix == module or prefix not in own_packages):
                found.setdefault(prefix, line)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package (a package's own name for __init__)
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                add(full if full in known else base, node.lineno)
    return {m: line for m, line in found.items() if m.split(".")[0] == "vllm_fleet"}


def import_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    files = module_files(package)
    return {name: imported_modules(name, path.read_text(), files) for name, path in files.items()}


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (or a module importing itself), each
    as one circle through it: [a, b, ..., a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1 or node in graph.get(node, {}):
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_circle_through(sorted(group), graph) for group in groups]


def _circle_through(group: list[str], graph: dict[str, dict[str, int]]) -> list[str]:
    """A path start -> ... -> start inside the group (breadth first: the shortest)."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for nxt in sorted(graph.get(node, {})):
            if nxt == start:
                return paths[node] + [start]
            if nxt in members and nxt not in paths:
                paths[nxt] = paths[node] + [nxt]
                queue.append(nxt)
    return group


def _top_level(module: str) -> bool:
    return module.count(".") <= 1


def test_every_top_level_module_is_in_a_layer():
    top_level = {name for name in module_files() if _top_level(name)}
    placed = {name for _, members in LAYERS for name in members if _top_level(name)}
    print("core modules:", ", ".join(sorted(CORE)))
    assert top_level == placed, (
        f"in no layer: {sorted(top_level - placed)}; gone: {sorted(placed - top_level)} "
        "(put a new module in CORE when it reaches no host, runs no command and knows no sandbox)")


def test_every_module_of_a_core_package_is_listed_as_core():
    # Listed one by one, so that the core's check reads each and a new one is core on purpose.
    inside = {name for name in module_files() if not _top_level(name) and ".".join(name.split(".")[:2]) in CORE}
    listed = {name for name in CORE if not _top_level(name)}
    assert inside == listed, f"unlisted: {sorted(inside - listed)}; gone: {sorted(listed - inside)}"


def test_the_core_imports_only_the_core():
    graph = import_graph()
    outward = [f"{module} imports {target} (line {line})" for module in sorted(CORE)
               for target, line in sorted(graph.get(module, {}).items()) if target not in CORE]
    assert outward == [], "\n".join(outward)


def test_no_circle_among_the_modules():
    found = circles(import_graph())
    assert found == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_production_module_imports_the_sandbox():
    graph = import_graph()
    assert [(module, target) for module, targets in graph.items() for target in targets
            if target.startswith("vllm_fleet.sandbox") and not module.startswith(("vllm_fleet.sandbox", "vllm_fleet.cli"))] == []


def test_the_walk_sees_imports_in_functions_and_relative_ones():
    known = {"vllm_fleet", "vllm_fleet.facts", "vllm_fleet.facts.batch", "vllm_fleet.render", "vllm_fleet.plan"}
    source = ("from __future__ import annotations\n"
              "from . import plan\n"
              "def late():\n"
              "    from vllm_fleet.facts import batch\n"
              "    import vllm_fleet.render as r\n")
    found = imported_modules("vllm_fleet.config", source, known)
    assert set(found) == {"vllm_fleet.plan", "vllm_fleet.facts", "vllm_fleet.facts.batch", "vllm_fleet.render"}
    assert found["vllm_fleet.facts.batch"] == 4


def test_a_sibling_import_is_no_import_of_the_own_package():
    known = {"vllm_fleet", "vllm_fleet.config", "vllm_fleet.config.gpus", "vllm_fleet.config.host"}
    sibling = "from vllm_fleet.config.gpus import GpuSpec\n"
    assert set(imported_modules("vllm_fleet.config.host", sibling, known)) == {"vllm_fleet.config.gpus"}
    through_the_package = "from vllm_fleet.config import GpuSpec\nfrom vllm_fleet import config\n"
    assert imported_modules("vllm_fleet.config.host", through_the_package, known) == {"vllm_fleet.config": 1}


def test_a_circle_hidden_in_a_function_is_found():
    graph = {"vllm_fleet.a": {"vllm_fleet.b": 1}, "vllm_fleet.b": {"vllm_fleet.c": 9},
             "vllm_fleet.c": {"vllm_fleet.a": 30}, "vllm_fleet.d": {"vllm_fleet.a": 2}}
    assert circles(graph) == [["vllm_fleet.a", "vllm_fleet.b", "vllm_fleet.c", "vllm_fleet.a"]]
    assert circles({"vllm_fleet.a": {"vllm_fleet.b": 1}, "vllm_fleet.b": {}}) == []


def _unit(module: str) -> str:
    """The top-level module or package a module belongs to (vllm_fleet itself for the package)."""
    return ".".join(module.split(".")[:2])


def layer_of(module: str) -> int:
    for number, (_, members) in enumerate(LAYERS):
        if module in members or (number > 0 and _unit(module) in members):
            return number
    raise AssertionError(f"{module} is in no layer: add it to CORE (a core package lists its modules one by one) "
                         "or put its package in LAYERS")


def test_every_module_has_a_layer():
    assert [layer_of(module) for module in module_files()]


def test_no_module_imports_from_a_higher_layer():
    graph = import_graph()
    upward = [f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]}), "
              f"line {line}"
              for module, targets in sorted(graph.items()) for target, line in sorted(targets.items())
              if layer_of(target) > layer_of(module)]
    assert upward == [], "\n".join(upward)


def test_no_circle_among_the_packages():
    """Between top-level modules and packages (vllm_fleet.config, vllm_fleet.facts, ...): a package
    that imports another is never imported back by it, through any path."""
    units: dict[str, dict[str, int]] = {}
    for module, targets in import_graph().items():
        imports = units.setdefault(_unit(module), {})
        for target, line in targets.items():
            if _unit(target) not in (_unit(module), "vllm_fleet"):
                imports.setdefault(_unit(target), line)
    found = circles(units)
    assert found == [], "package circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_an_upward_import_fails_both_checks(monkeypatch):
    """The deploy importing a command: both checks name it."""
    real = import_graph()
    real["vllm_fleet.deploy.prepare"]["vllm_fleet.commands.check"] = 23
    monkeypatch.setattr(sys.modules[__name__], "import_graph", lambda: real)
    with pytest.raises(AssertionError, match="prepare .the deploy. imports vllm_fleet.commands.check .the commands."):
        test_no_module_imports_from_a_higher_layer()
    with pytest.raises(AssertionError, match="vllm_fleet.commands -> vllm_fleet.deploy -> vllm_fleet.commands"):
        test_no_circle_among_the_packages()


def imported_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a test module (`test_*`, by its top-level name) anywhere in
    `source`: module level, functions, classes, if-blocks."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):  # relative: `from . import test_x` names it as an alias
            names = [node.module or ""] + ([alias.name for alias in node.names] if node.level else [])
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0].startswith("test_")]
    return sorted(found)


def imports_of_test_modules(tests: Path) -> list[str]:
    """Every import of a test module by a module of `tests`: the test modules, and what they share
    (support/, conftest.py, the device recorders), which would otherwise reach one test module's
    helpers from another."""
    return [f"{path.relative_to(tests.parent)}:{line} imports {module}"
            for path in sorted(tests.rglob("*.py"))
            for line, module in imported_test_modules(path.read_text())]


def test_no_test_module_imports_another():
    imports = imports_of_test_modules(TESTS)
    assert imports == [], ("move what test modules share into tests/support/ and import it from there:\n"
                           + "\n".join(imports))


def test_a_test_or_support_module_importing_a_test_module_is_found(tmp_path):
    tests = tmp_path / "tests"
    for relative, text in {"render/test_fleet.py": "from test_multinode_plan import llama, node\n",
                           "support/render_compare.py": "def fleets():\n    import test_real_tools as corpus\n",
                           "support/planning_fixtures.py": "from support.figures import report\n",
                           "conftest.py": "import support\n"}.items():
        (tests / relative).parent.mkdir(parents=True, exist_ok=True)
        (tests / relative).write_text(text)
    assert imports_of_test_modules(tests) == ["tests/render/test_fleet.py:1 imports test_multinode_plan",
                                          "tests/support/render_compare.py:2 imports test_real_tools"]


def test_the_test_import_walk_sees_every_form_and_only_test_modules():
    source = ("from test_gateway import gateway_render\n"
              "import json, test_plan as plan\n"
              "def late():\n"
              "    from test_multinode_plan import llama\n"
              "from support.planning_fixtures import test_data\n"
              "import support.test_helpers\n"
              "from . import test_sibling\n")
    assert imported_test_modules(source) == [(1, "test_gateway"), (2, "test_plan"), (4, "test_multinode_plan"),
                                             (7, "test_sibling")]
