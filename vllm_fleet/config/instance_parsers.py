"""The parsers of an instance's structured keys (engine_args, env, nodes; model_info's is in
model_info.py) and the tables they judge by: which `vllm serve` flags and environment variables are
vllm-fleet's to set, and why. InstanceConfig (vllm_fleet/config/instance.py) declares each key with
its parser."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from vllm_fleet import kinds, vllm_flags
from vllm_fleet.config.errors import Checker, did_you_mean
from vllm_fleet.kinds import ENV_NAME_RE

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
    "host": "vLLM listens on 127.0.0.1, behind the host's front (vllm_bind_host is where the front listens)",
    "config": "vllm-fleet writes the instance's engine config and starts vLLM with it",
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
    "enable-lora": "the instance's 'adapters' turn LoRA on",
    "max-lora-rank": "the planner sizes it from the ranks of the instance's 'adapters'",
    "max-loras": "the planner sizes it from the number of the instance's 'adapters'",
    "max-cpu-loras": "the planner sizes it from the number of the instance's 'adapters' (vLLM refuses one below max-loras)",
    "lora-modules": "the instance's 'adapters' are loaded into the running vLLM (adding one needs no restart)",
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
    # vLLM's LoRA resolvers load an adapter for any model name a request asks for, from a directory or
    # the hub (vllm/plugins/lora_resolvers): the instance's `adapters` are the only ones it serves.
    "VLLM_LORA_RESOLVER_CACHE_DIR": "it loads an adapter for any model name a request asks for (use 'adapters')",
    "VLLM_LORA_RESOLVER_HF_REPO_LIST": "it loads an adapter for any model name a request asks for (use 'adapters')",
    # The SageMaker hosting library vLLM's API server loads (model_hosting_container_standards) imports
    # the Python files and functions these name as handlers and middleware.
    "CUSTOM_SCRIPT_FILENAME": "it names Python code vLLM's API server loads",
    "CUSTOM_PRE_PROCESS": "it names Python code vLLM's API server runs on every request",
    "CUSTOM_POST_PROCESS": "it names Python code vLLM's API server runs on every response",
    "CUSTOM_FASTAPI_INVOCATION_HANDLER": "it names Python code vLLM's API server runs as a handler",
    "CUSTOM_FASTAPI_PING_HANDLER": "it names Python code vLLM's API server runs as a handler",
    "CUSTOM_FASTAPI_MIDDLEWARE_PRE_POST_PROCESS": "it names Python code vLLM's API server runs as middleware",
    "CUSTOM_FASTAPI_MIDDLEWARE_THROTTLE": "it names Python code vLLM's API server runs as middleware",
}
#: Prefixes of variables that change which code a process loads (the dynamic loader's LD_*, the
#: interpreter's PYTHON*): an instance's `env` sets none of them.
OWNED_ENV_PREFIXES = {"LD_": "the dynamic loader reads it: it changes which code vLLM loads",
                      "PYTHON": "the interpreter reads it: it changes which code vLLM runs",
                      "SAGEMAKER_": "the SageMaker hosting library in vLLM's API server reads it (SAGEMAKER_MODEL_PATH "
                                    "locates Python code it loads)"}
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


def parse_engine_args(check: Checker, raw: Any, instance: str, key: str = "engine_args", settings: Any = None, *,
                      keyed_flags: Mapping[str, str] = {}) -> dict[str, Any]:
    """`engine_args`: each name a flag of the `vllm serve` the host installs (its package's table,
    vllm_flags; vllm without `settings`) that vllm-fleet leaves to the user, each value one that flag
    takes. `keyed_flags`: the flags an instance key sets, and the key."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        check.error(f"expected a dict of `vllm serve` flags, got {type(raw).__name__}",
                    instance=instance, key="engine_args", fix="engine_args = {'enforce-eager': True}")
        return {}
    package = settings.engine_package if settings is not None else "vllm"
    if package not in vllm_flags.TABLES:
        package = "vllm"  # an unknown vllm_package is that knob's own error
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
        main, expands = vllm_flags.resolve(name, package)
        problem = _flag_name_problem(name, main, expands, package, keyed_flags)
        if problem:
            check.error(problem[0], instance=instance, key=key, fix=problem[1])
            continue
        problem = _flag_value_problem(name, main or name, value, package)
        if problem:
            check.error(f"value {problem[0]}", instance=instance, key=key, fix=problem[1])
            continue
        out[name] = value
    return out


def _flag_name_problem(name: str, main: str | None, expands: list[str], package: str,
                       keyed_flags: Mapping[str, str]) -> tuple[str, str] | None:
    """(message, fix) when engine_args may not name `name`: a flag vllm-fleet sets itself (by any of
    its names), or no flag of the package's parser (a prefix of some, or unknown)."""
    if name in _ENGINE_ARGS_SECRET:
        return (f"'{name}' is a secret and must not be written to the YAML config",
                "export it on the workstation in the variable named by vllm_api_key_env (or vllm_hf_token_env); "
                "it goes to the root-only env file")
    if name in keyed_flags:
        return f"'{name}' has its own instance key", f"set {keyed_flags[name]} on the instance instead"
    if name in _ENGINE_ARGS_PLANNED:
        return f"'{name}' is vllm-fleet's to set: {_ENGINE_ARGS_PLANNED[name]}", f"remove '{name}' from engine_args"
    if expands:
        return (f"'{name}' is no flag of vLLM's parser but the start of "
                f"{', '.join('--' + e for e in expands[:3])}{', ...' if len(expands) > 3 else ''}, "
                "which vLLM would expand it to", f"write the flag's full name, e.g. '{expands[0]}'")
    if main is None:
        guess = did_you_mean(name, list(vllm_flags.option_names(package)))
        release = vllm_flags.table(package)["vllm"]
        return (f"'{name}' is no flag of `vllm serve` ({package} {release}): vLLM would refuse to start",
                f"did you mean '{guess}'?" if guess else
                "use a flag `vllm serve --help` lists, by its long name without the dashes")
    owned = _ENGINE_ARGS_SECRET | set(keyed_flags) | set(_ENGINE_ARGS_PLANNED)
    if main != name and main in owned:
        return (f"'{name}' is another name of --{main}, which engine_args may not set",
                f"see what --{main} says: set it as vllm-fleet asks")
    return None


def _flag_value_problem(name: str, flag: str, value: Any, package: str) -> tuple[str, str] | None:
    """(problem, fix) when `value` is none that `--name` takes: a switch takes True or False, a list
    only a flag of several values, a flag with choices one of them."""
    takes_value = name not in vllm_flags.switch_flags(package)
    takes_list = name in vllm_flags.list_flags(package)
    problem = kinds.flag_value_problem(value, takes_list=takes_list, takes_value=takes_value)
    if problem:
        return problem, (f"give --{name} True or False" if not takes_value else
                         f"give --{name} a list of plain values, none starting with '-'" if takes_list else
                         f"give --{name} one value (a string, number or boolean)")
    if takes_value and value is True:
        return (f"{value!r}: vLLM's config loader writes True as the bare flag, and --{name} takes a value "
                "(vLLM refuses it: expected one argument)", f"give --{name} one value (a string, number or boolean)")
    if not takes_value and name != flag and kinds.switch_value(value) is False:
        # vllm-fleet writes a false as the flag's negated name; --name is one already, and vLLM's
        # config loader drops a false it is given.
        return (f"{value!r}: --{name} is the negation of --{flag}, and vLLM's config loader drops a false "
                "(the flag would keep its default)", f"write '{flag}': True instead (it says the same)")
    allowed = vllm_flags.choices(flag, package)
    if allowed and value is not None and not isinstance(value, bool):
        outside = [str(v) for v in (value if isinstance(value, (list, tuple)) else [value]) if str(v) not in allowed]
        if outside:
            guess = did_you_mean(outside[0], allowed)
            return (f"{outside[0]!r} is not one of vLLM's choices for --{name}: {', '.join(allowed)}",
                    f"did you mean '{guess}'?" if guess else f"give --{name} one of: {', '.join(allowed)}")
    return None


def parse_env(check: Checker, raw: Any, instance: str, key: str = "env", settings: Any = None) -> dict[str, str]:
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


def parse_nodes(check: Checker, raw: Any, instance: str, key: str = "nodes",
                settings: Any = None) -> tuple[str, ...] | None:
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
