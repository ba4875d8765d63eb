"""How vllm-fleet reads its pyinfra facts from a host (each runs one command, parsed in `process`).

A deploy reads them in two batches (`prefetch`: one remote command runs many facts) and through
`get`, which answers a fact once per run per host: pyinfra 3.10 runs a fact's command again on
every `host.get_fact`, and an operation's body runs twice (to plan, then to execute), so without
the memo a no-op deploy cost dozens of commands per host. See `prefetch` and `get`.

The facts themselves are grouped by what they read: `gpus` (the GPUs), `host` (paths, interfaces,
OS packages, models and environments in place), `state` (what the deploy manages), `model_sync` (a
synced model directory). Their users import this module as `facts`: `facts.get`, `facts.prefetch`
and `facts.RemoteFacts`, wherever the code and its docstrings name them, are this module's.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, Iterable

from pyinfra.api import FactBase

from vllm_fleet.facts.state import PreludeFact


# --- Many facts in one command, and a memo per run -------------------------------------------------

@dataclass(frozen=True)
class Query:
    """One fact and its arguments, as `prefetch` and `get` key them."""

    fact: type
    args: tuple[tuple[str, Any], ...]

    @classmethod
    def of(cls, fact: type, **kwargs) -> "Query":
        return cls(fact, tuple(sorted((k, _frozen(v)) for k, v in kwargs.items())))

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.args)

    def __repr__(self) -> str:  # pyinfra logs a fact's arguments: keep FactBatch's short
        return f"{self.fact.__name__}({', '.join(f'{k}={v!r}' for k, v in self.args)})"


def query(fact: type, **kwargs) -> Query:
    return Query.of(fact, **kwargs)


def _frozen(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    return value


BATCH_START = "##vllm-fleet-fact "
BATCH_END = "##vllm-fleet-fact-end "
MISSING_COMMAND = "##PYINFRA_NOCMD##"  # what pyinfra's own guard prints (pyinfra.api.facts)
# Characters of one batch once quoted: it travels as one argument (sh -c '...'), which Linux caps at
# 128 KiB (MAX_ARG_STRLEN), and `_su_user` quotes it a second time.
BATCH_LIMIT = 56_000


def _part(q: Query) -> tuple[str, str]:
    """(prelude, command) of one query, with pyinfra's "binary absent" guard where the fact has one."""
    fact = q.fact()
    if isinstance(fact, PreludeFact):
        prelude, command = fact.prelude, fact.call(**q.kwargs)
    else:
        prelude, command = "", fact.command(**q.kwargs)
    command = command.get_raw_value() if hasattr(command, "get_raw_value") else str(command)
    required = fact.requires_command(**q.kwargs)
    if required:
        command = (f"if command -v {required} >/dev/null 2>&1; then (\n{command}\n); "
                   f"else echo '{MISSING_COMMAND}'; fi")
    return prelude, command


def batch_command(queries: Iterable[Query]) -> str:
    """One shell command that runs each query's command in a subshell of its own (no input), between
    marker lines that carry its index and exit status; it always exits 0 (see parse_batch)."""
    preludes: list[str] = []
    body: list[str] = []
    for i, q in enumerate(queries):
        prelude, command = _part(q)
        if prelude and prelude not in preludes:
            preludes.append(prelude)
        body.append(f"echo '{BATCH_START}{i}'\n(\n{command}\n) </dev/null\necho \"{BATCH_END}{i} $?\"")
    return "\n".join(preludes + body + ["true"])


def parse_batch(lines: Iterable[str]) -> dict[int, tuple[int, list[str]]]:
    """{index: (exit status, stdout lines)} of each query that ran to its end marker."""
    out: dict[int, tuple[int, list[str]]] = {}
    current: int | None = None
    buffer: list[str] = []
    for line in lines:
        if current is None:
            if line.startswith(BATCH_START) and line[len(BATCH_START):].strip().isdigit():
                current, buffer = int(line[len(BATCH_START):]), []
            continue
        at = line.find(BATCH_END)
        if at < 0:
            buffer.append(line)
            continue
        if at > 0:  # the command's last line had no newline
            buffer.append(line[:at])
        fields = line[at + len(BATCH_END):].split()
        if len(fields) == 2 and fields[0] == str(current) and fields[1].isdigit():
            out[current] = (int(fields[1]), buffer)
        current = None
    return out


class FactBatch(FactBase):
    """Several facts in one remote command: {index: (exit status, stdout lines)}; `prefetch` hands each
    query's lines to its own fact's `process`."""

    def command(self, queries: tuple[Query, ...]) -> str:
        return batch_command(queries)

    def default(self):
        return None

    def process(self, output):
        return parse_batch(list(output))


def _answer(q: Query, lines: list[str]) -> Any:
    """What pyinfra's get_fact returns for these stdout lines of the fact's command (exit status 0)."""
    fact = q.fact()
    if not lines or lines == [MISSING_COMMAND]:
        return fact.default()
    return fact.process(lines)


def _memo(host) -> dict[Query, Any]:
    """This host's facts of this run (a new pyinfra State starts afresh)."""
    state = getattr(host, "state", None)
    held = getattr(host, "_vllm_fleet_facts", None)
    if held is None or held[0] is not state:
        held = (state, {})
        host._vllm_fleet_facts = held
    return held[1]


def _quoted_size(text: str) -> int:
    return len(shlex.quote(text))


def _chunks(queries: list[Query]) -> Iterable[list[Query]]:
    """The queries in batches whose command stays within BATCH_LIMIT (each prelude counted once)."""
    chunk: list[Query] = []
    preludes: set[str] = set()
    size = 0
    for q in queries:
        prelude, command = _part(q)
        cost = _quoted_size(command) + 2 * len(BATCH_END) + 40
        extra = _quoted_size(prelude) if prelude and prelude not in preludes else 0
        if chunk and size + cost + extra > BATCH_LIMIT:
            yield chunk
            chunk, preludes, size = [], set(), 0
            extra = _quoted_size(prelude) if prelude else 0
        chunk.append(q)
        preludes.add(prelude)
        size += cost + extra
    if chunk:
        yield chunk


def prefetch(host, queries: Iterable[Query]) -> None:
    """Read every fact of `queries` that this run has not read yet on this host in ONE remote
    command (another one only past BATCH_LIMIT characters); `get` then answers them without one.

    A query whose command failed there is not kept: `get` runs it alone, so pyinfra reports its
    failure as it does for any fact. A host that answers nothing (a stand-in in tests) keeps nothing.
    """
    memo = _memo(host)
    todo = [q for q in dict.fromkeys(queries) if q not in memo]
    for chunk in _chunks(todo):
        raw = host.get_fact(FactBatch, queries=tuple(chunk))
        if not isinstance(raw, dict):
            continue
        for i, q in enumerate(chunk):
            if i in raw and raw[i][0] == 0:
                memo[q] = _answer(q, raw[i][1])


def get(host, fact: type, **kwargs) -> Any:
    """`host.get_fact(fact, **kwargs)`, read once per run: from `prefetch`'s batch, or by the fact's
    own command the first time. pyinfra runs an operation's body to plan it and again to execute
    it; both see what the host was when the run planned it. That holds because the deploy lock is
    taken before the first fact is read (deploy/access.py take_lock: no other deploy changes the host in
    between) and no two of vllm-fleet's operations manage the same path or unit (deploy/prepare.py
    refuses a plan where two would)."""
    memo = _memo(host)
    q = Query.of(fact, **kwargs)
    if q not in memo:
        memo[q] = host.get_fact(fact, **kwargs)
    return memo[q]


class FactUnreadable(Exception):
    """A fact's command failed on the host (RemoteFacts): the message names the host and the fact."""


class RemoteFacts:
    """A connected host's facts outside a deploy (`vllm-fleet status`): the deploy's own fact commands,
    batch (`prefetch`) and processing, sent with vllm_fleet.connect.remote.run (the host's _sudo/_su_user/...
    applied). It stands in for pyinfra's host in `prefetch` and `get`, so status reads and plans
    from exactly what the deploy reads (discovery.discover), in one remote command."""

    def __init__(self, host, timeout: int = 120):
        self.host, self.timeout = host, timeout
        self.name = host.name
        self.print_prefix = getattr(host, "print_prefix", f"[{host.name}] ")
        self.state = object()  # this reader's facts are its own (facts._memo keys a run by its state)

    def get_fact(self, fact: type, **kwargs) -> Any:
        from vllm_fleet.connect import remote

        queries = kwargs["queries"] if fact is FactBatch else (Query.of(fact, **kwargs),)
        ok, out, err = remote.run(self.host, batch_command(queries), timeout=self.timeout)
        answers = parse_batch(out.splitlines()) if ok else {}
        if fact is FactBatch:
            return answers
        status, lines = answers.get(0, (None, []))
        if status != 0:
            said = " ".join(err.split())[-300:] or (f"exit status {status}" if status is not None else "no answer")
            raise FactUnreadable(f"host {self.name}: could not read {fact.__name__}: {said}")
        return _answer(queries[0], lines)
