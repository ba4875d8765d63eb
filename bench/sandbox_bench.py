"""Sandbox bench: time to ready for 3 hosts (from nothing when the base is not cached, then with the base
cached) and memory (PSS) per idle host. Run as root: `python bench/sandbox_bench.py [--cold]`.

--cold uses a fresh, temporary cache dir, so the base is built from nothing (needs the Debian mirror).
--serving measures hosts that are up and serving now (after `bin/demo --keep`): PSS per host and
whether its vLLM unit is active; it starts and stops nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from benchlib import SANDBOX_INVENTORY, cpu_sandbox

IDLE_SETTLE_S = 5.0  # let boot-time jobs finish before measuring an idle host


def timed_up(label: str) -> None:
    """Bring the 3 hosts up, print time to ready and PSS per idle host, always bring them down."""
    from vllm_fleet.sandbox import harness

    sandbox = cpu_sandbox()
    start = time.monotonic()
    try:
        statuses = harness.up(sandbox, log=lambda msg: print(f"  {msg}"))
        ready = time.monotonic() - start
        states = ", ".join(f"{s.name}={s.state}" for s in statuses)
        print(f"{label}: 3 hosts ready in {ready:.1f} s ({states})")
        time.sleep(IDLE_SETTLE_S)
        for host in sandbox.hosts:
            print(f"  idle host {host.name}: PSS {harness.host_pss_kib(sandbox, host) / 1024:.1f} MiB")
    finally:
        harness.down(sandbox)


def measure_serving() -> None:
    """PSS of each running sandbox host, with the state of its vLLM unit (read-only)."""
    from vllm_fleet.sandbox import harness, hosts

    sandbox = hosts.load(SANDBOX_INVENTORY)
    for status, host in zip(harness.status(sandbox), sandbox.hosts, strict=True):
        if not status.running:
            print(f"  {host.name}: not running")
            continue
        unit = sandbox.run(host, "systemctl is-active vllm-tiny.service").stdout.strip()
        label = "vLLM-serving" if unit == "active" else "idle"
        print(f"  {label} host {host.name}: PSS {harness.host_pss_kib(sandbox, host) / 1024:.1f} MiB "
              f"(vllm-tiny.service {unit})")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", action="store_true", help="build the base from nothing in a temporary cache")
    parser.add_argument("--serving", action="store_true", help="measure the running sandbox only")
    args = parser.parse_args(argv)
    if args.serving:
        measure_serving()
        return 0
    tmp_cache = None
    if args.cold:
        # The inventory reads VLLM_FLEET_CACHE too, so keys and known_hosts follow into the temp cache.
        tmp_cache = tempfile.mkdtemp(prefix="vllm-fleet-bench-cache.")
        os.environ["VLLM_FLEET_CACHE"] = tmp_cache
    from vllm_fleet.sandbox import harness, image

    try:
        if not image.base_dir().is_dir():
            timed_up("from nothing (base built, target < 240 s)")
        timed_up("base cached (target < 15 s)")
    except harness.SandboxError as e:
        print(f"sandbox bench: {e}", file=sys.stderr)
        return 2
    finally:
        if tmp_cache:
            shutil.rmtree(tmp_cache, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
