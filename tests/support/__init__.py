"""What the tests share: the sandbox fixture, fleets and deploy helpers, host and instance data,
the simulated deploy, rollout's pyinfra stubs, the real tools' wrappers, the bad-input corpus,
printed figures. Imported as `support.<module>` (tests/ is on sys.path: its conftest.py)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_directories() -> list[str]:
    """Every directory of tests, as pytest's (prepend) import mode puts each on sys.path once it
    collects a test of it: conftest.py puts them all there first, so that nothing imported by name
    depends on the order of collection. No module of tests/ imports a test module
    (tests/repo/test_import_rules.py): what tests share is in this package."""
    return [str(d) for d in sorted(TESTS.iterdir()) if d.is_dir() and any(d.glob("test_*.py"))]
