"""How vllm-fleet declares a key of its input, and checks a value of it: one `knob()` per host knob
(Settings, by section: config/knobs/) and per instance key (InstanceConfig) alike.

A declaration is a dataclass field: its annotation is the key's type, and `knob()` gives it the
default, a one-line doc, the longer notes group_data/all.py shows above it, the bounds or the kind
of text it takes (vllm_fleet/kinds.py), the fix an error shows and, for an instance key that becomes
a `vllm serve` flag, the flag. `declarations(cls)` reads them back as Declaration values: the one
check (`Declaration.problem`) serves every key, and group_data/all.py, docs/knobs.md and the README's
excerpt are written from them (config/reference.py).
"""

from __future__ import annotations

import math
import textwrap
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable, Mapping

from vllm_fleet.config.errors import Checker, did_you_mean

#: The default of an instance key that must be given.
REQUIRED: Any = MISSING

#: What a value is checked against beyond its type, each optional:
#:
#: + choices: the values allowed ("{value!r} is not one of ..." with a did-you-mean, or `problem`)
#: + low, high: an inclusive range; above: an exclusive lower bound (numbers)
#: + check: the value's kind (vllm_fleet/kinds.py): a function of a value of the right type that
#:   returns its problem in words, or None (None, where allowed, is always valid)
#: + problem: the message for a value of the right type that fails choices or the range ("{value!r} ...")
#: + must: "a positive integer": every failure, wrong type included, reads "must be <must>, got <value>"
#: + kind: the expected type in words, for "expected <kind>, got ..." (default: from the annotation)
#: + fix: the fix shown (default: `<key> = <default>`)
#: + shallow: only the container's type is checked here (and not echoed); its entries where parsed
#: + secret: the value is never part of a message (it may be a secret written in the wrong place)
RULES = frozenset({"choices", "low", "high", "above", "check", "problem", "must", "kind", "fix", "shallow",
                   "secret"})

#: A structured key's reader: (checker, value, instance, key, the host's Settings) -> the value to keep,
#: reporting what is wrong on the checker.
Parse = Callable[[Checker, Any, str, str, Any], Any]


@dataclass(frozen=True)
class HostKnob:
    """An instance key whose absence means a host knob: the host's value of it (`value`: its default)."""

    knob: str
    value: Any


def knob(default: Any, doc: str, *, notes: str | None = None, flag: str | None = None,
         parse: Parse | None = None, to: Callable[[Any], Any] | None = None, written: Any = MISSING,
         **rule: Any) -> Any:
    """A declared key (a dataclass field): its default (REQUIRED: none; a HostKnob: the host's knob),
    a one-line `doc`, the `notes` group_data/all.py shows above it (lines as written there), the
    `flag` of `vllm serve` it sets, and how a value is checked (RULES). A structured value is read by
    `parse` instead; `to` converts a valid value (an int utilization to a float); `written` is the
    default as group data writes it where the value kept differs ("auto" for gpus)."""
    unknown = set(rule) - RULES
    if unknown:
        raise TypeError(f"knob(): unknown rules {sorted(unknown)}")
    if "\n" in doc or not doc.strip():
        raise ValueError(f"knob(): the doc is one line: {doc!r}")
    if default is REQUIRED and "fix" not in rule and parse is None:
        raise ValueError(f"knob(): a required key declares its fix ({doc!r})")
    meta = {"doc": doc, "notes": textwrap.dedent(notes).strip("\n") if notes else None, "flag": flag,
            "parse": parse, "to": to, "written": written, "default": default, "rule": rule}
    if default is REQUIRED:
        return field(metadata=meta)
    value = default.value if isinstance(default, HostKnob) else default
    if isinstance(value, (list, dict)):
        return field(default_factory=lambda: type(value)(value), metadata=meta)
    return field(default=value, metadata=meta)


@dataclass(frozen=True)
class Section:
    """A part of the knobs, as group_data/all.py heads it: its title, the notes under the title, and
    pyinfra's own keys it sets there (not knobs of vllm-fleet)."""

    title: str
    notes: str | None = None
    pyinfra: Mapping[str, Any] = field(default_factory=dict)


def section(title: str, notes: str | None = None, pyinfra: Mapping[str, Any] | None = None) -> Callable[[type], type]:
    """Marks a dataclass of knobs as one section of Settings."""
    def mark(cls: type) -> type:
        cls.__section__ = Section(title, textwrap.dedent(notes).strip("\n") if notes else None,  # type: ignore[attr-defined]
                                  dict(pyinfra or {}))
        return cls
    return mark


def section_of(cls: type) -> Section:
    return cls.__dict__["__section__"]


@dataclass(frozen=True)
class Declaration:
    """One declared key, read back from its field (knob())."""

    name: str
    type: Any
    field: Field

    @property
    def doc(self) -> str:
        return self.field.metadata["doc"]

    @property
    def notes(self) -> str | None:
        return self.field.metadata["notes"]

    @property
    def flag(self) -> str | None:
        return self.field.metadata["flag"]

    @property
    def rule(self) -> Mapping[str, Any]:
        return self.field.metadata["rule"]

    @property
    def declared_default(self) -> Any:
        """REQUIRED, a HostKnob, or the value an absent key stands for."""
        return self.field.metadata["default"]

    @property
    def required(self) -> bool:
        return self.declared_default is REQUIRED

    @property
    def default(self) -> Any:
        """The value an absent key stands for (a fresh list or dict); MISSING when it is required."""
        f = self.field
        return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default

    @property
    def written(self) -> Any:
        """The default as host data writes it (the HostKnob itself for a host knob's)."""
        written = self.field.metadata["written"]
        if written is not MISSING:
            return written
        return self.declared_default if isinstance(self.declared_default, HostKnob) else self.default

    def fix(self) -> str:
        return self.rule.get("fix") or f"{self.name} = {self.default!r}"

    def problem(self, value: Any) -> tuple[str, str] | None:
        """(message, fix) when `value` is no valid value of this key, else None. A structured key
        (parse) is only checked for its container's type here."""
        rule, fix = self.rule, self.fix()
        choices = rule.get("choices")
        if choices is not None:
            if value in choices:
                return None
            if "problem" in rule:
                return rule["problem"].format(value=value), fix
            guess = did_you_mean(str(value), [c for c in choices if isinstance(c, str)])
            return (f"{value!r} is not one of {', '.join(map(str, choices))}",
                    f"did you mean '{guess}'?" if guess else f"{self.name} = {choices[0]!r}")
        typed = matches(value, self.type, rule.get("shallow", False))
        if typed and value is not None and "check" in rule and _in_range(value, rule):
            found = rule["check"](value)
            return (found, fix) if found else None
        if typed and (value is None or _in_range(value, rule)):
            return None
        if rule.get("secret"):
            # Neither the value nor its text: it may be the secret itself.
            return (f"expected {rule.get('kind') or describe(self.type)}, got {type(value).__name__} (the value "
                    "is not shown: it may be the secret itself)"), fix
        if "must" in rule:
            return f"must be {rule['must']}, got {value!r}", fix
        if not typed:
            # A container whose entries are checked elsewhere is not echoed (it may be the whole fleet's).
            got = type(value).__name__ if rule.get("shallow") else f"{type(value).__name__} {value!r}"
            return f"expected {rule.get('kind') or describe(self.type)}, got {got}", fix
        return rule.get("problem", "{value!r} is out of range").format(value=value), fix

    def read(self, check: Checker, value: Any, instance: str | None, settings: Any = None) -> Any:
        """The value to keep, checked: a structured key by its parse, any other by problem() (each
        problem reported on `check`, under this key and `instance`)."""
        parse = self.field.metadata["parse"]
        if parse is not None:
            return parse(check, value, instance, self.name, settings)
        found = self.problem(value)
        if found:
            check.error(found[0], instance=instance, key=self.name, fix=found[1])
            return value
        to = self.field.metadata["to"]
        return to(value) if to is not None and value is not None else value


def declarations(cls: type) -> dict[str, Declaration]:
    """Every key `cls` declares (a dataclass of knob() fields), in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: Declaration(f.name, hints[f.name], f) for f in fields(cls)}


def matches(value: Any, kind: Any, shallow: bool = False) -> bool:
    """Whether `value` is of the annotated type `kind`: bool is no number, an int is a float, a
    tuple is a list (of the right items, unless shallow)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, arg, shallow) for arg in args)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        return not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
    if origin is list:
        return isinstance(value, (list, tuple)) and (shallow or all(matches(v, args[0]) for v in value))
    if origin is dict:
        return isinstance(value, dict) and (shallow or all(matches(k, args[0]) and matches(v, args[1])
                                                           for k, v in value.items()))
    return isinstance(value, origin or kind)


def describe(kind: Any) -> str:
    """An annotation in words: `str | None` -> "str or None", `list[str]` -> "a list of str"."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in args)
    if kind is type(None):
        return "None"
    if kind is float:
        return "a number"
    if kind is bool:
        return "True or False"
    if origin is list:
        return f"a list of {describe(args[0])}"
    if origin is dict:
        return "dict"
    return getattr(kind, "__name__", str(kind))


def _in_range(value: Any, rule: Mapping[str, Any]) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False  # inf passes every bound, and nan fails none
    if "low" in rule and not value >= rule["low"]:
        return False
    if "above" in rule and not value > rule["above"]:
        return False
    if "high" in rule and not value <= rule["high"]:
        return False
    return True
