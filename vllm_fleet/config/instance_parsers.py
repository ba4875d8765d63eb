"""The parsers of an instance's structured keys (engine_args, env, nodes; model_info's is in
model_info.py) and the tables they judge by: which `vllm serve` flags and environment variables are
vllm-fleet's to set, and why. InstanceConfig (vllm_fleet/config/instance.py) declares each key with
its parser."""

from __future__ import annotations

import math
import re
from typing import Any

from vllm_fleet import kinds, vllm_flags
from vllm_fleet.kinds import ENV_NAME_RE
from vllm_fleet.settings import Checker


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
    "shutdown-timeout": "vllm_shutdown_timeout_s sets it (the unit's stop timeout leaves room for it)",
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


def parse_engine_args(check: Checker, raw: Any, instance: str, key: str = "engine_args") -> dict[str, Any]:
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
        choices = vllm_flags.table()["flags"].get(flag_of, {}).get("choices")
        if not problem and takes_value and value is True:
            problem = (f"{value!r}: vLLM's config loader writes True as the bare flag, and --{name} takes a value "
                       "(vLLM refuses it: expected one argument)")
        elif not problem and choices and value is not None and not isinstance(value, bool):
            outside = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if str(v) not in choices]
            if outside:
                problem = f"{outside[0]!r} is not one of vLLM's choices for --{name}: {', '.join(choices)}"
        if problem:
            fix = (f"give --{name} True or False" if not takes_value else
                   f"give --{name} one value (a string, number or boolean)" if name not in vllm_flags.LIST_FLAGS
                   else f"give --{name} a list of plain values, none starting with '-'")
            check.error(f"value {problem}", instance=instance, key=key, fix=fix)
            continue
        out[name] = value
    return out


def parse_env(check: Checker, raw: Any, instance: str, key: str = "env") -> dict[str, str]:
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


def parse_nodes(check: Checker, raw: Any, instance: str, key: str = "nodes") -> tuple[str, ...] | None:
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
