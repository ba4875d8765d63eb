"""The converge bench's pure helpers (bench/converge/), offline: counting commands and connections
from debug output, the playbook's variables, the inventories, the report. Its delaying TCP relay is
tested in test_latency_relay.py, the playbook and the bench's flow in test_converge_bench_flow.py."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest
from support.converge_records import render_record

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from converge import cli, inventories, report, settings, tool_output  # noqa: E402

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


def test_ansible_host_vars(tmp_path):
    v = inventories.ansible_host_vars(render_record(), tmp_path)
    assert v["vf_units"] == ["vllm-tiny.service", settings.FRONT_UNIT, settings.GATEWAY_UNIT]
    assert v["vf_instances"] == [{"name": "tiny", "unit": "vllm-tiny.service", "port": 18000,
                                  "env_file": "/etc/vllm-fleet/tiny.env", "served_model_name": "tiny-llama"}]
    env = next(f for f in v["vf_files"] if f["path"].endswith(".env"))
    assert env["secret"] is True and env["mode"] == "0600" and env["restart"] == ["vllm-tiny.service"]
    assert env["src"] == str(tmp_path / "sbx-cpu1" / "etc/vllm-fleet/tiny.env")
    assert "content" not in env  # the secret stays in its 0600 file, not in the inventory
    manifest = next(f for f in v["vf_files"] if f["path"].endswith("manifest.json"))
    assert manifest["owner"] is None and manifest["group"] is None  # left alone, as the deploy does
    assert inventories.ansible_host_vars(render_record(gateway=False), tmp_path)["vf_units"] == ["vllm-tiny.service", settings.FRONT_UNIT]


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
