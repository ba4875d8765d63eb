"""group_data/all.py, docs/knobs.md and the README's excerpt of the knobs, written from the
declarations (config/knobs/, config/instance.py): each knob's default, doc and notes are declared
once, and these files show them.

    python -m vllm_fleet.config.reference --write    # rewrite the three files
    python -m vllm_fleet.config.reference            # exit 1, naming each file that is out of date

tests/config/test_reference.py fails when a file is out of date.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from vllm_fleet.config.instance import INSTANCE_DECLARED
from vllm_fleet.config.schema import Declaration, HostKnob, describe, section_of
from vllm_fleet.config.settings import DECLARED, SECTIONS

REPO = Path(__file__).resolve().parents[2]
COMMAND = "python -m vllm_fleet.config.reference --write"
#: The longest line of group_data/all.py with a knob's doc beside its value (else the doc goes above).
LINE = 120
#: The knobs the README shows, with their docs.
README_KNOBS = ("placement", "vllm_target", "vllm_version", "vllm_wheelhouse", "vllm_bind_host", "vllm_gateway",
                "vllm_api_key_env", "vllm_api_clients", "vllm_tls", "vllm_metrics", "vllm_monitoring",
                "vllm_gpu_memory_utilization")
README_BEGIN = f"<!-- the knobs below are written by `{COMMAND}` -->"
README_END = "<!-- end of the knobs -->"


def literal(value: Any) -> str:
    """A default as group data writes it: Python, strings in double quotes."""
    if isinstance(value, str) and '"' not in value and "\\" not in value:
        return f'"{value}"'
    if isinstance(value, list):
        return "[" + ", ".join(literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _comment(text: str | None, indent: str = "") -> list[str]:
    return [f"#{' ' + indent if line else ''}{line}".rstrip() for line in text.splitlines()] if text else []


def _written(declared: Declaration) -> str:
    """What leaving an instance key out means, as group_data/all.py lists it."""
    if declared.required:
        return f"{declared.name} (required)"
    written = declared.written
    return f"{declared.name} = {written.knob if isinstance(written, HostKnob) else literal(written)}"


def instance_key_lines() -> list[str]:
    """The instance keys, one line each, then their notes: what group_data/all.py shows under
    vllm_instances."""
    lines = [f"#   {_written(declared)}: {declared.doc}" for declared in INSTANCE_DECLARED.values()]
    for declared in INSTANCE_DECLARED.values():
        lines += _comment(declared.notes)
    return lines


def group_data_all() -> str:
    """group_data/all.py: every knob at its default, with the notes users read."""
    out = [
        '"""Every vllm-fleet knob with its default, for all hosts (like an Ansible role\'s defaults/main.yml).',
        "",
        "pyinfra loads this file for every host; inventory host data, group_data/<group>.py and `--data`",
        "override it. A typo in a key is an error with a did-you-mean. Secrets never go here: see \"Secrets\"",
        "below. docs/knobs.md lists the same knobs with their types and bounds.",
        "",
        f"Written by `{COMMAND}` from the declarations in",
        "vllm_fleet/config/knobs/ (the knobs) and vllm_fleet/config/instance.py (the instance keys): change",
        "a default or a comment there, not here.",
        '"""',
    ]
    for cls in SECTIONS:
        section = section_of(cls)
        out += ["", f"# --- {section.title} ".ljust(100, "-")]
        out += _comment(section.notes)
        out += [f"{name} = {literal(value)}" for name, value in section.pyinfra.items()]
        for position, name in enumerate(f.name for f in fields(cls)):
            declared = DECLARED[name]
            if declared.notes and (position or section.notes):
                out.append("")  # a knob explained at length stands apart from the one before
            out += _comment(declared.notes)
            if name == "vllm_instances":
                out += instance_key_lines()
            assignment = f"{name} = {literal(declared.default)}"
            if len(f"{assignment}  # {declared.doc}") <= LINE:
                out.append(f"{assignment}  # {declared.doc}")
            else:
                out += [f"# {declared.doc}", assignment]
    return "\n".join(out) + "\n"


def _takes(declared: Declaration) -> str:
    """What a key takes, in words: its type, its bounds or choices."""
    rule = declared.rule
    if "choices" in rule:
        return "one of " + ", ".join(f"`{literal(c)}`" for c in rule["choices"])
    if "must" in rule:
        return str(rule["must"])
    text = rule.get("kind") or describe(declared.type)
    bounds = []
    if "low" in rule:
        bounds.append(f">= {rule['low']:g}")
    if "above" in rule:
        bounds.append(f"> {rule['above']:g}")
    if "high" in rule:
        bounds.append(f"<= {rule['high']:g}")
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _notes(declared: Declaration) -> list[str]:
    """A key's notes as one item of a list, led by the key's name."""
    if not declared.notes:
        return []
    name, text = declared.name, " ".join(line.strip() for line in declared.notes.splitlines())
    if text.startswith(f"{name}:"):
        text = text[len(name) + 1:].lstrip()
    elif text.startswith(name):
        return [f"- {text}", ""]
    return [f"- `{name}`: {text}", ""]


def knobs_page() -> str:
    """docs/knobs.md: every knob and instance key with its type, default, bounds and docs."""
    out = ["# Knobs", "",
           "Every knob of vllm-fleet with its default, what it takes and what it does: the same as",
           "[group_data/all.py](../group_data/all.py), both written from the declarations in",
           "[vllm_fleet/config/knobs/](../vllm_fleet/config/knobs/) and",
           "[vllm_fleet/config/instance.py](../vllm_fleet/config/instance.py) by",
           f"`{COMMAND}` (change those, not this page). A knob is set in the",
           "inventory (per host) or in group data; an unknown one is an error with a did-you-mean.", ""]
    for cls in SECTIONS:
        section = section_of(cls)
        out += [f"## {section.title}", ""]
        if section.notes:
            out += [" ".join(line.strip() for line in section.notes.splitlines()), ""]
        for name, value in section.pyinfra.items():
            out += [f"pyinfra's `{name}` defaults to `{literal(value)}` here.", ""]
        names = [f.name for f in fields(cls)]
        if not names:
            continue
        out += ["| knob | default | takes | what it is |", "|---|---|---|---|"]
        for name in names:
            declared = DECLARED[name]
            out.append(f"| `{name}` | `{_cell(literal(declared.default))}` | {_cell(_takes(declared))} | "
                       f"{_cell(declared.doc)} |")
        out.append("")
        for name in names:
            out += _notes(DECLARED[name])
            if name == "vllm_instances":
                out += instance_keys_section()
    return "\n".join(out).rstrip("\n") + "\n"


def instance_keys_section() -> list[str]:
    out = ["### The keys of an instance (`vllm_instances`)", "",
           "| key | absent | `vllm serve` flag | takes | what it is |", "|---|---|---|---|---|"]
    for name, declared in INSTANCE_DECLARED.items():
        written = declared.written
        absent = ("required" if declared.required else f"the host's `{written.knob}`"
                  if isinstance(written, HostKnob) else f"`{_cell(literal(written))}`")
        flag = f"`--{declared.flag}`" if declared.flag else ""
        takes = _cell(_takes(declared))
        out.append(f"| `{name}` | {absent} | {flag} | {takes} | {_cell(declared.doc)} |")
    out.append("")
    for declared in INSTANCE_DECLARED.values():
        out += _notes(declared)
    return out


def readme_excerpt() -> str:
    """The README's knobs: a few of them as group_data/all.py sets them, with their docs."""
    assignments = [(f"{name} = {literal(DECLARED[name].default)}", DECLARED[name].doc) for name in README_KNOBS]
    width = max(len(text) for text, _doc in assignments) + 2
    lines = [f"{text.ljust(width)}# {doc}" for text, doc in assignments]
    return "\n".join([README_BEGIN, "```python", *lines, "```", README_END])


def readme(text: str) -> str:
    """README.md with its excerpt of the knobs written anew (between README_BEGIN and README_END)."""
    begin, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    return text[:begin] + readme_excerpt() + text[end:]


def written_files() -> dict[Path, str]:
    """Every file this module writes, by path, as it should read now."""
    readme_path = REPO / "README.md"
    return {REPO / "group_data" / "all.py": group_data_all(), REPO / "docs" / "knobs.md": knobs_page(),
            readme_path: readme(readme_path.read_text())}


def stale() -> list[Path]:
    """The written files that differ from what the declarations make."""
    return [path for path, text in written_files().items() if not path.exists() or path.read_text() != text]


def main(argv: list[str]) -> int:
    if argv == ["--write"]:
        for path, text in written_files().items():
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
        return 0
    if argv:
        print("usage: python -m vllm_fleet.config.reference [--write]", file=sys.stderr)
        return 2
    out_of_date = stale()
    for path in out_of_date:
        print(f"{path.relative_to(REPO)} is out of date: run `{COMMAND}`", file=sys.stderr)
    return 1 if out_of_date else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
