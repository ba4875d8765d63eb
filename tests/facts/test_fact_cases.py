"""The facts as data, the way pyinfra tests its own (tests/facts/<module>.<Fact>/<case>.json): each
case gives the fact's arguments, the command it must send, what a real host printed for that command
(recorded on a Debian 12 host by tests/facts/record_cases.py) and the fact that output must give,
written by hand. A change to a fact's command or its parsing shows as a case to re-record or fix.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from pathlib import Path

import pytest
from pyinfra.api import FactBase

import vllm_fleet.facts

CASES = Path(__file__).resolve().parents[1] / "facts"
FACT_MODULES = tuple(module.name for module in pkgutil.iter_modules(vllm_fleet.facts.__path__))

# Facts whose output is not recorded here, and where their parsing is tested instead.
ELSEWHERE = {
    "batch.FactBatch": "the batching of the others (test_fact_shell_code.py)",
    "state.PreludeFact": "the base of the state facts, no command of its own",
    "state.UnitState": "systemd's answer, from a stand-in systemctl (test_fact_shell_code.py); every sandbox deploy reads it",
    "gpus.NvidiaGpus": "nvidia-smi's recorded outputs, tests/fixtures/nvidia-smi (test_gpu_support.py)",
    "gpus.GpuTopology": "the NVML probe's recorded outputs, tests/fixtures/nvml (test_gpu_topology.py)",
    "gpus.CudaMemory": "the CUDA memory probe run here against stand-in libcuda.so.1 builds (test_cuda_memory.py)",
}


def _cases() -> list[Path]:
    return sorted(CASES.glob("*/*.json"))


def _fact_class(directory: str) -> type[FactBase]:
    module, _, name = directory.partition(".")
    return getattr(importlib.import_module(f"vllm_fleet.facts.{module}"), name)


def _arguments(arg: dict) -> dict:
    """JSON has no tuples: a list argument (paths) is passed as the tuple the deploy passes."""
    return {key: tuple(value) if isinstance(value, list) else value for key, value in arg.items()}


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_fact_sends_its_command_and_reads_the_recorded_output(path: Path) -> None:
    case = json.loads(path.read_text())
    fact = _fact_class(path.parent.name)()
    assert fact.command(**_arguments(case["arg"])) == case["command"]
    # Through JSON, as the case is written: tuples read as lists.
    assert json.loads(json.dumps(fact.process(case["output"]))) == case["fact"]


def test_every_fact_has_cases_or_says_where_it_is_tested() -> None:
    facts = {f"{module}.{name}" for module in FACT_MODULES
             for name, value in vars(importlib.import_module(f"vllm_fleet.facts.{module}")).items()
             if inspect.isclass(value) and issubclass(value, FactBase) and value.__module__.endswith(f".{module}")}
    with_cases = {path.parent.name for path in _cases()}
    assert facts - with_cases - set(ELSEWHERE) == set(), "a fact with no case: record one (tests/facts/record_cases.py)"
    assert with_cases <= facts and set(ELSEWHERE) <= facts


def test_a_wrong_expectation_fails() -> None:
    case = json.loads((CASES / "state.FileState" / "file.json").read_text())
    fact = _fact_class("state.FileState")()
    assert fact.process(case["output"]) == case["fact"]
    assert fact.process(["file 644 root root " + "0" * 64]) != case["fact"]
