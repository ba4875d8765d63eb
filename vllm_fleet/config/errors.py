"""What every input check reports: ConfigError (one located problem and its fix), ConfigErrors (all
of a run's, reported together) and Checker, which collects one host's."""

from __future__ import annotations

import difflib
from typing import Any, Callable

from vllm_fleet import kinds


class ConfigError(Exception):
    """One invalid piece of input. `str()` gives the full located message."""

    def __init__(self, message: str, *, host: str | None = None, instance: str | None = None,
                 key: str | None = None, fix: str | None = None):
        self.host, self.instance, self.key, self.fix = host, instance, key, fix
        self.message = message
        super().__init__(self.located())

    def located(self) -> str:
        where = ", ".join(
            f"{label} {value!s}"
            for label, value in (("host", self.host), ("instance", self.instance), ("key", self.key))
            if value is not None
        )
        text = f"{where}: {self.message}" if where else self.message
        return f"{text}\n  fix: {self.fix}" if self.fix else text


class ConfigErrors(Exception):
    """Several ConfigErrors, all reported together so one run shows every mistake."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = errors
        super().__init__("\n".join(f"error: {e.located()}" for e in errors))


def did_you_mean(key: str, known: list[str] | tuple[str, ...]) -> str | None:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.7)
    return close[0] if close else None


def shown_key(name: str) -> str:
    """An unknown key as an error names it: as written, or quoted and escaped when it is empty or
    holds what a terminal would act on."""
    return name if name and kinds.printable(name) else repr(name)


class Checker:
    """Collects errors for one host so they are all reported at once."""

    def __init__(self, host: str):
        self.host = host
        self.errors: list[ConfigError] = []

    def error(self, message: str, *, instance: str | None = None, key: str | None = None,
              fix: str | None = None) -> None:
        self.errors.append(ConfigError(message, host=self.host, instance=instance, key=key, fix=fix))

    def unknown_keys(self, given: dict, known: tuple[str, ...] | list[str], *, instance: str | None,
                     prefix: str = "") -> None:
        for key in given:
            if key not in known:
                guess = did_you_mean(str(key), known)
                hint = f"did you mean '{prefix}{guess}'?" if guess else f"known keys: {', '.join(known)}"
                name = f"{prefix}{key}"
                self.error(f"unknown key {name!r}", instance=instance, key=shown_key(name), fix=hint)


def named_entries(check: Checker, entries: dict, knob: str, noun: str,
                  name_problem: Callable[[Any], str | None], fix: str, why_one: str = ""):
    """(key path, name, spec) of each entry of a dict knob named by a name (vllm_api_clients,
    vllm_alert_receivers). An entry whose name `name_problem` refuses, or that differs from an
    earlier one only in case (`why_one`: what would take the two for one), is reported on `check`
    with its key path and `fix`, and skipped."""
    folded: dict[str, str] = {}  # a name in lower case -> the entry that has it
    for name, spec in entries.items():
        key = f"{knob}.{name}" if kinds.printable(name) else f"{knob} (a key)"
        problem = name_problem(name)
        if problem:
            check.error(problem, key=key, fix=fix)
            continue
        if name.lower() in folded:
            check.error(f"{noun}s {folded[name.lower()]!r} and {name!r} differ only in case{why_one}", key=key,
                        fix=f"give one of them another name, or merge them into {folded[name.lower()]!r}")
            continue
        folded[name.lower()] = name
        yield key, name, spec
