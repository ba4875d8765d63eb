"""The `vllm-fleet` console script: what pyinfra's own CLI does not do.

Subcommands: plan, render, sandbox, bundle (rollout and status land with their issues).
Exit status: 0 success, 1 a failure on a host, 2 invalid input (nothing was touched).
"""

from __future__ import annotations

import sys


def _delegate(module: str, argv: list[str]) -> int:
    """Subcommands that own their argument parsing live in their own module's main(argv)."""
    import importlib

    return int(importlib.import_module(module).main(argv) or 0)


DELEGATED = {
    "sandbox": "vllm_fleet.sandbox.cli",
    "bundle": "vllm_fleet.bundle",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        return _delegate(DELEGATED[argv[0]], argv[1:])
    from vllm_fleet.cli_plan import main as plan_main

    return plan_main(argv)


if __name__ == "__main__":
    sys.exit(main())
