"""Arbitrary text in every string field of a host's data, one field at a time, through parse, the
fleet check, the planner and render: each example is either refused with errors that name the host,
the instance and the field, or it renders files whose structure is the one a benign value gives
(the systemd directives, nginx's statements, the engine YAML's keys and the flags vLLM's parser reads
from it), with the text arriving unchanged where it lands; and it takes at most SECONDS_PER_EXAMPLE.

The generative side of tests/input_boundary/test_text_boundary.py and tests/input_boundary/test_input_boundary.py. The fields are
enumerated from the schema where it has types: every knob annotated str, str | None or list[str]
(Settings), every text key of an instance (InstanceConfig) and of a declared GPU (GpuSpec); so a new
one is covered as soon as it exists (test_every_text_knob_has_a_benign_value says when it needs a
benign example). Listed here: a GPU's compute_capability (text or a number), the values inside env
and engine_args (one value, a switch's, a list item, JSON), the keys of every dict (the host's data,
an instance, env, engine_args and its JSON, model_info, a GPU), the host name and an instance's
nodes. Left out: the knobs gpus and vllm_instances themselves, lists of records whose strings are
the fields above."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import json
import re
import shlex
import signal
import types
import typing
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from support.boundary_hosts import CPU_HOST, ENGINE_ARGS, ENV, GPU_HOST, base_data
from support.figures import report
from support.planning_fixtures import TINY_MODEL_INFO
from vllm_fleet import kinds, vllm_flags
from vllm_fleet.catalog import ModelInfo, is_gguf, lookup
from vllm_fleet.config.model_info import READ_KEYS as MODEL_INFO_KEYS
from vllm_fleet.config.runner import CONVERTS, RUNNERS
from vllm_fleet.config import (DTYPES, INSTANCE_KEYS, ConfigError, ConfigErrors, GpuSpec, InstanceConfig,
                               check_fleet, parse_host)
from vllm_fleet.gateway import fleet_backends
from vllm_fleet.plan import plan_fleet
from vllm_fleet.render import RenderedFile, Secrets, render_host
from vllm_fleet.config.settings import KNOBS, TYPES, Settings

EXAMPLES_PER_CASE = 30
COUNTS: Counter = Counter()

# --- The two hosts every field is tried on (support/boundary_hosts.py) ------------------------------

def instance_name(kind: str) -> str:
    return base_data(kind)["vllm_instances"][0]["name"]


def render(name: str, data: dict) -> list[RenderedFile]:
    """What `vllm-fleet render` does for a fleet of this one host."""
    host = parse_host(name, data)
    check_fleet([host])
    plan = plan_fleet([host])
    backends = fleet_backends([host], plan) if host.settings.vllm_gateway is True else None
    return render_host(host, plan.hosts[0], Secrets("k"), backends=backends)


# --- The fields -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    """One place text goes into a host's data."""

    name: str
    kinds: tuple[str, ...]
    benign: Any
    #: (host name, host data, text) -> (host name, host data) with the text in this field.
    put: Callable[[str, dict, Any], tuple[str, dict]]
    #: Whether a refusal must name the instance.
    instance: bool = False
    #: Whether an error's key is this field's (one of the errors must be).
    blames: Callable[[str, Any], bool] = lambda key, text: True
    #: Whether the text is another valid configuration (a different dtype, another key of the same
    #: dict): no injection, so not compared with the benign value.
    other_value: Callable[[Any], bool] = lambda text: False
    #: Checks where the text lands in the rendered files.
    lands: Callable[[dict[str, str], Any], None] | None = None
    #: Texts tried in every run besides the generated ones (neighbours' values, near misses).
    near: tuple[str, ...] = ()


def walk(data: dict, path: tuple) -> Any:
    for step in path:
        data = data[step]
    return data


def set_at(*path: Any) -> Callable:
    def put(name: str, data: dict, text: Any) -> tuple[str, dict]:
        walk(data, path[:-1])[path[-1]] = text
        return name, data
    return put


def renamed(*path: Any) -> Callable:
    """The key at `path` renamed to the text, in its place (its value stays)."""
    def put(name: str, data: dict, text: Any) -> tuple[str, dict]:
        parent = walk(data, path[:-2])
        parent[path[-2]] = {(text if key == path[-1] else key): value for key, value in walk(data, path[:-1]).items()}
        return name, data
    return put


def added(*path: Any, value: Any = "x") -> Callable:
    """A key named by the text added to the dict at `path` (None: none added)."""
    def put(name: str, data: dict, text: Any) -> tuple[str, dict]:
        if text is not None:
            walk(data, path)[text] = value
        return name, data
    return put


def prefix(*keys: str) -> Callable[[str, Any], bool]:
    return lambda key, text: key.startswith(keys)


def text_kind(annotation: Any) -> str | None:
    """"text" for str and str | None, "list" for list[str], else None."""
    if annotation is str:
        return "text"
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = set(typing.get_args(annotation))
        return "text" if args == {str, type(None)} else None
    if typing.get_origin(annotation) is list and typing.get_args(annotation) == (str,):
        return "list"
    return None


#: Knobs whose values are lists of dicts: each string inside them is a field of its own below
#: (GPU fields, instance fields), not text of the knob itself.
KNOBS_OF_RECORDS = {"gpus", "vllm_instances"}
#: A valid value for each text knob whose default is None or an empty list.
BENIGN_KNOBS = {
    "vllm_package": "vllm",
    "vllm_wheelhouse": "/srv/vllm-fleet/wheelhouse",
    "vllm_index_url": "https://pypi.example.com/simple",
    "vllm_extra_index_urls": "https://download.pytorch.org/whl/cpu",
    "vllm_conda_exe": "/opt/conda/bin/conda",
    "vllm_miniforge_installer": "https://example.org/Miniforge3-Linux-x86_64.sh",
    "vllm_extra_packages": "ray==2.60.0",
    "vllm_advertise_address": "10.0.0.11",
    "vllm_private_interface": "eth1",
    "vllm_gateway_address": "10.0.0.100/24",
    "vllm_gateway_interface": "eth0",
    "vllm_api_key_file": "/home/ops/.vllm-fleet-key",
}
#: Every other knob annotated str, str | None or list[str]. Those read only at deploy time on the
#: workstation (vllm_wheelhouse, vllm_api_key_file, the variables' names) are in too: what no text of
#: theirs may do is change a rendered file.
#: Your own certificate's three files come together with vllm_tls or not at all (tests/render/test_team_service.py:
#: test_own_certificate_files_come_as_three_with_vllm_tls): no one of them alone is valid, and no text of theirs
#: reaches a rendered file (the workstation reads them at deploy time).
TLS_FILE_KNOBS = {"vllm_tls_cert_file", "vllm_tls_key_file", "vllm_tls_ca_file"}
TEXT_KNOBS = [knob for knob in KNOBS
              if knob not in KNOBS_OF_RECORDS | TLS_FILE_KNOBS and text_kind(TYPES[knob])]
KNOB_CHOICES = {f.name: f.metadata.get("choices") for f in dataclasses.fields(Settings)}


#: The addresses an instance port of the gateway's fleet always lets in (the host's own checks): a bind
#: or gateway address equal to one of them adds no entry of its own to the front's list, a
#: configuration of its own (render_front.front_gateway_access).
ALWAYS_LET_IN = {"vllm_bind_host": {"127.0.0.1", "::1"}, "vllm_advertise_address": {"127.0.0.1", "::1"}}


def knob_field(knob: str, kind: str) -> Field:
    """A text knob on one of the hosts: its benign value is the host's own, else BENIGN_KNOBS' or
    the default. Another valid choice, or the value of another of the host's knobs (a directory the
    state directory shares), is a configuration of its own."""
    own = base_data(kind).get(knob)
    benign = own if isinstance(own, str) else BENIGN_KNOBS.get(knob, Settings.defaults()[knob])
    choices = KNOB_CHOICES[knob] or ()
    others = {v for k, v in {**Settings.defaults(), **base_data(kind)}.items() if k != knob and isinstance(v, str)}
    listed = text_kind(TYPES[knob]) == "list"
    others |= ALWAYS_LET_IN.get(knob, set())
    return Field(knob, (kind,), benign, lambda n, d, t: (n, {**d, knob: [t] if listed else t}),
                 blames=prefix(knob), other_value=lambda text: text in choices or text in others,
                 near=tuple(c for c in choices if isinstance(c, str)))


def instance_text_fields() -> list[str]:
    """The instance keys whose values are text (InstanceConfig's str and str | None fields)."""
    hints = typing.get_type_hints(InstanceConfig)
    return [key for key in INSTANCE_KEYS if key in hints and text_kind(hints[key]) == "text"]


def yaml_of(files: dict[str, str]) -> list[dict]:
    return [yaml.safe_load(content) for path, content in files.items() if path.endswith(".yaml")]


def units_of(files: dict[str, str]) -> list[str]:
    return [content for path, content in files.items() if path.endswith(".service")
            and "/vllm-fleet-" not in path]


def lands_in_yaml(key: str, shape: Callable[[Any], Any] = lambda text: text) -> Callable:
    def check(files: dict[str, str], text: Any) -> None:
        for config in yaml_of(files):
            assert config[key] == shape(text), (key, config[key], text)
    return check


def lands_in_environment(variable: str | None, value: str | None) -> Callable:
    """The unit gives vLLM the variable (the text, when None) with the value (the text, when None)."""
    def check(files: dict[str, str], text: Any) -> None:
        for unit in units_of(files):
            environment = unit_environment(unit)
            assert environment[variable or text] == (text if value is None else value), environment
    return check


def lands_as_unit_name(files: dict[str, str], text: Any) -> None:
    names = [path.rsplit("/", 1)[1] for path in files if path.endswith(".service") and "/vllm-fleet-" not in path]
    assert names and all(n.startswith(f"vllm-{text}") for n in names), names


def lands_as_served_name(files: dict[str, str], text: Any) -> None:
    lands_in_yaml("served-model-name", lambda t: [t])(files, text)
    for path, content in files.items():
        if path.endswith("gateway-workers.json"):
            assert {w["model_id"] for w in json.loads(content)} == {text}
        if path.endswith("gateway-models.json"):
            assert [m["id"] for m in json.loads(content)["data"]] == [text]


def engine_args_field(name: str, path: tuple, kind_of_value: str) -> Field:
    flag = path[0]
    lands = {"one value": lands_in_yaml(flag),
             "no value": lands_in_yaml(flag, lambda t: True),
             "list item": lands_in_yaml(flag, lambda t: [t]),
             "JSON value": lands_in_yaml(flag, lambda t: {"temperature": t}),
             "JSON key": lands_in_yaml(flag, lambda t: {t: "0.7"})}[kind_of_value]
    put = (renamed("vllm_instances", 0, "engine_args", *path) if kind_of_value == "JSON key"
           else set_at("vllm_instances", 0, "engine_args", *path))
    benign = walk(ENGINE_ARGS, path) if kind_of_value != "JSON key" else path[-1]
    # A flag taking no value is switched off by the words for False: a configuration of its own.
    off = (lambda text: text.strip().lower() in ("false", "0", "no")) if kind_of_value == "no value" else (lambda text: False)
    return Field(name, (GPU_HOST, CPU_HOST), benign, put, instance=True, blames=prefix("engine_args"),
                 lands=lands, other_value=off,
                 near=("--host=0.0.0.0", "-1", "-1.5", "-", "true", " Yes", "1", "false", "no", "null", "~"))


def normalised_flag(text: str) -> str:
    return text.removeprefix("--").replace("_", "-")


def nodes_put(name: str, data: dict, text: Any) -> tuple[str, dict]:
    if text is not None:
        data["vllm_instances"][0]["nodes"] = [name, text]
    return name, data


def host_name_put(name: str, data: dict, text: Any) -> tuple[str, dict]:
    return text, data


def gpu_fields() -> list[Field]:
    """GpuSpec's text fields (as declared in host data) and compute_capability, which takes text
    too (nvidia-smi's "8.6"), on GPU 0."""
    hints = typing.get_type_hints(GpuSpec)
    declared = base_data(GPU_HOST)["gpus"]
    # uuid is read from nvidia-smi only: host data cannot declare it (parse_gpus refuses the key).
    text_fields = [key for key in hints if text_kind(hints[key]) == "text" and key != "uuid"] + ["compute_capability"]
    others = {"name": tuple(g["name"] for g in declared[1:]) + ("nvidia a100-sxm4-40gb!", "NVIDIA Ä100", "%%%"),
              "mig_mode": ("Enabled", "enabled")}
    # Another capability or MIG changes the plan; an empty bus id is none (the manifest lists none).
    valid = {"compute_capability": lambda text: bool(re.fullmatch(r"\s*\d{1,2}\.\d\s*", text)),
             "mig_mode": lambda text: text == "Enabled", "pci_bus_id": lambda text: text == ""}
    # The driver is the host's (every GPU reports the same one): its errors name driver_version alone.
    return [Field(f"gpus[0].{key}", (GPU_HOST,), declared[0][key], set_at("gpus", 0, key),
                  blames=prefix("gpus[0]", "driver_version"), other_value=valid.get(key, lambda text: False),
                  near=others.get(key, ())) for key in text_fields]


def fields() -> list[Field]:
    out = [knob_field(knob, kind) for knob in TEXT_KNOBS for kind in (GPU_HOST, CPU_HOST)]
    out.append(Field("host name", (GPU_HOST, CPU_HOST), None, host_name_put,
                     blames=lambda key, text: key in ("host name", "vllm_advertise_address"),
                     near=("@local", "10.0.0.5", "fe80::1%eth0", "a..b", "-x", "_x")))
    out.append(Field("a key of the host's data", (GPU_HOST, CPU_HOST), None, added(),
                     blames=lambda key, text: key == text or key.startswith(repr(text)),
                     other_value=lambda text: text in KNOBS or text in base_data(GPU_HOST) or text in base_data(CPU_HOST),
                     near=("vllm_typo", "vllm_rooot", "placemnt", "deploy_owner", "ssh_user", "vllm_\x1b[2J")))
    for key in instance_text_fields():
        benign = {CPU_HOST: base_data(CPU_HOST), GPU_HOST: base_data(GPU_HOST)}
        values = {k: d["vllm_instances"][0].get(key) for k, d in benign.items()}
        lands = {"name": lands_as_unit_name, "served_model_name": lands_as_served_name,
                 "model": lands_in_yaml("model"), "tokenizer": lands_in_yaml("tokenizer")}.get(key)
        for kind in (GPU_HOST, CPU_HOST):
            value = values[kind] if values[kind] is not None else {"model_source": "/srv/models/tiny",
                                                                    "dtype": "auto", "runner": "auto",
                                                                    "convert": "auto"}[key]
            # Another dtype, or another model (one the catalog knows, a GGUF file), plans differently.
            other = {"dtype": lambda text: text in DTYPES,
                     "runner": lambda text: text in ("auto",) + RUNNERS,
                     "convert": lambda text: text in ("auto",) + CONVERTS,
                     "model": lambda text, benign=value: (lookup(text) != lookup(benign)
                                                          or is_gguf(text) != is_gguf(benign))}
            out.append(Field(f"instance {key}", (kind,), value, set_at("vllm_instances", 0, key),
                             instance=True, blames=prefix(key), lands=lands,
                             other_value=other.get(key, lambda text: False),
                             near=("fleet-front", "fleet-gateway", "fleet-ray", "gemma-a100-sxm4-40gb", "x" * 65)
                             if key == "name" else ()))
    instance_at = ("vllm_instances", 0)
    out += [
        Field("instance gpus", (GPU_HOST,), "auto", set_at(*instance_at, "gpus"), instance=True,
              blames=prefix("gpus")),
        Field("instance nodes[1]", (GPU_HOST, CPU_HOST), None, nodes_put, instance=True, blames=prefix("nodes"),
              near=(GPU_HOST, CPU_HOST, "gpu-b")),
        Field("instance env value", (GPU_HOST, CPU_HOST), ENV["VLLM_LOGGING_LEVEL"],
              set_at(*instance_at, "env", "VLLM_LOGGING_LEVEL"), instance=True, blames=prefix("env"),
              lands=lands_in_environment("VLLM_LOGGING_LEVEL", None)),
        Field("instance env name", (GPU_HOST, CPU_HOST), "OMP_NUM_THREADS",
              renamed(*instance_at, "env", "OMP_NUM_THREADS"), instance=True, blames=prefix("env"),
              other_value=lambda text: text in ENV, lands=lands_in_environment(None, "4"),
              near=("HF_TOKEN", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "1X", "A-B", "X=Y")),
        engine_args_field("instance engine_args value", ("uvicorn-log-level",), "one value"),
        engine_args_field("instance engine_args value of a flag without one", ("enforce-eager",), "no value"),
        engine_args_field("instance engine_args list item", ("allowed-media-domains", 0), "list item"),
        engine_args_field("instance engine_args JSON value", ("override-generation-config", "temperature"),
                          "JSON value"),
        engine_args_field("instance engine_args JSON key", ("override-generation-config", "temperature"),
                          "JSON key"),
        Field("instance engine_args flag name", (GPU_HOST, CPU_HOST), "max-log-len",
              renamed(*instance_at, "engine_args", "max-log-len"), instance=True, blames=prefix("engine_args"),
              other_value=lambda text: text in ENGINE_ARGS,
              lands=lambda files, text: lands_in_yaml(normalised_flag(text), lambda t: "100")(files, text),
              near=("--uvicorn-log-level", "uvicorn_log_level", "--max_log_len", "host", "api-key",
                    "no-enforce-eager", "disable-log-stats", "headless", "model", "kv-cache-dtype")),
        Field("instance model_info dtype", (CPU_HOST,), TINY_MODEL_INFO["dtype"],
              set_at(*instance_at, "model_info", "dtype"), instance=True, blames=prefix("model_info")),
        Field("a key of an instance's model_info", (CPU_HOST,), None, added(*instance_at, "model_info", value=1),
              instance=True, blames=prefix("model_info"),
              other_value=lambda text: text in ModelInfo.field_names() or text in MODEL_INFO_KEYS,
              near=("rope_theta", "dtype ", "architectures", "weight_gib")),
        Field("a key of an instance", (GPU_HOST, CPU_HOST), None, added(*instance_at),
              instance=True, blames=lambda key, text: key == text or key.startswith(repr(text)),
              other_value=lambda text: text in INSTANCE_KEYS, near=("comment", "nmae", "Name", "port ")),
        Field("a key of a GPU", (GPU_HOST,), None, added("gpus", 0), blames=prefix("gpus[0]"),
              other_value=lambda text: text in base_data(GPU_HOST)["gpus"][0], near=("serial", "nme")),
    ]
    return out + gpu_fields()


FIELDS = fields()
CASES = [(kind, f) for f in FIELDS for kind in f.kinds]

# --- Text ------------------------------------------------------------------------------------------

# What ends a line or a token somewhere (systemd, nginx, YAML, a shell, a terminal), what systemd,
# nginx or a shell substitutes, and ordinary text around them; "\udcff" is a byte that is no UTF-8,
# as Python reads it with surrogateescape.
SPECIAL = list("\n\r\x00\x1b\x85\t\u2028\u2029\ufeff%'\"\\$[];{}# =-`*~&|<>!?():,@\udcff")
ORDINARY = list("abcxyzABCXYZ0189_./+é日")
PIECES = st.text(alphabet=st.sampled_from(SPECIAL + ORDINARY), max_size=12)
NEAR_ANYWHERE = ("", " ", "--host=0.0.0.0", "%Z", "%%", "a\\", "\\", "$HOME", "${X}", "x;y", "{", "}",
                 "[Service]", "x\nExecStartPre=+/bin/id", "'", '"', "#", ";", "true", "null", "yes", "1e3",
                 "a: b", "- x", "*a", "&a", "!!python/object/apply:os.system ['id']", "::", "0.0.0.0",
                 "127.0.0.1", "/", "/etc", "..", "/var/lib/vllm-fleet/x y", "\ufeffx", "x\u2028y")


@st.composite
def mutated(draw, benign: str) -> str:
    """The benign value with a piece put in, in front, at the end or in place of its tail."""
    piece = draw(PIECES)
    at = draw(st.integers(0, len(benign)))
    how = draw(st.sampled_from(["insert", "replace tail"]))
    return benign[:at] + piece + (benign[at:] if how == "insert" else "")


@st.composite
def long_text(draw, benign: str) -> str:
    unit = draw(st.text(alphabet=st.sampled_from(SPECIAL + ORDINARY), min_size=1, max_size=4))
    size = draw(st.integers(1000, 6000))
    return (benign + unit * size)[:size]


def texts(field: Field) -> st.SearchStrategy[str]:
    benign = field.benign if isinstance(field.benign, str) else ""
    return st.one_of(PIECES, st.text(max_size=16), mutated(benign), long_text(benign))


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


# --- The two outcomes ------------------------------------------------------------------------------

def assert_refused_where_it_is(errors: list[ConfigError], name: str, kind: str, field: Field, text: Any) -> None:
    where = [e.located() for e in errors]
    assert errors, "ConfigErrors without an error"
    hosts = {name, repr(name)} if field.name == "host name" else {name}
    for e in errors:
        assert e.host in hosts, where
        assert isinstance(e.key, str) and e.key, where
        for part in (e.host, e.instance, e.key, e.message, e.fix):
            # The CLI prints these: no control character of the input reaches the terminal, and
            # no byte that is no UTF-8 (printing it would crash the CLI).
            assert part is None or not kinds.LINE_BREAKING.search(part), ("control character", where)
            assert part is None or is_utf8(part), ("not UTF-8", where)
    if field.instance:
        label = instance_name(kind)
        if field.name == "instance name":
            label = text if text and not kinds.LINE_BREAKING.search(text) and is_utf8(text) else "#0"
        assert any(e.instance == label and field.blames(e.key, text) for e in errors), (label, where)
    else:
        assert any(e.instance is None and field.blames(e.key, text) for e in errors), where


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


SYSTEMD_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,250}\.service")  # unit_name_is_valid, 255 in all


def assert_same_structure(got: list[RenderedFile], baseline: list[RenderedFile], field: Field, text: Any) -> None:
    paths = [f.path for f in got]
    assert len(set(paths)) == len(paths), ("two files at one path", paths)
    assert len(got) == len(baseline), ([f.path for f in baseline], paths)
    for path in paths:  # Linux's NAME_MAX and PATH_MAX
        assert all(0 < len(part.encode("utf-8", "surrogatepass")) <= 255 for part in path.split("/")[1:]), path
        assert len(path.encode("utf-8", "surrogatepass")) < 4096, path
    for mine, base in zip(got, baseline, strict=True):
        assert mine.path.rsplit(".", 1)[-1] == base.path.rsplit(".", 1)[-1], (mine.path, base.path)
        content = mine.content
        assert is_utf8(content), (mine.path, "not UTF-8: the file cannot go to the host")
        if mine.path.endswith(".service"):
            assert SYSTEMD_UNIT_NAME.fullmatch(mine.path.rsplit("/", 1)[1]), mine.path
            assert "\x00" not in content and "\r" not in content, mine.path
            lines = SYSTEMD_LINE_END.split(content)
            assert not any(continues(line) for line in lines), (mine.path, "a line continues into the next")
            directives = [(s, d) for s, d, _w, _p in unit_structure(content)]
            assert directives == [(s, d) for s, d, _w, _p in unit_structure(base.content)], mine.path
            assert unit_structure(content) == unit_structure(base.content), mine.path
        elif mine.path.endswith(".conf"):
            assert nginx_structure(content) == nginx_structure(base.content), mine.path
        elif mine.path.endswith(".yaml"):
            config, expected = yaml.safe_load(content), yaml.safe_load(base.content)
            keys, flags = list(expected), vllm_flags_read(expected)
            if field.name == "instance engine_args flag name":  # the text is a flag name there
                renamed_flag = normalised_flag(text)
                keys = deduplicated([renamed_flag if k == field.benign else k for k in keys])
                flags = deduplicated([renamed_flag if f == field.benign else f for f in flags])
            assert list(config) == keys, mine.path
            assert vllm_flags_read(config) == flags, mine.path
        elif mine.path.endswith(".json"):
            assert json_shape(json.loads(content)) == json_shape(json.loads(base.content)), mine.path
        elif mine.path.endswith(".env"):
            names = [line.split("=", 1)[0] for line in content.splitlines() if line and not line.startswith("#")]
            assert names == [line.split("=", 1)[0] for line in base.content.splitlines()
                             if line and not line.startswith("#")], mine.path
        elif mine.path.endswith(".py"):
            ast.parse(content)
        else:
            raise AssertionError(f"{mine.path}: a kind of file this test does not read")
    if field.lands:
        field.lands({f.path: f.content for f in got}, text)


@functools.cache
def baseline(kind: str, field_name: str) -> list[RenderedFile]:
    field = next(f for f in FIELDS if f.name == field_name and kind in f.kinds)
    name, data = (kind, base_data(kind)) if field.benign is None else field.put(kind, base_data(kind), field.benign)
    return render(name, data)


# --- The tests ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def figures_line():
    yield
    if COUNTS["examples"]:
        report(f"boundary property test: {COUNTS['examples']} examples over {len({f.name for f in FIELDS})} fields: "
               f"{COUNTS['refused']} refused with a located error, {COUNTS['rendered']} rendered with the "
               "expected directives")


#: What parse, plan and render of one host may take, at most (a few milliseconds are usual): more is
#: a pattern backtracking without end, which would hang `vllm-fleet plan`.
SECONDS_PER_EXAMPLE = 10


@contextlib.contextmanager
def time_limit(seconds: float):
    def stop(signum, frame):
        raise TimeoutError(f"took more than {seconds} s")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused_where_it_is_or_rendered_alike(kind: str, field: Field, text: Any) -> None:
    """The property, for one text in one field of one host."""
    COUNTS["examples"] += 1
    name, host = field.put(kind, base_data(kind), text)
    try:
        with time_limit(SECONDS_PER_EXAMPLE):
            files = render(name, host)
    except ConfigErrors as exc:
        assert_refused_where_it_is(exc.errors, name, kind, field, text)
        COUNTS["refused"] += 1
        return
    except ConfigError as exc:
        assert_refused_where_it_is([exc], name, kind, field, text)
        COUNTS["refused"] += 1
        return
    assert_same_structure(files, baseline(kind, field.name), field, text)
    COUNTS["rendered"] += 1


IDS = [f"{kind}: {f.name}" for kind, f in CASES]


@pytest.mark.parametrize("kind, field", CASES, ids=IDS)
@settings(max_examples=EXAMPLES_PER_CASE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_text_in_a_field_is_refused_where_it_is_or_renders_the_benign_structure(kind, field, data):
    text = data.draw(texts(field), label="text")
    assume(not field.other_value(text))
    refused_where_it_is_or_rendered_alike(kind, field, text)


@pytest.mark.parametrize("kind, field", CASES, ids=IDS)
def test_near_misses_are_refused_where_they_are_or_render_the_benign_structure(kind, field):
    """Every near miss, in every run: generated text seldom hits one exactly. From the benign value:
    a name longer than a path's may be, thousands of digits, and a run of letters that fails at its
    end (what makes a pattern of nested repetitions backtrack)."""
    benign = field.benign if isinstance(field.benign, str) else ""
    derived = (benign + "/" + "x" * 300, benign + "0" * 5000, benign + "a" * 40 + "!")
    for text in NEAR_ANYWHERE + field.near + derived:
        if not field.other_value(text):
            refused_where_it_is_or_rendered_alike(kind, field, text)


def test_every_text_knob_has_a_benign_value():
    """A new text knob whose default is None or [] needs a valid example in BENIGN_KNOBS."""
    for knob in TEXT_KNOBS:
        benign = BENIGN_KNOBS.get(knob, Settings.defaults()[knob])
        assert isinstance(benign, str), f"add a valid value of {knob} to BENIGN_KNOBS"
        assert Settings.problem(knob, [benign] if text_kind(TYPES[knob]) == "list" else benign) is None, knob


@pytest.mark.parametrize("kind, field", CASES, ids=IDS)
def test_the_benign_value_renders(kind, field):
    files = baseline(kind, field.name)
    assert any(f.path.endswith(".service") for f in files)
    if field.lands and field.benign is not None:
        field.lands({f.path: f.content for f in files}, field.benign)


def test_the_readers_see_an_injected_directive():
    """The structure readers catch what the property is about (else every example would pass)."""
    unit = "[Service]\nUser=vllm\nDescription=x\n"
    assert unit_structure(unit) != unit_structure("[Service]\nUser=vllm\nDescription=x\rExecStartPre=+/bin/id\n")
    assert unit_structure(unit) != unit_structure("[Service]\nUser=vllm\nDescription=%x\n")
    assert continues("Description=x\\") and not continues("Description=x\\\\")
    conf = "events {\n}\nhttp {\n    listen 1.2.3.4:80;\n}\n"
    assert nginx_structure(conf) != nginx_structure(conf.replace("80;", "80; include /x;"))
    assert nginx_structure(conf) == nginx_structure(conf.replace("80;", "80; # x; y {"))
    assert nginx_structure('a "x;y";') == [(0, "a", 1, ";")]
    table = "geo $g {\n    10.0.0.11 1;\n}\n"  # an entry's address is data, a keyword is not
    assert nginx_structure(table) == nginx_structure(table.replace("10.0.0.11", "0.0.0.1"))
    assert nginx_structure(table) != nginx_structure(table.replace("10.0.0.11", "default"))
    assert nginx_structure(table) != nginx_structure(table.replace("10.0.0.11", "include"))
    assert vllm_flags_read({"enforce-eager": True, "port": 1}) == ["enforce-eager", "port"]
    assert vllm_flags_read({"enforce-eager": "--host=0.0.0.0"}) == ["enforce-eager", "host"]
    assert vllm_flags_read({"enforce-eager": "true"}) == ["enforce-eager", ("<stray argument>", "true")]
    assert vllm_flags_read({"uvicorn-log-level": "-x", "port": 1}) == [
        "uvicorn-log-level", ("<no value>", "uvicorn-log-level"), "x", ("<no value>", "x"), "port"]
    assert vllm_flags_read({"allowed-media-domains": ["a", "b"], "port": -1}) == ["allowed-media-domains", "port"]
