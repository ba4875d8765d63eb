"""The fleet gateway, offline: backends from every host's plan, its files, the key check at the edge,
the knobs and their errors, and `vllm-fleet plan`/`render` (no host, no root). Its files at work under
nginx and against stand-ins: test_gateway_at_work.py."""

from __future__ import annotations

import ast
import json
import re
import textwrap
from pathlib import Path

import pytest

from support.fleet_helpers import API_KEY, KEY_MARK
from support.gateway_fleet import cpu_instance, gateway_fleet, gateway_render
from support.planning_fixtures import parse_errors, run_cli
from vllm_fleet.config.clients import client_id
from vllm_fleet.config import ConfigErrors, check_fleet, parse_host
from vllm_fleet.fleet import load_fleet
from vllm_fleet.gateway import find_gateway, fleet_backends, gateway_files, gateway_paths, key_pattern
from vllm_fleet.host_layout import GATEWAY_UNIT
from vllm_fleet.plan import plan_fleet
from vllm_fleet.render import Secrets, environment_prefix, environment_spec, render_host
from vllm_fleet.config import GATEWAY_POLICIES

ROOT = Path(__file__).resolve().parents[2]
GATEWAY_KNOBS = {"vllm_gateway": False, "vllm_gateway_port": 9000, "vllm_gateway_version": "0.1.17",
                 "vllm_gateway_health_interval_s": 2, "vllm_gateway_failure_threshold": 2,
                 "vllm_advertise_address": None, "vllm_gateway_policy": "prefix",
                 "vllm_gateway_address": None, "vllm_gateway_interface": None, "vllm_gateway_vrrp_id": 51,
                 "vllm_gateway_priority": None}


# --- backends and models ------------------------------------------------------------------------

def test_backends_are_every_planned_instance_of_every_host():
    hosts, plan = gateway_fleet()
    got = [(b.host, b.instance, b.served_model_name, b.url) for b in fleet_backends(hosts, plan)]
    assert got == [("h1", "a", "alpha", "http://10.0.0.1:8000"),
                   ("h2", "b", "beta", "http://10.0.0.2:8000"),
                   ("h3", "b2", "beta", "http://h3.example:8001")]


def test_advertise_address_explicit_then_bind_then_ssh_hostname_then_name():
    base = {"vllm_target": "cpu", "vllm_instances": [cpu_instance("a", "alpha")]}
    assert parse_host("h", {**base, "ssh_hostname": "10.0.0.9", "vllm_advertise_address": "gw.lan"}
                      ).settings.vllm_advertise_address == "gw.lan"
    assert parse_host("h", {**base, "ssh_hostname": "10.0.0.9", "vllm_bind_host": "192.168.1.5"}
                      ).settings.vllm_advertise_address == "192.168.1.5"
    assert parse_host("h", {**base, "ssh_hostname": "10.0.0.9"}).settings.vllm_advertise_address == "10.0.0.9"
    assert parse_host("node7", base).settings.vllm_advertise_address == "node7"
    # IPv6 goes into URLs in brackets.
    hosts = [parse_host("h", {**base, "vllm_advertise_address": "fd00::7"})]
    assert fleet_backends(hosts, plan_fleet(hosts))[0].url == "http://[fd00::7]:8000"


def test_models_json_is_openai_shaped_with_each_name_once():
    files = gateway_render()
    models = json.loads(files["/etc/vllm-fleet/gateway-models.json"].content)
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == ["alpha", "beta"]
    for m in models["data"]:
        assert m["object"] == "model" and m["owned_by"] == "vllm-fleet" and isinstance(m["created"], int)
    # beta: 4096 on h2, 2048 on h3 -> what every backend of it accepts
    assert {m["id"]: m["max_model_len"] for m in models["data"]} == {"alpha": 2048, "beta": 2048}


def test_workers_file_lists_every_backend_with_its_model_and_no_secret():
    workers = json.loads(gateway_render()["/etc/vllm-fleet/gateway-workers.json"].content)
    assert [(w["url"], w["model_id"], w["host"], w["instance"]) for w in workers] == [
        ("http://10.0.0.1:8000", "alpha", "h1", "a"), ("http://10.0.0.2:8000", "beta", "h2", "b"),
        ("http://h3.example:8001", "beta", "h3", "b2")]


# --- the unit ------------------------------------------------------------------------------------

def test_unit_runs_vllm_router_on_loopback_as_the_service_user_without_secrets():
    files = gateway_render()
    unit = files[f"/etc/systemd/system/{GATEWAY_UNIT}"].content
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    hosts, plan = gateway_fleet()
    prefix = environment_prefix(hosts[0], environment_spec(hosts[0], plan.hosts[0]))
    # The flags as `vllm-router --help` (0.1.17) names them.
    assert exec_start == (f"ExecStart={prefix}/bin/vllm-router --enable-igw --host 127.0.0.1 --port 19000 "
                          "--policy consistent_hash --health-check-interval-secs 2 --health-failure-threshold 2 "
                          "--prometheus-host 127.0.0.1 --prometheus-port 19001")
    assert (f"ExecStartPost={prefix}/bin/python -I /etc/vllm-fleet/gateway-register.py "
            "http://127.0.0.1:19000 /etc/vllm-fleet/gateway-workers.json 60") in unit
    for line in ("User=vllm-router", "Group=vllm-router", "Restart=on-failure", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "RestrictSUIDSGID=yes"):
        assert line in unit.splitlines()
    assert "0.0.0.0" not in exec_start
    for f in files.values():
        if not f.secret:
            assert KEY_MARK not in f.content, f.path


def test_unit_follows_the_health_knobs_and_the_gateway_port():
    unit = gateway_render(vllm_gateway_port=9100, vllm_gateway_health_interval_s=5,
                          vllm_gateway_failure_threshold=3)[f"/etc/systemd/system/{GATEWAY_UNIT}"].content
    assert "--port 19100 " in unit and "--prometheus-port 19101" in unit
    assert "--health-check-interval-secs 5 --health-failure-threshold 3" in unit


@pytest.mark.parametrize("policy", GATEWAY_POLICIES)
def test_the_policy_knob_reaches_the_units_exec_start(policy):
    files = gateway_render(vllm_gateway_policy=policy)
    exec_start = next(line for line in files[f"/etc/systemd/system/{GATEWAY_UNIT}"].content.splitlines()
                      if line.startswith("ExecStart="))
    router_policy = "consistent_hash" if policy == "prefix" else policy
    assert f" --policy {router_policy} " in exec_start and exec_start.count("--policy") == 1
    # Only "prefix" gives the gateway's front its keyer (and the module it runs in).
    front = files["/etc/vllm-fleet/front.conf"].content
    assert ("/etc/vllm-fleet/front-prefix-key.js" in files) == (policy == "prefix")
    assert ("load_module modules/ngx_http_js_module.so;" in front) == (policy == "prefix")
    assert ("js_content vllm_fleet_prefix.route;" in front) == (policy == "prefix")


def test_only_the_gateway_hosts_front_keys_requests_by_prefix():
    """The prefix policy is the gateway's: a backend host's front (same group data) loads no njs."""
    backend = parse_host("h2", {"vllm_target": "cpu", "vllm_gateway_policy": "prefix",
                                "vllm_instances": [cpu_instance("b", "beta")]})
    backend_files = render_host(backend, plan_fleet([backend]).hosts[0], Secrets(API_KEY))
    front = next(f.content for f in backend_files if f.path == "/etc/vllm-fleet/front.conf")
    assert "js_" not in front and "load_module" not in front
    assert not any(f.path.endswith("front-prefix-key.js") for f in backend_files)


def test_a_policy_vllm_router_lacks_or_the_gateway_cannot_serve_is_refused_with_a_did_you_mean():
    error = next(e for e in parse_errors({"vllm_target": "cpu", "vllm_gateway_policy": "cache-aware"}, "gw")
                 if e.key == "vllm_gateway_policy")
    assert error.host == "gw" and "'cache-aware' is not one of round_robin, cache_aware" in error.message
    assert error.fix == "did you mean 'cache_aware'?"
    for value in ("kv_aware", "sticky_least_loaded", None):
        assert any(e.key == "vllm_gateway_policy" for e in parse_errors(
            {"vllm_target": "cpu", "vllm_gateway_policy": value}, "gw")), value


def test_vllm_router_is_in_the_gateway_hosts_versioned_environment_and_a_new_version_is_a_new_one():
    hosts, plan = gateway_fleet()
    spec = environment_spec(hosts[0], plan.hosts[0])
    assert "vllm-router==0.1.17" in spec.packages()
    assert "vllm-router==0.1.17" not in environment_spec(hosts[1], plan.hosts[1]).packages()
    other = parse_host("h1", {"vllm_target": "cpu", "vllm_gateway": True, "vllm_gateway_version": "0.1.18",
                              "vllm_instances": [cpu_instance("a", "alpha")]})
    other_spec = environment_spec(other, plan_fleet([other]).hosts[0])
    assert environment_prefix(other, other_spec) != environment_prefix(hosts[0], spec)


# --- the key check at the edge ---------------------------------------------------------------------

def nginx_token(text: str) -> str:
    """One double-quoted token as nginx's parser reads it (ngx_conf_read_token): \\" \\' \\\\ lose the
    backslash, \\t \\r \\n become control characters, any other backslash stays."""
    assert text.startswith('"') and text.endswith('"'), text
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt in "\"'\\":
                out.append(nxt)
                i += 2
                continue
            if nxt in "trn":
                out.append({"t": "\t", "r": "\r", "n": "\n"}[nxt])
                i += 2
                continue
        assert body[i] != '"', "an unescaped double quote ends the token early"
        out.append(body[i])
        i += 1
    return "".join(out)


@pytest.mark.parametrize("key", [API_KEY, "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~ aZ09 ${x} \\n \\E \\Q",
                                 "sk-plain-0123", "ключ-ü€"])
def test_key_pattern_matches_exactly_bearer_key(key):
    token = key_pattern(key)
    pattern = nginx_token(token)
    assert pattern.startswith("~^")  # a case-sensitive regex: nginx lower-cases plain map strings
    regex = re.compile(pattern[1:])  # Python's re reads these escapes as PCRE does: literal
    assert regex.search("Bearer " + key)
    for wrong in ("bearer " + key, "Bearer " + key.upper() if key.upper() != key else "Bearer x" + key,
                  "Bearer " + key + "x", "xBearer " + key, "Bearer " + key[:-1], "Bearer  " + key, ""):
        assert not regex.search(wrong), wrong


def test_keys_file_is_secret_0640_root_service_user_and_quotes_the_hostile_key():
    files = gateway_render()
    key = files["/etc/vllm-fleet/front-secrets/keys.conf"]
    assert (key.mode, key.owner, key.group, key.secret) == ("0640", "root", "vllm-front", True)
    assert f"{key_pattern(API_KEY)} {client_id('fleet-key')};" in key.content
    assert 'default "";' in key.content
    front = files["/etc/vllm-fleet/front.conf"].content
    assert 'include "/etc/vllm-fleet/front-secrets/keys.conf";' in front and KEY_MARK not in front


def test_without_secrets_the_keys_file_is_a_placeholder_that_refuses_everything():
    key = gateway_render(secrets=None)["/etc/vllm-fleet/front-secrets/keys.conf"]
    assert key.secret is False and "~" not in key.content.split("{", 1)[1]
    assert 'default "";' in key.content


def test_control_characters_in_the_key_are_refused():
    with pytest.raises(ValueError):
        key_pattern("sk-a\tb")
    with pytest.raises(ValueError):
        key_pattern("")


def test_front_has_the_gateway_server_block_checking_the_key_before_v1():
    front = gateway_render()["/etc/vllm-fleet/front.conf"].content
    block = front.split("The fleet gateway", 1)[1]
    assert "listen 0.0.0.0:9000;" in block
    assert "server 127.0.0.1:19000;" in block
    models = block.split("location = /v1/models {", 1)[1].split("location /v1/ {", 1)[0]
    assert 'if ($vllm_fleet_client_id = "")' in models and "return 401" in models
    assert "alias $vllm_fleet_models_file;" in models
    assert 'default "/etc/vllm-fleet/gateway-models.json";' in block
    v1 = block.split("location /v1/ {", 1)[1].split("location = /health", 1)[0]
    assert v1.index("return 401") < v1.index("proxy_pass http://vllm_fleet_gateway/v1/;")
    assert "proxy_buffering off;" in v1 and "proxy_read_timeout 3600s;" in v1
    assert "proxy_pass http://vllm_fleet_gateway/health;" in block
    assert "return 404" in block.split("location / {", 1)[1]


def test_a_gateway_host_without_instances_still_gets_its_front():
    hosts = [parse_host("gw", {"vllm_target": "cpu", "vllm_gateway": True}),
             parse_host("h2", {"vllm_target": "cpu", "vllm_instances": [cpu_instance("b", "beta")]})]
    plan = plan_fleet(hosts)
    files = {f.path: f for f in render_host(hosts[0], plan.hosts[0], None,
                                            backends=fleet_backends(hosts, plan))}
    assert "/etc/systemd/system/vllm-fleet-front.service" in files
    assert "listen 0.0.0.0:9000;" in files["/etc/vllm-fleet/front.conf"].content
    manifest = json.loads(files["/etc/vllm-fleet/manifest.json"].content)
    assert manifest["gateway"]["backends"] == [{"host": "h2", "instance": "b", "model": "beta",
                                                "url": "http://h2:8000"}]


def test_other_hosts_get_no_gateway_and_the_gateway_host_needs_the_backends():
    hosts, plan = gateway_fleet()
    other = {f.path for f in render_host(hosts[1], plan.hosts[1], backends=fleet_backends(hosts, plan))}
    assert not any("gateway" in p for p in other)
    with pytest.raises(ValueError, match="fleet_backends"):
        render_host(hosts[0], plan.hosts[0])


# --- knobs and their errors ------------------------------------------------------------------------

def test_two_gateway_hosts_are_an_error_naming_both():
    hosts = [parse_host(n, {"vllm_target": "cpu", "vllm_gateway": True}) for n in ("gw-a", "gw-b")]
    with pytest.raises(ConfigErrors) as info:
        find_gateway(hosts)
    (error,) = info.value.errors
    assert error.key == "vllm_gateway" and "gw-a" in error.located() and "gw-b" in error.located()
    assert error.fix
    check_fleet(hosts[:1])  # one is fine


@pytest.mark.parametrize("settings, words", [
    ({"vllm_gateway_port": 8000}, "vllm_gateway_port 8000 is the port of instance a"),
    ({"vllm_gateway_port": 9000, "vllm_instances": [cpu_instance("a", "alpha", port=19000)]},
     "router port 19000 (vllm_gateway_port + vllm_backend_port_offset 10000) is the port of instance a"),
    ({"vllm_gateway_port": 9000, "vllm_instances": [cpu_instance("a", "alpha", port=9001)]},
     "metrics port 19001 (its router port + 1) is the engine port of instance a"),
    ({"vllm_gateway_port": 60000}, "above 65535"),
])
def test_gateway_port_clashes_are_errors_naming_both(settings, words):
    data = {"vllm_target": "cpu", "vllm_gateway": True, "vllm_instances": [cpu_instance("a", "alpha")],
            **settings}
    errors = [e for e in parse_errors(data, "gw") if e.key == "vllm_gateway_port"]
    assert errors and words in errors[0].located(), [e.located() for e in errors]
    assert errors[0].host == "gw" and errors[0].fix


def test_the_same_ports_are_fine_on_a_host_that_is_not_the_gateway():
    """Port 8000 is an instance's and the (unused) gateway port's: only the gateway host checks it."""
    host = parse_host("h", {"vllm_target": "cpu", "vllm_gateway_port": 8000,
                            "vllm_instances": [cpu_instance("a", "x", port=8000)]})
    assert [i.port for i in host.instances] == [8000] and host.settings.vllm_gateway_port == 8000
    with pytest.raises(ConfigErrors, match="vllm_gateway_port"):
        parse_host("h", {"vllm_target": "cpu", "vllm_gateway": True, "vllm_gateway_port": 8000,
                         "vllm_instances": [cpu_instance("a", "x", port=8000)]})


@pytest.mark.parametrize("settings, key", [
    ({"vllm_gateway": "yes"}, "vllm_gateway"),
    ({"vllm_gateway_port": 0}, "vllm_gateway_port"),
    ({"vllm_gateway_port": "9000"}, "vllm_gateway_port"),
    ({"vllm_gateway_health_interval_s": 0}, "vllm_gateway_health_interval_s"),
    ({"vllm_gateway_failure_threshold": True}, "vllm_gateway_failure_threshold"),
    ({"vllm_gateway_version": "latest"}, "vllm_gateway_version"),
    ({"vllm_advertise_address": "my host"}, "vllm_advertise_address"),
    ({"vllm_advertise_address": "0.0.0.0"}, "vllm_advertise_address"),
    ({"vllm_gatway": True}, "vllm_gatway"),
])
def test_bad_gateway_knobs_are_located_with_a_fix(settings, key):
    errors = [e for e in parse_errors({"vllm_target": "cpu", **settings}, "h") if e.key == key]
    assert errors and errors[0].fix, key


def test_an_instance_cannot_take_the_gateways_unit_name():
    errors = parse_errors({"vllm_target": "cpu", "vllm_instances": [cpu_instance("fleet-gateway", "x")]}, "h")
    assert any(e.key == "name" and "reserved" in e.located() for e in errors)


def test_with_a_gateway_every_backend_host_needs_a_usable_address():
    hosts = [parse_host("gw", {"vllm_target": "cpu", "vllm_gateway": True}),
             parse_host("@local", {"vllm_target": "cpu", "vllm_instances": [cpu_instance("a", "x")]})]
    with pytest.raises(ConfigErrors) as info:
        check_fleet(hosts)
    assert info.value.errors[0].host == "@local" and info.value.errors[0].key == "vllm_advertise_address"


def test_group_data_documents_every_gateway_knob_with_its_default():
    text = (ROOT / "group_data" / "all.py").read_text()
    tree = ast.parse(text)
    documented = {node.targets[0].id: ast.literal_eval(node.value)
                  for node in tree.body if isinstance(node, ast.Assign)}
    for key, default in GATEWAY_KNOBS.items():
        assert documented.get(key, "missing") == default, key
    section = text.split("# --- The fleet gateway", 1)[1].split("# ---", 1)[0]
    for words in ("vllm-router", "127.0.0.1", "One host without vllm_gateway_address", "keepalived", "API key",
                  "ssh_hostname", "/v1/models"):
        assert words in section, words


# --- vllm-fleet plan / render ------------------------------------------------------------------------

INVENTORY = textwrap.dedent("""
    def inst(name, served, port=8000):
        return {"name": name, "model": "/models/tiny", "served_model_name": served, "port": port,
                "max_model_len": 2048}
    hosts = [
        ("h1", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.1", "vllm_gateway": True,
                "vllm_instances": [inst("a", "alpha")]}),
        ("h2", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.2", "vllm_instances": [inst("b", "beta")]}),
        ("h3", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.3", "vllm_instances": [inst("b", "beta", 8001)]}),
    ]
""")


def test_plan_json_has_the_gateway_with_every_backend_even_under_limit(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY)
    for limit in ([], ["--limit", "h2"]):
        result = run_cli("plan", "inv.py", "--json", *limit, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        (gateway,) = json.loads(result.stdout)["gateways"]
        assert gateway["host"] == "h1" and gateway["url"] == "http://10.0.0.1:9000/v1"
        assert (gateway["policy"], gateway["router_policy"]) == ("prefix", "consistent_hash")  # the default
        assert [(b["host"], b["instance"], b["model"], b["url"]) for b in gateway["backends"]] == [
            ("h1", "a", "alpha", "http://10.0.0.1:8000"), ("h2", "b", "beta", "http://10.0.0.2:8000"),
            ("h3", "b", "beta", "http://10.0.0.3:8001")]
    text = run_cli("plan", "inv.py", cwd=tmp_path).stdout
    assert "gateway on h1: http://10.0.0.1:9000/v1 (vllm-router 0.1.17, http://127.0.0.1:19000 on the host, routing prefix " \
           "(router consistent_hash))" in text
    assert "beta -> h2/b http://10.0.0.2:8000, h3/b http://10.0.0.3:8001" in text


def test_plan_json_without_a_gateway_has_an_empty_list():
    result = run_cli("plan", "inventory/prod.py", "--json", cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["gateways"] == []


def test_plan_with_two_gateways_exits_2_naming_both(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY.replace('"ssh_hostname": "10.0.0.2",',
                                                       '"ssh_hostname": "10.0.0.2", "vllm_gateway": True,'))
    result = run_cli("plan", "inv.py", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "hosts h1 and h2 both set vllm_gateway = True" in result.stderr


def test_render_writes_the_gateway_files_on_the_gateway_host_only(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY)
    result = run_cli("render", "inv.py", "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    hosts = load_fleet(tmp_path / "inv.py", cwd=tmp_path)
    for path in gateway_paths(hosts[0]).values():
        assert (tmp_path / "out" / "h1" / path.lstrip("/")).is_file(), path
    assert not list((tmp_path / "out" / "h2").rglob("gateway*"))
    workers = json.loads((tmp_path / "out/h1/etc/vllm-fleet/gateway-workers.json").read_text())
    assert len(workers) == 3
    assert {f.path for f in gateway_files(hosts[0], [], "/env")} == set(gateway_paths(hosts[0]).values())


def test_a_backend_with_other_clients_than_the_gateway_is_an_error():
    hosts, _plan = gateway_fleet()
    other = parse_host("h2", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.2", "vllm_api_key_env": "OTHER_KEY",
                              "vllm_instances": [cpu_instance("b", "beta", max_len=4096)]})
    with pytest.raises(ConfigErrors) as info:
        check_fleet([hosts[0], other, hosts[2]])
    text = str(info.value)
    assert "host h2, key vllm_api_key_env" in text and "fleet-key from $OTHER_KEY" in text
    limited = parse_host("h2", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.2",
                                "vllm_api_clients": {"ci": {"key_env": "CI_KEY"}},
                                "vllm_instances": [cpu_instance("b", "beta", max_len=4096)]})
    with pytest.raises(ConfigErrors) as info:
        check_fleet([hosts[0], limited, hosts[2]])
    assert "host h2, key vllm_api_clients" in str(info.value) and "ci from $CI_KEY" in str(info.value)
    check_fleet(hosts)  # the same clients everywhere: fine


def test_the_unit_does_not_change_with_the_backends_so_a_new_backend_reloads_instead_of_restarting():
    hosts, plan = gateway_fleet()
    backends = fleet_backends(hosts, plan)
    unit = f"/etc/systemd/system/{GATEWAY_UNIT}"
    full = {f.path: f.content for f in render_host(hosts[0], plan.hosts[0], Secrets(API_KEY), backends)}
    fewer = {f.path: f.content for f in render_host(hosts[0], plan.hosts[0], Secrets(API_KEY), backends[:1])}
    assert full[unit] == fewer[unit]
    assert full["/etc/vllm-fleet/gateway-workers.json"] != fewer["/etc/vllm-fleet/gateway-workers.json"]


# --- the gateway's verification waits for registrations only when the router is registering --------

@pytest.mark.parametrize("registering, waits", [(True, 10), (False, 0)])
def test_gateway_verification_waits_for_backends_only_after_the_router_started_or_reloaded(
        monkeypatch, registering, waits):
    """A rollout drains the batch's backends; a router this run neither started nor reloaded will not
    register them by itself, so waiting the 10 s for them only lengthened the gateway host's turn."""
    from types import SimpleNamespace

    from vllm_fleet.deploy import gateway as gateway_step

    sent = []

    def fake_run(host, command, **_kw):
        sent.append(command)
        return True, json.dumps({"ok": True, "not_registered": ["http://10.0.0.2:8000"]}), ""

    monkeypatch.setattr(gateway_step, "host_probe_command", lambda mode, spec: json.dumps([mode, spec]))
    monkeypatch.setattr(gateway_step.remote, "run", fake_run)
    monkeypatch.setattr(gateway_step, "parse_host_probe", json.loads)
    spec = {"timeout_s": 10, "urls": ["http://10.0.0.1:8000", "http://10.0.0.2:8000"], "models": ["m"]}
    gateway_step.verify_gateway(None, SimpleNamespace(name="gw", print_prefix="gw: ", data=SimpleNamespace()),
                           spec, registering=lambda: registering)
    mode, probed = json.loads(sent[0])
    assert mode == "gateway" and probed["timeout_s"] == waits
    assert spec["timeout_s"] == 10  # the deploy's own spec is not modified


def test_why_a_host_failed_reaches_rollout_per_run_not_through_host_data(monkeypatch):
    """A failed gateway verification's text is kept for `vllm-fleet rollout`'s report keyed by the run
    (pyinfra's State), never written into the inventory's host data (which the gateway host parses
    as knobs when it plans the fleet)."""
    from types import SimpleNamespace

    from pyinfra.api.exceptions import OperationError

    from vllm_fleet.deploy import gateway as gateway_step
    from vllm_fleet.deploy.outcome import failure_reason

    class State:  # stands in for pyinfra's State: any object a weak reference can point to
        pass

    monkeypatch.setattr(gateway_step, "host_probe_command", lambda mode, spec: "probe")
    monkeypatch.setattr(gateway_step.remote, "run", lambda host, command, **_kw: (
        True, json.dumps({"ok": False, "error": "vllm-router is not running", "unit": "gw.service"}), ""))
    monkeypatch.setattr(gateway_step, "parse_host_probe", json.loads)
    run1, run2 = State(), State()
    data = SimpleNamespace()
    gw = SimpleNamespace(name="gw", print_prefix="gw: ", data=data, state=run1)
    with pytest.raises(OperationError, match="host gw, gateway: verification failed: vllm-router is not running"):
        gateway_step.verify_gateway(run1, gw, {"timeout_s": 10})
    assert failure_reason(run1, "gw") == "host gw, gateway: verification failed: vllm-router is not running"
    assert failure_reason(run2, "gw") is None and failure_reason(run1, "other") is None
    assert vars(data) == {}


def test_the_keyers_gate_matches_exactly_the_body_lengths_it_reads():
    """nginx decides from $content_length, before reading a body, whether the keyer reads it: the
    pattern takes 1 .. PREFIX_BODY_BYTES as nginx holds them, nothing else."""
    import re

    from vllm_fleet.gateway import PREFIX_BODY_BYTES, body_length_pattern

    gate = re.compile(f"^{body_length_pattern(PREFIX_BODY_BYTES)}$")
    for n in (1, 9, 10, 999_999, 1_000_000, 3_999_999, 4_000_000):
        assert gate.match(str(n)), n
    for text in ("", "0", "01", "4000001", "4194304", "40000000", "-1", "1e6", " 1"):
        assert not gate.match(text), text
    assert re.fullmatch(body_length_pattern(30), "29") and not re.fullmatch(body_length_pattern(30), "31")
    with pytest.raises(ValueError):
        body_length_pattern(4_194_304)
