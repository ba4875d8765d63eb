"""The team service offline: the clients' schema, the front's client checks as rendered, the fleet CA
and its host certificates, the host's own key. (On real hosts: tests/sandbox/test_team_service_sandbox.py.)"""

from __future__ import annotations

import datetime
import os
import re
import stat

import pytest
from cryptography import x509

from support.planning_fixtures import API_CLIENTS, host_data
from vllm_fleet import host_keys, kinds, tls
from vllm_fleet.config import ConfigErrors, check_fleet, parse_host
from vllm_fleet.config.clients import client_id
from vllm_fleet.gateway import (CLIENT_SESSION_PATTERN, PREFIX_BODY_BYTES, body_length_pattern, gateway_access,
                                key_pattern)
from vllm_fleet.plan import plan_host
from vllm_fleet.render import Secrets, render_host
from vllm_fleet.templating import nginx_string

KEYS = (("ci", "sk-ci-1"), ("other", "sk-other-1"), ("research", "sk-research-1"))
HOST_KEY = "vf-host-" + "cd" * 32


def errors_of(data: dict) -> list:
    with pytest.raises(ConfigErrors) as info:
        parse_host("box", host_data(**data))
    return info.value.errors


def files_of(secrets=Secrets(client_keys=KEYS, host_key=HOST_KEY), **data) -> dict:
    host = parse_host("box", host_data(placement="single-instance", vllm_api_clients=API_CLIENTS, **data))
    return {f.path: f for f in render_host(host, plan_host(host), secrets)}


# --- vllm_api_clients ----------------------------------------------------------------------------

@pytest.mark.parametrize("clients, key, words", [
    ({"ci": {}}, "vllm_api_clients.ci", "exactly one of key_env or key_file"),
    ({"ci": {"key_env": "A", "key_file": "/k"}}, "vllm_api_clients.ci", "exactly one"),
    ({"ci": {"key_env": "sk-live-123"}}, "vllm_api_clients.ci.key_env", "not shown"),
    ({"ci": {"key_env": "A", "requests_per_minute": 0}}, "vllm_api_clients.ci.requests_per_minute", "1 to"),
    ({"ci": {"key_env": "A", "requests_per_minute": True}}, "vllm_api_clients.ci.requests_per_minute", "whole"),
    ({"ci": {"key_env": "A", "models": "qwen"}}, "vllm_api_clients.ci.models", "list"),
    ({"ci": {"key_env": "A", "models": ["bad name"]}}, "vllm_api_clients.ci.models", "served model name"),
    ({"ci": {"key_env": "A", "rpm": 3}}, "vllm_api_clients.ci.rpm", "requests_per_minute"),
    ({"c i": {"key_env": "A"}}, "vllm_api_clients.c i", "not a name"),
    ({"vllm-fleet": {"key_env": "A"}}, "vllm_api_clients.vllm-fleet", "vllm-fleet's own"),
    ({"fleet-key": {"key_env": "A"}}, "vllm_api_clients.fleet-key", "vllm-fleet's own"),
    # Case variants of vllm-fleet's own clients, and of one another: nginx, logs and status would
    # take them for the same client.
    ({"Vllm-Fleet": {"key_env": "A"}}, "vllm_api_clients.Vllm-Fleet", "vllm-fleet's own"),
    ({"FLEET-KEY": {"key_env": "A"}}, "vllm_api_clients.FLEET-KEY", "vllm-fleet's own"),
    ({"alice": {"key_env": "A"}, "Alice": {"key_env": "B"}}, "vllm_api_clients.Alice", "differ only in case"),
    # Keywords of nginx's config, in any case.
    ({"default": {"key_env": "A"}}, "vllm_api_clients.default", "keyword"),
    ({"Include": {"key_env": "A"}}, "vllm_api_clients.Include", "keyword"),
    ({"hostnames": {"key_env": "A"}}, "vllm_api_clients.hostnames", "keyword"),
    # Unicode look-alikes and what a terminal acts on are no names.
    ({"ａlice": {"key_env": "A"}}, "vllm_api_clients.ａlice", "not a name"),
    ({"ci\x1b]0;pwned\x07": {"key_env": "A"}}, "vllm_api_clients (a key)", "control character"),
    ({"ci": "A"}, "vllm_api_clients.ci", "expected a dict"),
])
def test_a_bad_client_is_refused_naming_its_key_with_a_fix(clients, key, words):
    errors = errors_of({"vllm_api_clients": clients})
    assert any(e.key == key and words in (e.message + str(e.fix)) and e.fix for e in errors), errors
    assert all("sk-live-123" not in e.located() for e in errors)
    # no raw control character reaches a terminal
    assert all(kinds.printable(line) for e in errors for line in e.located().splitlines())



def test_a_clients_models_fix_shows_a_served_name_not_an_instance_name():
    """The examples name the example fleet's served name (qwen2.5-7b), not its instance (qwen7b)."""
    (listed,) = errors_of({"vllm_api_clients": {"ci": {"key_env": "A", "models": "qwen"}}})
    assert "got str" in listed.message and '"models": ["qwen2.5-7b"]' in listed.fix
    (named,) = errors_of({"vllm_api_clients": {"ci": {"key_env": "A", "models": ["bad name"]}}})
    assert "models[0]" in named.message
    assert "not an instance's name" in named.fix and "'qwen2.5-7b'" in named.fix and "qwen7b" not in named.fix


def test_without_clients_the_fleet_key_is_the_one_client():
    host = parse_host("box", host_data())
    assert [(c.name, c.key_env, c.models) for c in host.api_clients] == [("fleet-key", "VLLM_FLEET_API_KEY", None)]


def test_own_certificate_files_come_as_three_with_vllm_tls():
    errors = errors_of({"vllm_tls": True, "vllm_tls_cert_file": "/c.pem"})
    assert {e.key for e in errors} == {"vllm_tls_key_file"}
    errors = errors_of({"vllm_tls_cert_file": "/c.pem", "vllm_tls_key_file": "/k.pem", "vllm_tls_ca_file": "/ca.pem"})
    assert [e.key for e in errors] == ["vllm_tls"]
    parse_host("box", host_data(vllm_tls=True, vllm_tls_cert_file="/c.pem", vllm_tls_key_file="/k.pem",
                                vllm_tls_ca_file="/ca.pem"))


# --- the front as rendered -----------------------------------------------------------------------

def test_clients_keys_only_in_the_secret_keys_file_and_vllm_gets_the_hosts_key():
    files = files_of()
    keys = files["/etc/vllm-fleet/front-secrets/keys.conf"]
    assert keys.secret and (keys.mode, keys.group) == ("0640", "vllm-front")
    for name, key in KEYS:
        assert f"{key_pattern(key)} {client_id(name)};" in keys.content
    assert f"{key_pattern(HOST_KEY)} {client_id('vllm-fleet')};" in keys.content
    assert f'default "Bearer {HOST_KEY}";' in keys.content
    for path, f in files.items():
        if path != keys.path:
            assert not any(key in f.content for _name, key in KEYS), path
    assert f"VLLM_API_KEY='{HOST_KEY}'" in files["/etc/vllm-fleet/gemma.env"].content


def test_the_front_checks_the_client_then_its_model_then_its_limit_before_vllm():
    front = files_of()["/etc/vllm-fleet/front.conf"].content
    ids = {name: client_id(name) for name in ("ci", "research", "other", "vllm-fleet")}
    allowed = front.split("map $vllm_fleet_client_id $vllm_fleet_allowed_18000 {", 1)[1].split("}", 1)[0]
    assert f"{ids['research']} 1;" in allowed and f"{ids['vllm-fleet']} 1;" in allowed and "default 0;" in allowed
    assert ids["other"] not in allowed and f"{ids['ci']} 1;" in allowed
    names = front.split("map $vllm_fleet_client_id $vllm_fleet_client {", 1)[1].split("}", 1)[0]
    assert all(f'{ids[name]} "{name}";' in names for name in ids)  # what the log and the answers print
    assert "limit_req_zone $vllm_fleet_limited_1 zone=vllm_fleet_client_1:1m rate=6r/m;" in front
    v1 = front.split("location /v1/ {", 1)[1].split("location = /health", 1)[0]
    order = [v1.index(text) for text in ('if ($vllm_fleet_client_id = "")', "return 401",
                                         "if ($vllm_fleet_allowed_18000 = 0)", "return 403",
                                         "limit_req zone=vllm_fleet_client_1 burst=5 nodelay;",
                                         "proxy_pass http://backend_18000/v1/;")]
    assert order == sorted(order)
    assert "proxy_set_header Authorization $vllm_fleet_vllm_authorization;" in v1
    assert f"{ids['ci']} 10;" in front.split("$vllm_fleet_retry_after {", 1)[1]  # 60 s / 6
    assert "access_log syslog:server=unix:/dev/log,tag=vllm_fleet_access" in front
    assert "listen 0.0.0.0:8000;" in front and "ssl_certificate" not in front


def test_a_changed_bind_address_changes_the_fronts_unit_so_the_deploy_restarts_it():
    """nginx cannot take a listen address moved on a reload (the old socket holds the port): the
    address is in the unit, whose change restarts the front; a changed key list only reloads it."""
    wildcard = files_of()
    one_address = files_of(vllm_bind_host="10.0.0.5")
    unit = "/etc/systemd/system/vllm-fleet-front.service"
    assert "listen 10.0.0.5:8000;" in one_address["/etc/vllm-fleet/front.conf"].content
    assert wildcard[unit].content != one_address[unit].content
    assert "Description=vllm-fleet front (nginx) of the vLLM instances on 10.0.0.5\n" in one_address[unit].content
    fewer_clients = files_of(Secrets(client_keys=KEYS[:1], host_key=HOST_KEY))
    assert fewer_clients[unit].content == wildcard[unit].content


def test_with_tls_every_listener_is_https_only_and_the_key_is_secret():
    host = parse_host("box", host_data(placement="single-instance", vllm_tls=True))
    files = {f.path: f for f in render_host(host, plan_host(host), None)}
    front = files["/etc/vllm-fleet/front.conf"].content
    assert "listen 0.0.0.0:8000 ssl;" in front and "ssl_protocols TLSv1.2 TLSv1.3;" in front
    assert "error_page 497 = @vllm_fleet_plain_http;" in front
    key = files["/etc/vllm-fleet/front-secrets/tls-key.pem"]
    assert "placeholder" in key.content and (key.mode, key.group) == ("0640", "vllm-front")
    material = tls.HostTls("CERT\n", "-----BEGIN PRIVATE KEY-----\n", "CA\n")
    files = {f.path: f for f in render_host(host, plan_host(host), Secrets("k", host_key=HOST_KEY, tls=material))}
    assert files["/etc/vllm-fleet/front-secrets/tls-key.pem"].secret
    assert files["/etc/vllm-fleet/front-cert.pem"].content == "CERT\n"
    assert files["/etc/vllm-fleet/trust.pem"].content == "CA\n"


def test_the_shutdown_timeout_reaches_vllm_and_the_stop_timeout_leaves_room():
    files = files_of(vllm_shutdown_timeout_s=45)
    assert "shutdown-timeout: 45\n" in files["/etc/vllm-fleet/gemma.yaml"].content
    assert "TimeoutStopSec=105\n" in files["/etc/systemd/system/vllm-gemma.service"].content
    errors = errors_of({"instances": [dict(host_data()["vllm_instances"][0],
                                           engine_args={"shutdown-timeout": 5})]})
    assert any("vllm_shutdown_timeout_s" in e.message for e in errors)


def _map_keys(front: str) -> list[str]:
    """Every key of every `map` block of an nginx config (the first word of each entry line)."""
    keys = []
    for block in re.findall(r"\n\s*map \S+ \S+ \{\n(.*?)\n\s*\}", front, re.S):
        keys += [line.split()[0] for line in block.splitlines() if line.strip() and not line.strip().startswith("#")]
    return keys


def test_no_client_name_is_a_map_key_nginx_could_fold_or_read_as_a_keyword():
    """nginx matches a map's plain keys case-insensitively, and `default`/`include` there are keywords:
    every map the fronts key by client is keyed by the client's id (lower-case hex), so clients named
    "Ci-Team" and "ci-team2", or one named like a keyword, never share or break an entry."""
    clients = {"Ci-Team": {"key_env": "A", "models": ["gemma3-12b-q4"]}, "ci-team2": {"key_env": "B", "models": ["x"]},
               "Research": {"key_env": "C", "requests_per_minute": 1}}
    host = parse_host("box", host_data(placement="single-instance", vllm_api_clients=clients, vllm_gateway=True))
    secrets = Secrets(client_keys=(("Ci-Team", "sk-a-1"), ("Research", "sk-c-1"), ("ci-team2", "sk-b-1")),
                      host_key=HOST_KEY)
    files = {f.path: f for f in render_host(host, plan_host(host), secrets, backends=[])}
    front, keys = files["/etc/vllm-fleet/front.conf"].content, files["/etc/vllm-fleet/front-secrets/keys.conf"].content
    map_keys = _map_keys(front) + _map_keys(keys)
    assert map_keys, "no map found"
    # The gateway's keyer maps by the deploy's own patterns, the same whatever the clients are called.
    keyer_patterns = {nginx_string("~" + CLIENT_SESSION_PATTERN),
                      nginx_string("~^:" + body_length_pattern(PREFIX_BODY_BYTES) + "$")}
    for key in map_keys:
        assert key == "default" or re.fullmatch(r"c[0-9a-f]{16}", key) or key.startswith('"~^Bearer') \
            or key in ("''", '""') or re.fullmatch(r"[0-9a-f.:]+", key) or key in keyer_patterns, key
    ids = {client_id(n) for n in clients} | {client_id("vllm-fleet")}
    assert len(ids) == 4 and ids <= set(map_keys)
    # requests_per_minute = 1: no burst at all (nginx refuses burst=0).
    assert "burst=0" not in front and "limit_req zone=vllm_fleet_client_1 nodelay;" in front


def _gateway_fleet(**backend):
    gateway = parse_host("gw", host_data(placement="single-instance", vllm_gateway=True,
                                         vllm_advertise_address="10.0.0.1"))
    host = parse_host("b1", host_data(placement="single-instance", vllm_advertise_address="10.0.0.2", **backend))
    return gateway, host


def test_with_a_gateway_an_instance_port_takes_v1_from_the_gateway_and_the_host_only():
    """A client could skip the gateway and get its requests_per_minute once more from every front:
    an instance port lets in the gateway host's address and the host's own checks only, and answers
    anyone else 403 naming the gateway's URL, before the key is even looked at."""
    gateway, host = _gateway_fleet()
    check_fleet([gateway, host])
    files = {f.path: f for f in render_host(host, plan_host(host), None, gateway_access=gateway_access(gateway))}
    front = files["/etc/vllm-fleet/front.conf"].content
    geo = front.split("geo $vllm_fleet_via_gateway {", 1)[1].split("}", 1)[0]
    assert [line.strip() for line in geo.strip().splitlines()] == [
        "default 0;", "127.0.0.1 1;", "::1 1;", "10.0.0.1 1;"]
    v1 = front.split("location /v1/ {", 1)[1].split("location = /health", 1)[0]
    assert v1.index("if ($vllm_fleet_via_gateway = 0)") < v1.index('if ($vllm_fleet_client_id = "")')
    assert "http://10.0.0.1:9000/v1" in v1 and '\\"code\\": \\"gateway_only\\"' in v1
    # /health (the router's check) and /metrics (the token's) are not behind it.
    assert "vllm_fleet_via_gateway" not in front.split("location = /health", 1)[1]
    # A host bound to one address probes itself there: that address is let in too.
    bound = parse_host("b1", host_data(placement="single-instance", vllm_bind_host="10.0.0.2"))
    front = {f.path: f for f in render_host(bound, plan_host(bound), None,
                                            gateway_access=gateway_access(gateway))}["/etc/vllm-fleet/front.conf"].content
    assert "10.0.0.2 1;" in front.split("geo $vllm_fleet_via_gateway {", 1)[1].split("}", 1)[0]
    # vllm_direct_access = True, or no gateway: every client, each front counting on its own.
    open_host = parse_host("b1", host_data(placement="single-instance", vllm_direct_access=True))
    for config, access in ((open_host, gateway_access(gateway)), (host, None)):
        front = {f.path: f for f in render_host(config, plan_host(config), None,
                                                gateway_access=access)}["/etc/vllm-fleet/front.conf"].content
        assert "vllm_fleet_via_gateway" not in front


def test_a_gateway_by_host_name_or_of_another_scheme_than_its_backends_is_refused():
    gateway, host = _gateway_fleet()
    named = parse_host("gw", host_data(placement="single-instance", vllm_gateway=True, ssh_hostname="gw.example.org"))
    with pytest.raises(ConfigErrors) as info:
        check_fleet([named, host])
    error = next(e for e in info.value.errors if e.key == "vllm_advertise_address")
    assert error.host == "gw" and "'gw.example.org' (its vllm_advertise_address;" in error.message
    assert error.message.endswith("is no IP address")
    # The fix names the gateway's own address to find, never an example a backend could have.
    assert "<gw's IP address on the backends' network>" in error.fix and "10.0." not in error.fix
    assert "vllm_direct_access = True" in error.fix
    # Every front open to clients (the gateway host's own too): no address to let in.
    named_open = parse_host("gw", host_data(placement="single-instance", vllm_gateway=True,
                                            ssh_hostname="gw.example.org", vllm_direct_access=True))
    check_fleet([named_open, parse_host("b1", host_data(placement="single-instance", vllm_direct_access=True,
                                                        vllm_advertise_address="10.0.0.2"))])
    # A TLS gateway would pass its clients' keys on to a plain-HTTP backend in clear text.
    tls_gateway = parse_host("gw", host_data(placement="single-instance", vllm_gateway=True, vllm_tls=True,
                                             vllm_advertise_address="10.0.0.1"))
    with pytest.raises(ConfigErrors) as info:
        check_fleet([tls_gateway, host])
    error = next(e for e in info.value.errors if e.key == "vllm_tls")
    assert error.host == "b1" and "clear text" in error.message and error.fix.startswith("vllm_tls = True")
    with pytest.raises(ConfigErrors) as info:
        check_fleet([gateway, parse_host("b1", host_data(placement="single-instance", vllm_tls=True,
                                                         vllm_advertise_address="10.0.0.2"))])
    assert any(e.key == "vllm_tls" and e.host == "b1" for e in info.value.errors)


def test_a_tls_monitoring_host_never_scrapes_a_plain_http_target():
    monitor = parse_host("mon", host_data(placement="single-instance", vllm_monitoring=True, vllm_metrics=True,
                                          vllm_tls=True, vllm_advertise_address="10.0.0.1"))
    plain = parse_host("b1", host_data(placement="single-instance", vllm_metrics=True,
                                       vllm_advertise_address="10.0.0.2"))
    with pytest.raises(ConfigErrors) as info:
        check_fleet([monitor, plain])
    error = next(e for e in info.value.errors if e.key == "vllm_tls")
    assert error.host == "b1" and "metrics token would cross the network in clear text" in error.message


# --- the workstation's CA and keys ---------------------------------------------------------------

def test_the_fleet_ca_issues_once_and_reissues_when_names_change_or_the_end_nears(tmp_path, monkeypatch):
    cert, key = tls.issue_host_certificate(tmp_path, "h1", ["h1", "localhost"], ["10.0.0.1", "127.0.0.1"])
    assert stat.S_IMODE(os.stat(tmp_path).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "hosts" / "h1.key").st_mode) == 0o600
    leaf = x509.load_pem_x509_certificate(cert.encode())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sorted(names.get_values_for_type(x509.DNSName)) == ["h1", "localhost"]
    assert cert.endswith((tmp_path / "ca.pem").read_text())  # the chain ends in the CA
    assert tls.issue_host_certificate(tmp_path, "h1", ["h1", "localhost"], ["10.0.0.1", "127.0.0.1"]) == (cert, key)
    moved = tls.issue_host_certificate(tmp_path, "h1", ["h1", "localhost"], ["10.0.0.2", "127.0.0.1"])
    assert moved[0] != cert
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=tls.HOST_DAYS - tls.RENEW_DAYS + 1)
    monkeypatch.setattr(tls, "_now", lambda: later)
    assert tls.issue_host_certificate(tmp_path, "h1", ["h1", "localhost"], ["10.0.0.2", "127.0.0.1"])[0] != moved[0]


def test_a_connectors_host_name_gets_a_certificate_of_its_own(tmp_path):
    """pyinfra names a container's host @docker/<name>: its files stay in the CA's hosts/ directory."""
    one = tls.issue_host_certificate(tmp_path, "@docker/web", ["web"], ["127.0.0.1"])
    two = tls.issue_host_certificate(tmp_path, "@docker/db", ["db"], ["127.0.0.1"])
    assert one != two and sorted(p.name for p in (tmp_path / "hosts").iterdir()) == [
        "@docker%2Fdb.key", "@docker%2Fdb.pem", "@docker%2Fweb.key", "@docker%2Fweb.pem"]


def test_a_hosts_names_hold_its_addresses_and_loopback():
    host = parse_host("gpu-a", host_data(vllm_advertise_address="10.0.0.7", vllm_bind_host="10.0.0.7"))
    dns, ips = tls.host_names(host, "gpu-a.example.org")
    assert dns == ["gpu-a", "gpu-a.example.org", "localhost"] and ips == ["10.0.0.7", "127.0.0.1", "::1"]


def test_the_hosts_key_is_stable_per_host_and_its_seed_private(tmp_path):
    one = parse_host("a", host_data(vllm_workstation_dir=str(tmp_path)))
    two = parse_host("b", host_data(vllm_workstation_dir=str(tmp_path)))
    assert host_keys.host_key(one) == host_keys.host_key(one) != host_keys.host_key(two)
    assert stat.S_IMODE(os.stat(tmp_path / "host-key-seed").st_mode) == 0o600
