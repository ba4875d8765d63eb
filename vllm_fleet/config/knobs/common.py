"""What the knobs of several sections share: units, limits and the rules of common kinds of value."""

from __future__ import annotations

from typing import Any, Callable

from vllm_fleet import kinds

#: How a kind of value is checked: knob()'s rules (config/schema.py RULES), shared by several knobs.
Rule = dict[str, Any]

GIB_BYTES = 1 << 30
#: The most GiB whose bytes an int64 holds (Prometheus' retention size, Ray's object store).
INT64_GIB_MAX = (2 ** 63 - 1) // GIB_BYTES - 1

PATH: Rule = {"check": kinds.managed_path_problem}
VERSION: Rule = {"check": kinds.version_problem}
POSITIVE: Rule = {"low": 1, "must": "a positive integer"}
BOOL: Rule = {"must": "True or False"}
GIB: Rule = {"low": 0, "must": "a number >= 0"}
# The value is never echoed, whatever is wrong with it: it may be the secret itself, written where
# its name belongs (`secret`).
ENV_NAME: Rule = {"secret": True, "check": kinds.secret_env_name_problem}
# A file on the workstation that holds a secret or a certificate: a path, never echoed (a key pasted
# where its file's path belongs); whether it is a safe file to read is the workstation's to check
# (vllm_fleet/fleet_secrets.py).
WORKSTATION_FILE: Rule = {"secret": True, "check": kinds.workstation_path_problem}


def each(check: Callable[[Any], str | None]) -> Callable[[list], str | None]:
    """A kind's checker for every item of a list: the first item's problem."""
    return lambda items: next(filter(None, map(check, items)), None)
