"""A payload as the host runs it, for tests in this process: its bundled text (vllm_fleet.payloads)
executed as ONE module, so a test calls and monkeypatches the names the shipped script has, in the
one namespace they share there."""

from __future__ import annotations

import types

from vllm_fleet import payloads


def bundled_module(payload: tuple[str, ...], name: str) -> types.ModuleType:
    """A fresh module from the payload's bundled script (its `if __name__ == "__main__"` not run)."""
    module = types.ModuleType(name)
    exec(compile(payloads.script(payload), f"<{name}: bundled payload>", "exec"), module.__dict__)  # noqa: S102
    return module
