"""The converge bench's figures and report: summaries of timed runs, the ratio ours/reference, the
README's Markdown table and the printed report."""

from __future__ import annotations

import statistics
from typing import Any

from converge.settings import BARE_LABEL


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": [round(v, 3) for v in values]}


def usage_summary(usage: list[dict[str, float]]) -> dict[str, Any]:
    """The workstation's side of a tool's runs: median CPU seconds, largest peak RSS (MiB)."""
    measured = [u for u in usage if u]
    if not measured:
        return {}
    figures = {"cpu_s": statistics.median(u["cpu_s"] for u in measured),
               "peak_rss_mib": max(u["peak_rss_mib"] for u in measured)}
    if all("machine_cpu_s" in u for u in measured):  # the sandbox hosts share this machine's CPUs
        figures["machine_cpu_s"] = statistics.median(u["machine_cpu_s"] for u in measured)
    return figures


def ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    return ours["median"] / theirs["median"]


def round_trips(base_s: float, slow_s: float, rtt_ms: float) -> float:
    """How many round trips in sequence the added time amounts to."""
    return (slow_s - base_s) / (rtt_ms / 1000.0)


def fmt_summary(s: dict[str, Any]) -> str:
    text = f"{s['median']:.2f} s ({s['min']:.2f}–{s['max']:.2f})"
    if "cpu_s" in s:
        text += f"; CPU {s['cpu_s']:.1f} s"
        if "machine_cpu_s" in s:
            text += f" (the machine's, hosts included: {s['machine_cpu_s']:.1f} s)"
        text += f", peak RSS {s['peak_rss_mib']:.0f} MiB"
    return text


def fmt_per_host(counts: dict[str, dict[str, int]], key: str, hosts: list[str]) -> str:
    """Each host's count, in order; past 5 hosts the range and the median instead."""
    values = [counts.get(h, {}).get(key, 0) for h in hosts]
    if len(hosts) <= 5:
        return " · ".join(str(v) for v in values)
    if min(values) == max(values):
        return f"{values[0]} on each of {len(hosts)}"
    return f"{min(values)}–{max(values)} (median {statistics.median(values):g})"


def markdown_table(result: dict[str, Any]) -> str:
    """The README table: one row per scenario, then commands and connections per host."""
    hosts = result["host_names"]
    head = (f"| {len(hosts)} sandbox hosts, A B A B, {result['runs']} runs each | vllm-fleet deploy.py "
            f"(pyinfra {result['versions']['pyinfra']}) | Ansible playbook (ansible-core "
            f"{result['versions']['ansible_core']}) | ours/Ansible |\n|---|---|---|---|\n")
    rows = []
    for key, label in result["scenario_labels"].items():
        s = result["scenarios"].get(key)
        if s:
            rows.append(f"| {label} | {fmt_summary(s['ours'])} | {fmt_summary(s['ansible'])} | "
                        f"{s['ratio']:.2f} |")
    counts = result.get("counts")
    if counts:
        order = " · ".join(hosts) if len(hosts) <= 5 else f"{len(hosts)} hosts"
        rows.append(f"| remote commands per host, no-op ({order}) | "
                    f"{fmt_per_host(counts['ours'], 'commands', hosts)} | "
                    f"{fmt_per_host(counts['ansible'], 'commands', hosts)} | |")
        rows.append(f"| SSH connections per host, no-op (counted by the relay) | "
                    f"{fmt_per_host(counts['ours_relay'], 'connections', hosts)} | "
                    f"{fmt_per_host(counts['ansible_relay'], 'connections', hosts)} | |")
    for key in ("rollout", "status"):
        measured = result.get(key)
        if measured:
            rows.append(f"| {measured['label']} | {fmt_summary(measured)} | — | |")
    bare = result.get("bare_pyinfra")
    tail = (f"\n{BARE_LABEL}: ours {fmt_summary(bare['ours'])}, bare pyinfra {fmt_summary(bare['bare'])}: "
            f"**{bare['ratio']:.2f}×** (target ≤ 2×)\n") if bare else ""
    return head + "\n".join(rows) + "\n" + tail


def _peak_rss_mib(result: dict[str, Any]) -> float | None:
    """The largest peak RSS of any of our runs (deploy, rollout, status)."""
    peaks = [s["ours"]["peak_rss_mib"] for s in result.get("scenarios", {}).values() if "peak_rss_mib" in s["ours"]]
    peaks += [result[k]["peak_rss_mib"] for k in ("rollout", "status") if "peak_rss_mib" in (result.get(k) or {})]
    return max(peaks) if peaks else None


def targets(result: dict[str, Any]) -> list[str]:
    """Each target of the fleet-size work that this run measured, its figure, and met or MISSED."""
    lines = []

    def check(text: str, value: float, limit: float, unit: str = "") -> None:
        shown = f"{value:g}" if float(value).is_integer() else f"{value:.2f}"
        lines.append(f"{text}: {shown}{unit} (target ≤ {limit:g}{unit}): {'met' if value <= limit else 'MISSED'}")

    hosts = len(result["host_names"])
    slow = next((s for k, s in result.get("scenarios", {}).items() if k == "noop_relay_50ms"), None)
    if slow:
        check(f"no-op of {hosts} hosts at +50 ms", slow["ours"]["median"], 5.0, " s")
        check(f"no-op of {hosts} hosts at +50 ms against Ansible's", slow["ratio"], 0.1, "×")
    peak = _peak_rss_mib(result)
    if peak is not None:
        check("the workstation's peak RSS over our runs", peak / 1024, 1.0, " GiB")
    if result.get("status"):
        check(f"`vllm-fleet status` of {hosts} hosts", result["status"]["median"], 3.0, " s")
    rollout = result.get("rollout")
    if rollout:
        pct = 100 * rollout["overhead_per_batch_s"] / rollout["span_per_batch_s"]
        lines.append(f"rollout overhead per batch beyond the slowest start-up: {rollout['overhead_per_batch_s']:.1f} s "
                     f"of {rollout['span_per_batch_s']:.1f} s ({pct:.0f} %) with the stand-in's "
                     f"{rollout['start_up_s']:.1f} s start-up; the 10 % target is against the genuine vLLM's "
                     "start-up (bench/rollout_bench.py)")
    counts = (result.get("counts") or {}).get("ours")
    if counts:
        check("remote commands per host in a no-op (the most of any host)",
              max(c.get("commands", 0) for c in counts.values()), 4)
    return lines


def print_report(result: dict[str, Any], log) -> None:
    log("")
    log(markdown_table(result).rstrip())
    log("")
    cost = result.get("host_cost")
    if cost:
        log(f"One stand-in host costs this machine {cost['pss_mib']:.0f} MiB of memory (PSS of every process in "
            f"it, median of {cost['hosts']}) and {cost['disk_mib']:.0f} MiB of disk (its overlay's upper layer)")
    for line in targets(result):
        log(line)
    latency = result.get("latency") or {}
    for rtt, growth in (latency.get("growth") or {}).items():
        log(f"No-op time with +{rtt} ms RTT, against {latency['base']['label']}: ours "
            f"{growth['ours']['added_s']:+.2f} s (as {growth['ours']['round_trips']:.0f} round trips in "
            f"sequence), Ansible {growth['ansible']['added_s']:+.2f} s (as "
            f"{growth['ansible']['round_trips']:.0f})")
    profile = result.get("noop_profile")
    if profile:
        log(f"Our no-op, where the time goes ({profile['seconds']:.2f} s wall, {profile['cpu_s']:.2f} s CPU "
            "on this machine for the pyinfra process):")
        for label, seconds in profile["phases"]:
            log(f"  {seconds:6.2f} s  {label}")
        if profile.get("top"):
            log("The same no-op under cProfile (its overhead included), the functions with the most time of "
                "their own:")
            for row in profile["top"]:
                log(f"  {row['own_s']:6.2f} s own, {row['cumulative_s']:6.2f} s with callees, {row['calls']:>7} calls  "
                    f"{row['function']}  ({row['where']})")
    if "first_converge_s" in result:
        log(f"First converge by deploy.py (not compared): {result['first_converge_s']:.1f} s")
    log("Ansible: ansible-core " + str(result["versions"].get("ansible_core")) + ", "
        + ", ".join(f"{k}={v}" for k, v in result["ansible_settings"].items()))
    for note in result.get("notes", []):
        log(note)
    log("Every run was checked afterwards: managed files (sha256) and MainPIDs on every host as before"
        + (": all as expected." if not result["noop_violations"] else
           f": {len(result['noop_violations'])} run(s) left them otherwise: "
           + "; ".join(result["noop_violations"])))
    log("API key in any captured output: " + (", ".join(result["api_key_in_output"]) or "no"))
