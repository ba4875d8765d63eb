"""Validated fleet configuration: host data (inventory + group_data) -> dataclasses.

Every knob and its default is documented in `group_data/all.py`; the host-level knobs' types, defaults
and checks are `vllm_fleet/settings.py`'s Settings, each instance key's are a field of InstanceConfig.
This package holds the rest of the schema (GPUs, the fleet) and the one place where input is checked:
each key on its own by its declaration, then the rules between keys, instances and hosts. Errors name
the host, the instance and the key, and say the fix.

By concern, each module importing only those above it:

- gpus: GpuSpec, a host's declared `gpus`;
- model_files: a model directory on this workstation (config.json, the weights' size), read safely;
- model_info: the instance key model_info, a model's config.json as it is (or its directory);
- instance_parsers: the other structured instance keys (engine_args, env, nodes);
- instance: InstanceConfig (the instance schema), one vllm_instances entry, the unit naming rule;
- host: HostConfig and parse_host, the rules between one host's instances, the gateway's ports;
- fleet_checks: check_fleet and the node groups of multi-node instances;
- inventory: reading a pyinfra inventory file.

The rest of vllm_fleet imports the names below from `vllm_fleet.config`.
"""

from vllm_fleet.config.fleet_checks import (RAY_HEAD_PORTS, RAY_NODE_PORTS, RAY_WORKER_PORTS, NodeGroup, check_fleet,
                                            node_group_of, node_groups)
from vllm_fleet.config.gpus import GpuSpec
from vllm_fleet.config.host import (HUB_TOKEN_FILE, MANAGED_DIRECTORY_KNOBS, RESERVED_GATEWAY_NAME,
                                    RESERVED_INSTANCE_NAME, RESERVED_RAY_NAME, HostConfig, config_dir_clashes,
                                    gateway_ports, host_ports, monitoring_ports, parse_host, service_user_directories,
                                    synced_model_clashes)
from vllm_fleet.config.instance import (DTYPES, HOST_DEFAULTS, INSTANCE_FIELDS, INSTANCE_KEYS, INSTANCE_UNIT_PREFIX,
                                        INSTANCE_UNIT_SUFFIX, MAX_START_TIMEOUT_S, MIN_START_TIMEOUT_S, REQUIRED,
                                        REQUIRED_INSTANCE_KEYS, HostKnob, InstanceConfig, instance_field,
                                        instance_of_unit, instance_unit)
from vllm_fleet.config.instance_parsers import OWNED_ENV, OWNED_ENV_FIX, OWNED_ENV_PREFIXES
from vllm_fleet.config.inventory import (inventory_rows, limited_rows, load_inventory, read_pyinfra_inventory,
                                        split_names, unused_group_data)
# The error types and the shared constants of every input check live in settings (Settings raises
# them too); they are importable from here as well, beside the schema that reports them.
from vllm_fleet.kinds import ENV_NAME_RE, INDEX_URL_RE
from vllm_fleet.settings import (ENV_MANAGERS, GIB_BYTES, KNOBS, PLACEMENTS,
                                 RAY_OBJECT_STORE_MIN_BYTES, TARGETS, Checker, ConfigError, ConfigErrors, Settings,
                                 did_you_mean)

__all__ = [
    # errors and shared constants (vllm_fleet.settings)
    "Checker", "ConfigError", "ConfigErrors", "Settings", "did_you_mean", "ENV_MANAGERS", "ENV_NAME_RE", "GIB_BYTES",
    "INDEX_URL_RE", "KNOBS", "PLACEMENTS", "RAY_OBJECT_STORE_MIN_BYTES", "TARGETS",
    # gpus
    "GpuSpec",
    # instance_parsers
    "OWNED_ENV", "OWNED_ENV_FIX", "OWNED_ENV_PREFIXES",
    # instance
    "DTYPES", "HOST_DEFAULTS", "INSTANCE_FIELDS", "INSTANCE_KEYS", "INSTANCE_UNIT_PREFIX", "INSTANCE_UNIT_SUFFIX",
    "MAX_START_TIMEOUT_S", "MIN_START_TIMEOUT_S", "REQUIRED", "REQUIRED_INSTANCE_KEYS", "HostKnob", "InstanceConfig",
    "instance_field", "instance_of_unit", "instance_unit",
    # host
    "HUB_TOKEN_FILE", "MANAGED_DIRECTORY_KNOBS", "RESERVED_GATEWAY_NAME", "RESERVED_INSTANCE_NAME",
    "RESERVED_RAY_NAME", "HostConfig", "config_dir_clashes", "gateway_ports", "host_ports", "monitoring_ports",
    "parse_host",
    "service_user_directories", "synced_model_clashes",
    # fleet_checks
    "RAY_HEAD_PORTS", "RAY_NODE_PORTS", "RAY_WORKER_PORTS", "NodeGroup", "check_fleet", "node_group_of",
    "node_groups",
    # inventory
    "inventory_rows", "limited_rows", "load_inventory", "read_pyinfra_inventory", "split_names", "unused_group_data",
]
