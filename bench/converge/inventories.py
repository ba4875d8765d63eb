"""What each tool is given: the playbook's variables and inventory from vllm-fleet's render records
(bench/ansible/render_files.py), bench/bare_pyinfra.py's input, and the pyinfra inventories the
bench writes (the sandbox's hosts, directly or through a relay, or a stand-in fleet of its own)."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path
from typing import Any

from benchlib import GROUP_DATA, SANDBOX_INVENTORY
from converge.settings import BENCH_SUBNET, FRONT_UNIT, GATEWAY_UNIT


def file_actions(role: str, unit_name: str | None) -> dict[str, Any]:
    """What a change of a managed file means, by deploy.py's rules (vllm_fleet/deploy/services.py and
    gateway_service): {unit: a systemd unit file (daemon-reload), restart: [units], reload: [units]}."""
    kind = role.partition("-")[2]
    actions: dict[str, Any] = {"unit": kind == "unit", "restart": [], "reload": []}
    if role.startswith("instance-"):  # unit, engine YAML or env file: the instance restarts
        actions["restart"] = [unit_name]
    elif role == "front-unit" or role == "gateway-unit":
        actions["restart"] = [unit_name]
    elif role == "front-config":
        actions["reload"] = [unit_name]
    elif role == "gateway-key":  # an include of the front's nginx config
        actions["reload"] = [FRONT_UNIT]
    elif role in ("gateway-workers", "gateway-register"):  # the router re-registers its backends
        actions["reload"] = [unit_name]
    return actions  # gateway-models (read per request), the manifest, other files: nothing to do


def rendered_src(files_dir: Path, host: str, path: str) -> Path:
    """Where the bench writes a host's rendered file for the playbook's copy (`src`)."""
    return files_dir / host / path.lstrip("/")


def ansible_host_vars(record: dict[str, Any], files_dir: Path) -> dict[str, Any]:
    """The playbook's variables for one host from its render record (bench/ansible/render_files.py)."""
    files = []
    for f in record["files"]:
        files.append({"src": str(rendered_src(files_dir, record["host"], f["path"])), "path": f["path"],
                      "owner": f["owner"], "group": f["group"], "mode": f["mode"], "secret": bool(f["secret"]),
                      **file_actions(f["role"], f["unit_name"])})
    roles = {f["role"] for f in record["files"]}
    units = [inst["unit"] for inst in record["instances"]]
    units += [FRONT_UNIT] if "front-unit" in roles else []
    units += [GATEWAY_UNIT] if "gateway-unit" in roles else []
    instances = [{k: inst[k] for k in ("name", "unit", "port", "env_file", "served_model_name")}
                 for inst in record["instances"]]
    return {"vf_files": files, "vf_units": units, "vf_instances": instances}


def bare_spec(record: dict[str, Any], files_dir: Path) -> dict[str, Any]:
    """bench/bare_pyinfra.py's input for one host: its first instance's unit and env file (the files
    deploy.py wrote there, rendered by vllm-fleet) and where /v1/models answers."""
    inst = record["instances"][0]
    picked = {}
    for f in record["files"]:
        kind = f["role"].removeprefix("instance-")
        if f["unit_name"] == inst["unit"] and kind in ("unit", "env"):
            picked[kind] = {"src": str(rendered_src(files_dir, record["host"], f["path"])), "path": f["path"],
                            "owner": f["owner"], "group": f["group"], "mode": f["mode"]}
    if set(picked) != {"unit", "env"}:
        raise SystemExit(f"{record['host']}: no unit and env file rendered for instance {inst['name']}")
    return {"unit_name": inst["unit"], "port": inst["port"], "served_model_name": inst["served_model_name"],
            **picked}


def ansible_inventory(hosts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """An ansible YAML inventory (written as JSON, which YAML reads) with every host in `converge`."""
    return {"all": {"children": {"converge": {"hosts": hosts}}}}


def ssh_vars(address: str, port: int, user: str, key: str, known_hosts: str) -> dict[str, Any]:
    """How Ansible reaches a host: the inventory's login user and key, sudo, strict host key checking
    against the given known_hosts only."""
    return {"ansible_host": address, "ansible_port": port, "ansible_user": user, "ansible_become": True,
            "ansible_ssh_private_key_file": key,
            "ansible_ssh_common_args": (f"-o UserKnownHostsFile={shlex.quote(known_hosts)} "
                                        "-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes "
                                        "-o IdentitiesOnly=yes")}


def known_hosts_line(address: str, port: int, public_key: str) -> str:
    """A known_hosts entry for address:port (OpenSSH and paramiko look up [addr]:port off port 22)."""
    keytype, key = public_key.split()[:2]
    name = address if port == 22 else f"[{address}]:{port}"
    return f"{name} {keytype} {key}\n"


def pyinfra_inventory_source(base: Path, relays: dict[str, dict[str, Any]] | None = None,
                             instance_changes: dict[str, Any] | None = None) -> str:
    """A pyinfra inventory with the cpu_hosts of `base` (inventory/sandbox.py). `relays`: {host:
    {hostname, port, known_hosts}} reached through a relay instead; such a host keeps its
    address for the gateway (vllm_advertise_address, else the gateway's backends would follow
    ssh_hostname to the relay and the rendered files would change). `instance_changes`: set on
    every host's instance (the sandbox group data's), e.g. {"max_num_seqs": 16} for a rollout."""
    return textwrap.dedent(f"""\
        # Written by bench/converge_bench.py (removed when it ends).
        import copy, importlib.util, runpy
        _base = runpy.run_path({str(base)!r})
        _relays = {dict(relays or {})!r}
        _instance_changes = {dict(instance_changes or {})!r}
        _spec = importlib.util.spec_from_file_location("g", {str(GROUP_DATA / "sandbox.py")!r})
        _group = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_group)


        def _host(name, data):
            data = dict(data)
            relay = _relays.get(name)
            if relay:
                data["vllm_advertise_address"] = data.get("vllm_advertise_address") or data["ssh_hostname"]
                data.update(ssh_hostname=relay["hostname"], ssh_port=relay["port"],
                            ssh_known_hosts_file=relay["known_hosts"])
            if _instance_changes:
                data["vllm_instances"] = [dict(copy.deepcopy(_group.vllm_instances[0]), **_instance_changes)]
            return name, data


        cpu_hosts = [_host(name, data) for name, data in _base["cpu_hosts"]]
        """)


def fleet_inventory_source(count: int) -> str:
    """A sandbox inventory of `count` CPU hosts for the stand-in runs, each defined by
    inventory/sandbox.py's own `_host` (login user deploy with sudo, strict host keys), the fleet
    gateway on the first, as sbx-cpu1 there. Its file must be named sandbox.py beside a link to
    inventory/group_data, so the sandbox's group data (target cpu, wheelhouse, the tiny instance)
    applies."""
    names = [f"sbx-b{i:02d}" for i in range(1, count + 1)]
    return textwrap.dedent(f"""\
        # Written by bench/converge_bench.py (removed when it ends).
        import runpy
        _host = runpy.run_path({str(SANDBOX_INVENTORY)!r})["_host"]
        cpu_hosts = [_host(name, "{BENCH_SUBNET}." + str(10 + i)) for i, name in enumerate({names!r}, start=1)]
        cpu_hosts[0] = (cpu_hosts[0][0], dict(cpu_hosts[0][1], vllm_gateway=True))
        """)
