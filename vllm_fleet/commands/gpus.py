"""`vllm-fleet gpus INVENTORY [--limit HOST] [--json]`: each host's `gpus` declaration, read from its
nvidia-smi, ready to paste into the inventory.

It reaches the hosts as `vllm-fleet status` does (commands/connection.py: pyinfra's inventory, SSH
settings and connector) and reads the deploy's own GPU fact (facts/gpus.py NvidiaGpus: one
nvidia-smi query, parsed by gpu_support), so the declaration holds nvidia-smi's exact names and MiB,
the ones the deploy compares a declaration with. Hosts are named from the inventory: one whose data
does not parse yet is still read (the declaration is what its data is missing), and where it does,
the declaration is compared with the host's own. Only nvidia-smi runs there; nothing is changed.
What the deploy would refuse about these GPUs (gpu_support.preflight: a value nvidia-smi could not
read, a driver or GPU too old for the pinned vLLM, MIG) is said beside them.

Exit status: 0 every host answered with GPUs it could fully read; 1 a host unreachable, without
nvidia-smi, or with a value nvidia-smi could not read; 2 the inventory or --limit is invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vllm_fleet.config import (ConfigError, ConfigErrors, GpuSpec, inventory_rows, limited_rows, parse_host,
                               read_pyinfra_inventory, split_names)

EXAMPLES = """examples:
  vllm-fleet gpus inventory/prod.py                    # every host of the inventory
  vllm-fleet gpus inventory/prod.py --limit gpu-a100-01
  vllm-fleet gpus inventory/prod.py --json
"""


def declaration(gpus: list[GpuSpec]) -> list[dict[str, Any]]:
    """The `gpus` entries of these GPUs, as host data declares them (config/gpus.py reads them back)."""
    out = []
    for gpu in gpus:
        entry: dict[str, Any] = {"name": gpu.name, "memory_mib": gpu.memory_mib}
        if gpu.compute_capability is not None:
            entry["compute_capability"] = gpu.compute_capability
        out.append(entry)
    return out


def compared(declared: tuple[GpuSpec, ...] | None, live: list[GpuSpec]) -> tuple[str, list[str]]:
    """("none" | "same" | "differs", the differences) of a host's declared GPUs against nvidia-smi's."""
    if not declared:
        return "none", []
    if len(declared) != len(live):
        return "differs", [f"{len(declared)} GPU{'s' if len(declared) != 1 else ''} declared, {len(live)} found"]
    differences = []
    for want, got in zip(declared, live, strict=True):
        for field in ("name", "memory_mib", "compute_capability"):
            mine, theirs = getattr(want, field), getattr(got, field)
            if mine is not None and mine != theirs:
                differences.append(f"GPU {got.index} {field}: {json.dumps(mine)} declared, "
                                   f"{json.dumps(theirs)} found")
    return ("differs" if differences else "same"), differences


def host_gpus(name: str, host, data: dict[str, Any]) -> dict[str, Any]:
    """One host's report: its GPUs from nvidia-smi, their declaration, the comparison, the problems."""
    from vllm_fleet.gpu_support import preflight
    from vllm_fleet.facts import batch as facts
    from vllm_fleet.facts.gpus import NvidiaGpus

    try:
        config = parse_host(name, data)
    except ConfigErrors as exc:
        config, unparsed = None, len(exc.errors)
    else:
        unparsed = 0
    if config is not None and config.settings.vllm_target == "cpu":
        return {"name": name, "gpus": [], "note": "a CPU host (vllm_target = 'cpu'): it declares no gpus"}
    if host is None:
        return {"name": name, "error": "unreachable over SSH"}
    try:
        live = facts.get(facts.RemoteFacts(host), NvidiaGpus)
    except facts.FactUnreadable as exc:
        return {"name": name, "error": str(exc)}
    if live is None:
        return {"name": name, "error": "nvidia-smi is missing: no NVIDIA driver on this host"}
    live = list(live)
    version = config.settings.vllm_version if config is not None else "0.33.0"
    problems = [e.located() for e in preflight(name, live, None, version)]
    missing = [f"GPU {g.index} ({g.name}): nvidia-smi reported no memory.total" for g in live
               if g.memory_mib <= 0 and not any(f == "memory.total" for f, _ in g.unreadable)]
    state, differences = ("unparsed", []) if config is None else compared(config.gpus, live)
    return {"name": name, "gpus": declaration(live),
            "driver_version": next((g.driver_version for g in live if g.driver_version), None),
            "complete": not missing and not any(g.unreadable for g in live),
            "declared": state, "differences": differences, "unparsed_errors": unparsed,
            "problems": missing + problems}


def print_text(report: list[dict[str, Any]]) -> None:
    for host in report:
        if host.get("error"):
            print(f"{host['name']}: {host['error']}")
            continue
        if host.get("note"):
            print(f"{host['name']}: {host['note']}")
            continue
        declared = {"none": "the inventory declares none",
                    "same": "the inventory declares the same",
                    "differs": "the inventory declares others: " + "; ".join(host["differences"]),
                    "unparsed": f"its host data does not parse yet ({host['unparsed_errors']} error(s): "
                                "vllm-fleet plan names them)"}[host["declared"]]
        driver = f", driver {host['driver_version']}" if host["driver_version"] else ""
        count = len(host["gpus"])
        print(f"{host['name']}: {count} GPU{'s' if count != 1 else ''} from nvidia-smi{driver}; {declared}")
        if host["gpus"]:
            print('    "gpus": [')
            for entry in host["gpus"]:
                print(f"        {json.dumps(entry)},")
            print("    ],")
        for line in host["problems"]:
            print(f"  the deploy would refuse it: {line}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet gpus", formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXAMPLES,
        description="Connect to each host (as `vllm-fleet status` does) and print its `gpus` declaration from\n"
                    "nvidia-smi: the exact names, MiB and compute capabilities, ready to paste into the\n"
                    "inventory for offline plans. Says whether the inventory already declares them, and\n"
                    "what the deploy would refuse about these GPUs. Runs only nvidia-smi; changes nothing.")
    parser.add_argument("inventory", help="a pyinfra inventory file")
    parser.add_argument("--limit", action="append", help="host or group names (comma-separated)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    try:
        inventory = read_pyinfra_inventory(args.inventory)
        rows = limited_rows(inventory_rows(inventory), split_names(args.limit), args.inventory)
    except ConfigError as exc:
        print(f"error: {exc.located()}", file=sys.stderr)
        return 2
    from vllm_fleet.commands import connection
    from vllm_fleet.commands.connection import connected

    connection.install()  # gevent: only once a run reaches hosts

    data = {name: host_data for name, host_data, _groups in rows}
    with connected(inventory, list(data)) as (state, active):
        report = state.pool.map(lambda name: host_gpus(name, active[name], data[name]), list(data))
    if args.json:
        json.dump({"hosts": report}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_text(report)
    failed = any(h.get("error") or (h.get("gpus") and not h.get("complete", True)) for h in report)
    return 1 if failed else 0
