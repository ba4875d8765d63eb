"""Rollout bench: the first converge split by step, and a rollout's timeline per host.

Run as root (it boots the 3 CPU sandbox hosts and stops them; the sandbox must be free):

    sudo .venv/bin/python bench/rollout_bench.py [--json]

(estimated 8-15 minutes on the 2-core machine: the first converge ~3 min, the rollout 3 restarts)

1. First converge of the 3 CPU hosts from nothing (`pyinfra -y INVENTORY deploy.py`), each host's SSH
   through bench/latency_relay.py at +0 ms, which counts the bytes the workstation sends per host
   (stats rewritten every 0.5 s, read at each "Starting operation" line). The output is read as it
   comes, each line timestamped; the split by step comes from pyinfra's "--> Starting operation:"
   lines, each host's status line ("[host] Success") and our progress lines ("environment: wheelhouse
   pushed and unpacked in N s", "environment: ... built in N s", "verified NAME: ... (N s to healthy)").
   Steps: transfer (the wheelhouse push; 0 with an index), environment install (the rest of the
   environment operation), model sync, OS packages, first start (start + verification), other
   (connect, facts and plan before the first operation; files, users, front, gateway).
   Timings are through the relay (a Python process copying every byte): the transfer may be slower
   than direct SSH.
2. `vllm-fleet rollout` (batch 1, inventory order) of a variant inventory that changes every
   instance's max_num_seqs (every instance restarts), pyinfra's log lines enabled (the same
   rollout.main, with pyinfra's CLI log handler at INFO). Per host: batch start (then the snapshot),
   files written (the start of the Restart operation: every file operation is done), restart issued
   (the host's status line of that operation), healthy (the verification's start + its
   seconds_to_healthy), verified (the "verified NAME" line), done (rollout's "HOST: updated ... and
   verified" line). The service's own start-up time: systemd's ActiveEnterTimestampMonotonic -
   InactiveExitTimestampMonotonic of the unit (its start job ends when vLLM answers /health),
   read afterwards over the harness's sandbox.run. Overhead = host's time in the rollout (batch
   line to done line) - service start-up, in s and %; target <= 10%.

Prints the two tables (Markdown, for the README); --json: one JSON document on stdout (progress on
stderr). Everything it starts (relay, pyinfra, rollout) is stopped by PID; the hosts are stopped at
the end.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import CPU_HOSTS, REPO, Relay, deploy_env, print_json, run_to_the_end, stop_process
from converge.settings import DEPLOY_NAME
from converge.machine import Bench  # the sandbox, its hosts, temp dir, API key, inventories, cleanup

TARGET_OVERHEAD_PCT = 10.0
STEPS = ["transfer", "environment install", "model sync", "OS packages", "first start", "other"]
VARIANT = {"max_num_seqs": 16}  # as tests/sandbox/test_rollout_sandbox.py: every instance restarts
ROLLOUT_WRAPPER = ("import logging, sys; from pyinfra_cli.log import setup_logging; setup_logging(logging.INFO); "
                   "from vllm_fleet.commands.rollout import main; sys.exit(main(sys.argv[1:]))")

# --- pure helpers (tests/bench/test_rollout_bench.py) -------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The operation's own name: after the packaged deploy's, which pyinfra puts before each of its operations.
_OP = re.compile(r"^\s*--> Starting (?:[\w ,]+ )?operation:\s*(?:" + re.escape(DEPLOY_NAME) + r" \| )?(?P<name>.*?)\s*$")
_HOST = re.compile(r"^\s*\[(?P<host>[^\]\s]+)\]\s+(?P<rest>.*?)\s*$")
_STATUS = re.compile(r"^(Success|No changes|Error)\b")
_PUSHED = re.compile(r"environment: wheelhouse pushed and unpacked in ([\d.]+) s")
_BUILT = re.compile(r"environment: .* built in ([\d.]+) s")
_INDEX = re.compile(r"no vllm_wheelhouse: installing from")
_WHEELS = re.compile(r"environment: pushing wheelhouse \S+ \((\d+) MiB")
_VERIFIED = re.compile(r"verified (?P<inst>\S+): .*\((?P<s>[\d.]+|None) s to healthy\)")
_BATCH = re.compile(r"^batch \d+: (?P<hosts>.+?)\s*$")
_DONE = re.compile(r"^(?P<host>\S+): (?P<state>updated|unchanged|failed)\b")
_RESTART_OP = re.compile(r"^Restart (?P<unit>vllm-\S+\.service) \(its config")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def step_of(op_name: str) -> str:
    """The step of the split an operation belongs to ('environment' is split later)."""
    if op_name.startswith("Sync model"):
        return "model sync"
    if op_name.startswith("vLLM environment"):
        return "environment"
    if op_name.startswith("OS packages"):
        return "OS packages"
    if re.match(r"(Restart|Start) vllm-\S+\.service", op_name) or op_name.startswith("Verify instances"):
        return "first start"
    return "other"


def parse_operations(lines: list[tuple[float, str]], end: float) -> dict[str, Any]:
    """pyinfra output lines (seconds since the start, text) -> operations with their start, wall time
    (to the next operation's start) and each host's time (to its status line), plus the progress
    lines' figures per host."""
    ops: list[dict[str, Any]] = []
    per_host: dict[str, dict[str, Any]] = {}
    for t, raw in lines:
        text = strip_ansi(raw).rstrip()
        m = _OP.match(text)
        if m:
            ops.append({"name": m.group("name"), "step": step_of(m.group("name")), "t0": t, "hosts": {}})
            continue
        m = _HOST.match(text)
        if not m:
            continue
        host, rest = m.group("host"), m.group("rest")
        info = per_host.setdefault(host, {})
        if ops and _STATUS.match(rest) and host not in ops[-1]["hosts"]:
            ops[-1]["hosts"][host] = t - ops[-1]["t0"]
        if (p := _PUSHED.search(rest)):
            info["push_s"] = float(p.group(1))
        elif (p := _BUILT.search(rest)):
            info["build_s"] = float(p.group(1))
        elif _INDEX.search(rest):
            info["index"] = True
        elif (p := _WHEELS.search(rest)):
            info["wheelhouse_mib"] = int(p.group(1))
        elif (p := _VERIFIED.search(rest)):
            info.setdefault("seconds_to_healthy", {})[p.group("inst")] = (
                None if p.group("s") == "None" else float(p.group("s")))
            info["verified_t"] = t
    for i, op in enumerate(ops):
        op["wall_s"] = (ops[i + 1]["t0"] if i + 1 < len(ops) else end) - op["t0"]
    return {"ops": ops, "hosts": per_host, "first_op_t": ops[0]["t0"] if ops else end, "end": end}


def bytes_at(samples: list[tuple[float, dict[str, int]]], t: float) -> dict[str, int]:
    """The last byte counts sampled at or before t ({} before the first)."""
    out: dict[str, int] = {}
    for ts, counts in samples:
        if ts > t:
            break
        out = counts
    return out


def converge_split(parsed: dict[str, Any], hosts: list[str],
                   samples: list[tuple[float, dict[str, int]]] | None = None,
                   final_bytes: dict[str, int] | None = None) -> dict[str, Any]:
    """Seconds per step (wall, and per host) and, with byte samples, bytes sent per step per host.
    'environment' splits into transfer (the push's own figure) and environment install (the rest)."""
    samples = samples or []
    wall = {s: 0.0 for s in STEPS}
    host_s = {h: {s: 0.0 for s in STEPS} for h in hosts}
    host_b = {h: {s: 0 for s in STEPS} for h in hosts}
    wall["other"] += parsed["first_op_t"]  # connect, facts, plan
    for h in hosts:
        host_s[h]["other"] += parsed["first_op_t"]
    ops = parsed["ops"]
    for i, op in enumerate(ops):
        t1 = ops[i + 1]["t0"] if i + 1 < len(ops) else parsed["end"]
        b0, b1 = bytes_at(samples, op["t0"]), (final_bytes if i + 1 == len(ops) and final_bytes is not None
                                               else bytes_at(samples, t1))
        if op["step"] == "environment":
            pushes = [parsed["hosts"].get(h, {}).get("push_s", 0.0) for h in hosts]
            transfer = min(max(pushes, default=0.0), op["wall_s"])
            wall["transfer"] += transfer
            wall["environment install"] += op["wall_s"] - transfer
        else:
            wall[op["step"]] += op["wall_s"]
        for h in hosts:
            took = op["hosts"].get(h, 0.0)
            sent = max(0, b1.get(h, 0) - b0.get(h, 0))
            if op["step"] == "environment":
                push = min(parsed["hosts"].get(h, {}).get("push_s", 0.0), took)
                host_s[h]["transfer"] += push
                host_s[h]["environment install"] += took - push
                host_b[h]["transfer"] += sent  # the wheelhouse: the environment operation's bytes
            else:
                host_s[h][op["step"]] += took
                host_b[h][op["step"]] += sent
    if final_bytes is not None:  # what the samples missed (before the first op, the connection's end)
        for h in hosts:
            host_b[h]["other"] += max(0, final_bytes.get(h, 0) - sum(host_b[h].values()))
    info = parsed["hosts"]
    return {"wall_s": {k: round(v, 1) for k, v in wall.items()},
            "host_s": {h: {k: round(v, 1) for k, v in d.items()} for h, d in host_s.items()},
            "host_bytes": host_b if (samples or final_bytes) else None,
            "total_bytes": {h: (final_bytes or {}).get(h) for h in hosts} if final_bytes is not None else None,
            "source": {h: ("index" if info.get(h, {}).get("index") else
                           f"wheelhouse {info[h]['wheelhouse_mib']} MiB" if "wheelhouse_mib" in info.get(h, {})
                           else "wheelhouse (on the host already)" if h in info else "?") for h in hosts},
            "seconds_to_healthy": {h: info.get(h, {}).get("seconds_to_healthy") for h in hosts},
            "total_s": round(parsed["end"], 1)}


def rollout_timeline(lines: list[tuple[float, str]], hosts: list[str]) -> dict[str, dict[str, Any]]:
    """`vllm-fleet rollout` output with pyinfra's log lines (seconds since the start, text) -> per
    host: batch, files_written, restart_issued, healthy, verified, done (seconds since the start)."""
    out = {h: {"batch": None, "files_written": None, "restart_issued": None, "verify_start": None,
               "seconds_to_healthy": None, "healthy": None, "verified": None, "done": None, "state": None,
               "unit": None} for h in hosts}
    batch: list[str] = []
    op_name = None
    for t, raw in lines:
        text = strip_ansi(raw).rstrip()
        if (m := _BATCH.match(text)):
            batch = [h.strip() for h in m.group("hosts").split(",")]
            for h in batch:
                if h in out:
                    out[h]["batch"] = t
            continue
        if (m := _OP.match(text)):
            op_name = m.group("name")
            if (r := _RESTART_OP.match(op_name)):
                for h in batch:
                    if h in out and out[h]["files_written"] is None:
                        out[h]["files_written"], out[h]["unit"] = t, r.group("unit")
            elif op_name.startswith("Verify instances"):
                for h in batch:
                    if h in out and out[h]["verify_start"] is None:
                        out[h]["verify_start"] = t
            continue
        if (m := _HOST.match(text)) and m.group("host") in out:
            h, rest, rec = m.group("host"), m.group("rest"), out[m.group("host")]
            if op_name and _RESTART_OP.match(op_name) and rest.startswith("Success") and rec["restart_issued"] is None:
                rec["restart_issued"] = t
            if (v := _VERIFIED.search(rest)) and rec["verified"] is None:
                rec["verified"] = t
                if v.group("s") != "None":
                    rec["seconds_to_healthy"] = float(v.group("s"))
                    if rec["verify_start"] is not None:
                        rec["healthy"] = rec["verify_start"] + rec["seconds_to_healthy"]
            continue
        if (m := _DONE.match(text)) and m.group("host") in out and out[m.group("host")]["done"] is None:
            out[m.group("host")]["done"], out[m.group("host")]["state"] = t, m.group("state")
    return out


def parse_systemd_startup(text: str) -> float | None:
    """`systemctl show -p InactiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic UNIT` ->
    seconds of the unit's last start job (None when either is unset)."""
    props = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    try:
        begin, end = int(props["InactiveExitTimestampMonotonic"]), int(props["ActiveEnterTimestampMonotonic"])
    except (KeyError, ValueError):
        return None
    if not begin or not end or end < begin:
        return None
    return (end - begin) / 1e6


def overhead(total_s: float | None, startup_s: float | None) -> dict[str, Any]:
    if total_s is None or startup_s is None or total_s <= 0:
        return {"seconds": None, "pct": None, "met": None}
    over = total_s - startup_s
    pct = 100.0 * over / total_s
    return {"seconds": round(over, 1), "pct": round(pct, 1), "met": pct <= TARGET_OVERHEAD_PCT}


def rollout_rows(timeline: dict[str, dict[str, Any]], startup: dict[str, float | None]) -> dict[str, Any]:
    """Per host: times relative to its batch start, total, start-up and overhead."""
    rows = {}
    for h, ev in timeline.items():
        b = ev["batch"]
        rel = {k: (round(ev[k] - b, 1) if ev[k] is not None and b is not None else None)
               for k in ("files_written", "restart_issued", "healthy", "verified", "done")}
        total = rel["done"]
        derived = (round(ev["healthy"] - ev["restart_issued"], 1)
                   if ev["healthy"] is not None and ev["restart_issued"] is not None else None)
        service = startup.get(h)
        used = service if service is not None else derived
        rows[h] = {**rel, "state": ev["state"], "unit": ev["unit"], "total_s": total,
                   "startup_systemd_s": None if service is None else round(service, 1),
                   "startup_derived_s": derived, "seconds_to_healthy": ev["seconds_to_healthy"],
                   "startup_used": "systemd" if service is not None else "derived",
                   "overhead": overhead(total, used)}
    return rows


def _f(v: Any, unit: str = "") -> str:
    return "-" if v is None else f"{v:.1f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def markdown_tables(result: dict[str, Any]) -> str:
    hosts = result["host_names"]
    out = []
    split = result.get("converge")
    if split:
        out.append("| first converge, 3 hosts from nothing | wall s | " + " | ".join(f"{h} s / MiB sent" for h in hosts)
                   + " |\n|---|---|" + "---|" * len(hosts))
        for step in STEPS:
            cells = []
            for h in hosts:
                b = (split["host_bytes"] or {}).get(h, {}).get(step) if split["host_bytes"] else None
                cells.append(f"{_f(split['host_s'][h][step])} / {_f(None if b is None else b / 2**20)}")
            out.append(f"| {step} | {_f(split['wall_s'][step])} | " + " | ".join(cells) + " |")
        tot = split["total_bytes"] or {}
        out.append(f"| total | {_f(split['total_s'])} | " + " | ".join(
            f"{_f(None if tot.get(h) is None else tot[h] / 2**20)} MiB sent" for h in hosts) + " |")
        out.append("")
    rows = result.get("rollout")
    if rows:
        out.append("| rollout (batch 1, max_num_seqs changed), s from the host's batch start | files written | "
                   "restart issued | healthy | verified | done | vLLM start-up | overhead |\n"
                   "|---|---|---|---|---|---|---|---|")
        for h in hosts:
            r = rows.get(h)
            if not r:
                continue
            o = r["overhead"]
            start = r["startup_systemd_s"] if r["startup_used"] == "systemd" else r["startup_derived_s"]
            out.append(f"| {h} | {_f(r['files_written'])} | {_f(r['restart_issued'])} | {_f(r['healthy'])} | "
                       f"{_f(r['verified'])} | {_f(r['done'])} | {_f(start)} ({r['startup_used']}) | "
                       f"{_f(o['seconds'])} s ({_f(o['pct'])} %){'' if o['met'] is None else ' ok' if o['met'] else ' over'} |")
        out.append(f"\nOverhead = the host's time in the rollout - its vLLM start-up; target <= {TARGET_OVERHEAD_PCT:g} %.")
    return "\n".join(out) + "\n"


# --- the machine side ---------------------------------------------------------------------------


def stream(argv: list[str], env: dict[str, str], log, label: str, timeout: float,
           on_line=None) -> tuple[int, list[tuple[float, str]], str, float]:
    """Run argv (started and, on timeout, ended by its PID); stderr lines timestamped as they
    arrive (stdout too, merged, unless kept apart). Returns (rc, lines, stdout, seconds)."""
    start = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, bufsize=1)
    lines: list[tuple[float, str]] = []
    out_chunks: list[str] = []
    lock = threading.Lock()

    def read_out() -> None:
        for chunk in proc.stdout:
            out_chunks.append(chunk)

    reader = threading.Thread(target=read_out, daemon=True)
    reader.start()
    try:
        for raw in proc.stderr:
            t = time.monotonic() - start
            with lock:
                lines.append((t, raw.rstrip("\n")))
            if on_line:
                on_line(t, raw)
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{label}: over {timeout:.0f} s")
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - start)))
    except BaseException:
        stop_process(proc, grace_s=10)
        raise
    finally:
        reader.join(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    return proc.returncode, lines, "".join(out_chunks), time.monotonic() - start


class ByteRelay(Relay):
    """The relay at +0 ms with --save-every: bytes readable while connections are open."""

    def __init__(self, targets: dict[str, tuple[str, int]], workdir: Path, save_every: float = 0.5):
        super().__init__(0, targets, workdir, save_every=save_every)

    def bytes_up(self) -> dict[str, int]:
        try:
            return dict(json.loads(self.stats_path.read_text())["bytes_up"])
        except (OSError, ValueError, KeyError):
            return {}

    def open_connections(self) -> int:
        try:
            return sum(json.loads(self.stats_path.read_text())["open"].values())
        except (OSError, ValueError, KeyError):
            return -1


def run_bench(b, args) -> dict[str, Any]:
    import pyinfra

    from vllm_fleet import __version__
    from vllm_fleet.sandbox import assets

    sys.path.insert(0, str(REPO / "tests"))
    from support.fleet_helpers import variant_inventory

    log = b.log
    _tiny, wheelhouse = assets.prepare(log=lambda line: log(f"  {line}"))
    b.env = deploy_env(b.api_key, wheelhouse)
    result: dict[str, Any] = {"host_names": CPU_HOSTS, "versions": {"vllm_fleet": __version__,
                                                                    "pyinfra": pyinfra.__version__},
                              "api_key_in_output": b.leaks}
    b.result = result
    b.harness.up(b.sandbox, log=lambda line: log(f"  {line}"))

    # 1. First converge through the byte-counting relay.
    relay = ByteRelay({n: (h.address, 22) for n, h in b.hosts.items()}, b.tmp)
    b.relays.append(relay)
    inv, _known_hosts = b.relay_inventory(relay, "bytes")
    samples: list[tuple[float, dict[str, int]]] = [(0.0, {})]

    def sample(t: float, raw: str) -> None:
        if "Starting" in raw and "operation" in raw:
            samples.append((t, relay.bytes_up()))
        if args.verbose:
            log("  | " + strip_ansi(raw.rstrip("\n")))

    log("first converge (3 hosts from nothing) through the +0 ms byte-counting relay ...")
    argv = [sys.executable, "-m", "pyinfra", "-y", str(inv), "deploy.py"]
    rc, lines, stdout, seconds = stream(argv, b.env, log, "first converge", 3600, sample)
    text = stdout + "\n".join(t for _, t in lines)
    b.check_output("first converge", text)
    if rc != 0:
        raise SystemExit(f"first converge failed (exit {rc}):\n{text[-4000:]}")
    deadline = time.monotonic() + 10  # the connections' close is saved by the relay
    while relay.open_connections() > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    final = relay.bytes_up()
    relay.stop()
    parsed = parse_operations(lines, seconds)
    result["converge"] = converge_split(parsed, CPU_HOSTS, samples, final)
    result["converge"]["operations"] = [{k: op[k] for k in ("name", "step", "t0", "wall_s", "hosts")}
                                        for op in parsed["ops"]]
    log(f"first converge: {seconds:.1f} s; sent per host: "
        + ", ".join(f"{h} {final.get(h, 0) / 2**20:.1f} MiB" for h in CPU_HOSTS))

    # 2. The rollout: every instance's engine config changed, so every instance restarts.
    vdir = b.tmp / "inv-variant"
    vdir.mkdir()
    variant = variant_inventory(vdir, every=VARIANT)
    log(f"rollout of {VARIANT} (every instance restarts), batch 1 ...")
    argv = [sys.executable, "-c", ROLLOUT_WRAPPER, variant, "--json"]
    rc, lines, stdout, seconds = stream(
        argv, b.env, log, "rollout", 3600,
        (lambda t, raw: log("  | " + strip_ansi(raw.rstrip("\n")))) if args.verbose else None)
    b.check_output("rollout", stdout + "\n".join(t for _, t in lines))
    try:
        report = json.loads(stdout)
    except ValueError:
        report = {}
    if rc != 0:
        raise SystemExit(f"rollout failed (exit {rc}):\n" + "\n".join(t for _, t in lines)[-4000:])
    timeline = rollout_timeline(lines, CPU_HOSTS)
    startup: dict[str, float | None] = {}
    for h in CPU_HOSTS:
        unit = timeline[h]["unit"] or "vllm-tiny.service"
        proc = b.sandbox.run(h, "systemctl show -p InactiveExitTimestampMonotonic -p ActiveEnterTimestampMonotonic "
                                f"-p NRestarts {unit}", timeout=30)
        startup[h] = parse_systemd_startup(proc.stdout)
    rows = rollout_rows(timeline, startup)
    for h, row in rows.items():
        json_row = next((r for r in report.get("hosts", []) if r.get("name") == h), {})
        row["rollout_seconds"] = json_row.get("seconds")
        row["rollout_state"] = json_row.get("state")
    result["rollout"] = rows
    result["rollout_s"] = round(seconds, 1)
    result["rollout_timeline_abs"] = timeline
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout, progress on stderr")
    parser.add_argument("--verbose", action="store_true", help="echo the deploy's and the rollout's lines")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from vllm_fleet.sandbox import image

    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    image.require_root()
    bench = Bench(args, out)
    result = run_to_the_end(bench, lambda: run_bench(bench, args),
                            lambda so_far: print(markdown_tables(so_far), file=out),
                            "sandbox hosts stopped, relay stopped, temporary inventories removed")
    print("", file=out)
    print(markdown_tables(result), file=out)
    print("API key in any captured output: " + (", ".join(result["api_key_in_output"]) or "no"), file=out)
    if args.json:
        print_json(result)
    return 1 if result["api_key_in_output"] else 0


if __name__ == "__main__":
    sys.exit(main())
