"""The figures the test suite reports (bad inputs tried, hosts touched, fault seeds): tests add a line
with `report(...)`; conftest prints them all in pytest's terminal summary, so they show with -q and
with output capture on (CI), not only under -s."""

from __future__ import annotations

LINES: list[str] = []


def report(line: str) -> None:
    LINES.append(line)
    print(line)  # also in the test's own captured output
