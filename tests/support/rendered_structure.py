"""The rendered files read as systemd, nginx and vLLM read them, for the input boundary's property
(tests/input_boundary/test_boundary_properties.py): a unit's lines, directives, specifiers and
environment; nginx's statements; the flags vLLM's parser reads from the engine YAML; each reduced
to a structure that a benign value and a hostile one must share."""

from __future__ import annotations

import functools
import json
import re
import shlex
from typing import Any

from vllm_fleet import vllm_flags

# --- Reading the rendered files as systemd, nginx and vLLM read them -------------------------------

SYSTEMD_LINE_END = re.compile(r"\r\n|[\n\r\x00]")  # systemd's read_line ends a line at each of these


def unit_lines(content: str) -> list[str]:
    """The lines systemd reads, stripped, without comments and blank lines."""
    lines = [line.strip() for line in SYSTEMD_LINE_END.split(content)]
    return [line for line in lines if line and line[0] not in "#;"]


def continues(line: str) -> bool:
    """systemd joins a line ending in an unescaped backslash with the next."""
    return (len(line) - len(line.rstrip("\\"))) % 2 == 1


def unresolved_specifiers(value: str) -> int:
    """'%' specifiers systemd would expand (the units use none: a '%' of text is written '%%')."""
    return value.replace("%%", "").count("%")


def word_count(value: str) -> int | str:
    try:
        return len(shlex.split(value))
    except ValueError as exc:  # an unbalanced quote
        return f"unparsable: {exc}"


def unit_structure(content: str) -> list[tuple]:
    """(section, directive, words of its value, specifiers) in order: what systemd sees."""
    out, section = [], None
    for line in unit_lines(content):
        if line.startswith("["):
            section = line
            out.append((section, None, None, None))
            continue
        name, equals, value = line.partition("=")
        if not equals:
            out.append((section, f"<no '=': {line[:40]!r}>", None, None))
            continue
        out.append((section, name.strip(), word_count(value), unresolved_specifiers(value)))
    return out


def unit_environment(content: str) -> dict[str, str]:
    """The environment the unit gives its process: Environment= unquoted as systemd does (every
    backslash and quote of a value is escaped, so shlex's unquoting is systemd's), '%%' is '%'."""
    env = {}
    for line in unit_lines(content):
        name, _, value = line.partition("=")
        if name == "Environment":
            for word in shlex.split(value):
                key, _, val = word.partition("=")
                env[key] = val.replace("%%", "%")
    return env


#: Words with a meaning of their own at the start of a `geo` or `map` entry (ngx_http_geo_module,
#: ngx_http_map_module): data that became one of them changes what the table does.
NGINX_TABLE_KEYWORDS = frozenset({"default", "include", "hostnames", "volatile", "ranges", "delete", "proxy",
                                  "proxy_recursive"})


def nginx_structure(text: str) -> list[tuple]:
    """(depth, directive, arguments, terminator) of each statement, tokenized as nginx's
    ngx_conf_read_token does: words end at whitespace, ';', '{' or '}'; a quote opens a token only at
    its start and a backslash escapes the next character; '#' at a token's start comments to the end
    of the line. Inside a `geo` or `map` block an entry's first word is data (an address, a client's
    id), so it stands as "<entry>" unless it is one of those blocks' own keywords."""
    out, words, depth, i, n = [], [], 0, 0, len(text)
    blocks: list[str | None] = []

    def head() -> str | None:
        if not words:
            return None
        if blocks and blocks[-1] in ("geo", "map") and words[0] not in NGINX_TABLE_KEYWORDS:
            return "<entry>"
        return words[0]

    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
        elif c == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif c in ";{":
            out.append((depth, head(), len(words) - 1, c))
            if c == "{":
                blocks.append(words[0] if words else None)
            words, depth, i = [], depth + (c == "{"), i + 1
        elif c == "}":
            if words:
                out.append((depth, head(), len(words) - 1, "<unterminated>"))
            if blocks:
                blocks.pop()
            words, depth, i = [], depth - 1, i + 1
            out.append((depth, "}", 0, "}"))
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                out.append((depth, "<unclosed quote>", 0, ""))
                break
            words.append(text[i:j + 1])
            i = j + 1
        else:
            j = i
            while j < n and text[j] not in " \t\r\n;{}":
                j += 2 if text[j] == "\\" else 1
            words.append(text[i:j])
            i = j
    if words:
        out.append((depth, words[0], len(words) - 1, "<end of file>"))
    return out


@functools.cache
def flag_arities() -> dict[str, Any]:
    """nargs of every `vllm serve` flag by each of its names (None: one value)."""
    out = {}
    for name, entry in vllm_flags.table()["flags"].items():
        for alias in entry.get("names", [name]):
            out[alias] = entry.get("nargs")
    return out


def reads_as_flag(arg: str) -> bool:
    """What vLLM's parser takes for an option, not a value: anything starting with '-' but '-' and a
    negative integer (argparse), '-x.y' included (vLLM's dotted arguments, FlexibleArgumentParser)."""
    return arg.startswith("-") and arg != "-" and not re.fullmatch(r"-\d+", arg)


def vllm_flags_read(config: dict) -> list:
    """The flags vLLM reads from its --config YAML: the arguments load_config_file makes of it
    (vllm/utils/argparse_utils.py), parsed with each flag's nargs; a value that reads as a flag, a
    missing value and a stray argument show as such."""
    argv = []
    for key, value in config.items():
        if isinstance(value, bool):
            argv += [f"--{key}"] if value else []
        elif isinstance(value, list):
            argv += [f"--{key}", *map(str, value)] if value else []
        elif isinstance(value, dict):
            argv += [f"--{key}", json.dumps(value)]
        else:
            argv += [f"--{key}", str(value)]
    read, i = [], 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not reads_as_flag(arg):
            read.append(("<stray argument>", arg[:40]))
            continue
        name, attached, _ = arg.lstrip("-").partition("=")
        read.append(name)
        nargs = flag_arities().get(name)
        if nargs == 0 or attached:
            continue
        if nargs in ("+", "*"):
            while i < len(argv) and not reads_as_flag(argv[i]):
                i += 1
        elif i < len(argv) and not reads_as_flag(argv[i]):
            i += 1
        else:
            read.append(("<no value>", name))
    return read


def json_shape(value: Any) -> Any:
    """A JSON document's structure: lists' lengths, dicts' sizes and their values' shapes (a dict's
    keys may be data: the manifest's instances are keyed by name), the scalars' types."""
    if isinstance(value, dict):
        return ("dict", sorted(repr(json_shape(v)) for v in value.values()))
    if isinstance(value, list):
        return ("list", [json_shape(v) for v in value])
    return type(value).__name__


def deduplicated(items: list) -> list:
    return list(dict.fromkeys(items))
