"""Validated fleet configuration: host data (inventory + group_data) -> dataclasses.

Every key of the input is declared once, with knob() (schema.py): the host knobs by section in
knobs/ (joined into Settings by settings.py), an instance's keys in instance.py (InstanceConfig).
group_data/all.py, docs/knobs.md and the README's excerpt are written from those declarations
(reference.py). Every input check lives here: each key on its own by its declaration, then the rules
between keys of one host (host_checks.py), then those of the fleet (fleet_checks.py). Errors name the
host, the instance and the key, and say the fix.

By concern, each module importing only those above it:

- errors: ConfigError, ConfigErrors, Checker (what every check reports);
- schema: knob(), section(), Declaration (a key's type, default, doc, notes, bounds, fix, flag) and
  its check;
- knobs/: the host knobs, one module per section of group_data/all.py;
- settings: Settings (every host knob), Settings.from_data;
- gpus: GpuSpec, a host's declared `gpus`;
- model_files: a model directory on this workstation (config.json, the weights' size), read safely;
- model_info: the instance key model_info, a model's config.json as it is (or its directory);
- instance_parsers: the other structured instance keys (engine_args, env, nodes);
- instance: InstanceConfig (the instance schema), the unit naming rule;
- ports: the ports a host's listeners take;
- clients: the API's clients (vllm_api_clients);
- host_checks: the rules between the keys of one host's data (an instance's keys, its instances,
  its knobs);
- host: HostConfig and parse_host (reads one host's data, then host_checks);
- fleet_checks: check_fleet (the rules no single host can check);
- node_groups: the node groups of multi-node instances and their rules (check_fleet runs them);
- inventory: reading a pyinfra inventory file;
- reference: writes group_data/all.py, docs/knobs.md and the README's excerpt from the declarations.

The rest of vllm_fleet imports the names below from `vllm_fleet.config`.
"""

from vllm_fleet.config.errors import Checker, ConfigError, ConfigErrors, did_you_mean
from vllm_fleet.config.fleet_checks import check_fleet, gateway_priorities
from vllm_fleet.config.node_groups import (RAY_HEAD_PORTS, RAY_NODE_PORTS, RAY_WORKER_PORTS, NodeGroup, node_group_of,
                                           node_groups)
from vllm_fleet.config.gpus import GpuSpec
from vllm_fleet.config.host import HUB_TOKEN_FILE, HostConfig, parse_host, service_user_directories
from vllm_fleet.config.host_checks import MANAGED_DIRECTORY_KNOBS, RESERVED_INSTANCE_PREFIX
from vllm_fleet.config.instance import (DTYPES, HOST_DEFAULTS, INSTANCE_DECLARED, INSTANCE_FLAGS, INSTANCE_KEYS,
                                        INSTANCE_UNIT_PREFIX, INSTANCE_UNIT_SUFFIX, MAX_START_TIMEOUT_S,
                                        MIN_START_TIMEOUT_S, REQUIRED_INSTANCE_KEYS, InstanceConfig, instance_of_unit,
                                        instance_unit)
from vllm_fleet.config.instance_parsers import OWNED_ENV, OWNED_ENV_FIX, OWNED_ENV_PREFIXES
from vllm_fleet.config.inventory import (inventory_rows, limited_rows, load_inventory, read_pyinfra_inventory,
                                        split_names, unused_group_data)
from vllm_fleet.config.knobs.common import GIB_BYTES
from vllm_fleet.config.knobs.environment import ENV_MANAGERS, SUPPORTED_VLLM, TARGETS
from vllm_fleet.config.knobs.files import PROMETHEUS_DIR_SUFFIX
from vllm_fleet.config.knobs.gateway import GATEWAY_POLICIES
from vllm_fleet.config.knobs.multinode import RAY_OBJECT_STORE_MIN_BYTES
from vllm_fleet.config.knobs.serve import PLACEMENTS
from vllm_fleet.config.ports import gateway_ports, host_ports, monitoring_ports
from vllm_fleet.config.schema import REQUIRED, Declaration, HostKnob, knob
from vllm_fleet.config.settings import KNOBS, Settings
from vllm_fleet.kinds import ENV_NAME_RE, INDEX_URL_RE

__all__ = [
    # errors
    "Checker", "ConfigError", "ConfigErrors", "did_you_mean",
    # schema, knobs, settings
    "REQUIRED", "Declaration", "HostKnob", "knob", "KNOBS", "Settings", "ENV_MANAGERS", "GATEWAY_POLICIES",
    "GIB_BYTES", "PLACEMENTS", "PROMETHEUS_DIR_SUFFIX", "RAY_OBJECT_STORE_MIN_BYTES", "SUPPORTED_VLLM", "TARGETS",
    "ENV_NAME_RE", "INDEX_URL_RE",
    # gpus
    "GpuSpec",
    # instance_parsers
    "OWNED_ENV", "OWNED_ENV_FIX", "OWNED_ENV_PREFIXES",
    # instance
    "DTYPES", "HOST_DEFAULTS", "INSTANCE_DECLARED", "INSTANCE_FLAGS", "INSTANCE_KEYS", "INSTANCE_UNIT_PREFIX",
    "INSTANCE_UNIT_SUFFIX", "MAX_START_TIMEOUT_S", "MIN_START_TIMEOUT_S", "REQUIRED_INSTANCE_KEYS", "InstanceConfig",
    "instance_of_unit", "instance_unit",
    # ports
    "gateway_ports", "host_ports", "monitoring_ports",
    # host_checks, host
    "MANAGED_DIRECTORY_KNOBS", "RESERVED_INSTANCE_PREFIX",
    "HUB_TOKEN_FILE", "HostConfig", "parse_host", "service_user_directories",
    # fleet_checks
    "RAY_HEAD_PORTS", "RAY_NODE_PORTS", "RAY_WORKER_PORTS", "NodeGroup", "check_fleet", "gateway_priorities",
    "node_group_of",
    "node_groups",
    # inventory
    "inventory_rows", "limited_rows", "load_inventory", "read_pyinfra_inventory", "split_names", "unused_group_data",
]
