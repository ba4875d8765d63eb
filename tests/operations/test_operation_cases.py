"""The operations as data, the way pyinfra tests its own (tests/operations/<module>.<operation>/<case>.json):
each case gives the operation's arguments, the facts the host answers, the files on the workstation it
reads (a model to sync, a wheelhouse to push) and the commands it must yield, exactly, in order; a
"description" says what the case shows. The expected commands were written from the operation's
output and each one read against what the operation must do on such a host.

- "facts": {"<module>.<Fact>": {"<arguments>": value}}, as pyinfra's FakeHost keys them: the arguments
  as `key=value, ...` sorted by key (a tuple written as a JSON list), the value what the fact returns
  (its `process`ed form, as in tests/facts). The operation reads them through `facts.get`, as in a
  deploy; a fact it asks for that the case lacks, or one the case gives that it never asks for, fails.
- "local_files": {"<relative path>": text} on the workstation, under a fresh directory written
  `<workstation>` in arguments and commands; every file's mtime is WORKSTATION_MTIME.
- "commands": a shell command as its text; an upload as ["upload", what it sends, its destination];
  a function run at execution as [its name, args, kwargs]; a command run with connection arguments
  of its own (an upload as the login user) as those arguments with the command under "command".
- "noop_description": what the operation told pyinfra when it changes nothing (absent: it told nothing).
- "diff": true runs the operation as `pyinfra --diff` plans it; "logged" then lists, exactly, the lines
  it logs (what the user reads: a changed file's diff, and never a secret's contents).
- "exception": {"name", "message"} when the operation raises while it is planned (the run stops there).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import logging
import os
import pkgutil
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pyinfra import logger
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.context import ctx_host, ctx_state

import vllm_fleet.operations
from vllm_fleet.operations import model_sync

CASES = Path(__file__).resolve().parent
OPERATION_MODULES = tuple(module.name for module in pkgutil.iter_modules(vllm_fleet.operations.__path__))
WORKSTATION = "<workstation>"
WORKSTATION_MTIME = 1_700_000_000

# Operations with no case here, and where they are tested instead.
ELSEWHERE: dict[str, str] = {}


class _State:
    """What the operations read of pyinfra's state while planning (not executing): its config says
    whether the run is `--diff`."""

    is_executing = False

    def __init__(self, diff: bool = False):
        self.config = types.SimpleNamespace(DIFF=diff)


class _Host:
    """pyinfra's host as an operation sees it while planning: its facts from the case, the arguments
    of each fact it asked for, and what it noted when it changed nothing."""

    name, print_prefix = "gpu9", "[gpu9] "
    data = {"ssh_user": "deploy"}  # the login user: uploads go into directories of its own
    current_op_global_arguments: dict = {}

    def __init__(self, facts: dict[str, dict[str, Any]], diff: bool = False):
        self.facts = facts
        self.state = _State(diff)  # facts.get keeps what it read per run, by this
        self.asked: list[tuple[str, str]] = []
        self.noops: list[str] = []
        self.logged: list[str] = []

    def get_fact(self, fact: type, **kwargs) -> Any:
        assert set(kwargs) <= set(inspect.signature(fact().command).parameters), (
            f"{fact.__name__} has no argument among {sorted(kwargs)}")
        key = (f"{fact.__module__.rsplit('.', 1)[-1]}.{fact.__name__}", _fact_arguments(kwargs))
        self.asked.append(key)
        answers = self.facts.get(key[0], {})
        assert key[1] in answers, f"the case gives no {key[0]} for {key[1]!r} (it has {sorted(answers)})"
        return answers[key[1]]

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def get_temp_filename(self, key: str, temp_directory: str | None = None) -> str:
        return "_tempfile_"


def _fact_arguments(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{key}={json.dumps(list(value)) if isinstance(value, (list, tuple)) else value}"
                     for key, value in sorted(kwargs.items()))


def _cases() -> list[Path]:
    return sorted(CASES.glob("*/*.json"))


def _operation(directory: str):
    module, _, name = directory.partition(".")
    return getattr(importlib.import_module(f"vllm_fleet.operations.{module}"), name)


def _from_json(value: Any, workstation: Path, hint: Any = None) -> Any:
    """A case's argument as the operation takes it: `<workstation>` made the directory's path, a
    list a tuple where the parameter is one, a dict the dataclass the parameter is."""
    hint = next((h for h in typing.get_args(hint) if h is not type(None)), hint) \
        if isinstance(hint, types.UnionType) else hint
    if isinstance(value, str):
        return value.replace(WORKSTATION, str(workstation))
    if isinstance(value, dict) and dataclasses.is_dataclass(hint):
        fields = typing.get_type_hints(hint)
        return hint(**{key: _from_json(item, workstation, fields.get(key)) for key, item in value.items()})
    if isinstance(value, list):
        items = [_from_json(item, workstation) for item in value]
        return tuple(items) if typing.get_origin(hint) is tuple else items
    return value


def _as_written(command: Any, workstation: Path) -> Any:
    """A yielded command as a case writes it (pyinfra's tests/test_operations.py parse_commands)."""
    if isinstance(command, str):
        command = StringCommand(command.strip())
    if isinstance(command, StringCommand):
        raw, masked = command.get_raw_value(), command.get_masked_value()
        written: Any = raw if raw == masked else [raw, masked]
    elif isinstance(command, FunctionCommand):
        written = [command.function.__name__, list(command.args), command.kwargs]
    elif isinstance(command, FileUploadCommand):
        if hasattr(command.src, "read"):
            command.src.seek(0)
            data = command.src.read()
            try:
                sent = data.decode() if isinstance(data, bytes) else data
            except UnicodeDecodeError:
                sent = f"sha256:{hashlib.sha256(data).hexdigest()}"
        else:
            sent = str(command.src)
        written = ["upload", sent, str(command.dest)]
    else:
        raise AssertionError(f"{command!r} is not a command pyinfra runs")
    if command.connector_arguments:
        written = {**command.connector_arguments, "command": written}
    return json.loads(json.dumps(written).replace(json.dumps(str(workstation))[1:-1], WORKSTATION))


def _workstation(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "workstation"
    root.mkdir(parents=True)
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (WORKSTATION_MTIME, WORKSTATION_MTIME))
    return root


class _Logged(logging.Handler):
    """The lines pyinfra's logger is given while the operation is planned."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def run_case(case: dict, directory: str, tmp_path: Path) -> tuple[list, _Host]:
    """The commands the case's operation yields for its facts, as a case writes them, and the host
    (`logged`: the lines it logged)."""
    operation = _operation(directory)
    workstation = _workstation(tmp_path, case.get("local_files", {}))
    hints = typing.get_type_hints(operation._inner)
    given = inspect.signature(operation._inner).bind(*case.get("args", []), **case.get("kwargs", {})).arguments
    arguments = {name: _from_json(value, workstation, hints.get(name)) for name, value in given.items()}
    host = _Host(case.get("facts", {}), diff=case.get("diff", False))
    logged, level = _Logged(), logger.level
    logger.addHandler(logged)
    logger.setLevel(logging.DEBUG)  # as pyinfra's CLI sets it: every line reaches the handler
    try:
        with ctx_state.use(host.state), ctx_host.use(host):
            commands = list(operation._inner(**arguments))
    finally:
        logger.removeHandler(logged)
        logger.setLevel(level)
    host.logged = logged.lines
    return [_as_written(command, workstation) for command in commands], host


@pytest.fixture(autouse=True)
def _a_fresh_run(tmp_path, monkeypatch):
    """Each case is a run of its own: the workstation's manifest cache and the host hashes of an
    earlier case are not there."""
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_sync, "_HOST_HASHES", {})


@pytest.mark.parametrize("path", _cases(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_an_operation_yields_exactly_the_commands_its_facts_call_for(path: Path, tmp_path: Path) -> None:
    case = json.loads(path.read_text())
    assert case.get("description"), "say what the case shows"
    if "exception" in case:
        with pytest.raises(Exception) as raised:
            run_case(case, path.parent.name, tmp_path)
        assert (type(raised.value).__name__, str(raised.value).replace(str(tmp_path / "workstation"), WORKSTATION)) \
            == (case["exception"]["name"], case["exception"]["message"])
        return
    commands, host = run_case(case, path.parent.name, tmp_path)
    assert commands == case["commands"], "the operation yielded:\n" + json.dumps(commands, indent=2)
    assert host.noops == ([case["noop_description"]] if "noop_description" in case else [])
    if case.get("diff"):
        assert host.logged == case["logged"], "the operation logged:\n" + json.dumps(host.logged, indent=2)
    given = {(fact, arguments) for fact, answers in case.get("facts", {}).items() for arguments in answers}
    assert given <= set(host.asked), f"facts the operation never asked for: {sorted(given - set(host.asked))}"


def test_every_operation_has_cases_or_says_where_it_is_tested() -> None:
    operations = {f"{module}.{name}" for module in OPERATION_MODULES
                  for name, value in vars(importlib.import_module(f"vllm_fleet.operations.{module}")).items()
                  if callable(value) and hasattr(value, "_inner") and value.__module__.endswith(f".{module}")}
    with_cases = {path.parent.name for path in _cases()}
    assert operations - with_cases - set(ELSEWHERE) == set(), "an operation with no case: write one"
    assert with_cases <= operations and set(ELSEWHERE) <= operations


def test_a_wrong_expectation_fails(tmp_path: Path) -> None:
    case = json.loads((CASES / "managed.managed_file" / "wrong_mode.json").read_text())
    commands, _ = run_case(case, "managed.managed_file", tmp_path)
    assert commands == case["commands"]
    case["facts"]["state.FileState"] = {key: dict(found, mode=0o640)
                                        for key, found in case["facts"]["state.FileState"].items()}
    assert run_case(case, "managed.managed_file", tmp_path / "again")[0] != case["commands"]
    del case["facts"]["state.FileState"]
    with pytest.raises(AssertionError, match="the case gives no state.FileState for 'path=/etc/vllm-fleet/gemma.yaml'"):
        run_case(case, "managed.managed_file", tmp_path / "without_facts")


def test_a_diff_case_fails_on_lines_the_operation_did_not_log(tmp_path: Path) -> None:
    case = json.loads((CASES / "managed.managed_file" / "diff_shows_the_change.json").read_text())
    assert run_case(case, "managed.managed_file", tmp_path)[1].logged == case["logged"]
    case["diff"] = False  # the same run without --diff shows nothing
    assert run_case(case, "managed.managed_file", tmp_path / "again")[1].logged == []
