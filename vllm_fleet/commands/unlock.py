"""`vllm-fleet unlock INVENTORY --limit HOST`: break the deploy lock of hosts whose deploy is gone.

The lock itself (how it is held, who holds it, how it is broken) is vllm_fleet/connect/lock.py's; this
command reaches the hosts with pyinfra's connection (commands/connection.py) and runs its
`break_command` there.
"""

from __future__ import annotations

import argparse
import sys

from vllm_fleet.config import inventory_rows, limited_rows, read_pyinfra_inventory, split_names
from vllm_fleet.connect.lock import OWNER_FILE, break_command, describe, parse_busy
from vllm_fleet.connect.remote import run


def main(argv: list[str]) -> int:
    """`vllm-fleet unlock INVENTORY --limit HOST`: break a deploy lock whose holder is gone."""
    parser = argparse.ArgumentParser(
        prog="vllm-fleet unlock", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Break the deploy lock of hosts whose deploy is gone (its workstation crashed or lost the
network). A deploy or rollout holds a lock on each of its hosts while it runs, and refuses a
host whose lock another workstation holds. Over SSH, this prints who held each host's lock and
frees it. A deploy that is still running loses its lock: check first.
Exit status: 0 every lock free, 1 a host unreachable or its lock not broken.""",
        epilog="""\
examples:
  vllm-fleet unlock inventory/prod.py --limit gpu-h100-01
      free one host's lock""")
    parser.add_argument("inventory", help="the pyinfra inventory file, e.g. inventory/prod.py")
    parser.add_argument("--limit", action="append", required=True, metavar="NAMES",
                        help="host or group names (comma-separated; repeatable); required, so no host is "
                             "unlocked by accident")
    args = parser.parse_args(argv)
    from vllm_fleet.commands import connection
    from vllm_fleet.commands.connection import connected

    connection.install()  # gevent: only once a run reaches hosts

    # Read once, for the names and the connections both; a host is named from the inventory, never
    # validated: one whose data does not parse can still have its lock broken.
    inventory = read_pyinfra_inventory(args.inventory)
    names = [name for name, _d, _g in limited_rows(inventory_rows(inventory), split_names(args.limit),
                                                   args.inventory)]
    failed = 0
    with connected(inventory, names) as (_state, active):
        for name in names:
            if active[name] is None:
                print(f"{name}: unreachable over SSH; nothing done", file=sys.stderr)
                failed += 1
                continue
            ok, holder, _ = run(active[name], f"cat {OWNER_FILE} 2>/dev/null || true", timeout=30)
            ok, out, err = run(active[name], break_command(), timeout=30)
            who = describe(parse_busy(holder.splitlines())) if holder.strip() else "nobody"
            if ok and "FREE" in out:
                print(f"{name}: deploy lock free (was held by {who})")
            else:
                print(f"{name}: could not break the lock held by {who}: {err.strip()[-300:]}",
                      file=sys.stderr)
                failed += 1
    return 1 if failed else 0
