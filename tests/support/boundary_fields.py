"""Every place text goes into a host's data, for the input boundary's property
(tests/input_boundary/test_boundary_properties.py): enumerated from the schema where it has types
(every text knob, every text key of an instance and of a declared GPU), and listed where it has none
(a GPU's compute_capability, the values inside env and engine_args, the keys of every dict, the host
name, an instance's nodes); each with a benign value, how to put a text there and where it must
land. And the render of one host, as `vllm-fleet render` does it."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from support.boundary_hosts import CPU_HOST, ENGINE_ARGS, ENV, GPU_HOST, base_data
from support.planning_fixtures import TINY_MODEL_INFO
from support.rendered_structure import unit_environment
from vllm_fleet.catalog import ModelInfo, is_gguf, lookup
from vllm_fleet.config import DTYPES, INSTANCE_KEYS, GpuSpec, InstanceConfig, check_fleet, parse_host
from vllm_fleet.config.model_info import READ_KEYS as MODEL_INFO_KEYS
from vllm_fleet.config.runner import CONVERTS, RUNNERS
from vllm_fleet.config.settings import KNOBS, TYPES, Settings
from vllm_fleet.gateway import fleet_backends
from vllm_fleet.plan import plan_fleet
from vllm_fleet.render import RenderedFile, Secrets, render_host

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
