"""The converge bench's run, step by step (bench/converge_bench.py's docstring says what each
measures): the tools and the engine's wheelhouse, the first converge, the files rendered by
vllm-fleet, Ansible's first run, then the scenarios, each tool run A B A B, the profile of our
no-op, the commands and connections counted through a relay, and the no-op at each added latency.

Each step records what it measured in the result as it ends (Bench.result), so a bench that stops
early still reports the steps before."""

from __future__ import annotations

import json
import shlex
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from benchlib import Relay, deploy_env
from converge.inventories import bare_spec
from converge.machine import Bench
from converge.report import fmt_summary, round_trips, summary, usage_summary
from converge.settings import (ANSIBLE_SETTINGS, BARE_DEPLOY, BARE_LABEL, FILE_CHANGE_LABEL, FIRST_CONVERGE_LABEL,
                               NOTES, ROLLOUT_CHANGE, ROLLOUT_LABEL, STANDIN_NOTE, STATUS_LABEL)
from converge.tool_output import ansible_counts, changed_lines, play_recap, pyinfra_counts


def run_bench(b: Bench) -> dict[str, Any]:
    """The whole bench on b's hosts, step by step; the result (also b.result as it fills)."""
    args = b.args
    versions = tool_versions(b)
    b.env = deploy_env(b.api_key, engine_wheelhouse(b))
    direct = b.pyinfra_inventory("inv-direct")
    result = b.result = new_result(b, versions)  # what there is so far, reported if a later step fails

    b.harness.up(b.sandbox, log=lambda line: b.log(f"  {line}"))
    result["first_converge_s"] = first_converge(b, direct)
    result["host_cost"] = host_cost(b)
    result["managed_files"] = render_the_managed_files(b, direct)
    ans_direct = b.ansible_inventory("ansible-direct")
    check_ansibles_first_run_then_warm_up(b, direct, ans_direct)

    if args.engine == "standin" and not args.no_first:  # instant starts: a first converge can be repeated
        compare(b, "first_services", FIRST_CONVERGE_LABEL, ours(b, direct, "first converge (ours)"),
                ansible(b, ans_direct, "first converge (Ansible)"),
                before=b.remove_services, check=b.check_converged)
    compare(b, "noop", "no-op", ours(b, direct, "no-op (ours)"), ansible(b, ans_direct, "no-op (Ansible)"))
    result["bare_pyinfra"] = compare_with_bare_pyinfra(b, direct)
    result["noop_profile"] = profile_our_no_op(b, direct)
    result["counts"] = count_commands_and_connections(b)
    result["latency"] = latency_growth(b, measure_latency(b), result["scenarios"]["noop"])
    if not args.no_file_change:
        compare(b, "one_file_changed", FILE_CHANGE_LABEL, ours(b, direct, "file change (ours)"),
                ansible(b, ans_direct, "file change (Ansible)"), before=b.inject_drift)
    if args.engine == "standin" and not args.no_rollout:  # instant starts: the overhead shows
        result["rollout"] = rollout_in_batches(b, direct)
    result["status"] = status_of_the_fleet(b, direct)
    return result


# --- before the scenarios ------------------------------------------------------------------------


def tool_versions(b: Bench) -> dict[str, str]:
    """vllm-fleet's, pyinfra's and ansible-core's versions (ansible-core installed when missing)."""
    import pyinfra

    from vllm_fleet import __version__

    versions = {"vllm_fleet": __version__, "pyinfra": pyinfra.__version__, "ansible_core": b.ensure_ansible()}
    b.log(f"vllm-fleet {versions['vllm_fleet']} with pyinfra {versions['pyinfra']} vs ansible-core "
          f"{versions['ansible_core']} ({' '.join(b.ansible_cmd[-1:])})")
    b.log("Ansible settings: " + ", ".join(f"{k}={v}" for k, v in ANSIBLE_SETTINGS.items())
          + f" (here {b.ansible_forks()})")
    return versions


def engine_wheelhouse(b: Bench) -> Path:
    """The wheelhouse the deploy installs from: the sandbox's real one, or with --engine standin the
    stand-in engine's, built from it (its vllm-router)."""
    from vllm_fleet.sandbox import assets
    from vllm_fleet.sandbox.hosts import cache_dir

    _tiny, wheelhouse = assets.prepare(log=lambda line: b.log(f"  {line}"))
    if b.args.engine == "standin":
        import standin_engine

        wheelhouse = standin_engine.build_standin_wheelhouse(cache_dir() / "bench" / "standin",
                                                             real_wheelhouse=wheelhouse)
        b.log(f"stand-in engine wheelhouse (SIMULATED vLLM): {wheelhouse}")
    return wheelhouse


def new_result(b: Bench, versions: dict[str, str]) -> dict[str, Any]:
    args = b.args
    return {"host_names": b.host_names, "engine": args.engine, "runs": args.runs, "versions": versions,
            "ansible_settings": ANSIBLE_SETTINGS, "scenarios": {}, "scenario_labels": {},
            "notes": NOTES + ([STANDIN_NOTE] if args.engine == "standin" else []),
            "noop_violations": b.violations, "api_key_in_output": b.leaks}


def first_converge(b: Bench, direct: Path) -> float:
    """Our deploy.py onto the hosts from nothing (timed, not compared); its seconds."""
    seconds, _ = b.run_pyinfra(direct, "first converge (ours)")
    b.log(f"first converge by deploy.py ({len(b.host_names)} hosts from nothing, not compared): {seconds:.1f} s")
    return seconds


def host_cost(b: Bench) -> dict[str, Any]:
    """What one converged host costs this machine: memory (PSS of every process in its cgroup) and
    disk (its overlay's upper layer: what it wrote over the shared base), median over the hosts."""
    from vllm_fleet.sandbox.hosts import _host_dir

    pss = [b.harness.host_pss_kib(b.sandbox, h) / 1024 for h in b.sandbox.hosts]
    disk = []
    for h in b.sandbox.hosts:
        du = subprocess.run(["du", "-sxm", str(_host_dir(b.sandbox, h) / "upper")], capture_output=True, text=True)
        disk.append(float(du.stdout.split()[0]) if du.returncode == 0 else float("nan"))
    cost = {"hosts": len(pss), "pss_mib": statistics.median(pss), "disk_mib": statistics.median(disk),
            "pss_mib_total": sum(pss), "disk_mib_total": sum(disk)}
    b.log(f"one converged host costs {cost['pss_mib']:.0f} MiB of memory (PSS) and {cost['disk_mib']:.0f} MiB of "
          f"disk (median of {cost['hosts']}); all of them {cost['pss_mib_total'] / 1024:.1f} GiB and "
          f"{cost['disk_mib_total'] / 1024:.1f} GiB")
    return cost


def render_the_managed_files(b: Bench, direct: Path) -> dict[str, int]:
    """Every file deploy.py manages, rendered by vllm-fleet, written for the playbook and checked
    byte for byte against the hosts (whose state is then the baseline); how many per host."""
    b.records = b.render(direct, "direct")
    b.write_rendered_files()
    b.baseline = b.host_state()
    expected = b.expected_files()
    mismatch = [f"{n}:{p}" for n, files in expected.items() for p, digest in files.items()
                if b.baseline[n]["files"].get(p) != digest]
    if mismatch:
        raise SystemExit("the rendered files differ from what deploy.py wrote on the hosts (the two tools "
                         f"would not manage the same files): {', '.join(mismatch)}")
    managed = {n: len(r["files"]) for n, r in b.records.items()}
    b.log("files rendered by vllm-fleet, byte-identical to the hosts': "
          + ", ".join(f"{n} {k}" for n, k in managed.items()))
    return managed


def check_ansibles_first_run_then_warm_up(b: Bench, direct: Path, ans_direct: Path) -> None:
    """The playbook's first run over the converged hosts changes nothing (else the bench stops);
    then one run of ours, not timed, as a warm-up."""
    seconds, text, _ = b.run_ansible(ans_direct, "Ansible first run")
    changed = changed_lines(text)
    if changed or any(r["changed"] for r in play_recap(text).values()):
        raise SystemExit("Ansible's first run over the converged hosts changed something (it must be a "
                         "no-op):\n" + "\n".join(changed[:20]))
    b.check_state("Ansible first run")
    b.run_pyinfra(direct, "warm-up (ours)")
    b.check_state("warm-up (ours)")
    b.log(f"Ansible's first run: a no-op ({seconds:.2f} s); warm-up done")


# --- the scenarios -------------------------------------------------------------------------------


def ours(b: Bench, inventory: Path, label: str) -> Callable[[], float]:
    """One timed run of our deploy.py."""
    return lambda: b.run_pyinfra(inventory, label)[0]


def ansible(b: Bench, inventory: Path, label: str) -> Callable[[], float]:
    """One timed run of the playbook."""
    return lambda: b.run_ansible(inventory, label)[0]


def compare(b: Bench, key: str, label: str, ours_run: Callable[[], float], ansible_run: Callable[[], float],
            **alternate_options) -> dict[str, Any]:
    """One scenario, ours against Ansible A B A B (Bench.alternate), recorded under `key`."""
    b.result["scenario_labels"][key] = label
    b.result["scenarios"][key] = b.alternate(label, ours_run, ansible_run, **alternate_options)
    return b.result["scenarios"][key]


def compare_with_bare_pyinfra(b: Bench, direct: Path) -> dict[str, Any]:
    """The other reference point: a bare pyinfra deploy of one unit + env file + daemon-reload + curl
    (bench/bare_pyinfra.py) over the same hosts and files; its no-op against ours, A B A B."""
    bare_input = b.tmp / "bare.json"
    bare_input.write_text(json.dumps({n: bare_spec(r, b.tmp / "files") for n, r in b.records.items()}))
    bare_env = dict(b.env, VLLM_FLEET_BENCH_BARE=str(bare_input))

    def bare(label: str) -> Callable[[], float]:
        return lambda: b.run_pyinfra(direct, label, deploy=BARE_DEPLOY, env=bare_env)[0]

    bare("bare pyinfra first run")()
    b.check_state("bare pyinfra first run")  # the same files: a no-op from the start
    return b.alternate(BARE_LABEL, ours(b, direct, "no-op (ours)"), bare("no-op (bare pyinfra)"),
                       names=("ours", "bare"))


def profile_our_no_op(b: Bench, direct: Path) -> dict[str, Any]:
    """Where our no-op's time goes: --runs more runs, the median of each phase."""
    runs = [b.profile_pyinfra(direct, "no-op profile (ours)") for _ in range(b.args.runs)]
    for _run in runs:
        b.check_state("no-op profile (ours)")
    phases = [label for label, _s in runs[0]["phases"]]
    profile = {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "cpu_s": statistics.median(r["cpu_s"] for r in runs),
        "phases": [(label, statistics.median(dict(r["phases"]).get(label, 0.0) for r in runs)) for label in phases]}
    b.log(f"our no-op, where the time goes (median of {len(runs)} runs, {profile['seconds']:.2f} s wall, "
          f"{profile['cpu_s']:.2f} s CPU on this machine): "
          + "; ".join(f"{label} {seconds:.2f} s" for label, seconds in profile["phases"]))
    profile["top"] = b.cprofile_pyinfra(direct, "no-op under cProfile (ours)")
    b.check_state("no-op under cProfile (ours)")
    b.log("our no-op under cProfile, the functions that took the most time of their own: " + "; ".join(
        f"{row['function']} {row['own_s']:.2f} s ({row['calls']} calls)" for row in profile["top"][:8]))
    return profile


# --- through a relay -----------------------------------------------------------------------------


def connections_since(relay: Relay, before: dict[str, int], hosts: list[str]) -> dict[str, int]:
    after = relay.connections()
    return {n: after.get(n, 0) - before.get(n, 0) for n in hosts}


def count_commands_and_connections(b: Bench) -> dict[str, Any]:
    """One no-op run of each tool with debug output, through a 0 ms relay that counts connections:
    commands, connections and transfers per host from the output, connections from the relay."""
    hosts = b.host_names
    relay = b.start_relay(0)
    tag = "relay-count"
    inv, known_hosts = b.relay_inventory(relay, tag)
    if b.render(inv, tag) != b.records:
        raise SystemExit("through the relay, vllm-fleet renders other files than directly (the relay "
                         "inventory changed the plan); not measured")
    ans = b.ansible_inventory(f"ansible-{tag}", relay.ports, known_hosts)
    endpoints = b.endpoints(relay.ports)
    counts: dict[str, Any] = {}
    before = relay.connections()
    _s, text = b.run_pyinfra(inv, "count (ours, --debug)", debug=True)
    b.check_state("count (ours)")
    counts["ours"] = pyinfra_counts(text, endpoints)
    counts["ours_relay"] = {n: {"connections": c} for n, c in connections_since(relay, before, hosts).items()}
    before = relay.connections()
    try:
        _s, text, masters = b.run_ansible(ans, "count (Ansible, -vvv)", verbose=True)
    except SystemExit as exc:  # ssh's own -v output is only for counting connections: do without it
        b.log(f"  the -vvv run with ssh -v failed ({str(exc).splitlines()[0]}); again without ssh -v")
        before = relay.connections()
        _s, text, masters = b.run_ansible(ans, "count (Ansible, -vvv)", verbose=True, ssh_verbosity=0)
    b.check_state("count (Ansible)")
    counts["ansible"] = ansible_counts(text, endpoints)
    counts["ansible_relay"] = {n: {"connections": c} for n, c in connections_since(relay, before, hosts).items()}
    counts["ansible_control_masters"] = masters
    relay.stop()
    for tool, name in (("ours", "ours"), ("ansible", "Ansible")):
        per = counts[tool]
        b.log(f"{name}, no-op, per host: commands " + ", ".join(f"{h} {per.get(h, {}).get('commands', 0)}"
                                                                for h in hosts)
              + "; SSH connections (debug output / relay) " + ", ".join(
                  f"{h} {per.get(h, {}).get('connections', 0)}/{counts[tool + '_relay'][h]['connections']}"
                  for h in hosts)
              + (f"; file transfers {sum(v.get('transfers', 0) for v in per.values())}"))
    return counts


def counting_connections(relay: Relay, run: Callable[[], float], hosts: list[str],
                         runs: list[dict[str, int]]) -> Callable[[], float]:
    """`run`, with the connections the relay saw during it appended to `runs`."""
    def counted() -> float:
        before = relay.connections()
        seconds = run()
        runs.append(connections_since(relay, before, hosts))
        return seconds
    return counted


def measure_latency(b: Bench) -> dict[str, Any]:
    """The same no-op through a relay per --latency-ms added round-trip time: each a scenario of its
    own, with the connections of every run."""
    latency: dict[str, Any] = {"rtt_ms": [], "ours": [], "ansible": [], "connections": {}}
    for rtt in b.args.latency_ms:
        relay = b.start_relay(rtt)
        tag = f"relay-{rtt:g}ms"
        inv, known_hosts = b.relay_inventory(relay, tag)
        ans = b.ansible_inventory(f"ansible-{tag}", relay.ports, known_hosts)
        conn_runs: dict[str, list[dict[str, int]]] = {"ours": [], "ansible": []}
        key = f"noop_relay_{rtt:g}ms"
        scenario = compare(b, key, f"no-op through a relay, +{rtt:g} ms RTT",
                           counting_connections(relay, ours(b, inv, f"{key} (ours)"), b.host_names, conn_runs["ours"]),
                           counting_connections(relay, ansible(b, ans, f"{key} (Ansible)"), b.host_names,
                                                conn_runs["ansible"]))
        relay.stop()
        latency["rtt_ms"].append(rtt)
        latency["ours"].append(scenario["ours"]["median"])
        latency["ansible"].append(scenario["ansible"]["median"])
        latency["connections"][f"{rtt:g}"] = conn_runs
    return latency


def latency_growth(b: Bench, latency: dict[str, Any], noop: dict[str, Any]) -> dict[str, Any]:
    """How the no-op time grows with latency, against the 0 ms relay (the same path, no added
    delay), or without one against the direct no-op: added seconds and the round trips in sequence
    they amount to."""
    if 0 in latency["rtt_ms"]:
        i0 = latency["rtt_ms"].index(0)
        base = {"label": "relay +0 ms", "ours": latency["ours"][i0], "ansible": latency["ansible"][i0]}
    else:
        base = {"label": "direct (no relay)", "ours": noop["ours"]["median"], "ansible": noop["ansible"]["median"]}
    latency["base"] = base
    latency["growth"] = {}
    for i, rtt in enumerate(latency["rtt_ms"]):
        if rtt == 0:
            continue
        growth = {tool: {"added_s": latency[tool][i] - base[tool],
                         "round_trips": round_trips(base[tool], latency[tool][i], rtt)}
                  for tool in ("ours", "ansible")}
        latency["growth"][f"{rtt:g}"] = growth
        b.log(f"latency: +{rtt:g} ms RTT against {base['label']}: ours {growth['ours']['added_s']:+.2f} s "
              f"(= {growth['ours']['round_trips']:.0f} round trips in sequence), Ansible "
              f"{growth['ansible']['added_s']:+.2f} s (= {growth['ansible']['round_trips']:.0f})")
    return latency


# --- operating the fleet: rollout and status ------------------------------------------------------


def start_up_seconds(b: Bench) -> dict[str, float]:
    """Each host's instance start-up in its latest start: systemd's ActiveEnterTimestampMonotonic -
    InactiveExitTimestampMonotonic of its unit (the start job ends once the engine answers /health)."""
    def one(name: str) -> tuple[str, float]:
        unit = b.records[name]["instances"][0]["unit"]
        proc = b.sandbox.run(name, "systemctl show -p InactiveExitTimestampMonotonic -p "
                                   f"ActiveEnterTimestampMonotonic {shlex.quote(unit)}", timeout=60)
        values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
        try:
            seconds = (int(values["ActiveEnterTimestampMonotonic"])
                       - int(values["InactiveExitTimestampMonotonic"])) / 1e6
        except (KeyError, ValueError):
            raise SystemExit(f"{name}: could not read {unit}'s start timestamps: "
                             f"{proc.stdout.strip()} {proc.stderr.strip()}") from None
        return name, seconds
    with ThreadPoolExecutor(len(b.records)) as pool:
        return dict(pool.map(one, sorted(b.records)))


def batch_figures(hosts: list[dict[str, Any]], batch_size: int, run_end: float,
                  start_up: dict[str, float]) -> list[dict[str, Any]]:
    """Per batch of a rollout's --json report (its hosts in rollout order): its span (its first
    host's start to the next batch's, the last batch's to the run's end: snapshots, drain, deploy,
    verification, the gateway's restore), the slowest instance start-up in it, and the overhead:
    the span less that start-up, in seconds and as a share of the span."""
    batches = [hosts[i:i + batch_size] for i in range(0, len(hosts), batch_size)]
    starts = [min(h["started"] for h in batch) for batch in batches] + [run_end]
    figures = []
    for i, batch in enumerate(batches):
        span = starts[i + 1] - starts[i]
        slowest = max(start_up[h["name"]] for h in batch)
        figures.append({"hosts": len(batch), "span_s": span, "slowest_start_up_s": slowest,
                        "overhead_s": span - slowest, "overhead_pct": 100 * (span - slowest) / span})
    return figures


def rollout_in_batches(b: Bench, direct: Path) -> dict[str, Any]:
    """`vllm-fleet rollout --batch 25%` of a change that restarts every instance (ROLLOUT_CHANGE),
    then back: --runs of each, every host reported updated by each, and every managed file as
    before once back; per run its time, CPU and peak RSS, per batch batch_figures."""
    from vllm_fleet.commands.rollout import parse_batch

    variant = b.pyinfra_inventory("inv-rollout", instance_changes=ROLLOUT_CHANGE)
    size = parse_batch("25%", len(b.host_names))
    runs: list[dict[str, Any]] = []
    for i in range(b.args.runs):
        for inventory, what in ((variant, f"to {ROLLOUT_CHANGE}"), (direct, "back")):
            label = f"rollout {what} (run {i + 1})"
            started = time.time()
            seconds, out = b.run_fleet_command(["rollout", str(inventory), "--batch", "25%", "--json"], label)
            report = json.loads(out)["hosts"]
            not_updated = [h["name"] for h in report if h["state"] != "updated"]
            if not_updated:
                raise SystemExit(f"{label}: not updated: {', '.join(not_updated)}")
            batches = batch_figures(report, size, started + seconds, start_up_seconds(b))
            runs.append({"seconds": seconds, **b.last_usage, "batches": batches})
            b.log(f"  {label}: {seconds:.1f} s, {len(batches)} batches, overhead per batch "
                  + ", ".join(f"{x['overhead_s']:.1f} s ({x['overhead_pct']:.0f} %)" for x in batches))
    # Rolled back to the inventory's own config: every managed file as before the rollouts (only
    # the units' MainPIDs are new), which becomes the baseline of what follows.
    before, now = b.baseline, b.host_state()
    differ = [f"{n}: {p}" for n in before for p, digest in before[n]["files"].items()
              if now[n]["files"].get(p) != digest]
    if differ:
        b.violations.append("after the rollouts back: files not as before: " + ", ".join(differ))
        b.log(f"  WARNING: after the rollouts back, files not as before: {', '.join(differ[:10])}")
    b.baseline = now
    overheads = [x["overhead_s"] for r in runs for x in r["batches"]]
    spans = [x["span_s"] for r in runs for x in r["batches"]]
    result = {"label": ROLLOUT_LABEL, "batch_size": size, "rollouts": runs,
              **summary([r["seconds"] for r in runs]), **usage_summary(runs),
              "overhead_per_batch_s": statistics.median(overheads),
              "span_per_batch_s": statistics.median(spans),
              "start_up_s": statistics.median(x["slowest_start_up_s"] for r in runs for x in r["batches"])}
    b.log(f"{ROLLOUT_LABEL}: {fmt_summary(result)}; per batch (median) {result['span_per_batch_s']:.1f} s, "
          f"of which {result['overhead_per_batch_s']:.1f} s overhead beyond the slowest start-up "
          f"({result['start_up_s']:.1f} s, the stand-in's)")
    return result


def status_of_the_fleet(b: Bench, direct: Path) -> dict[str, Any]:
    """`vllm-fleet status --json` over every host, --runs times; each run must find every host and
    instance healthy (exit 0)."""
    times, usage = [], []
    for i in range(b.args.runs):
        seconds, out = b.run_fleet_command(["status", str(direct), "--json"], f"status (run {i + 1})")
        hosts = json.loads(out)["hosts"]
        if sorted(h["name"] for h in hosts) != sorted(b.host_names):
            raise SystemExit(f"status (run {i + 1}) reported {len(hosts)} hosts of {len(b.host_names)}")
        times.append(seconds)
        usage.append(b.last_usage)
    result = {"label": STATUS_LABEL, **summary(times), **usage_summary(usage)}
    b.log(f"{STATUS_LABEL}: {fmt_summary(result)}")
    return result
