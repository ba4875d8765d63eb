"""`vllm-fleet check INVENTORY [--limit HOST] [--json]`: everything that can be wrong before a host is
reached, at once, without connecting to any host.

It reports, each problem naming its host, key and fix (never a secret's value):
- every host's data that does not parse, and what only the fleet can check (config.check_fleet):
  a client model that no instance serves (with the served name meant: an instance's name is the
  usual slip), two secrets read from one variable or file, the gateway, the node groups;
- every secret missing, unreadable, unsafe or weak, of every host and client
  (fleet_secrets.check_secrets): key files and TLS files read safely, TLS pairs matched;
- group-data files that match no group of the inventory (config.unused_group_data);

then what the fleet will be (fleet_summary): endpoints and their scheme, instances, the gateway,
the monitoring host, the clients with their models and limits.

The deploy runs the same check (vllm_fleet.fleet_check.problems) before the first host's lock, and `vllm-fleet rollout`
before its first batch. Exit status: 0 no problem, 2 problems (nothing was connected).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path

from vllm_fleet.config import ConfigError, split_names
from vllm_fleet.fleet import Fleet
from vllm_fleet.fleet_summary import fleet_summary, summary_lines
from vllm_fleet.fleet_check import problems
from vllm_fleet.workstation_files import shown

EXIT_INVALID = 2


def check(inventory: str | Path, limit: list[str] | None = None, *, cwd: str | Path | None = None,
          environ: Mapping[str, str] | None = None) -> tuple[list[ConfigError], dict | None]:
    """(every problem, the fleet's summary) of an inventory file; the summary is None when the file
    cannot be read at all, or when a selected host's data has errors (a summary without that host
    would show a fleet smaller than the one described: no gateway, no monitoring)."""
    try:
        fleet = Fleet.load(inventory, limit, cwd=cwd)
    except ConfigError as exc:
        return [exc], None
    errors = problems(fleet, inventory=inventory, cwd=cwd, environ=environ)
    if any(name in fleet.errors for name in fleet.selected):
        return errors, None
    configs = [fleet.configs[name] for name in fleet.selected if name in fleet.configs]
    every = [fleet.configs[name] for name in fleet.names if name in fleet.configs]
    return errors, fleet_summary(configs, every, show_path=shown)


def _as_dict(error: ConfigError) -> dict:
    return {"host": error.host, "instance": error.instance, "key": error.key, "message": error.message,
            "fix": error.fix}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="vllm-fleet check", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  vllm-fleet check inventory/prod.py\n  vllm-fleet check inventory/prod.py --limit "
               "gpu-h100-01 --json\n\nexit status: 0 no problem, 2 problems (nothing was connected).")
    parser.add_argument("inventory", help="a pyinfra inventory file, e.g. inventory/prod.py")
    parser.add_argument("--limit", action="append", help="host or group names (comma-separated)")
    parser.add_argument("--json", action="store_true", help='machine-readable: {"ok", "problems", "fleet_summary"}')
    args = parser.parse_args(argv)
    errors, summary = check(args.inventory, split_names(args.limit))
    if args.json:
        json.dump({"ok": not errors, "problems": [_as_dict(e) for e in errors], "fleet_summary": summary},
                  sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        if summary is not None:
            print("\n".join(summary_lines(summary)))
        elif errors:
            print("What the fleet will be: not shown until every host's data is valid (the errors are below)")
        for error in errors:
            print(f"error: {error.located()}", file=sys.stderr)
        print(f"{len(errors)} problem(s); no host was connected to." if errors else
              "no problem found; no host was connected to.", file=sys.stderr)
    return EXIT_INVALID if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
