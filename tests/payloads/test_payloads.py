"""The payloads (vllm_fleet.payloads): each bundles into one script that compiles for the hosts'
Python 3.9, holds no import of its own modules, comes out the same bytes every time, and runs as the
host runs it; every payload module keeps the rules the bundle depends on, and the bundler refuses
a module that breaks one. The payloads' behaviour is tested on their bundled text elsewhere:
tests/payloads/test_host_exporter.py (the exporter's file, as a subprocess), tests/facts/test_gpu_topology.py (the
topology command, as a subprocess), tests/commands/test_status_offline.py, test_verify_facts.py and
test_standin_engine.py (the probe, its script executed as one module)."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fleet import payloads
from vllm_fleet.facts.gpus import CUDA_MEMORY_SOURCE, TOPOLOGY_SOURCE
from vllm_fleet.facts.verify import PROBE_SOURCE, host_probe_command, parse_host_probe, printed_result
from vllm_fleet.monitoring.files import exporter_source
from vllm_fleet.payloads import PayloadError, bundle

PAYLOADS_DIR = Path(payloads.__file__).parent
#: Imported where the host may have it, its absence handled: NVML's bindings (nvidia-ml-py).
OPTIONAL_MODULES = {"pynvml"}


def payload_modules() -> dict[str, Path]:
    """Every module under vllm_fleet/payloads but the bundler itself, by dotted name."""
    out = {}
    for path in sorted(PAYLOADS_DIR.rglob("*.py")):
        parts = path.relative_to(PAYLOADS_DIR.parent.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name != payloads.PACKAGE:
            out[name] = path
    return out


@pytest.mark.parametrize("name", sorted(payloads.PAYLOADS))
def test_a_bundled_payload_compiles_for_python_3_9_and_imports_none_of_its_modules(name):
    text = payloads.script(payloads.PAYLOADS[name])
    compile(text, name, "exec")
    tree = ast.parse(text, feature_version=(3, 9))
    ours = [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Import) and any(a.name.startswith("vllm_fleet") for a in node.names)
            or isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("vllm_fleet"))]
    assert ours == [], f"imports of vllm_fleet left in the bundle, lines {ours}"
    assert not [line for line in text.splitlines() if line.lstrip().startswith(("from vllm_fleet", "import vllm_fleet"))]
    # The payload package's docstring is the script's (what runs where, how it is called).
    first = payloads.module_text(payloads.PAYLOADS[name][0])
    assert ast.get_docstring(tree) == ast.get_docstring(ast.parse(first))


@pytest.mark.parametrize("name", sorted(payloads.PAYLOADS))
def test_a_bundle_is_the_same_bytes_every_time(name):
    """The exporter's file decides whether its unit restarts: the same modules give the same bytes,
    in this process and in another one (another hash seed)."""
    modules = [(module, payloads.module_text(module)) for module in payloads.PAYLOADS[name]]
    once = bundle(modules)
    assert bundle(modules) == once == payloads.script(payloads.PAYLOADS[name])
    code = ("import hashlib; from vllm_fleet import payloads; "
            f"print(hashlib.sha256(payloads.script(payloads.PAYLOADS[{name!r}]).encode()).hexdigest())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.strip()
    assert other == hashlib.sha256(once.encode()).hexdigest()


def test_what_the_hosts_get_is_the_bundled_payloads():
    assert PROBE_SOURCE == payloads.script(payloads.PROBE)
    assert TOPOLOGY_SOURCE == payloads.script(payloads.GPU_TOPOLOGY)
    assert CUDA_MEMORY_SOURCE == payloads.script(payloads.CUDA_MEMORY)
    assert exporter_source() == payloads.script(payloads.EXPORTER)


def test_every_payload_module_is_in_a_payload_and_imports_the_standard_library_alone():
    in_payloads = {module for payload in payloads.PAYLOADS.values() for module in payload}
    assert set(payload_modules()) == in_payloads
    for name, path in payload_modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for imported in names:
                top = imported.split(".")[0]
                assert (top in sys.stdlib_module_names or top in OPTIONAL_MODULES
                        or imported.startswith(payloads.PACKAGE + ".")), (
                    f"{name} line {node.lineno} imports {imported}: a payload has the standard library alone")


def test_the_bundled_probe_runs_as_the_host_runs_it():
    """`python3 -c TEXT MODE JSON`, the command verify and status send: a mode that needs no
    systemd here (no manifest: no gateway), and an unknown mode refused with the known ones."""
    done = subprocess.run(["bash", "-c", host_probe_command("gateway-status", {"manifest": "/nonexistent"})],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert printed_result(done.stdout) and parse_host_probe(done.stdout) is None
    done = subprocess.run(["python3", "-c", PROBE_SOURCE, "no-such-mode", json.dumps({})],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "unknown mode 'no-such-mode'" in done.stderr and "verify-with-gateway" in done.stderr


def test_the_bundled_exporter_runs_as_a_file(tmp_path):
    """The file the deploy writes, run as its unit runs it (a refused --listen: it parses its
    arguments, then exits before listening)."""
    script = tmp_path / "host-exporter.py"
    script.write_text(exporter_source())
    done = subprocess.run(["python3", "-I", str(script), "--listen", "nowhere"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--listen wants HOST:PORT" in done.stderr


# --- the bundler's rules ------------------------------------------------------------------------

P = payloads.PACKAGE


def test_the_imports_between_modules_go_and_the_modules_follow_each_other():
    text = bundle([(f"{P}.a", '"""A."""\n\nimport json\n\nX = 1\n'),
                   (f"{P}.b", f'"""B."""\n\nimport json\n\nfrom {P}.a import (\n    X,\n)\n\n\ndef f():\n'
                              '    return json.dumps(X)\n\n\nif __name__ == "__main__":\n    print(f())\n')])
    assert text == ('"""A."""\n\nimport json\n\nX = 1\n'
                    f'\n\n# --- {P.replace(".", "/")}/b.py\n"""B."""\n\nimport json\n\n\n\ndef f():\n'
                    '    return json.dumps(X)\n\n\nif __name__ == "__main__":\n    print(f())\n')
    done = subprocess.run([sys.executable, "-c", text], capture_output=True, text=True, check=True)
    assert done.stdout == "1\n"


@pytest.mark.parametrize("second, words", [
    (f"from {P}.a import X as Y\n", "no `*` and no `as`"),
    (f"from {P}.a import *\n", "no `*` and no `as`"),
    (f"from {P}.c import X\n", "not an earlier module"),
    (f"import {P}.a\n", "import a payload module's names with"),
    ("from . import a\n", "imports only the standard library"),
    ("from vllm_fleet.config import HostConfig\n", "imports only the standard library"),
    (f"def f():\n    from {P}.a import X\n", "belongs at the module's top level"),
    ("from __future__ import annotations\n", "no `from __future__`"),
    ("X = 2\n", "binds 'X', which vllm_fleet.payloads.a binds too"),
    ("def X():\n    pass\n", "binds 'X', which vllm_fleet.payloads.a binds too"),
    ("from os import path as X\n", "binds 'X'"),
])
def test_a_module_that_breaks_a_rule_is_refused(second, words):
    first = (f"{P}.a", "X = 1\n")
    with pytest.raises(PayloadError, match=words.replace("`", ".").replace("*", ".").replace("'", ".")):
        bundle([first, (f"{P}.b", second), (f"{P}.c", "")])


def test_only_the_last_module_runs_as_main():
    main = 'if __name__ == "__main__":\n    pass\n'
    with pytest.raises(PayloadError, match="belongs in the payload's last module"):
        bundle([(f"{P}.a", main), (f"{P}.b", "")])
    assert bundle([(f"{P}.a", ""), (f"{P}.b", main)])
