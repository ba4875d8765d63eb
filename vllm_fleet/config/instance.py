"""The instance schema: every key of an instance declared once, as a field of InstanceConfig, and the
parse of one vllm_instances entry (each key on its own, then the rules between its keys)."""

from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable

from vllm_fleet import kinds
from vllm_fleet.catalog import ModelInfo, is_gguf, lookup
from vllm_fleet.config.instance_parsers import parse_engine_args, parse_env, parse_nodes
from vllm_fleet.config.model_info import parse_model_info
from vllm_fleet.settings import Checker, Settings, did_you_mean


# Host-level knobs and their defaults, from the typed model (vllm_fleet/settings.py: each knob's type,
# default, doc and check). group_data/all.py repeats them with documentation (tests/test_settings.py
# keeps the two in step).
HOST_DEFAULTS: dict[str, Any] = Settings.defaults()

DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
MIN_START_TIMEOUT_S = 30
#: A day: the longest start the unit waits for (TimeoutStartSec=; systemd's own limit is far above it,
#: but a larger number in the unit's start limit interval is one systemd cannot parse).
MAX_START_TIMEOUT_S = 86400


def instance_unit(name: str) -> str:
    """The systemd unit of instance `name`: the one naming rule (plan, render, deploy, status)."""
    return f"{INSTANCE_UNIT_PREFIX}{name}{INSTANCE_UNIT_SUFFIX}"


def instance_of_unit(unit: str) -> str | None:
    """The instance a unit name belongs to (instance_unit's inverse); None for another unit."""
    if unit.startswith(INSTANCE_UNIT_PREFIX) and unit.endswith(INSTANCE_UNIT_SUFFIX):
        return unit[len(INSTANCE_UNIT_PREFIX):-len(INSTANCE_UNIT_SUFFIX)] or None
    return None


INSTANCE_UNIT_PREFIX, INSTANCE_UNIT_SUFFIX = "vllm-", ".service"


# --- The instance schema: every key of an instance declared once, in InstanceConfig ---------------
#
# Each field of InstanceConfig is one instance key: its type (the annotation), the value an absent key
# stands for, a one-line doc (group_data/all.py lists them; tests/test_config.py keeps the two in
# step) and the function that checks a given value. INSTANCE_KEYS and the parser are derived from
# it; what relates two keys, or an instance to its host, is checked after every key on its own
# (_check_instance, parse_host, check_fleet).

#: An instance key that must be given.
REQUIRED: Any = MISSING


@dataclass(frozen=True)
class HostKnob:
    """An instance default that is a host knob: the host's value of it (Settings' default unless set)."""

    knob: str


def instance_field(default: Any, doc: str, parse: Callable[[Checker, Any, str, str], Any], **meta: Any) -> Any:
    """A field of InstanceConfig. `default`: what an absent key means (REQUIRED: none; a HostKnob:
    the host's knob); `doc`: one line; `parse(check, value, instance, key)` returns the value to keep
    and reports a bad one on `check`. `written`: the default as host data writes it, where the
    parsed value differs ("auto" for gpus)."""
    meta = {"doc": doc, "default": default, "parse": parse, **meta}
    if default is REQUIRED:
        return field(metadata=meta)
    value = HOST_DEFAULTS[default.knob] if isinstance(default, HostKnob) else default
    if isinstance(value, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=value, metadata=meta)


def _optional(parse: Callable[[Checker, Any, str, str], Any]) -> Callable[[Checker, Any, str, str], Any]:
    """`parse` for a key that may also be given as None (the same as leaving it out)."""
    return lambda check, value, instance, key: None if value is None else parse(check, value, instance, key)


def _parse_name(check: Checker, value: Any, instance: str, key: str) -> Any:
    if not isinstance(value, str):
        check.error(f"expected str, got {value!r}", instance=instance, key=key, fix="name = 'gemma'")
    elif kinds.name_problem(value):
        check.error(f"name {value!r} is not allowed (it becomes the unit vllm-<name>.service)",
                    instance=instance, key=key, fix="letters, digits, '-' and '_' only, 1-64 chars")
    return value


def _model_reference(fix: str) -> Callable[[Checker, Any, str, str], Any]:
    """A model or tokenizer: a Hugging Face id or an absolute path on the host (kinds)."""
    def parse(check: Checker, value: Any, instance: str, key: str) -> Any:
        problem = kinds.model_reference_problem(value)
        if problem:
            check.error(f"{key} {problem}", instance=instance, key=key, fix=fix)
        return value
    return parse


def _parse_served_name(check: Checker, value: Any, instance: str, key: str) -> Any:
    problem = kinds.served_name_problem(value)
    if problem:
        check.error(f"served_model_name {problem}", instance=instance, key=key,
                    fix="served_model_name = 'gemma3-12b-q4' (clients send it as 'model')")
    return value


def _parse_port(check: Checker, value: Any, instance: str, key: str) -> Any:
    if check.typed(value, int, instance=instance, key=key, example="8000") and not 1024 <= value <= 65535:
        check.error(f"port {value} is outside 1024-65535 (vLLM runs as a non-root user)",
                    instance=instance, key=key, fix="pick a free port such as 8000")
    return value


def _parse_model_source(check: Checker, value: Any, instance: str, key: str) -> Any:
    if not isinstance(value, str) or not value.strip():
        check.error(f"expected the model's directory on this workstation, got {value!r}", instance=instance,
                    key=key, fix="model_source = '/srv/models/qwen2.5-7b' (or leave it unset)")
    return value


def _parse_instance_gpus(check: Checker, value: Any, instance: str, key: str) -> tuple[int, ...] | None:
    if value == "auto":
        return None
    if (not isinstance(value, (list, tuple)) or not value
            or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in value)):
        check.error(f"gpus must be 'auto' or a non-empty list of GPU indices, got {value!r}",
                    instance=instance, key=key, fix="gpus = [1, 2] (PCI bus order, as nvidia-smi shows)")
    elif len(set(value)) != len(value):
        check.error(f"gpus lists a GPU twice: {list(value)}", instance=instance, key=key,
                    fix="list each GPU index once")
    else:
        return tuple(value)
    return None


def _parse_positive(check: Checker, value: Any, instance: str, key: str) -> int | None:
    """A whole number of at least 1 (None: the key's default)."""
    if value is None or not check.typed(value, int, instance=instance, key=key, example="2"):
        return None
    if value < 1:
        check.error(f"must be at least 1, got {value}", instance=instance, key=key, fix=f"{key} = 2")
    return value


def _parse_start_timeout(check: Checker, value: Any, instance: str, key: str) -> int | None:
    before = len(check.errors)
    value = _parse_positive(check, value, instance, key)
    if value is not None and len(check.errors) == before and value < MIN_START_TIMEOUT_S:
        check.error(f"start_timeout_s {value} is too short for any vLLM to start", instance=instance, key=key,
                    fix=f"at least {MIN_START_TIMEOUT_S} s, or leave it unset (sized to the weights)")
    elif value is not None and len(check.errors) == before and value > MAX_START_TIMEOUT_S:
        check.error(f"start_timeout_s {value} is more than a day ({MAX_START_TIMEOUT_S} s)", instance=instance,
                    key=key, fix=f"at most {MAX_START_TIMEOUT_S} s, or leave it unset (sized to the weights)")
    return value


def _parse_utilization(check: Checker, value: Any, instance: str, key: str) -> Any:
    if check.typed(value, (int, float), instance=instance, key=key, example="0.9"):
        if not 0 < value <= 1:
            check.error(f"gpu_memory_utilization must be in (0, 1], got {value}", instance=instance, key=key,
                        fix="a fraction of each GPU's total memory, e.g. 0.9")
        return float(value)
    return value


def _parse_dtype(check: Checker, value: Any, instance: str, key: str) -> Any:
    if value not in DTYPES:
        guess = did_you_mean(str(value), DTYPES)
        check.error(f"dtype {value!r} is not one vLLM accepts", instance=instance, key=key,
                    fix=f"did you mean '{guess}'?" if guess else f"one of {', '.join(DTYPES)}")
    return value


@dataclass(frozen=True)
class InstanceConfig:
    """One `vllm serve` the user asked for (before planning): one field per instance key."""

    name: str = instance_field(
        REQUIRED, "the unit is vllm-<name>.service: letters, digits, '-' and '_' (1-64 characters)", _parse_name)
    model: str = instance_field(
        REQUIRED, "a Hugging Face id, or the model's absolute path on the host",
        _model_reference("model = 'Qwen/Qwen2.5-7B-Instruct', or the model's absolute path on the host"))
    served_model_name: str = instance_field(
        REQUIRED, "what clients send as 'model'; one name is one model across the fleet", _parse_served_name)
    port: int = instance_field(
        REQUIRED, "clients reach the instance at <vllm_bind_host>:<port> (1024-65535)", _parse_port)
    tokenizer: str | None = instance_field(
        None, "a Hugging Face id or a host path (None: the model's); a GGUF model needs its base model's",
        _optional(_model_reference("tokenizer = 'google/gemma-3-12b-it', or the tokenizer directory's "
                                   "absolute path on the host")))
    model_source: str | None = instance_field(
        None, "a directory on the workstation, synced to `model` on the host (None: no sync)",
        _optional(_parse_model_source))
    gpus: tuple[int, ...] | None = instance_field(
        None, "'auto' (the planner places the instance) or GPU indices in PCI bus order", _parse_instance_gpus,
        written="auto")
    tensor_parallel_size: int | None = instance_field(
        None, "GPUs per tensor-parallel group (None: the planner decides)", _parse_positive)
    pipeline_parallel_size: int | None = instance_field(
        None, "pipeline stages (None: the planner decides)", _parse_positive)
    data_parallel_size: int | None = instance_field(None, "replicas (None: the planner decides)", _parse_positive)
    max_model_len: int | None = instance_field(
        None, "the longest sequence (None: the model's max_position_embeddings)", _parse_positive)
    gpu_memory_utilization: float = instance_field(
        HostKnob("vllm_gpu_memory_utilization"), "the fraction of each GPU's total memory vLLM may use",
        _parse_utilization)
    max_num_seqs: int | None = instance_field(None, "vLLM's --max-num-seqs (None: vLLM's default)", _parse_positive)
    max_num_batched_tokens: int | None = instance_field(
        None, "vLLM's --max-num-batched-tokens (None: vLLM's default)", _parse_positive)
    start_timeout_s: int | None = instance_field(
        None, "how long a start may take before the unit stops it (None: 300 s + 20 s per GiB, at most 3600)",
        _parse_start_timeout)
    dtype: str = instance_field("auto", f"one of {', '.join(DTYPES)}", _parse_dtype)
    engine_args: dict[str, Any] = instance_field(
        {}, "other `vllm serve` flags by their long names, e.g. {'enforce-eager': True}", parse_engine_args)
    env: dict[str, str] = instance_field({}, "extra, non-secret environment variables", parse_env)
    model_info: ModelInfo | None = instance_field(
        None, "the model's config.json as it is, or its directory's path (None: the built-in catalog's shape)",
        parse_model_info)
    nodes: tuple[str, ...] | None = instance_field(
        None, "multi-node (Ray): inventory host names, the head first (None: this host alone)", parse_nodes)

    @property
    def unit_name(self) -> str:
        return instance_unit(self.name)

    @property
    def head(self) -> str | None:
        """The host that runs `vllm serve` of a multi-node instance (None on one host)."""
        return self.nodes[0] if self.nodes else None

    @property
    def gguf(self) -> bool:
        return is_gguf(self.model, self.model_info)

    @property
    def enforce_eager(self) -> bool:
        return bool(kinds.switch_value(self.engine_args.get("enforce-eager")))


INSTANCE_FIELDS: dict[str, Field] = {f.name: f for f in fields(InstanceConfig)}
INSTANCE_KEYS: tuple[str, ...] = tuple(INSTANCE_FIELDS)
REQUIRED_INSTANCE_KEYS = tuple(k for k, f in INSTANCE_FIELDS.items() if f.metadata["default"] is REQUIRED)


def parse_instance(check: Checker, raw: Any, position: int, settings: Settings) -> InstanceConfig | None:
    """One entry of vllm_instances: each key by its field's parser (InstanceConfig), then the rules
    between keys (_check_instance). None when anything is wrong (reported on `check`)."""
    if not isinstance(raw, dict):
        check.error(f"vllm_instances[{position}] must be a dict, got {type(raw).__name__}",
                    key=f"vllm_instances[{position}]",
                    fix="vllm_instances = [{'name': 'gemma', 'model': ..., 'served_model_name': ..., 'port': 8000}]")
        return None
    name = raw.get("name")
    label = name if isinstance(name, str) and name else f"#{position}"
    before = len(check.errors)
    check.unknown_keys(raw, INSTANCE_KEYS, instance=label)
    values: dict[str, Any] = {}
    valid: set[str] = set()  # the keys given or defaulted without a problem
    for key, f in INSTANCE_FIELDS.items():
        default = f.metadata["default"]
        if key in raw:
            errors = len(check.errors)
            values[key] = f.metadata["parse"](check, raw[key], label, key)
            if len(check.errors) == errors:
                valid.add(key)
        elif default is REQUIRED:
            check.error(f"missing required key '{key}'", instance=label, key=key, fix=f"add '{key}' to the instance")
        else:
            valid.add(key)
            if isinstance(default, HostKnob) and not Settings.problem(default.knob, settings[default.knob]):
                values[key] = f.metadata["parse"](check, settings[default.knob], label, key)
    _check_instance(check, raw, values, valid, label)
    if len(check.errors) > before:
        return None
    return InstanceConfig(**values)


def _check_instance(check: Checker, raw: dict, values: dict[str, Any], valid: set[str], label: str) -> None:
    """The rules between an instance's keys, once each key is checked on its own; fills in the
    model's shape from the built-in catalog when model_info is not given."""
    model = values.get("model")
    if values.get("model_source") is not None and {"model", "model_source"} <= valid:
        _check_sync_destination(check, label, model)
    nodes = values.get("nodes")
    if nodes and "data_parallel_size" in valid and (values.get("data_parallel_size") or 1) > 1:
        check.error("a multi-node instance is one replica: tensor parallel inside each node, pipeline "
                    "parallel across the nodes", instance=label, key="data_parallel_size",
                    fix="drop data_parallel_size; for more replicas declare another instance")
    given_pp = values.get("pipeline_parallel_size") if "pipeline_parallel_size" in valid else None
    if nodes and given_pp is not None and given_pp != len(nodes):
        check.error(f"pipeline_parallel_size {given_pp} but a multi-node instance has pipeline_parallel_size "
                    f"= the number of nodes = {len(nodes)}", instance=label, key="pipeline_parallel_size",
                    fix="drop pipeline_parallel_size (the nodes decide it), or change 'nodes'/'gpus'")
    if "model_info" not in raw and isinstance(model, str):
        values["model_info"] = lookup(model)
    if isinstance(model, str) and is_gguf(model, values.get("model_info")) and not values.get("tokenizer"):
        check.error("a GGUF model needs 'tokenizer' (the base model's tokenizer directory or id)",
                    instance=label, key="tokenizer",
                    fix="tokenizer = 'google/gemma-3-12b-it' (the model the GGUF was made from)")


def _check_sync_destination(check: Checker, label: str, model: str) -> None:
    """With model_source, `model` is the host directory the sync makes equal to the source: what the
    source lacks is deleted there. It must be a directory vllm-fleet may own (the sync itself checks
    at deploy time that it holds nothing vllm-fleet did not put there)."""
    problem = kinds.managed_path_problem(model) if model.startswith("/") else (
        f"{model!r} is not an absolute path on the host")
    if problem:
        check.error(f"model is where model_source is synced to (deleting what the source lacks): {problem}",
                    instance=label, key="model",
                    fix="model = '<vllm_models_dir>/<a directory of this model's own>', e.g. "
                        "'/var/lib/vllm-fleet/models/qwen2.5-7b'")
