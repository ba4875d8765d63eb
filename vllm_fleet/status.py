"""`vllm-fleet status INVENTORY [--json]`: what each host serves now, and whether it drifted.

Read-only: one probe per host over SSH (host_probe.py, status mode) — GPUs, unit state and uptime,
vLLM version, served models, /health, requests and KV-cache usage from /metrics — compared with
what the plan would render now (drift: a managed file on the host differs from the plan's). On CUDA
hosts a second one (gpu_topology.py, with the vLLM environment's pynvml) adds NVLink and P2P.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from typing import Any

from vllm_fleet import gpu_topology
from vllm_fleet.config import ConfigError, ConfigErrors, load_inventory, parse_host, split_names
from vllm_fleet.envbuild import current_link
from vllm_fleet.facts import topology_command
from vllm_fleet.plan import plan_host
from vllm_fleet.render import instance_paths, render_host
from vllm_fleet.verify import host_probe_command, parse_host_probe

# Files whose drift status reports. The env file is secret: its content is not compared here.
DRIFT_KINDS = ("unit", "config")


def planned_files(config) -> tuple[dict[str, dict[str, str]], str | None]:
    """{instance: {kind: sha256}} of what the plan renders now (or an error text)."""
    try:
        plan = plan_host(config)
    except ConfigErrors as exc:
        return {}, "; ".join(e.located() for e in exc.errors)
    rendered = {f.path: f for f in render_host(config, plan)}
    out = {}
    for inst in plan.instances:
        paths = instance_paths(config, inst.name)
        out[inst.name] = {kind: hashlib.sha256(rendered[paths[kind]].content.encode()).hexdigest()
                          for kind in DRIFT_KINDS}
    return out, None


def host_status(name: str, host, config) -> dict[str, Any]:
    from vllm_fleet.connection import run

    if host is None:
        return {"name": name, "reachable": False, "error": "unreachable over SSH"}
    planned, plan_error = planned_files(config)
    payload = {"manifest": f"{config['vllm_config_dir']}/manifest.json",
               "config_dir": config["vllm_config_dir"],
               "instances": {n: {"paths": {k: v for k, v in instance_paths(config, n).items()
                                           if k in DRIFT_KINDS}} for n in planned}}
    ok, out, err = run(host, host_probe_command("status", payload), timeout=120)
    probe = parse_host_probe(out)
    if probe is None:
        return {"name": name, "reachable": True, "error": f"status probe failed: {err.strip()[-300:]}"}
    for inst_name, entry in probe["instances"].items():
        want = planned.get(inst_name)
        if want is None:
            entry["drift"] = ["not in the plan (would be removed by the next deploy)"]
            continue
        entry["drift"] = [f"{kind} differs from the plan" for kind in DRIFT_KINDS
                          if entry["files_sha256"].get(kind) != want[kind]]
    for missing in sorted(set(planned) - set(probe["instances"])):
        probe["instances"][missing] = {"state": "not deployed", "drift": ["planned, not deployed"]}
    if config["vllm_target"] == "cuda":  # P2P and NVLink, from NVML in the vLLM environment
        try:
            _ok, out, _err = run(host, topology_command(current_link(config["vllm_root"]) + "/bin/python"),
                                 timeout=60)
            topology = gpu_topology.parse_output(out.splitlines())
        except Exception as exc:  # optional information: never fail status for it
            topology = gpu_topology.unavailable(f"{type(exc).__name__}: {exc}")
        probe["gpu_topology"] = gpu_topology.summary(topology)
    return {"name": name, "reachable": True, "plan_error": plan_error, **probe}


def collect(inventory: str, limit: list[str] | None) -> list[dict[str, Any]]:
    from vllm_fleet.connection import connected

    hosts = load_inventory(inventory, limit=limit)
    configs = {name: parse_host(name, data) for name, data, _groups in hosts}
    with connected(inventory, [name for name, _d, _g in hosts]) as (_state, active):
        return [host_status(name, active[name], configs[name]) for name, _d, _g in hosts]


def print_table(report: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    table = Table(title="vllm-fleet status")
    for column in ("host", "instance", "unit", "uptime", "health", "vLLM", "served", "running/waiting",
                   "KV use", "drift"):
        table.add_column(column)
    for host in report:
        if host.get("error"):
            table.add_row(host["name"], "-", "[red]" + host["error"] + "[/red]", *["-"] * 7)
            continue
        for name, inst in sorted(host["instances"].items()):
            m = inst.get("metrics", {})
            kv = m.get("kv_cache_usage_perc", m.get("gpu_cache_usage_perc"))
            table.add_row(
                host["name"], name, inst.get("state", "-"),
                f"{inst['uptime_s']} s" if inst.get("uptime_s") is not None else "-",
                "ok" if inst.get("health") else "[red]down[/red]", str(inst.get("vllm_version") or "-"),
                ",".join(inst.get("served_models", [])) or "-",
                f"{m.get('num_requests_running', 0):.0f}/{m.get('num_requests_waiting', 0):.0f}" if m else "-",
                f"{kv * 100:.1f}%" if kv is not None else "-",
                "[yellow]" + "; ".join(inst["drift"]) + "[/yellow]" if inst.get("drift") else "none")
        for gpu in host.get("gpus", []):
            console.print(f"{host['name']} GPU {gpu['index']} {gpu['name']}: {gpu['memory_used_mib']}/"
                          f"{gpu['memory_total_mib']} MiB, {gpu['utilization_pct']}% busy", highlight=False)
        if host.get("gpu_topology"):
            console.print(f"{host['name']} GPU topology: {host['gpu_topology']}", highlight=False)
    console.print(table)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="vllm-fleet status", description=__doc__.splitlines()[0])
    parser.add_argument("inventory")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--limit", action="append")
    args = parser.parse_args(argv)
    limit = split_names(args.limit)
    try:
        report = collect(args.inventory, limit)
    except ConfigErrors as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"error: {exc.located()}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"hosts": report}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_table(report)
    unhealthy = any(h.get("error") or any(not i.get("health") for i in h["instances"].values())
                    for h in report)
    return 1 if unhealthy else 0

