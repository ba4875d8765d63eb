"""`vllm-fleet status INVENTORY [--json]`: what each host serves now, and whether it drifted.

Read-only: one probe per host over SSH (payloads.PROBE, status mode) — GPUs, unit state and uptime,
vLLM version, served models, /health, requests and KV-cache usage from /metrics, the front unit, and
for a failed (or restarting) unit systemd's Result, its restart count and the journal's reason —
compared with what the plan would render now (drift: a managed file on the host differs from the
plan's). The plan is made as the deploy makes it, from the deploy's own discovery (facts/discovery.py,
one remote command before the probe): the host's live GPUs, NVLink and P2P (NVML through the vLLM
environment's pynvml), the models' config.json. Where the deploy would refuse the host as it is
(no nvidia-smi, a model path missing...), the declared data is planned and the plan error says why.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from typing import Any

from vllm_fleet import gateway
from vllm_fleet.facts import batch as facts
from vllm_fleet.rules import gpu_topology
from vllm_fleet.facts import ray_cluster
from vllm_fleet.connect import remote
from vllm_fleet.config import ConfigError, ConfigErrors, split_names
from vllm_fleet.fleet import Fleet
from vllm_fleet.facts.discovery import discover, discovery_queries, env_python
from vllm_fleet.facts.gpus import GpuTopology
from vllm_fleet.plan import RayNode
from vllm_fleet.prepared import Discovered
from vllm_fleet.render import instance_paths, manifest_path
from vllm_fleet.host_layout import FRONT_UNIT, RAY_UNIT, host_layout
from vllm_fleet.config.ports import monitoring_ports
from vllm_fleet.monitoring.targets import PROMETHEUS_PREFIX
from vllm_fleet.facts.verify import diagnose, host_probe_command, parse_host_probe, printed_result

# Files whose drift status reports. The env file is secret: its content is not compared here.
DRIFT_KINDS = ("unit", "config")


JOURNAL_TAIL = 15  # journal lines of a failing unit shown (and in the JSON)

# systemd's Result= of a failed unit, in words (systemd.exec(5) lists the values).
RESULTS = {
    "start-limit-hit": "crash loop: systemd stopped restarting it after its start limit "
                       "(StartLimitBurst); the next deploy resets it (systemctl reset-failed)",
    "timeout": "a start (model load) or stop took longer than the unit allows (TimeoutStartSec/TimeoutStopSec)",
    "exit-code": "exited with an error (or its /health wait gave up)",
    "signal": "killed by a signal",
    "core-dump": "crashed (core dump)",
    "oom-kill": "killed by the kernel's OOM killer",
    "resources": "systemd could not set it up (user, directories, the env file?)",
}


def discover_host(host, config) -> tuple[Discovered, str, str | None, dict[str, Any] | None]:
    """(what to plan from, where its GPUs come from, why the deploy would refuse this host or None,
    NVML's GPU topology report on a CUDA host).

    The deploy's own discovery (vllm_fleet/facts/discovery.py), read over the status connection in
    one remote command (facts.RemoteFacts): live GPUs, NVML's topology, the models' config.json, the
    paths the instances name. What it read is planned even where the deploy would refuse the host
    as it is (a model path missing, a driver too old): status still shows what runs and its drift,
    and the reason is reported. Only GPUs nvidia-smi could not list fall back to the declared ones."""
    on = facts.RemoteFacts(host)
    topology = None
    try:
        facts.prefetch(on, discovery_queries(config))
        found, errors = discover(on, config, for_deploy=False)
        if config.settings.vllm_target == "cuda":  # answered by the batch above: no command of its own
            topology = facts.get(on, GpuTopology, python=env_python(config))
    except facts.FactUnreadable as exc:
        found, errors = Discovered(config, None, None, None), [ConfigError(str(exc), host=config.name)]
    refusal = ("; ".join(e.located() for e in errors) + " (the deploy would refuse this host as it is)"
               if errors else None)
    if config.settings.vllm_target != "cuda":
        source = "none (CPU host)"
    else:
        source = "live (nvidia-smi)" if found.live else "declared (nvidia-smi listed none: see the plan error)"
    return found, source, refusal, topology


def planned_files(found: Discovered, fleet: Fleet | None = None,
                  ) -> tuple[dict[str, dict[str, str]], dict[str, Any] | None, str | None, RayNode | None]:
    """({instance: {kind: sha256}}, the front's unit entry or None, error text or None, the host's
    Ray node or None) of what the deploy would write now: the fleet's prepared host (the deploy's
    own, Fleet.prepare_for_drift) from what discovery read. `fleet`: the inventory's, for a node of
    a multi-node instance (its group's plan); None: this host alone."""
    config = found.config
    fleet = fleet or Fleet.of([config])
    try:
        prepared = fleet.prepare_for_drift(found)
    except ConfigErrors as exc:
        return {}, None, "; ".join(e.located() for e in exc.errors), None
    out = {inst.name: {kind: hashlib.sha256(prepared.instance_file(inst.name, kind).content.encode()).hexdigest()
                       for kind in DRIFT_KINDS}
           for inst in prepared.plan.instances}
    for inst in prepared.plan.instances:  # not a file kind: what adapter_drift compares with vLLM's models
        out[inst.name]["adapters"] = [a.name for a in inst.config.adapters]  # type: ignore[assignment]
        out[inst.name]["served_model_name"] = inst.config.served_model_name
    front = {"unit": FRONT_UNIT, "bind": config.settings.vllm_bind_host} if prepared.plan.instances else None
    return out, front, None, prepared.plan.ray


def explain_failure(failure: dict[str, Any]) -> dict[str, Any]:
    """A failing unit's probe entry -> result, restarts, reason, diagnosis, the journal's last lines."""
    journal = [ln for ln in failure.get("journal", []) if ln.strip()]
    result = failure.get("result") or "unknown"
    return {"result": result, "restarts": failure.get("restarts"),
            "reason": RESULTS.get(result, f"systemd result {result}"),
            "diagnosis": diagnose("\n".join(journal)), "journal": journal[-JOURNAL_TAIL:]}


def adapter_drift(entry: dict[str, Any], planned: list[str], served_name: str) -> list[str]:
    """The planned LoRA adapters vLLM does not serve, and those it serves that the plan lacks (its
    /v1/models: the base model's served name and every loaded adapter); nothing while it is down."""
    served = entry.get("served_models")
    if not entry.get("health") or served is None:
        return []
    missing = [name for name in planned if name not in served]
    extra = [name for name in served if name != served_name and name not in planned]
    return ([f"adapters not loaded: {', '.join(missing)}"] if missing else []) + (
        [f"adapters loaded but not planned: {', '.join(extra)}"] if extra else [])


def host_status(name: str, host, config, fleet: Fleet | None = None) -> dict[str, Any]:
    if host is None:
        return {"name": name, "reachable": False, "error": "unreachable over SSH"}
    found, gpu_source, refusal, topology = discover_host(host, config)
    planned, front, plan_error, ray_node = planned_files(found, fleet)
    plan_error = "; ".join(e for e in (refusal, plan_error) if e) or None
    payload = {"manifest": manifest_path(config),
               "config_dir": config.settings.vllm_config_dir, "front": front,
               "instances": {n: {"paths": {k: v for k, v in instance_paths(config, n).items()
                                           if k in DRIFT_KINDS}} for n in planned}}
    # With the host's _sudo/_su_user/... applied, like every command of ours.
    ok, out, err = remote.run(host, host_probe_command("status", payload), timeout=120)
    probe = parse_host_probe(out)
    if probe is None:
        return {"name": name, "reachable": True, "error": f"status probe failed: {err.strip()[-300:]}"}
    for inst_name, entry in probe["instances"].items():
        if entry.get("failure"):
            entry["failure"] = explain_failure(entry["failure"])
        want = planned.get(inst_name)
        if want is None:
            entry["drift"] = ["not planned: see the plan error" if plan_error and not planned
                              else "not in the plan (would be removed by the next deploy)"]
            continue
        entry["drift"] = [f"{kind} differs from the plan" for kind in DRIFT_KINDS
                          if entry["files_sha256"].get(kind) != want[kind]] + adapter_drift(entry, want["adapters"], want["served_model_name"])
        entry["adapters"] = want["adapters"]
    for missing in sorted(set(planned) - set(probe["instances"])):
        probe["instances"][missing] = {"state": "not deployed", "drift": ["planned, not deployed"]}
    if topology is not None:
        probe["gpu_topology"] = gpu_topology.summary(topology)
    if (probe.get("front") or {}).get("failure"):
        probe["front"]["failure"] = explain_failure(probe["front"]["failure"])
    if ray_node is not None:
        probe["ray"] = ray_status(host, config, ray_node)
    return {"name": name, "reachable": True, "plan_error": plan_error, "gpus_planned_from": gpu_source,
            **probe}


USAGE_KINDS = ("prompt", "cached", "completion", "requests")
WINDOW = re.compile(r"[0-9]{1,6}[smhdw]\Z")  # a Prometheus range: 90m, 24h, 7d


def _add_usage(into: dict[tuple[str, str], dict[str, int]], clients: dict[str, Any]) -> None:
    for client, models in (clients or {}).items():
        for model, counts in models.items():
            row = into.setdefault((client, model), dict.fromkeys(USAGE_KINDS, 0))
            for kind in USAGE_KINDS:
                row[kind] += int(counts.get(kind, 0))


def summed_usage(parts: list[dict[str, Any]], *, source: str, since: str | None,
                 errors: list[str] | None = None) -> dict[str, Any]:
    """One usage report from several readings ({"clients": {client: {model: counts}}, "vllm":
    {prompt, generation, cached}}): a row per client and model, the totals over every client, and
    vLLM's own counters, which the totals' prompt and completion tokens reconcile with."""
    rows: dict[tuple[str, str], dict[str, int]] = {}
    own: dict[str, int] = {}
    for part in parts:
        _add_usage(rows, part.get("clients"))
        for kind, value in (part.get("vllm") or {}).items():
            own[kind] = own.get(kind, 0) + int(value)
    table = [{"client": client, "model": model, "prompt_tokens": c["prompt"], "cached_prompt_tokens": c["cached"],
              "completion_tokens": c["completion"], "requests": c["requests"]}
             for (client, model), c in sorted(rows.items())]
    totals = {key: sum(r[key] for r in table)
              for key in ("prompt_tokens", "cached_prompt_tokens", "completion_tokens", "requests")}
    return {"source": source, "since": since, "clients": table, "totals": totals,
            "vllm": {"prompt_tokens": own.get("prompt"), "generation_tokens": own.get("generation"),
                     "cached_prompt_tokens": own.get("cached")},
            "errors": list(errors or [])}


def instances_usage(report: list[dict[str, Any]]) -> dict[str, Any]:
    """Every instance's counters as its /metrics holds them now (since that vLLM started), summed."""
    errors = [f"{h['name']}: {h['error']}" for h in report if h.get("error")]
    parts = []
    for host in report:
        for name, inst in (host.get("instances") or {}).items():
            if inst.get("usage") is not None:
                parts.append(inst["usage"])
            elif inst.get("state") != "not deployed":
                errors.append(f"{host['name']}/{name}: no /metrics (not healthy): its tokens are not counted")
    return summed_usage(parts, source="instances", since=None, errors=errors)


def prometheus_usage(name: str, host, config, since: str) -> dict[str, Any]:
    """The fleet's Prometheus, asked on its own host (loopback, over SSH): each counter's increase
    over `since`, by client and model, and vLLM's own."""
    ports = monitoring_ports(config.settings)
    payload = {"port": ports["prometheus"], "prefix": PROMETHEUS_PREFIX, "since": since}
    _ok, out, err = remote.run(host, host_probe_command("usage", payload), timeout=120)
    probe = parse_host_probe(out)
    if probe is None:
        return summed_usage([], source=f"prometheus on {name}", since=since,
                            errors=[f"{name}: the usage query failed: {err.strip()[-300:]}"])
    return summed_usage([probe], source=f"prometheus on {name}", since=since, errors=probe.get("errors"))


def fleet_alerts(name: str, host, config) -> dict[str, Any]:
    """The alerts the fleet's Alertmanager holds, asked on its own host (loopback, over SSH): each
    firing one, and each held back (by a host down, or a silence), with its labels."""
    payload = {"port": monitoring_ports(config.settings)["alertmanager"]}
    _ok, out, err = remote.run(host, host_probe_command("alerts", payload), timeout=60)
    probe = parse_host_probe(out)
    if probe is None:
        return {"source": f"alertmanager on {name}", "alerts": [],
                "errors": [f"{name}: the alerts query failed: {err.strip()[-300:]}"]}
    return {"source": f"alertmanager on {name}", **probe}


def monitoring_host(fleet: Fleet, configs: dict[str, Any]) -> str | None:
    """The host that runs the fleet's Prometheus, if status reaches it (it is within --limit)."""
    return next((name for name, config in configs.items()
                 if config.settings.vllm_monitoring is True and config.settings.vllm_metrics is True), None)


def collect(inventory: str, limit: list[str] | None, usage_since: str | None = None,
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], dict[str, Any] | None]:
    from vllm_fleet.commands import connection
    from vllm_fleet.commands.connection import connected

    connection.install()  # gevent, before pyinfra loads the inventory and connects
    fleet = Fleet.load(inventory, limit)  # the inventory, read once: a broken host outside --limit is not reported
    configs = {c.name: c for c in fleet.configs_of(fleet.matched)}
    with connected(fleet.pyinfra_inventory, list(fleet.matched)) as (state, active):
        # Every host at once, in pyinfra's own pool of greenlets (as its operations run): one after
        # the other, 50 hosts would wait out 100 round trips and 50 probes in sequence.
        report = state.pool.map(lambda name: host_status(name, active[name], configs[name], fleet),
                                list(fleet.matched))
        gateways = [gateway_status(name, active[name], configs[name]) for name in fleet.matched
                    if configs[name].settings.vllm_gateway is True]
        usage = None
        monitor = monitoring_host(fleet, configs)
        reached = monitor is not None and active.get(monitor) is not None
        if usage_since is not None:
            if reached:
                usage = prometheus_usage(monitor, active[monitor], configs[monitor], usage_since or "24h")
            else:
                usage = instances_usage(report)
        elif reached:
            # On the monitoring host's own entry; main() shows them apart from the hosts.
            entry = next(h for h in report if h.get("name") == monitor)
            entry["alerts"] = fleet_alerts(monitor, active[monitor], configs[monitor])
    # Beside the hosts, one row per Ray node (a host that is unreachable, or whose plan failed, says so
    # in its own entry and has none).
    ray = [h.pop("ray") for h in report if "ray" in h]
    return report, gateways, ray, usage


def ray_status(host, config, role: RayNode) -> dict[str, Any]:
    """A node of a multi-node instance, `role` from the host's prepared plan (the deploy's): its Ray
    unit's state; on the head, the cluster's nodes as Ray's GCS lists them now (ray_cluster's probe,
    no wait) and which of the group are missing."""
    row: dict[str, Any] = {"host": host.name, "instance": role.instance,
                           "role": "head" if role.is_head else "worker", "unit": RAY_UNIT}
    _ok, out, _err = remote.run(host, f"systemctl is-active {RAY_UNIT}")
    row["state"] = out.strip() or "unknown"
    if role.is_head:
        spec = ray_cluster.spec(role, config, host_layout(config).current, timeout_s=0)
        res = ray_cluster.check(host, spec)
        row.update(nodes=res.get("nodes", []), missing=res.get("missing", []), error=res.get("error"))
    return row


def print_ray(rows: list[dict[str, Any]]) -> None:
    """One line per Ray node: its unit, and on the head the cluster's nodes."""
    for r in rows:
        line = f"ray {r['role']} of {r['instance']} on {r['host']}: {r['unit']} {r.get('state', '-')}"
        if r.get("error"):
            line += f" ({r['error']})"
        elif r["role"] == "head":
            alive = [n["ip"] for n in r.get("nodes", []) if n.get("alive")]
            line += f"; cluster: {len(alive)} node(s) alive ({', '.join(alive) or 'none'})"
            if r.get("missing"):
                line += f"; MISSING: {', '.join(r['missing'])}"
        print(line)


def gateway_status(name: str, host, config) -> dict[str, Any]:
    """The fleet gateway on `host`: its unit, client URL and every backend with vllm-router's health
    verdict, as the host probe reads them (the manifest's list and the router's /workers); behind a
    floating address, whether it holds the address now (`floating`; `holds` None: not known)."""
    entry = _gateway_status(name, host, config)
    if config.settings.vllm_gateway_address is not None and "floating" not in entry:
        entry["floating"] = {"address": gateway.floating_ip(config), "interface": config.settings.vllm_gateway_interface,
                             "holds": None, "error": entry.get("error") or "not reported by the host"}
    return entry


def floating_summary(gateways: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Which gateway holds the floating address, from each gateway's own `ip addr`: `holders` (one is
    right; none: clients reach nothing; two: both answer, a split), `unknown` (not asked: unreachable,
    not deployed), and a `verdict` saying so in words. None without a floating address."""
    behind = [g for g in gateways if g.get("floating")]
    if not behind:
        return None
    holders = [g["host"] for g in behind if g["floating"].get("holds") is True]
    unknown = [g["host"] for g in behind if g["floating"].get("holds") is None]
    verdict = ("none" if not holders and not unknown else "unknown" if not holders
               else holders[0] if len(holders) == 1 else f"two holders! ({', '.join(holders)})")
    return {"address": behind[0]["floating"]["address"], "holders": holders, "unknown": unknown,
            "gateways": [g["host"] for g in behind], "verdict": verdict}


def print_floating(summary: dict[str, Any] | None, gateways: list[dict[str, Any]]) -> None:
    """One line: the floating address and who holds it; then each gateway's keepalived."""
    if summary is None:
        return
    line = f"floating address {summary['address']}: held by {summary['verdict']}"
    if summary["unknown"]:
        line += f" (not known for {', '.join(summary['unknown'])})"
    print(line)
    for g in gateways:
        floating = g.get("floating")
        if floating:
            held = {True: "holds it", False: "does not hold it", None: "unknown"}[floating.get("holds")]
            print(f"  {g['host']}: {held}; {floating.get('unit', 'keepalived.service')} {floating.get('state', '-')}"
                  + (f" ({floating['error']})" if floating.get("error") else ""))


def _gateway_status(name: str, host, config) -> dict[str, Any]:
    if host is None:
        return {"host": name, "url": gateway.gateway_url(config), "error": "unreachable over SSH",
                "backends": []}
    payload = {"manifest": manifest_path(config)}
    _ok, out, err = remote.run(host, host_probe_command("gateway-status", payload), timeout=60)
    probe = parse_host_probe(out)
    if probe is None:
        return {"host": name, "url": gateway.gateway_url(config), "backends": [],
                "error": "not deployed (no gateway in the manifest)" if printed_result(out) else
                         f"status probe failed: {err.strip()[-300:]}"}
    if probe.get("failure"):
        probe["failure"] = explain_failure(probe["failure"])
    return {"host": name, **probe}


def unit_cell(entry: dict[str, Any]) -> str:
    """The unit column: its state, and for a failing unit systemd's result and restart count."""
    state = entry.get("state", "-")
    failure = entry.get("failure")
    if not failure:
        return state
    return f"[red]{state} ({failure['result']}, {failure.get('restarts') or 0} restarts)[/red]"


def failure_lines(host: str, what: str, failure: dict[str, Any]) -> list[str]:
    """Lines under the table for a failing unit: the reason, the diagnosis, the journal's tail."""
    lines = [f"{host} {what}: {failure['reason']}"]
    if failure.get("diagnosis"):
        lines.append(f"  diagnosis: {failure['diagnosis']}")
    if failure.get("journal"):
        lines.append("  last journal lines:")
        lines.extend(f"    {ln}" for ln in failure["journal"])
    return lines


def print_table(report: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=170)
    notes: list[str] = []
    table = Table(title="vllm-fleet status")
    for column in ("host", "instance", "unit", "uptime", "health", "vLLM", "served", "running/waiting",
                   "KV use", "drift"):
        table.add_column(column)
    for host in report:
        if host.get("error"):
            table.add_row(host["name"], "-", "[red]" + escape(host["error"]) + "[/red]", *["-"] * 7)
            continue
        console.print(f"{host['name']}: planned with {host.get('gpus_planned_from', '-')} GPUs"
                      + (f"; plan error: {host['plan_error']}" if host.get("plan_error") else ""),
                      highlight=False, markup=False)
        for name, inst in sorted(host["instances"].items()):
            if inst.get("failure"):
                notes.extend(failure_lines(host["name"], f"instance {name} ({inst.get('unit')})",
                                           inst["failure"]))
            m = inst.get("metrics", {})
            kv = m.get("kv_cache_usage_perc", m.get("gpu_cache_usage_perc"))
            table.add_row(
                host["name"], name, unit_cell(inst),
                f"{inst['uptime_s']} s" if inst.get("uptime_s") is not None else "-",
                "ok" if inst.get("health") else "[red]down[/red]", str(inst.get("vllm_version") or "-"),
                ",".join(inst.get("served_models", [])) or "-",
                f"{m.get('num_requests_running', 0):.0f}/{m.get('num_requests_waiting', 0):.0f}" if m else "-",
                f"{kv * 100:.1f}%" if kv is not None else "-",
                "[yellow]" + "; ".join(inst["drift"]) + "[/yellow]" if inst.get("drift") else "none")
        front = host.get("front")
        if front:
            table.add_row(host["name"], "(front)", unit_cell(front) if front.get("active") or front.get("failure")
                          else f"[red]{front.get('state', '-')}[/red]", "-",
                          "-", "-", "-", "-", "-", "-")
            if front.get("failure"):
                notes.extend(failure_lines(host["name"], f"front ({front['unit']})", front["failure"]))
            if front.get("requests_last_hour"):
                notes.append(f"{host['name']} front, requests in the last hour by client: "
                             + requests_words(front["requests_last_hour"]))
        for gpu in host.get("gpus", []):
            console.print(f"{host['name']} GPU {gpu['index']} {gpu['name']}: {gpu['memory_used_mib']}/"
                          f"{gpu['memory_total_mib']} MiB, {gpu['utilization_pct']}% busy", highlight=False)
        if host.get("gpu_topology"):
            console.print(f"{host['name']} GPU topology: {host['gpu_topology']}", highlight=False)
    console.print(table)
    for line in notes:
        console.print(line, highlight=False, markup=False)


def requests_words(counts: dict[str, dict[str, int]]) -> str:
    """{"ci": {"2xx": 12, "4xx": 1}} -> "ci 2xx 12, 4xx 1"; a request with no known key is "(no key)"."""
    return "; ".join(f"{client or '(no key)'} " + ", ".join(f"{k} {n}" for k, n in sorted(by_class.items()))
                     for client, by_class in sorted(counts.items()))


def print_gateways(gateways: list[dict[str, Any]]) -> None:
    """One line per gateway, then one per backend with the router's verdict."""
    for g in gateways:
        state = g.get("error") or g.get("state", "-")
        print(f"gateway on {g['host']}: {g['url']} ({g.get('unit', gateway.GATEWAY_UNIT)} {state})")
        for line in failure_lines(g["host"], "gateway", g["failure"]) if g.get("failure") else []:
            print(line)
        for b in g.get("backends", []):
            verdict = ("not registered" if not b.get("registered")
                       else "healthy" if b.get("healthy") else "unhealthy (no requests sent)")
            print(f"  {b['model']:<24} {b['host']}/{b['instance']:<16} {b['url']:<28} {verdict}")


def print_usage(usage: dict[str, Any]) -> None:
    """The usage table: a row per client and model, the totals, and vLLM's own counters."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    window = (f"increase over the last {usage['since']}" if usage["since"]
              else "since each instance's vLLM started (no Prometheus reached: --since needs the fleet's monitoring)")
    table = Table(title=f"tokens by client ({usage['source']}: {window})")
    for column in ("client", "model", "prompt", "cached prompt", "completion", "requests"):
        table.add_column(column, justify="left" if column in ("client", "model") else "right")
    for row in usage["clients"]:
        table.add_row(row["client"], row["model"], str(row["prompt_tokens"]), str(row["cached_prompt_tokens"]),
                      str(row["completion_tokens"]), str(row["requests"]))
    totals = usage["totals"]
    table.add_row("(all)", "", str(totals["prompt_tokens"]), str(totals["cached_prompt_tokens"]),
                  str(totals["completion_tokens"]), str(totals["requests"]))
    console.print(table)
    own = usage["vllm"]
    console.print("vLLM's own counters: prompt " + str(own["prompt_tokens"]) + ", generation "
                  + str(own["generation_tokens"]) + ", cached prompt " + str(own["cached_prompt_tokens"]),
                  highlight=False, markup=False)
    for error in usage["errors"]:
        console.print(f"not counted: {error}", highlight=False, markup=False)


def print_alerts(alerts: dict[str, Any] | None) -> None:
    """The alerts table: a row per alert the fleet's Alertmanager holds (none: a line saying so)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    if alerts is None:
        return  # no monitoring host within --limit
    console = Console(width=170)
    for error in alerts["errors"]:
        console.print(f"alerts not read: {error}", highlight=False, markup=False)
    if not alerts["alerts"]:
        if not alerts["errors"]:
            console.print(f"no alert firing ({alerts['source']})", highlight=False, markup=False)
        return
    table = Table(title=f"alerts ({alerts['source']})")
    for column in ("alert", "severity", "host", "instance", "state", "since", "summary"):
        table.add_column(column)
    for alert in alerts["alerts"]:
        labels = alert["labels"]
        state = alert["state"]
        if alert["inhibited_by"]:
            state += " (held back: its host is down)"
        elif alert["silenced_by"]:
            state += " (silenced)"
        table.add_row(*(Text(value) for value in (
            labels.get("alertname", ""), labels.get("severity", ""), labels.get("host", ""),
            labels.get("vllm_instance") or labels.get("name") or labels.get("job", ""), state,
            str(alert.get("starts_at") or "")[:19], alert["summary"])))
    console.print(table)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet status", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
What each host serves now, and whether it drifted from the plan. Read-only: over SSH, one
discovery and one probe per host. Per instance: its unit's state and uptime, the vLLM version,
the served models, /health, requests and KV cache use from its /metrics; per host: the GPUs
and the front; for a failed or restarting unit, systemd's result, its restart count and the
journal's last lines. Drift: a managed file on the host that differs from what the plan
would render now. Then the gateway's backends, the Ray cluster of a multi-node instance, and
the alerts the fleet's Alertmanager holds (when the monitoring host is within --limit).
Exit status: 0 all healthy, 1 a host unreachable or an instance, front, gateway or Ray node
unhealthy, 2 invalid input.""",
        epilog="""\
examples:
  vllm-fleet status inventory/prod.py
      a table per host
  vllm-fleet status inventory/prod.py --limit gpu-h100-01 --json | jq '.hosts[0].instances'
      one host, as JSON
  vllm-fleet status inventory/prod.py --usage --since 7d --json | jq '.usage.clients'
      each client's prompt, cached and completion tokens by model over the last 7 days""")
    parser.add_argument("inventory", help="the pyinfra inventory file, e.g. inventory/prod.py")
    parser.add_argument("--json", action="store_true",
                        help="print {\"hosts\": ..., \"gateways\": ..., \"ray\": ..., \"alerts\": ...} as JSON "
                             "instead of tables")
    parser.add_argument("--limit", action="append", metavar="NAMES",
                        help="only these hosts or groups (comma-separated; repeatable)")
    parser.add_argument("--usage", action="store_true",
                        help="tokens by client and model instead of the tables: from the fleet's Prometheus "
                             "(their increase over --since) when status reaches the monitoring host, else each "
                             "instance's /metrics (since its vLLM started); with vLLM's own counters")
    parser.add_argument("--since", metavar="WINDOW",
                        help="with --usage: the window, as Prometheus writes one (90m, 24h, 7d; default 24h)")
    args = parser.parse_args(argv)
    limit = split_names(args.limit)
    if args.since is not None and (not args.usage or not WINDOW.match(args.since)):
        print(f"error: --since {args.since!r}: " + ("a window of digits and one of s, m, h, d, w (24h)" if args.usage
                                                      else "only with --usage"), file=sys.stderr)
        return 2
    try:
        report, gateways, ray, usage = collect(args.inventory, limit, (args.since or "") if args.usage else None)
    except ConfigErrors as exc:
        print(str(exc), file=sys.stderr)
        return 2
    except ConfigError as exc:
        print(f"error: {exc.located()}", file=sys.stderr)
        return 2
    floating = floating_summary(gateways)
    if usage is not None and args.json:
        json.dump({"usage": usage}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    elif usage is not None:
        print_usage(usage)
    elif args.json:
        alerts = next((h.pop("alerts") for h in report if "alerts" in h), None)
        json.dump({"hosts": report, "gateways": gateways, "floating": floating, "ray": ray, "alerts": alerts},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        alerts = next((h.pop("alerts") for h in report if "alerts" in h), None)
        print_table(report)
        print_gateways(gateways)
        print_floating(floating, gateways)
        print_ray(ray)
        print_alerts(alerts)
    unhealthy = any(h.get("error") or any(not i.get("health") for i in h["instances"].values())
                    or (h.get("front") is not None and not h["front"].get("active"))
                    for h in report) or any(g.get("error") or not g.get("active") for g in gateways)
    unhealthy = unhealthy or any(r.get("error") or r.get("missing") or r.get("state") != "active" for r in ray)
    unhealthy = unhealthy or (floating is not None and len(floating["holders"]) != 1)
    return 1 if unhealthy else 0

