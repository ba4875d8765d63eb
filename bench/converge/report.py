"""The converge bench's figures and report: summaries of timed runs, the ratio ours/reference, the
README's Markdown table and the printed report."""

from __future__ import annotations

import statistics
from typing import Any

from converge.settings import BARE_LABEL


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": [round(v, 3) for v in values]}


def ratio(ours: dict[str, Any], theirs: dict[str, Any]) -> float:
    return ours["median"] / theirs["median"]


def round_trips(base_s: float, slow_s: float, rtt_ms: float) -> float:
    """How many round trips in sequence the added time amounts to."""
    return (slow_s - base_s) / (rtt_ms / 1000.0)


def fmt_summary(s: dict[str, Any]) -> str:
    return f"{s['median']:.2f} s ({s['min']:.2f}–{s['max']:.2f})"


def fmt_per_host(counts: dict[str, dict[str, int]], key: str, hosts: list[str]) -> str:
    return " · ".join(f"{counts.get(h, {}).get(key, 0)}" for h in hosts)


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
        order = " · ".join(hosts)
        rows.append(f"| remote commands per host, no-op ({order}) | "
                    f"{fmt_per_host(counts['ours'], 'commands', hosts)} | "
                    f"{fmt_per_host(counts['ansible'], 'commands', hosts)} | |")
        rows.append(f"| SSH connections per host, no-op (counted by the relay) | "
                    f"{fmt_per_host(counts['ours_relay'], 'connections', hosts)} | "
                    f"{fmt_per_host(counts['ansible_relay'], 'connections', hosts)} | |")
    bare = result.get("bare_pyinfra")
    tail = (f"\n{BARE_LABEL}: ours {fmt_summary(bare['ours'])}, bare pyinfra {fmt_summary(bare['bare'])}: "
            f"**{bare['ratio']:.2f}×** (target ≤ 2×)\n") if bare else ""
    return head + "\n".join(rows) + "\n" + tail


def print_report(result: dict[str, Any], log) -> None:
    log("")
    log(markdown_table(result).rstrip())
    log("")
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
