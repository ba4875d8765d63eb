"""What the tests share: the sandbox fixture, fleets and deploy helpers, the real tools' wrappers,
the bad-input corpus, printed figures. Imported as `support.<module>` (tests/ is on sys.path: its
conftest.py)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_directories() -> list[str]:
    """Every directory of tests: each goes on sys.path, as pytest's (prepend) import mode puts one
    there once it collects a test of it, so that a test using another's helpers (test_fleet the
    multi-node plan's) imports them by module name whatever the order of collection."""
    return [str(d) for d in sorted(TESTS.iterdir()) if d.is_dir() and any(d.glob("test_*.py"))]
