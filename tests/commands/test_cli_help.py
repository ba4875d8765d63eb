"""Every `vllm-fleet COMMAND --help` says what the command does, gives each of its arguments and options
with what it does, and shows an example; the README and docs name only commands and options that exist.
Checked over whatever subcommands the parser has, each through `vllm-fleet COMMAND --help` itself."""

from __future__ import annotations

import argparse
import re
from functools import cache
from pathlib import Path

import pytest

from vllm_fleet import cli

REPO = Path(__file__).resolve().parents[2]


def _subparsers() -> argparse._SubParsersAction:
    (sub,) = [a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return sub


COMMANDS = sorted(_subparsers().choices)


@cache
def help_text(command: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        cli.main([command, "--help"])
    assert exited.value.code == 0, command
    return out.getvalue()


def sections(text: str) -> dict[str, list[str]]:
    """The help's blocks by heading ("usage", "description", "options", "examples", ...)."""
    blocks: dict[str, list[str]] = {"usage": []}
    current = "usage"
    for line in text.splitlines():
        if current == "usage" and not line.strip():
            current = "description"
            blocks[current] = []
        elif re.fullmatch(r"[a-z][a-z ]*:", line):
            current = line[:-1]
            blocks[current] = []
        else:
            blocks[current].append(line)
    return blocks


def entries(lines: list[str]) -> dict[str, str]:
    """An argument section's entries: the names (e.g. "--limit NAMES") -> their help text."""
    out: dict[str, str] = {}
    name = None
    for line in lines:
        if re.match(r"  \S", line):
            name, _, rest = line.strip().partition("  ")
            out[name] = rest.strip()
        elif name and line.strip():
            out[name] = (out[name] + " " + line.strip()).strip()
    return out


def test_there_are_subcommands_and_each_has_a_summary_in_the_top_level_help():
    assert {"plan", "render", "status", "rollout"} <= set(COMMANDS)
    summaries = {action.dest: action.help for action in _subparsers()._choices_actions}
    for command in COMMANDS:
        assert summaries.get(command) and not summaries[command].startswith("see "), command


@pytest.mark.parametrize("command", COMMANDS)
def test_each_subcommand_help_says_what_it_does_its_options_and_an_example(command):
    text = help_text(command)
    blocks = sections(text)
    assert text.startswith(f"usage: vllm-fleet {command}"), text[:80]
    description = " ".join(" ".join(blocks.get("description", [])).split())
    assert len(description) >= 60 and "see `vllm-fleet" not in description, (command, description)
    assert not re.search(r"vllm_fleet\.[a-z_.]+", text), f"{command} --help names internal modules"
    listed = {**entries(blocks.get("positional arguments", [])), **entries(blocks.get("options", []))}
    assert "-h, --help" in listed, command
    for name, what in listed.items():
        assert what, f"{command} --help: {name} has no help text"
    usage = " ".join(blocks["usage"])
    for option in set(re.findall(r"\[(--?[a-z][a-z-]*)", usage)) | set(re.findall(r" (--[a-z][a-z-]*) ", usage)):
        assert any(re.match(rf"(-\w, )?{re.escape(option)}\b", name) for name in listed), (command, option)
    examples = [heading for heading in blocks if heading in ("example", "examples")]
    assert examples, f"{command} --help has no examples"
    lines = [line for heading in examples for line in blocks[heading]]
    assert any(re.match(rf"\s+(sudo )?vllm-fleet {command}\b", line) for line in lines), (command, lines)


def _documented_commands() -> list[tuple[str, str, str]]:
    """(file, command, the rest of its command line) for every command line `vllm-fleet COMMAND ...` in
    the README and docs/: an inline code span that starts with it, or a line of a fenced block that
    starts with it (after `sudo`, `$` or an assignment) or runs it after a pipe or `&&`."""
    found = []
    command_line = re.compile(r"(?:^\s*|^\s*(?:\$ |sudo |[A-Z_]+=\S+ )+|[|&;(] *|\$\()"
                              r"vllm-fleet ([a-z][a-z-]*)([^|;&#`)]*)")
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text()
        lines = [line for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for line in block.splitlines()]
        lines += re.findall(r"`(vllm-fleet [^`\n]+)`", text)
        for line in lines:
            for match in command_line.finditer(line):
                found.append((path.name, match.group(1), match.group(2)))
    return found


def test_the_readme_lists_every_subcommand():
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Using it", 1)[1].split("```", 2)[1]
    for command in COMMANDS:
        assert f"vllm-fleet {command} " in block, command


def test_the_docs_name_only_subcommands_and_options_that_exist():
    documented = _documented_commands()
    assert len(documented) > 20
    for where, command, rest in documented:
        assert command in COMMANDS, f"{where}: `vllm-fleet {command}` is no subcommand"
        options = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest))
        for option in options:
            assert re.search(rf"(?<![\w-]){re.escape(option)}\b", help_text(command)), (
                f"{where}: `vllm-fleet {command} ... {option}`: {option} is not an option of {command}")
