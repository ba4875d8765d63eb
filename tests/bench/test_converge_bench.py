"""The converge bench's pure helpers (bench/converge/) and its delaying TCP relay (bench/latency_relay.py), offline:
counting commands and connections from debug output, the playbook's variables, the inventories, the
report; the relay forwarding bytes with its delay between sockets made here, in-process and as the
process the bench starts and stops by PID. With ansible-core installed, the playbook itself runs
against this machine (local connection, files in a temp dir, no systemd units)."""

from __future__ import annotations

import asyncio
import json
import os
import runpy
import shutil
import socket
import socketserver
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import benchlib  # noqa: E402
import latency_relay as lr  # noqa: E402
from converge import cli, inventories, machine, report, settings, steps, tool_output  # noqa: E402

# --- counting from debug output -------------------------------------------------------------------

PYINFRA_DEBUG = """\
--> Connecting to hosts...
    [pyinfra.connectors.ssh] Connecting to: 127.0.0.1 ({'allow_agent': False, 'look_for_keys': False, '_pyinfra_ssh_known_hosts_file': '/tmp/kh', 'username': 'deploy', 'port': 40001, 'timeout': 10, 'pkey': <paramiko.ed25519key.Ed25519Key object at 0x7f>})
    [pyinfra.connectors.ssh] Connecting to: 127.0.0.1 ({'allow_agent': False, 'username': 'deploy', 'port': 40002, 'timeout': 10})
    [sbx-cpu1] Connected
    [pyinfra.connectors.ssh] Running command on sbx-cpu1: (pty=False) { sudo -H -n sh -c 'id -u'; echo vllm-fleet-exit=$?; } 2>&1 | sed 's/^/out: /'
    [pyinfra.connectors.ssh] Waiting for exit status...
    [pyinfra.connectors.ssh] Command exit status: 0
    [pyinfra.connectors.ssh] Running command on sbx-cpu2: (pty=False) sudo -H -n sh -c 'systemctl show'
    [pyinfra.connectors.ssh] Running command on sbx-cpu1: (pty=False) sudo -H -n sh -c 'python3 -c '"'"'
import json
print("Running command on nothing")'"'"''
    [sbx-cpu1] deploy lock /run/vllm-fleet/deploy.lock taken
    [pyinfra.connectors.ssh] Attempting upload of <_io.BytesIO object at 0x7f> to /opt/x
"""


def test_pyinfra_counts_commands_connections_and_the_lock_per_host():
    endpoints = {("127.0.0.1", 40001): "sbx-cpu1", ("127.0.0.1", 40002): "sbx-cpu2"}
    counts = tool_output.pyinfra_counts(PYINFRA_DEBUG, endpoints)
    assert counts["sbx-cpu1"] == {"commands": 3, "connections": 1, "transfers": 0}  # 2 + the lock
    assert counts["sbx-cpu2"] == {"commands": 1, "connections": 1, "transfers": 0}
    assert counts["*"]["transfers"] == 1  # uploads are not named per host in pyinfra's debug line


def test_pyinfra_counts_a_connection_without_port_as_port_22():
    log = "    [pyinfra.connectors.ssh] Connecting to: 10.213.7.11 ({'username': 'deploy', 'timeout': 10})\n"
    assert tool_output.pyinfra_counts(log, {("10.213.7.11", 22): "sbx-cpu1"})["sbx-cpu1"]["connections"] == 1


ANSIBLE_VVV = """\
TASK [Files rendered by vllm-fleet] ********************************************
<127.0.0.1> ESTABLISH SSH CONNECTION FOR USER: deploy
<127.0.0.1> SSH: EXEC ssh -v -C -o ControlMaster=auto -o ControlPersist=60s -o Port=40001 -o 'IdentityFile="/k"' -o 'User="deploy"' -o ConnectTimeout=10 -o 'ControlPath="/tmp/vfcb-x/cp1/c3e4c78d80"' 127.0.0.1 '/bin/sh -c '"'"'echo ~deploy && sleep 0'"'"''
<127.0.0.1> (0, b'/home/deploy\\n', b'OpenSSH_9.2p1 Debian-2+deb12u6\\r\\ndebug1: auto-mux: Trying existing master\\r\\ndebug1: Connecting to 127.0.0.1 [127.0.0.1] port 40001.\\r\\ndebug1: Connection established.\\r\\n')
<127.0.0.1> SSH: EXEC ssh -v -C -o ControlMaster=auto -o ControlPersist=60s -o Port=40002 127.0.0.1 '/bin/sh -c '"'"'echo ~deploy && sleep 0'"'"''
<127.0.0.1> (0, b'/home/deploy\\n', b'debug1: Connecting to 127.0.0.1 [127.0.0.1] port 40002.\\r\\n')
<127.0.0.1> SSH: EXEC ssh -v -C -o ControlMaster=auto -o ControlPersist=60s -o Port=40001 127.0.0.1 '/bin/sh -c '"'"'sudo -H -S -n  -u root /bin/sh -c '"'"'"'"'"'"'"'"'echo BECOME-SUCCESS-x ; /usr/bin/python3'"'"'"'"'"'"'"'"' && sleep 0'"'"''
<127.0.0.1> (0, b'{"changed": false}\\n', b'debug1: auto-mux: Trying existing master\\r\\ndebug1: mux_client_request_session: master session id: 2\\r\\n')
<127.0.0.1> SSH: EXEC sftp -b - -v -C -o Port=40001 '[127.0.0.1]'
<10.213.7.13> SSH: EXEC ssh -C -o ControlMaster=auto 10.213.7.13 '/bin/sh -c '"'"'true'"'"''
"""


def test_ansible_counts_execs_transfers_and_new_connections_per_host():
    endpoints = {("127.0.0.1", 40001): "sbx-cpu1", ("127.0.0.1", 40002): "sbx-cpu2", ("10.213.7.13", 22): "sbx-cpu3"}
    counts = tool_output.ansible_counts(ANSIBLE_VVV, endpoints)
    assert counts["sbx-cpu1"] == {"commands": 2, "connections": 1, "transfers": 1}
    assert counts["sbx-cpu2"] == {"commands": 1, "connections": 1, "transfers": 0}
    assert counts["sbx-cpu3"] == {"commands": 1, "connections": 0, "transfers": 0}  # no Port=: 22


def test_play_recap_and_changed_lines():
    text = """\
changed: [sbx-cpu2] => (item=/etc/vllm-fleet/front.conf)
ok: [sbx-cpu1] => (item=/etc/vllm-fleet/front.conf)

PLAY RECAP *********************************************************************
sbx-cpu1                   : ok=5    changed=0    unreachable=0    failed=0    skipped=4    rescued=0    ignored=0
sbx-cpu2                   : ok=6    changed=1    unreachable=0    failed=0    skipped=3    rescued=0    ignored=0
"""
    assert tool_output.play_recap(text) == {"sbx-cpu1": {"ok": 5, "changed": 0, "unreachable": 0, "failed": 0},
                                   "sbx-cpu2": {"ok": 6, "changed": 1, "unreachable": 0, "failed": 0}}
    assert tool_output.changed_lines(text) == ["changed: [sbx-cpu2] => (item=/etc/vllm-fleet/front.conf)"]


# --- what the playbook is given ---------------------------------------------------------------------

@pytest.mark.parametrize("role,unit,expected", [
    ("instance-unit", "vllm-tiny.service", {"unit": True, "restart": ["vllm-tiny.service"], "reload": []}),
    ("instance-config", "vllm-tiny.service", {"unit": False, "restart": ["vllm-tiny.service"], "reload": []}),
    ("instance-env", "vllm-tiny.service", {"unit": False, "restart": ["vllm-tiny.service"], "reload": []}),
    ("front-unit", settings.FRONT_UNIT, {"unit": True, "restart": [settings.FRONT_UNIT], "reload": []}),
    ("front-config", settings.FRONT_UNIT, {"unit": False, "restart": [], "reload": [settings.FRONT_UNIT]}),
    ("gateway-unit", settings.GATEWAY_UNIT, {"unit": True, "restart": [settings.GATEWAY_UNIT], "reload": []}),
    ("gateway-workers", settings.GATEWAY_UNIT, {"unit": False, "restart": [], "reload": [settings.GATEWAY_UNIT]}),
    ("gateway-register", settings.GATEWAY_UNIT, {"unit": False, "restart": [], "reload": [settings.GATEWAY_UNIT]}),
    ("gateway-key", settings.GATEWAY_UNIT, {"unit": False, "restart": [], "reload": [settings.FRONT_UNIT]}),
    ("gateway-models", settings.GATEWAY_UNIT, {"unit": False, "restart": [], "reload": []}),
    ("manifest", None, {"unit": False, "restart": [], "reload": []}),
    ("other", None, {"unit": False, "restart": [], "reload": []}),
])
def test_file_actions_follow_the_deploys_rules(role, unit, expected):
    assert inventories.file_actions(role, unit) == expected


def test_unit_names_match_vllm_fleets():
    from vllm_fleet import gateway, render
    assert settings.FRONT_UNIT == render.FRONT_UNIT and settings.GATEWAY_UNIT == gateway.GATEWAY_UNIT


def _record(host="sbx-cpu1", gateway=True):
    def f(path, role, unit, secret=False, group="root", mode="0644"):
        return {"path": path, "content": f"{path}\n", "owner": "root", "group": group, "mode": mode,
                "secret": secret, "role": role, "unit_name": unit}
    files = [f("/etc/systemd/system/vllm-tiny.service", "instance-unit", "vllm-tiny.service"),
             f("/etc/vllm-fleet/tiny.yaml", "instance-config", "vllm-tiny.service", group="vllm", mode="0640"),
             f("/etc/vllm-fleet/tiny.env", "instance-env", "vllm-tiny.service", secret=True, mode="0600"),
             f("/etc/vllm-fleet/front.conf", "front-config", settings.FRONT_UNIT, group="vllm", mode="0640"),
             f("/etc/systemd/system/vllm-fleet-front.service", "front-unit", settings.FRONT_UNIT)]
    if gateway:
        files.append(f("/etc/systemd/system/vllm-fleet-gateway.service", "gateway-unit", settings.GATEWAY_UNIT))
    files.append(dict(f("/etc/vllm-fleet/manifest.json", "manifest", None), owner=None, group=None))
    return {"host": host, "files": files,
            "instances": [{"name": "tiny", "unit": "vllm-tiny.service", "port": 18000, "front_port": 8000,
                           "served_model_name": "tiny-llama", "env_file": "/etc/vllm-fleet/tiny.env"}]}


def test_ansible_host_vars(tmp_path):
    v = inventories.ansible_host_vars(_record(), tmp_path)
    assert v["vf_units"] == ["vllm-tiny.service", settings.FRONT_UNIT, settings.GATEWAY_UNIT]
    assert v["vf_instances"] == [{"name": "tiny", "unit": "vllm-tiny.service", "port": 18000,
                                  "env_file": "/etc/vllm-fleet/tiny.env", "served_model_name": "tiny-llama"}]
    env = next(f for f in v["vf_files"] if f["path"].endswith(".env"))
    assert env["secret"] is True and env["mode"] == "0600" and env["restart"] == ["vllm-tiny.service"]
    assert env["src"] == str(tmp_path / "sbx-cpu1" / "etc/vllm-fleet/tiny.env")
    assert "content" not in env  # the secret stays in its 0600 file, not in the inventory
    manifest = next(f for f in v["vf_files"] if f["path"].endswith("manifest.json"))
    assert manifest["owner"] is None and manifest["group"] is None  # left alone, as the deploy does
    assert inventories.ansible_host_vars(_record(gateway=False), tmp_path)["vf_units"] == ["vllm-tiny.service", settings.FRONT_UNIT]


def test_ssh_vars_and_inventory_shape():
    v = inventories.ssh_vars("127.0.0.1", 40001, "deploy", "/k/id", "/tmp/known hosts")
    assert v["ansible_port"] == 40001 and v["ansible_become"] is True and v["ansible_user"] == "deploy"
    assert "UserKnownHostsFile='/tmp/known hosts'" in v["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in v["ansible_ssh_common_args"]
    inv = inventories.ansible_inventory({"h": v})
    assert inv["all"]["children"]["converge"]["hosts"]["h"] is v


def test_known_hosts_line():
    pub = "ssh-ed25519 AAAAC3Nza root@sbx-cpu1\n"
    assert inventories.known_hosts_line("127.0.0.1", 40001, pub) == "[127.0.0.1]:40001 ssh-ed25519 AAAAC3Nza\n"
    assert inventories.known_hosts_line("10.213.7.11", 22, pub) == "10.213.7.11 ssh-ed25519 AAAAC3Nza\n"


def test_pyinfra_inventory_source_keeps_the_gateways_addresses(tmp_path):
    base = tmp_path / "base.py"
    base.write_text("cpu_hosts = [('a', {'ssh_hostname': '10.0.0.1', 'vllm_gateway': True}),\n"
                    "             ('b', {'ssh_hostname': '10.0.0.2', 'vllm_advertise_address': '10.9.9.9'})]\n")
    plain = tmp_path / "plain.py"
    plain.write_text(inventories.pyinfra_inventory_source(base))
    assert runpy.run_path(str(plain))["cpu_hosts"] == [("a", {"ssh_hostname": "10.0.0.1", "vllm_gateway": True}),
                                                       ("b", {"ssh_hostname": "10.0.0.2",
                                                              "vllm_advertise_address": "10.9.9.9"})]
    relayed = tmp_path / "relayed.py"
    relays = {n: {"hostname": "127.0.0.1", "port": p, "known_hosts": "/tmp/kh"} for n, p in (("a", 1), ("b", 2))}
    relayed.write_text(inventories.pyinfra_inventory_source(base, relays))
    hosts = dict(runpy.run_path(str(relayed))["cpu_hosts"])
    assert hosts["a"] == {"ssh_hostname": "127.0.0.1", "ssh_port": 1, "ssh_known_hosts_file": "/tmp/kh",
                          "vllm_gateway": True, "vllm_advertise_address": "10.0.0.1"}
    assert hosts["b"]["vllm_advertise_address"] == "10.9.9.9" and hosts["b"]["ssh_port"] == 2


# --- the report -----------------------------------------------------------------------------------

def test_summary_ratio_and_round_trips():
    s = report.summary([3.0, 1.0, 2.0, 5.0, 4.0])
    assert (s["median"], s["min"], s["max"], s["n"]) == (3.0, 1.0, 5.0, 5)
    assert report.ratio(s, report.summary([6.0])) == 0.5
    assert report.round_trips(4.0, 6.5, 50) == pytest.approx(50.0)


def test_markdown_table():
    s = report.summary([1.0, 2.0, 3.0])
    t = report.summary([4.0, 6.0, 8.0])
    counts = {"ours": {"a": {"commands": 40}, "b": {"commands": 30}}, "ansible": {"a": {"commands": 59}},
              "ours_relay": {"a": {"connections": 1}, "b": {"connections": 1}},
              "ansible_relay": {"a": {"connections": 1}, "b": {"connections": 1}}}
    result = {"host_names": ["a", "b"], "runs": 3, "versions": {"pyinfra": "3.10.0", "ansible_core": "2.19.14"},
              "scenario_labels": {"noop": "no-op", "missing": "not run"},
              "scenarios": {"noop": {"ours": s, "ansible": t, "ratio": report.ratio(s, t)}}, "counts": counts}
    table = report.markdown_table(result)
    lines = table.splitlines()
    assert lines[0].startswith("| 2 sandbox hosts, A B A B, 3 runs each | vllm-fleet deploy.py (pyinfra 3.10.0)")
    assert lines[1] == "|---|---|---|---|"
    assert "| no-op | 2.00 s (1.00–3.00) | 6.00 s (4.00–8.00) | 0.33 |" in lines
    assert "| remote commands per host, no-op (a · b) | 40 · 30 | 59 · 0 | |" in lines
    assert "| SSH connections per host, no-op (counted by the relay) | 1 · 1 | 1 · 1 | |" in lines
    assert not any("not run" in line for line in lines)


def test_bare_spec_takes_the_first_instances_unit_and_env_file(tmp_path):
    files = [{"path": "/etc/systemd/system/vllm-a.service", "role": "instance-unit", "unit_name": "vllm-a.service",
              "owner": "root", "group": "root", "mode": "0644"},
             {"path": "/etc/vllm-fleet/a.env", "role": "instance-env", "unit_name": "vllm-a.service",
              "owner": "root", "group": "root", "mode": "0600"},
             {"path": "/etc/vllm-fleet/a.yaml", "role": "instance-config", "unit_name": "vllm-a.service",
              "owner": "root", "group": "vllm", "mode": "0640"},
             {"path": "/etc/vllm-fleet/b.env", "role": "instance-env", "unit_name": "vllm-b.service",
              "owner": "root", "group": "root", "mode": "0600"}]
    record = {"host": "h1", "files": files,
              "instances": [{"name": "a", "unit": "vllm-a.service", "port": 18000, "served_model_name": "tiny"},
                            {"name": "b", "unit": "vllm-b.service", "port": 18001, "served_model_name": "t2"}]}
    spec = inventories.bare_spec(record, tmp_path)
    assert spec["unit_name"] == "vllm-a.service" and spec["port"] == 18000 and spec["served_model_name"] == "tiny"
    assert spec["unit"] == {"src": str(tmp_path / "h1/etc/systemd/system/vllm-a.service"),
                            "path": "/etc/systemd/system/vllm-a.service", "owner": "root", "group": "root",
                            "mode": "0644"}
    assert spec["env"]["path"] == "/etc/vllm-fleet/a.env" and spec["env"]["mode"] == "0600"
    record["files"] = files[:1]
    with pytest.raises(SystemExit, match="h1: no unit and env file rendered for instance a"):
        inventories.bare_spec(record, tmp_path)


def test_markdown_table_ends_with_the_bare_pyinfra_ratio():
    s, t = report.summary([3.0, 3.2, 3.4]), report.summary([1.5, 1.6, 1.7])
    result = {"host_names": ["a"], "runs": 3, "versions": {"pyinfra": "3.10.0", "ansible_core": "2.19.14"},
              "scenario_labels": {}, "scenarios": {}, "bare_pyinfra": {"ours": s, "bare": t, "ratio": report.ratio(s, t)}}
    assert report.markdown_table(result).splitlines()[-1] == (
        f"{settings.BARE_LABEL}: ours 3.20 s (3.00–3.40), bare pyinfra 1.60 s (1.50–1.70): **2.00×** (target ≤ 2×)")


def test_phase_split_follows_the_markers_in_order_and_skips_missing_ones():
    lines = [(0.8, "--> Loading config...\n"), (0.9, "--> Loading inventory...\n"),
             (1.0, "--> Connecting to hosts...\n"), (1.5, "--> Preparing operation files...\n"),
             (2.5, "--> Beginning operation run...\n"), (2.6, "--> Starting operation: vLLM fleet | Verify instances (health)\n"),
             (3.4, "--> Results:\n")]
    phases = tool_output.phase_split(lines, 3.5)
    assert [label for label, _s in phases] == [label for label, _m in tool_output.PHASE_MARKERS if label != "verification of the gateway"]
    assert dict(phases) == pytest.approx({"interpreter start-up and imports": 0.8, "config and inventory": 0.2,
                                          "SSH connections": 0.5, tool_output.PHASE_MARKERS[3][0]: 1.0,
                                          "operations before verification": 0.1,
                                          tool_output.PHASE_MARKERS[5][0]: 0.8, "results and disconnecting": 0.1})
    assert sum(s for _l, s in phases) == pytest.approx(3.5)


def test_engine_defaults_and_the_real_engine_only_on_three_hosts(capsys):
    assert cli.parse_args([]).engine == "vllm"  # the 3 CPU hosts of inventory/sandbox.py, genuine vLLM
    assert cli.parse_args(["--hosts", "10"]).engine == "standin"
    assert cli.parse_args(["--hosts", "3", "--engine", "standin"]).engine == "standin"
    with pytest.raises(SystemExit):  # refused before anything starts: 10 CPU vLLMs do not fit
        cli.parse_args(["--hosts", "10", "--engine", "vllm"])
    assert "--engine vllm runs on inventory/sandbox.py's 3 CPU hosts only" in capsys.readouterr().err


def test_fleet_inventory_gives_each_host_the_sandbox_login_and_the_gateway_to_the_first(tmp_path):
    path = tmp_path / "sandbox.py"
    path.write_text(inventories.fleet_inventory_source(10))
    hosts = runpy.run_path(str(path))["cpu_hosts"]
    assert [name for name, _ in hosts] == [f"sbx-b{i:02d}" for i in range(1, 11)]
    assert [d["ssh_hostname"] for _, d in hosts] == [f"10.213.9.{10 + i}" for i in range(1, 11)]
    assert all(d["ssh_user"] == "deploy" and d["_sudo"] is True for _, d in hosts)
    assert [bool(d.get("vllm_gateway")) for _, d in hosts] == [True] + [False] * 9


# --- the relay ------------------------------------------------------------------------------------

async def _echo_server():
    async def echo(reader, writer):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()
        await writer.wait_closed()
    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_relay_forwards_bytes_in_order_with_the_delay_and_counts():
    async def scenario():
        server, port = await _echo_server()
        stats = lr.Stats()
        servers, ports = await lr.start_relays({"echo": ("127.0.0.1", port)}, 100, stats)
        start = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", ports["echo"])
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"
        first = time.monotonic() - start  # handshake (1 RTT) + the answer's way back (RTT/2)
        start = time.monotonic()
        writer.write(b"pong")
        assert await reader.readexactly(4) == b"pong"
        second = time.monotonic() - start  # one round trip
        payload = os.urandom(1 << 20)
        writer.write(payload)
        writer.write_eof()
        assert await reader.readexactly(len(payload)) == payload  # all of it, in order
        assert await reader.read() == b""  # the end of stream came back through the relay
        writer.close()
        await writer.wait_closed()
        for _ in range(100):
            if stats.open.get("echo") == 0:
                break
            await asyncio.sleep(0.02)
        for s in (*servers, server):
            s.close()
            await s.wait_closed()
        return first, second, stats
    first, second, stats = asyncio.run(scenario())
    assert 0.14 <= first < 1.0
    assert 0.095 <= second < 0.6
    assert stats.connections == {"echo": 1} and stats.open == {"echo": 0}
    assert stats.bytes_up["echo"] == stats.bytes_down["echo"] == 8 + (1 << 20)


def test_relay_without_delay_is_fast():
    async def scenario():
        server, port = await _echo_server()
        servers, ports = await lr.start_relays({"echo": ("127.0.0.1", port)}, 0, lr.Stats())
        reader, writer = await asyncio.open_connection("127.0.0.1", ports["echo"])
        start = time.monotonic()
        for _ in range(20):
            writer.write(b"x")
            await reader.readexactly(1)
        took = time.monotonic() - start
        writer.write_eof()
        assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()
        for s in (*servers, server):
            s.close()
            await s.wait_closed()
        return took
    assert asyncio.run(scenario()) < 0.5


def test_parse_target():
    assert lr.parse_target("sbx-cpu1=10.213.7.11:22") == ("sbx-cpu1", ("10.213.7.11", 22))
    with pytest.raises(ValueError):
        lr.parse_target("sbx-cpu1")


class _Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while data := self.request.recv(65536):
            self.request.sendall(data)


def test_relay_process_started_and_stopped_by_pid(tmp_path):
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        relay = benchlib.Relay(20, {"echo": ("127.0.0.1", server.server_address[1])}, tmp_path)
        try:
            with socket.create_connection(("127.0.0.1", relay.ports["echo"]), timeout=5) as conn:
                conn.sendall(b"hello")
                assert conn.recv(5) == b"hello"
            assert relay.connections() == {"echo": 1}
        finally:
            relay.stop()
            server.shutdown()
        assert relay.proc.returncode is not None  # ended by its PID, nothing left running
        assert not Path(f"/proc/{relay.proc.pid}").exists() or relay.proc.poll() is not None


def test_relay_save_every_shows_the_bytes_of_an_open_connection(tmp_path):
    """--save-every (bench/rollout_bench.py): the stats file has the bytes while the connection is
    still open; without it the file changes only when a connection opens or closes (as before)."""
    stats = tmp_path / "stats.json"
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "latency_relay.py"), "--rtt-ms", "0",
                                 "--stats", str(stats), "--save-every", "0.05",
                                 f"--target=echo=127.0.0.1:{server.server_address[1]}"],
                                stdout=subprocess.PIPE, text=True)
        try:
            ports = json.loads(proc.stdout.readline())
            with socket.create_connection(("127.0.0.1", ports["echo"]), timeout=5) as conn:
                conn.sendall(b"x" * 1000)
                got = b""
                while len(got) < 1000:
                    got += conn.recv(65536)
                deadline = time.monotonic() + 5
                counts = {}
                while time.monotonic() < deadline:
                    counts = json.loads(stats.read_text())
                    if counts["bytes_up"].get("echo") == 1000:
                        break
                    time.sleep(0.05)
                assert counts["open"] == {"echo": 1}
                assert counts["bytes_up"] == {"echo": 1000} and counts["bytes_down"] == {"echo": 1000}
        finally:
            os.kill(proc.pid, 15)
            proc.wait(timeout=10)
            proc.stdout.close()
            server.shutdown()
    assert proc.returncode == 0


# --- the playbook itself (needs ansible-core) -------------------------------------------------------

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
needs_ansible = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-core is not installed here "
                                   f"(the bench installs it: {sys.executable} -m pip install 'ansible-core>=2.17')")


class _Models(BaseHTTPRequestHandler):
    key = ""

    def do_GET(self):  # noqa: N802
        if self.path != "/v1/models" or self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"object": "list", "data": [{"id": "tiny-llama"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _ansible(tmp_path: Path, inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(settings.ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_HOME=str(tmp_path / "ah"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ah" / "tmp"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([sys.executable, str(ANSIBLE_PLAYBOOK), "-i", str(inventory), *extra, str(settings.PLAYBOOK)],
                          capture_output=True, text=True, env=env, timeout=300)


@needs_ansible
def test_playbook_no_op_then_one_file_changed_and_the_key_check(tmp_path):
    """On this machine (local connection, no become, no units): a no-op changes nothing, an edited file
    is rewritten, and /v1/models is asked with the key read from the env file, which no output shows."""
    key = "skbenchtest" + os.urandom(6).hex()
    _Models.key = key
    server = HTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        user, group = os.getuid(), os.getgid()
        import grp
        import pwd
        owner, group_name = pwd.getpwuid(user).pw_name, grp.getgrgid(group).gr_name
        files_dir, dest = tmp_path / "files", tmp_path / "dest"
        record = {"host": "h", "files": [
            {"path": str(dest / "tiny.env"), "content": f"# secrets\nVLLM_API_KEY='{key}'\n", "owner": owner,
             "group": group_name, "mode": "0600", "secret": True, "role": "other", "unit_name": None},
            {"path": str(dest / "manifest.json"), "content": "{}\n", "owner": None, "group": None,
             "mode": "0644", "secret": False, "role": "manifest", "unit_name": None}],
            "instances": [{"name": "tiny", "unit": "vllm-tiny.service", "port": server.server_address[1],
                           "served_model_name": "tiny-llama", "env_file": str(dest / "tiny.env")}]}
        dest.mkdir()
        for f in record["files"]:
            for target in (inventories.rendered_src(files_dir, "h", f["path"]), Path(f["path"])):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f["content"])
                target.chmod(int(f["mode"], 8))
        host = {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable,
                **inventories.ansible_host_vars(record, files_dir)}
        host["vf_units"] = []  # no systemd here
        inventory = tmp_path / "inv.yml"
        inventory.write_text(json.dumps(inventories.ansible_inventory({"h": host})))

        proc = _ansible(tmp_path, inventory, "-vvv")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert tool_output.play_recap(proc.stdout)["h"]["changed"] == 0
        assert key not in proc.stdout + proc.stderr

        (dest / "manifest.json").write_text("{edited}\n")
        (dest / "tiny.env").write_text(f"VLLM_API_KEY='{key}'\n# edited\n")
        proc = _ansible(tmp_path, inventory)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert tool_output.play_recap(proc.stdout)["h"]["changed"] == 2
        assert (dest / "manifest.json").read_text() == "{}\n"
        assert (dest / "tiny.env").read_text() == f"# secrets\nVLLM_API_KEY='{key}'\n"
        assert key not in proc.stdout + proc.stderr
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp_path / "ah", ignore_errors=True)


# --- the bench's flow, with every tool and host faked --------------------------------------------------

@pytest.mark.parametrize("argv", [[], ["--hosts", "10"]], ids=["vllm-3-hosts", "standin-10-hosts"])
def test_run_bench_flow_with_fake_tools(monkeypatch, tmp_path, capsys, argv):
    """run_bench end to end without a host: fake deploys, playbook runs, relays and host state. Checks
    the phases, the A B A B order, what the report and the JSON hold, and that cleanup stops relays.
    With the stand-in engine (10 hosts of its own) the services' first converge is compared too."""
    import hashlib
    from types import SimpleNamespace

    import standin_engine
    from vllm_fleet.sandbox import assets

    args = cli.parse_args(["--runs", "2", "--latency-ms", "0,50", *argv])
    bench = machine.Bench(args, sys.stdout)
    names = bench.host_names
    records = {h: _record(h, gateway=h == names[0]) for h in names}
    calls: list[str] = []
    relays: list = []

    class FakeRelay:
        def __init__(self, rtt_ms, targets, workdir):
            self.rtt_ms, self.stopped, self.count = rtt_ms, False, 0
            self.ports = {n: 40000 + i for i, n in enumerate(sorted(targets))}
            relays.append(self)

        def connections(self):
            return {n: self.count for n in self.ports}

        def stop(self):
            self.stopped = True

    def fake_pyinfra(self, inventory, label, debug=False, deploy=None, extra=(), env=None):
        calls.append(f"{'bare' if deploy == settings.BARE_DEPLOY else 'ours'}:{label}")
        if deploy == settings.BARE_DEPLOY:  # its input: the first instance's rendered unit and env file
            assert json.loads(Path(env["VLLM_FLEET_BENCH_BARE"]).read_text())[names[0]]["unit_name"] == "vllm-tiny.service"
        if relays and not relays[-1].stopped:
            relays[-1].count += 1
        text = ""
        if debug:
            text = "".join(f"    [pyinfra.connectors.ssh] Connecting to: 127.0.0.1 ({{'port': {p}}})\n"
                           f"    [pyinfra.connectors.ssh] Running command on {n}: (pty=False) true\n"
                           for n, p in relays[-1].ports.items())
        return (1.0 + 0.05 * ("relay-50" in str(inventory)), text)

    def fake_ansible(self, inventory, label, verbose=False, ssh_verbosity=None):
        calls.append(f"ansible:{label}")
        if relays and not relays[-1].stopped:
            relays[-1].count += 1
        text = "PLAY RECAP ***\n" + "".join(f"{h} : ok=5 changed=0 unreachable=0 failed=0\n" for h in names)
        return (2.0 + 0.5 * ("relay-50" in str(inventory)), text, 3)

    def fake_state(self):
        return {n: {"files": {f["path"]: hashlib.sha256(f["content"].encode()).hexdigest() for f in r["files"]},
                    "pids": {u: "100" for u in inventories.ansible_host_vars(r, self.tmp)["vf_units"]}}
                for n, r in self.records.items()}

    def fake_fleet_command(self, argv, label):
        calls.append(f"fleet:{' '.join(argv[:1] + argv[2:])}")
        self.last_usage = {"cpu_s": 0.8, "peak_rss_mib": 150.0}
        if argv[0] == "rollout":  # each host 2 s after the previous one, in inventory order
            now = time.time()
            hosts = [{"name": n, "state": "updated", "started": now + 2 * i, "finished": now + 2 * i + 1.5}
                     for i, n in enumerate(names)]
            return 2.0 * len(names), json.dumps({"hosts": hosts})
        return 0.5, json.dumps({"hosts": [{"name": n} for n in names]})

    downs = []
    monkeypatch.setattr(machine.Bench, "run_fleet_command", fake_fleet_command)
    monkeypatch.setattr(steps, "start_up_seconds", lambda b: {n: 1.0 for n in names})
    monkeypatch.setattr(machine.Bench, "report_leftovers", lambda self: calls.append("leftovers checked"))
    monkeypatch.setattr(machine, "Relay", FakeRelay)
    monkeypatch.setattr(machine.Bench, "run_pyinfra", fake_pyinfra)
    monkeypatch.setattr(machine.Bench, "run_ansible", fake_ansible)
    monkeypatch.setattr(machine.Bench, "host_state", fake_state)
    monkeypatch.setattr(machine.Bench, "render", lambda self, inv, tag: json.loads(json.dumps(records)))
    monkeypatch.setattr(machine.Bench, "ensure_ansible", lambda self: "2.19.14")
    monkeypatch.setattr(machine.Bench, "relay_known_hosts", lambda self, ports, tag: tmp_path / f"kh-{tag}")
    monkeypatch.setattr(machine.Bench, "inject_drift", lambda self: calls.append("drift"))
    monkeypatch.setattr(machine.Bench, "remove_services", lambda self: calls.append("remove"))
    monkeypatch.setattr(machine.Bench, "cprofile_pyinfra", lambda self, inv, label: calls.append("cprofile") or [
        {"function": "arguments.py:395(pop_global_arguments)", "where": "pyinfra/api/arguments.py", "calls": 1408,
         "own_s": 0.24, "cumulative_s": 3.0}])
    monkeypatch.setattr(machine.Bench, "profile_pyinfra", lambda self, inv, label: calls.append("profile") or {
        "seconds": 1.0, "cpu_s": 0.5, "phases": [("SSH connections", 0.25), ("operations before verification", 0.75)]})
    monkeypatch.setattr(assets, "prepare", lambda log: (tmp_path / "tiny", tmp_path / "wheelhouse"))
    monkeypatch.setattr(standin_engine, "build_standin_wheelhouse",
                        lambda dest, real_wheelhouse: calls.append(f"standin:{real_wheelhouse}") or tmp_path / "si")
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path))  # the stand-in wheelhouse's place
    bench.harness = SimpleNamespace(up=lambda sandbox, log: calls.append("up"),
                                    down=lambda sandbox: downs.append(sandbox),
                                    host_pss_kib=lambda sandbox, host: 60 * 1024)
    try:
        result = steps.run_bench(bench)
    finally:
        bench.cleanup()
    assert downs and not bench.tmp.exists() and all(r.stopped for r in relays)
    assert calls[-1] == "leftovers checked"  # after the hosts' teardown
    standin = argv != []
    first = ["up", "ours:first converge (ours)", "ansible:Ansible first run", "ours:warm-up (ours)"]
    if standin:  # built from the real wheelhouse (its vllm-router), before the hosts start
        assert calls.pop(0) == f"standin:{tmp_path / 'wheelhouse'}"
    assert calls[:4] == first
    assert bench.env["VLLM_FLEET_WHEELHOUSE"] == str(tmp_path / ("si" if standin else "wheelhouse"))
    noop = [c for c in calls if c.startswith(("ours:no-op", "ansible:no-op", "bare:"))]
    assert noop == (["ours:no-op (ours)", "ansible:no-op (Ansible)"] * 2  # A B A B
                    + ["bare:bare pyinfra first run"] + ["ours:no-op (ours)", "bare:no-op (bare pyinfra)"] * 2)
    assert result["bare_pyinfra"]["ratio"] == 1.0
    assert calls.count("drift") == 4  # before each run of the file-change scenario
    assert calls.count("profile") == 2 and result["noop_profile"]["phases"][0] == ("SSH connections", 0.25)
    assert calls.count("cprofile") == 1 and result["noop_profile"]["top"][0]["calls"] == 1408
    scenarios = {"noop", "noop_relay_0ms", "noop_relay_50ms", "one_file_changed"}
    if standin:  # services removed before each run, A B A B
        firsts = [c for c in calls if c == "remove" or c.startswith(("ours:first converge", "ansible:first"))]
        assert firsts[1:] == ["remove", "ours:first converge (ours)", "remove", "ansible:first converge (Ansible)"] * 2
        scenarios.add("first_services")
        assert result["engine"] == "standin" and settings.STANDIN_NOTE in result["notes"]
        assert result["host_names"] == [f"sbx-b{i:02d}" for i in range(1, 11)]
    else:
        assert result["engine"] == "vllm" and result["host_names"] == benchlib.CPU_HOSTS
    assert set(result["scenarios"]) == scenarios
    assert result["scenarios"]["noop"]["ratio"] == 0.5
    growth = result["latency"]["growth"]["50"]
    assert growth["ours"]["added_s"] == pytest.approx(0.05) and growth["ansible"]["added_s"] == pytest.approx(0.5)
    assert growth["ansible"]["round_trips"] == pytest.approx(10)
    assert result["counts"]["ours"][names[1]]["commands"] == 1
    assert result["counts"]["ours_relay"][names[0]]["connections"] == 1
    assert result["latency"]["connections"]["50"]["ansible"] == [{h: 1 for h in names}] * 2
    assert result["noop_violations"] == [] and result["api_key_in_output"] == []
    assert result["managed_files"] == {h: 7 if h == names[0] else 6 for h in names}
    assert result["host_cost"]["pss_mib"] == 60 and result["host_cost"]["hosts"] == len(names)
    assert result["status"]["median"] == 0.5 and result["status"]["peak_rss_mib"] == 150.0
    assert [c for c in calls if c.startswith("fleet:status")] == ["fleet:status --json"] * 2
    rollouts = [c for c in calls if c.startswith("fleet:rollout")]
    if standin:  # to the change and back, each --runs times; 10 hosts in batches of 2 (25 %, rounded down)
        assert rollouts == ["fleet:rollout --batch 25% --json"] * 4
        rollout = result["rollout"]
        assert [b["hosts"] for b in rollout["rollouts"][0]["batches"]] == [2] * 5
        # each batch spans 2 hosts x 2 s (the last: to the run's end), the slowest start-up is 1 s
        assert rollout["span_per_batch_s"] == pytest.approx(4.0)
        assert rollout["overhead_per_batch_s"] == pytest.approx(3.0)
    else:
        assert rollouts == [] and "rollout" not in result
    report.print_report(result, print)
    out = capsys.readouterr().out
    assert f"`vllm-fleet status` of {len(names)} hosts: 0.50 s (target ≤ 3 s): met" in out
    assert "the workstation's peak RSS over our runs: 0.15 GiB (target ≤ 1 GiB): met" in out
    assert "| no-op through a relay, +50 ms RTT | 1.05 s (1.05–1.05) | 2.50 s (2.50–2.50) | 0.42 |" in out
    assert "API key in any captured output: no" in out
    assert f"{settings.BARE_LABEL}: ours 1.00 s (1.00–1.00), bare pyinfra 1.00 s (1.00–1.00): **1.00×**" in out
    assert ("SIMULATED engine" in out) == standin
    json.dumps(result)  # --json can print it


def test_drift_and_service_removal_commands_run_on_every_host_and_a_failure_names_it():
    from functools import partial
    from types import SimpleNamespace

    sent = {}

    class Sandbox:
        def run(self, name, command, timeout=60):
            sent[name] = command
            return SimpleNamespace(returncode=0 if name != "sbx-cpu3" or "printf" in command else 1,
                                   stderr="Failed to disable unit")

    bench = SimpleNamespace(sandbox=Sandbox(), records={h: _record(h) for h in ("sbx-cpu1", "sbx-cpu2")})
    bench.on_every_host = partial(machine.Bench.on_every_host, bench)
    machine.Bench.inject_drift(bench)
    drift_path = next(f["path"] for f in _record()["files"] if f["role"] == settings.DRIFT_ROLE)
    assert set(sent) == {"sbx-cpu1", "sbx-cpu2"} and all(c.endswith(f">> {drift_path}") for c in sent.values())
    machine.Bench.remove_services(bench)
    assert sent["sbx-cpu1"].startswith("systemctl disable --now --quiet vllm-fleet-front.service vllm-tiny.service;")
    assert "/etc/vllm-fleet/tiny.env" in sent["sbx-cpu1"] and "manifest.json" not in sent["sbx-cpu1"]
    bench.records["sbx-cpu3"] = _record("sbx-cpu3")
    with pytest.raises(SystemExit, match="sbx-cpu3: could not remove the services: Failed to disable unit"):
        machine.Bench.remove_services(bench)
