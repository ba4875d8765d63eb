"""Two or more gateways behind one floating address, offline: the knobs and what they refuse before any
host changes, keepalived's config and readiness check per gateway (checked by Debian's keepalived
where this machine has it), the backends' fronts letting in every gateway, the certificate's names,
the plan, and the deploy's table of what reloads keepalived."""

from __future__ import annotations

import http.server
import json
import re
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from support import real_tool_checks as tools
from support.debian_tool import ToolUnavailable
from support.planning_fixtures import run_cli
from vllm_fleet import kinds
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.deploy import handlers
from vllm_fleet.fleet import Fleet
from vllm_fleet.gateway import KEEPALIVED_UNIT, floating_files, floating_paths, gateway_url
from vllm_fleet.host_layout import KEEPALIVED_CONFIG
from vllm_fleet.render import render_host
from vllm_fleet.render_front import front_gateway_access
from vllm_fleet.rules import host_packages
from vllm_fleet.tls import host_names

ADDRESS = "10.0.0.100/24"
GROUP = {"vllm_target": "cpu", "vllm_gateway_address": ADDRESS, "vllm_gateway_interface": "eth0"}


def cpu_instance(name: str, served: str, port: int = 8000) -> dict:
    return {"name": name, "model": "/models/tiny", "served_model_name": served, "port": port, "max_model_len": 2048}


def rows(gw1: dict | None = None, gw2: dict | None = None, backend: dict | None = None) -> list:
    """Two gateways without instances and one backend host, all reading GROUP (group data); each
    host's own data changed by its argument."""
    return [("gw1", {**GROUP, "ssh_hostname": "10.0.0.1", "vllm_gateway": True, **(gw1 or {})}, []),
            ("gw2", {**GROUP, "ssh_hostname": "10.0.0.2", "vllm_gateway": True, "vllm_gateway_interface": "ens3",
                     **(gw2 or {})}, []),
            ("h3", {**GROUP, "ssh_hostname": "10.0.0.3", "vllm_instances": [cpu_instance("a", "alpha")],
                    **(backend or {})}, [])]


def fleet_errors(fleet_rows: list) -> list:
    with pytest.raises(ConfigErrors) as info:
        Fleet.from_rows(fleet_rows).hosts()
    return info.value.errors


def keepalived_conf(fleet: Fleet, name: str) -> str:
    files = {f.path: f.content for f in floating_files(fleet.configs[name], fleet.gateway_access())}
    return files[KEEPALIVED_CONFIG]


# --- what two gateways get ------------------------------------------------------------------------

def test_two_gateways_behind_one_address_are_accepted_and_clients_get_the_floating_url():
    fleet = Fleet.from_rows(rows())
    fleet.hosts()
    access = fleet.gateway_access()
    assert access.url == "http://10.0.0.100:9000/v1"
    assert access.sources == ("10.0.0.1", "10.0.0.2")
    assert [(m.name, m.address, m.priority) for m in access.members] == [("gw1", "10.0.0.1", 200),
                                                                         ("gw2", "10.0.0.2", 190)]
    assert gateway_url(fleet.configs["gw2"]) == "http://10.0.0.100:9000/v1"


def test_each_gateway_speaks_unicast_to_the_others_from_its_own_address_on_its_own_interface():
    fleet = Fleet.from_rows(rows())
    first, second = keepalived_conf(fleet, "gw1"), keepalived_conf(fleet, "gw2")
    assert "unicast_src_ip 10.0.0.1\n" in first and re.search(r"unicast_peer \{\s+10\.0\.0\.2\s+\}", first)
    assert "unicast_src_ip 10.0.0.2\n" in second and re.search(r"unicast_peer \{\s+10\.0\.0\.1\s+\}", second)
    assert "interface eth0\n" in first and "10.0.0.100/24 dev eth0\n" in first
    assert "interface ens3\n" in second and "10.0.0.100/24 dev ens3\n" in second
    assert "priority 200\n" in first and "priority 190\n" in second
    for conf in (first, second):
        assert "virtual_router_id 51\n" in conf and "check_unicast_src" in conf
        # Every gateway starts as a backup and keeps the address once it has it: no flapping back.
        assert "state BACKUP\n" in conf and "\n    nopreempt\n" in conf and "preempt_delay" not in conf
        # No VRRP authentication is relied on (the comment says why).
        assert "authentication {" not in conf and "auth_pass" not in conf
        assert "enable_script_security" in conf and "script_user vllm-gateway-check" in conf
        assert re.search(r"track_script \{\s+vllm_fleet_gateway_ready\s+\}", conf)
        assert 'script "/usr/bin/python3 -I /etc/vllm-fleet/gateway-check.py"' in conf


def test_priorities_follow_the_inventory_order_unless_given_and_two_equal_ones_are_refused():
    fleet = Fleet.from_rows(rows(gw2={"vllm_gateway_priority": 250}))
    fleet.hosts()
    assert [m.priority for m in fleet.gateway_access().members] == [200, 250]
    (error,) = fleet_errors(rows(gw2={"vllm_gateway_priority": 200}))
    assert (error.host, error.key) == ("gw2", "vllm_gateway_priority") and "gw1" in error.message


def test_three_gateways_each_peer_with_the_two_others():
    three = rows() + [("gw3", {**GROUP, "ssh_hostname": "10.0.0.4", "vllm_gateway": True}, [])]
    fleet = Fleet.from_rows(three)
    fleet.hosts()
    conf = keepalived_conf(fleet, "gw3")
    assert re.search(r"unicast_peer \{\s+10\.0\.0\.1\s+10\.0\.0\.2\s+\}", conf) and "priority 180\n" in conf


def test_the_backends_fronts_let_in_every_gateway_and_name_the_floating_url():
    fleet = Fleet.from_rows(rows())
    allowed = front_gateway_access(fleet.configs["h3"], fleet.gateway_access())
    assert {"10.0.0.1", "10.0.0.2"} <= set(allowed["allowed"]) and allowed["url"] == "http://10.0.0.100:9000/v1"
    plan = fleet.plan()
    front = {f.path: f.content for f in render_host(fleet.configs["h3"], plan.hosts[2],
                                                    gateway_access=fleet.gateway_access())}["/etc/vllm-fleet/front.conf"]
    assert "10.0.0.1 1;" in front and "10.0.0.2 1;" in front


def test_render_gives_keepalived_files_to_the_gateways_only_and_the_manifest_names_the_address():
    fleet = Fleet.from_rows(rows())
    plan, backends, access = fleet.plan(), fleet.gateway_backends(), fleet.gateway_access()
    rendered = {h.name: {f.path: f for f in render_host(fleet.configs[h.name], h, backends=backends,
                                                        gateway_access=access)} for h in plan.hosts}
    paths = floating_paths(fleet.configs["gw1"])
    for name in ("gw1", "gw2"):
        assert paths["keepalived"] in rendered[name] and paths["check"] in rendered[name]
        manifest = json.loads(rendered[name]["/etc/vllm-fleet/manifest.json"].content)
        floating = manifest["gateway"]["floating"]
        assert floating["address"] == "10.0.0.100" and floating["unit"] == KEEPALIVED_UNIT
        assert [g["host"] for g in floating["gateways"]] == ["gw1", "gw2"]
    assert paths["keepalived"] not in rendered["h3"] and paths["check"] not in rendered["h3"]


def test_one_gateway_without_the_address_gets_no_keepalived_and_keeps_its_own_url():
    hosts = [parse_host("gw", {"vllm_target": "cpu", "ssh_hostname": "10.0.0.1", "vllm_gateway": True,
                               "vllm_gateway_interface": "eth0"})]
    fleet = Fleet.of(hosts)
    fleet.hosts()
    assert floating_files(hosts[0], fleet.gateway_access()) == []
    assert fleet.gateway_access().url == "http://10.0.0.1:9000/v1" and fleet.gateway_access().members == ()
    files = {f.path: f for f in render_host(hosts[0], fleet.plan().hosts[0], backends=[])}
    assert not {p for p in files if "keepalived" in p or p.endswith("gateway-check.py")}
    assert "floating" not in json.loads(files["/etc/vllm-fleet/manifest.json"].content)["gateway"]


def test_one_gateway_with_the_address_holds_it_alone_without_peers():
    fleet = Fleet.from_rows(rows()[:1] + rows()[2:])
    fleet.hosts()
    conf = keepalived_conf(fleet, "gw1")
    assert "unicast_peer" not in conf and "unicast_src_ip" not in conf and "10.0.0.100/24 dev eth0" in conf


def test_the_certificate_of_a_gateway_names_the_floating_address_and_a_backends_does_not():
    fleet = Fleet.from_rows(rows(gw1={"vllm_tls": True}, gw2={"vllm_tls": True}, backend={"vllm_tls": True}))
    fleet.hosts()
    assert "10.0.0.100" in host_names(fleet.configs["gw1"], "10.0.0.1")[1]
    assert "10.0.0.100" in host_names(fleet.configs["gw2"], "10.0.0.2")[1]
    assert "10.0.0.100" not in host_names(fleet.configs["h3"], "10.0.0.3")[1]


# --- what is refused, before any host changes ------------------------------------------------------

@pytest.mark.parametrize("value", [
    "010.0.0.100/24",  # a leading zero (octal to some parsers)
    "１0.0.0.100/24",  # a fullwidth digit
    "10.0.0.١٠٠/24",  # Arabic-Indic digits
    "10.0.0.100/24\n",  # a line break
    "10.0.0.100/24\x00",
    "10.0.0.100",  # no prefix: no subnet to check against
    "fd00::100/64",  # IPv6
    "10.0.0.0/24",  # the network's address
    "10.0.0.255/24",  # the broadcast address
    "0.0.0.0/8",
    "127.0.0.5/8",  # loopback
    "224.0.0.18/24",  # multicast (VRRP's own group)
    "169.254.0.5/16",  # link-local
    "10.0.0.100/32",  # no room for a gateway's own address
    "10.0.0.100/24 dev eth0",  # keepalived syntax smuggled in
    "10.0.0.100/24\"}",
    10,
])
def test_a_hostile_floating_address_is_refused_naming_the_key(value):
    with pytest.raises(ConfigErrors) as info:
        parse_host("gw", {**GROUP, "vllm_gateway": True, "vllm_gateway_address": value})
    assert any(e.key == "vllm_gateway_address" and e.fix for e in info.value.errors)


@pytest.mark.parametrize("key, value", [
    ("vllm_gateway_interface", "eth0 dev lo"), ("vllm_gateway_interface", "eth0\n}"),
    ("vllm_gateway_interface", "a-very-long-interface"), ("vllm_gateway_interface", ""),
    ("vllm_gateway_vrrp_id", 0), ("vllm_gateway_vrrp_id", 256), ("vllm_gateway_vrrp_id", True),
    ("vllm_gateway_vrrp_id", 10 ** 30), ("vllm_gateway_priority", 255), ("vllm_gateway_priority", 0),
    ("vllm_gateway_check_user", "root"), ("vllm_gateway_check_user", "vllm-router"),
    ("vllm_gateway_check_user", "x;y"),
])
def test_hostile_keepalived_knobs_are_refused_naming_the_key(key, value):
    with pytest.raises(ConfigErrors) as info:
        parse_host("gw", {**GROUP, "vllm_gateway": True, key: value})
    assert any(e.key == key and e.fix for e in info.value.errors), info.value.errors


def test_an_address_outside_a_gateways_subnet_is_refused_naming_that_gateway():
    (error,) = fleet_errors(rows(gw2={"ssh_hostname": "10.0.1.2"}))
    assert (error.host, error.key) == ("gw2", "vllm_gateway_address") and "10.0.0.0/24" in error.message
    assert "vllm_advertise_address" in error.fix


def test_a_gateway_known_by_a_name_only_is_refused_since_keepalived_needs_its_address():
    (error,) = fleet_errors(rows(gw2={"ssh_hostname": "gw2.example"}))
    assert (error.host, error.key) == ("gw2", "vllm_gateway_address") and "'gw2.example'" in error.message


def test_two_gateways_with_one_own_address_are_refused_since_each_would_advertise_to_itself():
    errors = fleet_errors(rows(gw2={"vllm_advertise_address": "10.0.0.1"}))
    assert any(e.host == "gw2" and e.key == "vllm_advertise_address" and "also the gateway gw1's" in e.message
               for e in errors), errors


@pytest.mark.parametrize("spelling", ["10.0.0.3", "10.0.0.3 ", "H3.Example.", "::ffff:10.0.0.3"])
def test_two_inventory_hosts_of_one_machine_are_refused_naming_the_second(spelling):
    """Each one's deploy would remove the other's instances as stale ones and write its own front and
    manifest over the other's. The same address in another spelling is the same machine; the same
    address on another SSH port is another machine (a forwarded port)."""
    first = "h3.example" if spelling.startswith("H3") else ("::ffff:10.0.0.3" if "::" in spelling else "10.0.0.3")
    twin = ("h4", {**GROUP, "ssh_hostname": spelling, "vllm_instances": [cpu_instance("b", "beta")]}, [])
    errors = fleet_errors(rows(backend={"ssh_hostname": first}) + [twin])
    assert any(e.host == "h4" and e.key == "ssh_hostname" and "same machine as h3" in e.message
               for e in errors), errors
    other_port = ("h4", {**GROUP, "ssh_hostname": "10.0.0.3", "ssh_port": 2222,
                         "vllm_instances": [cpu_instance("b", "beta")]}, [])
    Fleet.from_rows(rows() + [other_port]).hosts()


@pytest.mark.parametrize("changes, host", [
    ({"backend": {"ssh_hostname": "10.0.0.100"}}, "h3"),
    ({"backend": {"vllm_advertise_address": "10.0.0.100"}}, "h3"),
    ({"gw2": {"ssh_hostname": "10.0.0.100"}}, "gw2"),
])
def test_the_floating_address_as_a_hosts_own_is_refused_naming_that_host(changes, host):
    errors = fleet_errors(rows(**changes))
    assert any(e.host == host and e.key == "vllm_gateway_address" and "own" in e.message for e in errors), errors


@pytest.mark.parametrize("key, value", [
    ("vllm_gateway_policy", "random"), ("vllm_gateway_port", 9100), ("vllm_gateway_vrrp_id", 52),
    ("vllm_gateway_address", "10.0.0.101/24"), ("vllm_gateway_version", "0.1.16"),
    ("vllm_gateway_health_interval_s", 5), ("vllm_api_key_env", "OTHER_FLEET_KEY"),
    ("vllm_api_clients", {"ci": {"key_env": "CI_KEY"}}),
])
def test_gateways_with_different_router_settings_are_refused_naming_the_second_and_the_key(key, value):
    errors = fleet_errors(rows(gw2={key: value}))
    assert any(e.host == "gw2" and e.key == key and "gw1" in e.message for e in errors), errors


def test_a_gateway_without_an_interface_is_refused_with_the_fix():
    fleet_rows = rows()
    del fleet_rows[1][1]["vllm_gateway_interface"]
    errors = fleet_errors(fleet_rows)
    (error,) = [e for e in errors if e.key == "vllm_gateway_interface"]
    assert error.host == "gw2" and "eth0" in error.fix


def test_a_gateway_whose_front_listens_on_one_address_only_is_refused():
    errors = fleet_errors(rows(gw1={"vllm_bind_host": "10.0.0.1"}))
    assert any(e.host == "gw1" and e.key == "vllm_bind_host" for e in errors), errors


def test_two_gateways_without_the_address_are_still_refused_and_the_fix_names_it():
    plain = [(name, {k: v for k, v in data.items() if k != "vllm_gateway_address"}, g) for name, data, g in rows()]
    (error,) = fleet_errors(plain)
    assert error.key == "vllm_gateway" and "vllm_gateway_address" in error.fix


def test_the_floating_address_checker_takes_a_plain_host_address():
    assert kinds.floating_address_problem("192.168.7.250/23") is None


# --- keepalived's readiness check, run as keepalived runs it ------------------------------------------

class _FakeGateway(http.server.BaseHTTPRequestHandler):
    """vllm-router's /workers (with the workers given) and the front's /health, on loopback."""

    workers: list = []
    health = 200

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path == "/workers":
            status, body = 200, json.dumps({"workers": self.workers}).encode()
        elif self.path == "/health":
            status, body = self.health, b"ok"
        else:
            status, body = 404, b""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _serve(handler) -> tuple[http.server.ThreadingHTTPServer, int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_check(tmp_path: Path, router_port: int, front_port: int) -> int:
    """The rendered check with only its two ports moved to the fakes', run as keepalived runs it."""
    fleet = Fleet.from_rows(rows())
    text = {f.path: f.content for f in floating_files(fleet.configs["gw1"], fleet.gateway_access())}[
        floating_paths(fleet.configs["gw1"])["check"]]
    assert "ROUTER_PORT = 19000\n" in text and "FRONT_PORT = 9000\n" in text
    script = tmp_path / "gateway-check.py"
    script.write_text(text.replace("ROUTER_PORT = 19000\n", f"ROUTER_PORT = {router_port}\n")
                      .replace("FRONT_PORT = 9000\n", f"FRONT_PORT = {front_port}\n"))
    return subprocess.run([sys.executable, "-I", str(script)], timeout=30).returncode


@pytest.mark.parametrize("workers, health, expected", [
    ([{"url": "http://10.0.0.3:8000", "is_healthy": True}], 200, 0),
    ([{"url": "http://10.0.0.3:8000", "is_healthy": False}, {"url": "http://x:1", "is_healthy": True}], 200, 0),
    ([{"url": "http://10.0.0.3:8000", "is_healthy": False}], 200, 1),  # no healthy backend
    ([], 200, 1),
    ([{"url": "http://10.0.0.3:8000", "is_healthy": True}], 502, 1),  # the front cannot reach the router
])
def test_the_readiness_check_wants_the_router_a_healthy_backend_and_the_front(tmp_path, workers, health, expected):
    handler = type("Handler", (_FakeGateway,), {"workers": workers, "health": health})
    server, port = _serve(handler)
    try:
        assert _run_check(tmp_path, port, port) == expected
    finally:
        server.shutdown()
        server.server_close()


def test_the_readiness_check_fails_when_the_router_or_the_front_is_down(tmp_path):
    handler = type("Handler", (_FakeGateway,), {"workers": [{"url": "u", "is_healthy": True}], "health": 200})
    server, port = _serve(handler)
    try:
        assert _run_check(tmp_path, _closed_port(), port) == 1
        assert _run_check(tmp_path, port, _closed_port()) == 1
    finally:
        server.shutdown()
        server.server_close()


# --- Debian's keepalived on the rendered config ---------------------------------------------------

def keepalived_or_skip():
    try:
        return tools.keepalived(), tools.machine_interface()
    except ToolUnavailable as exc:
        pytest.skip(str(exc))


@pytest.mark.parametrize("tls", [False, True])
def test_keepalived_accepts_every_gateways_rendered_config(tmp_path, tls):
    keepalived_or_skip()
    three = rows(gw1={"vllm_tls": tls}, gw2={"vllm_tls": tls}, backend={"vllm_tls": tls}) + [
        ("gw3", {**GROUP, "ssh_hostname": "10.0.0.4", "vllm_gateway": True, "vllm_tls": tls,
                 "vllm_gateway_vrrp_id": 51, "vllm_gateway_priority": 1}, [])]
    fleet = Fleet.from_rows(three)
    fleet.hosts()
    for name in ("gw1", "gw2", "gw3"):
        config = fleet.configs[name]
        conf = keepalived_conf(fleet, name)
        problems = tools.keepalived_problems(tmp_path / name, conf, config.settings.vllm_gateway_interface,
                                             config.settings.vllm_gateway_check_user)
        assert problems == "", f"keepalived refused {name}'s config:\n{problems}\n\n{conf}"


@pytest.mark.parametrize("broken", [
    ("virtual_router_id 51", "virtual_router_id 300"), ("    advert_int 0.5", "    advert_int 0.5\n    no_such_word"),
    ("    interval 1", "    interval 0"),
])
def test_keepalived_refuses_a_broken_variant_so_the_check_above_can_fail(tmp_path, broken):
    keepalived_or_skip()
    fleet = Fleet.from_rows(rows())
    conf = keepalived_conf(fleet, "gw1")
    assert broken[0] in conf
    problems = tools.keepalived_problems(tmp_path, conf.replace(broken[0], broken[1]), "eth0", "vllm-gateway-check")
    assert problems


# --- the deploy: keepalived installed, its file written, reloaded -----------------------------------

def test_keepalived_and_nftables_are_packages_of_gateways_behind_an_address_only():
    def names(**kw):
        return [n.debian for n in host_packages.needs("cpu", "3.11", "uv", eager_only=True, has_instances=False,
                                                      gateway=True, **kw)]
    for package in ("keepalived", "nftables"):  # nftables: a rollout holds new connections while the address moves
        assert package in names(floating=True) and package not in names()
        assert package in host_packages.every_debian_package("3.11")  # the sandbox's mirror holds it


def test_a_changed_keepalived_config_reloads_it_and_nothing_restarts_it():
    row = handlers.HANDLERS["keepalived"]
    assert row["config"] == handlers.RELOAD and handlers.RESTART not in row.values()


# --- the plan ---------------------------------------------------------------------------------------

INVENTORY = textwrap.dedent("""
    group = {"vllm_target": "cpu", "vllm_gateway_address": "10.0.0.100/24", "vllm_gateway_interface": "eth0"}
    hosts = [
        ("gw1", {**group, "ssh_hostname": "10.0.0.1", "vllm_gateway": True}),
        ("gw2", {**group, "ssh_hostname": "10.0.0.2", "vllm_gateway": True, "vllm_gateway_interface": "ens3"}),
        ("h3", {**group, "ssh_hostname": "10.0.0.3", "vllm_instances": [
            {"name": "a", "model": "/models/tiny", "served_model_name": "alpha", "port": 8000, "max_model_len": 2048}]}),
    ]
""")


def test_plan_shows_every_gateway_and_the_floating_address_as_text_and_json(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY)
    result = run_cli("plan", "inv.py", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    gateways = json.loads(result.stdout)["gateways"]
    assert [g["host"] for g in gateways] == ["gw1", "gw2"]
    for gateway in gateways:
        assert gateway["url"] == "http://10.0.0.100:9000/v1"
        assert [b["url"] for b in gateway["backends"]] == ["http://10.0.0.3:8000"]
    assert [(g["floating"]["interface"], g["floating"]["priority"]) for g in gateways] == [("eth0", 200), ("ens3", 190)]
    text = run_cli("plan", "inv.py", cwd=tmp_path).stdout
    assert "gateway on gw1: http://10.0.0.100:9000/v1" in text and "gateway on gw2: http://10.0.0.100:9000/v1" in text
    assert "floating address 10.0.0.100/24 on ens3 (keepalived, VRRP id 51, priority 190); the other gateways: " \
           "gw1 (10.0.0.1, priority 200)" in text
    assert "gateway: http://10.0.0.100:9000/v1 on gw1, gw2 (the floating address 10.0.0.100/24, moved by " \
           "keepalived), models alpha" in text


def test_plan_refuses_gateways_that_disagree_before_any_host(tmp_path):
    (tmp_path / "inv.py").write_text(INVENTORY.replace('"vllm_gateway_interface": "ens3"',
                                                       '"vllm_gateway_interface": "ens3", "vllm_gateway_policy": "random"'))
    result = run_cli("plan", "inv.py", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "host gw2, key vllm_gateway_policy" in result.stderr and "nothing was changed on any host" in result.stderr


# --- a gateway's own certificate (vllm_tls_cert_file) must name the floating address ----------------

def _own_certificate_files(tmp_path: Path, ips: list[str]) -> dict:
    """A CA and a gateway certificate it signed, naming `ips`, as the three own-certificate knobs."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Team CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gw1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("gw1")] +
                                                       [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    texts = {"vllm_tls_cert_file": ("gw1.pem", cert.public_bytes(pem), 0o644),
             "vllm_tls_key_file": ("gw1.key", key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                                serialization.NoEncryption()), 0o600),
             "vllm_tls_ca_file": ("ca.pem", ca.public_bytes(pem), 0o644)}
    out = {"vllm_tls": True}
    for knob, (name, data, mode) in texts.items():
        path = tmp_path / name
        path.write_bytes(data)
        path.chmod(mode)
        out[knob] = str(path)
    return out


def test_a_gateways_own_certificate_without_the_floating_address_is_refused(tmp_path):
    from vllm_fleet import tls

    without = parse_host("gw1", {**GROUP, "ssh_hostname": "10.0.0.1", "vllm_gateway": True,
                                 **_own_certificate_files(tmp_path, ["10.0.0.1"])})
    with pytest.raises(ConfigErrors) as info:
        tls.own_certificate(without)
    (error,) = info.value.errors
    assert error.key == "vllm_tls_cert_file" and "10.0.0.100" in error.message and "10.0.0.100" in error.fix
    (tmp_path / "ok").mkdir()
    named = parse_host("gw1", {**GROUP, "ssh_hostname": "10.0.0.1", "vllm_gateway": True,
                               **_own_certificate_files(tmp_path / "ok", ["10.0.0.1", "10.0.0.100"])})
    assert tls.own_certificate(named).cert_pem.startswith("-----BEGIN CERTIFICATE-----")
    backend = parse_host("h3", {**GROUP, "ssh_hostname": "10.0.0.3", **_own_certificate_files(tmp_path, ["10.0.0.3"])})
    tls.own_certificate(backend)  # not a gateway: the floating address is not its
