"""The metric names the alert rules and the dashboard use, and whether what vLLM and the exporters
really expose has them. Standard library only, and pure but for dashboard_text (the packaged file);
the live sandbox test calls it too.

A renamed metric (vLLM renamed several between releases) makes a rule silently never fire and a
panel silently empty: Prometheus has no error for a name nothing exposes. So the names are read out
of the PromQL and looked up in recorded scrapes of the genuine programs.

Example:

    used = used_names(alert_rules(120, tls=True), dashboard_text())
    check_against({"vllm": scrape_text, "node": node_text, ...}, used)   # {"vllm": set(), ...}
"""

from __future__ import annotations

import json
import re
from importlib import resources

# Identifiers that are PromQL's own words, never metric names (matched case-insensitively, as
# Prometheus' lexer does). Functions need no list: a name followed by "(" is one.
KEYWORDS = frozenset({
    # aggregation operators: also written `sum by (le) (...)`, where no "(" follows the name
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk",
    "topk", "quantile", "limitk", "limit_ratio",
    "and", "or", "unless", "atan2", "bool", "offset",
    "by", "without", "on", "ignoring", "group_left", "group_right",
    "inf", "nan",
})
# Keywords followed by a list of label names (optional after group_left/group_right).
LABEL_LIST_BEFORE = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# Series Prometheus makes itself: no exposition has them. vllm_fleet_peer_up is the other monitoring
# host's `up`, renamed by the peer job's relabelling (monitoring.targets.PEER_UP).
SYNTHETIC = frozenset({"up", "ALERTS", "ALERTS_FOR_STATE", "scrape_duration_seconds",
                       "scrape_samples_scraped", "scrape_samples_post_metric_relabeling",
                       "scrape_series_added", "vllm_fleet_peer_up"})
# Which recorded exposition (tests/fixtures/metrics/<source>.prom) holds a name, by its prefix.
SOURCES = (
    ("vllm:", "vllm"),
    ("node_", "node"),
    ("vllm_fleet_gpu_", "gpu"),
    ("vllm_fleet_front_", "front"),
    ("vllm_fleet_storage_", "front"),
    ("vllm_fleet_tls_", "front"),
    ("vllm_router_", "router"),
    ("vllm_tokenizer_", "router"),
    ("prometheus_", "prometheus"),
)
UNKNOWN = "unknown"
# The sample names a family of each type exposes besides its own name.
FAMILY_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count", "_created"),
                   "summary": ("_sum", "_count", "_created"), "gaugehistogram": ("_bucket", "_gsum", "_gcount")}

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'|`[^`]*`)
  | (?P<variable>\$\{[^}]*\}|\$\w+|\[\[\w+\]\])
  | (?P<number>[0-9][0-9a-zA-Z_.]*(?:[eE][+-][0-9]+)?|\.[0-9]+)
  | (?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
  | (?P<other>.)
""", re.VERBOSE | re.DOTALL)


def _tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) of `expr`, blanks and comments left out."""
    out = []
    for match in _TOKEN.finditer(expr):
        kind = match.lastgroup or "other"
        if kind not in ("space", "comment"):
            out.append((kind, match.group()))
    return out


def _skip_group(tokens: list[tuple[str, str]], start: int, opening: str, closing: str) -> int:
    """The index after the group opened at tokens[start] (strings inside are single tokens, so a
    bracket in a label value does not count)."""
    depth = 0
    for index in range(start, len(tokens)):
        text = tokens[index][1]
        if tokens[index][0] == "other" and text == opening:
            depth += 1
        elif tokens[index][0] == "other" and text == closing:
            depth -= 1
            if depth == 0:
                return index + 1
    return len(tokens)


def _matcher_names(tokens: list[tuple[str, str]]) -> set[str]:
    """Metric names a selector's braces give as `__name__="..."` (an exact match only)."""
    names = set()
    for index in range(len(tokens) - 2):
        (_, label), (_, op), (kind, value) = tokens[index:index + 3]
        if label == "__name__" and op == "=" and kind == "string":  # =~ and != have "~"/"!" here
            names.add(value[1:-1])
    return names


def names_in_promql(expr: str) -> set[str]:
    """The metric names `expr` reads: identifiers that are not functions (followed by "("),
    keywords, label names (inside {...} or the label list of by/without/on/ignoring/group_left/
    group_right), durations (in [...] or after offset), numbers or Grafana variables."""
    tokens = _tokens(expr)
    names: set[str] = set()
    index = 0
    while index < len(tokens):
        kind, text = tokens[index]
        following = tokens[index + 1] if index + 1 < len(tokens) else ("", "")
        if kind == "other" and text == "{":
            end = _skip_group(tokens, index, "{", "}")
            names |= _matcher_names(tokens[index:end])
            index = end
        elif kind == "other" and text == "[":
            index = _skip_group(tokens, index, "[", "]")  # a range or subquery: durations only
        elif kind == "name" and text.lower() in LABEL_LIST_BEFORE and following == ("other", "("):
            index = _skip_group(tokens, index + 1, "(", ")")
        elif kind == "name" and following != ("other", "(") and text.lower() not in KEYWORDS:
            names.add(text)
            index += 1
        else:
            index += 1
    return names


# --- Where the expressions are ----------------------------------------------------------------

_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<args>.*)\)\s*$", re.DOTALL)
_QUERY_RESULT = re.compile(r"^\s*query_result\((?P<expr>.*)\)\s*$", re.DOTALL)


def _variable_expr(query: str) -> str | None:
    """The PromQL inside a Grafana Prometheus variable's query: label_values(EXPR, label) and
    query_result(EXPR) hold one; label_values(label), label_names() and metrics(re) none."""
    if match := _QUERY_RESULT.match(query):
        return match["expr"]
    if match := _LABEL_VALUES.match(query):
        expr, comma, _label = match["args"].rpartition(",")
        return expr if comma else None
    return None


def dashboard_exprs(dashboard_json_text: str) -> list[str]:
    """Every PromQL expression of a Grafana dashboard: each panel target's `expr` (rows and nested
    panels included) and each query variable's query, in document order."""
    out: list[str] = []

    def walk(node: object, in_templating: bool) -> None:
        if isinstance(node, dict):
            expr = node.get("expr")
            if isinstance(expr, str) and expr.strip():
                out.append(expr)
            if in_templating and node.get("type") == "query":
                query = node.get("query")
                text = query.get("query") if isinstance(query, dict) else query
                if isinstance(text, str) and (inner := _variable_expr(text)) is not None:
                    out.append(inner)
            for key, value in node.items():
                if key not in ("expr", "query"):
                    walk(value, in_templating or key == "templating")
        elif isinstance(node, list):
            for item in node:
                walk(item, in_templating)

    walk(json.loads(dashboard_json_text), False)
    return out


_EXPR_KEY = re.compile(r"^\s*(?:-\s+)?expr:\s*(?P<value>.*?)\s*$")


def _unquote_yaml(value: str) -> str:
    """A one-line YAML flow scalar's text: "double" (backslash escapes), 'single' ('' is '), plain."""
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return json.loads(value)  # YAML's double-quoted escapes PromQL needs are JSON's
    if len(value) >= 2 and value[0] == value[-1] == "'":
        return value[1:-1].replace("''", "'")
    return value


def rule_exprs(rules_yaml_text: str) -> list[str]:
    """Every `expr:` of a Prometheus rules file, in order: plain, quoted, or a block scalar (| or >)
    on the lines below, indented more than the key. Read line by line (no YAML library) — enough
    for rule files, whose expr is always a scalar."""
    lines = rules_yaml_text.splitlines()
    out = []
    index = 0
    while index < len(lines):
        match = _EXPR_KEY.match(lines[index])
        index += 1
        if not match:
            continue
        key_indent = lines[index - 1].index("expr:")  # the column of the key, after any "- "
        value = match["value"]
        block = []
        while index < len(lines) and (not lines[index].strip()
                                      or len(lines[index]) - len(lines[index].lstrip()) > key_indent):
            block.append(lines[index].strip())
            index += 1
        while block and not block[-1]:
            block.pop()
        if value[:1] in ("|", ">"):
            out.append("\n".join(block))
        else:
            out.append(" ".join([_unquote_yaml(value)] + block) if block else _unquote_yaml(value))
    return out


def dashboard_text() -> str:
    """The fleet's Grafana dashboard (package data: grafana/vllm-fleet.json)."""
    return (resources.files(__package__) / "grafana" / "vllm-fleet.json").read_text(encoding="utf-8")


def used_names(rules_yaml_text: str, dashboard_json_text: str) -> set[str]:
    """Every metric name the rules and the dashboard read."""
    exprs = rule_exprs(rules_yaml_text) + dashboard_exprs(dashboard_json_text)
    return set().union(*map(names_in_promql, exprs))


# --- What is exposed --------------------------------------------------------------------------

_SAMPLE_NAME = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{ \t]")
_QUOTED_SAMPLE_NAME = re.compile(r'^\{\s*"(?P<name>(?:\\.|[^"\\])*)"')  # OpenMetrics 2 / UTF-8 names
_DESCRIPTOR = re.compile(r"^#\s+(?P<what>TYPE|HELP|UNIT)\s+(?P<name>\S+)(?:\s+(?P<rest>.*))?$")


def exposed_names(exposition_text: str) -> set[str]:
    """The metric names a Prometheus text exposition (or OpenMetrics) offers: every sample's name,
    every family's name (# TYPE / # HELP), and for a counter, histogram or summary family the
    sample names it stands for (foo -> foo_total; foo_bucket, foo_sum, foo_count), so a name used
    with or without its suffix matches when the family is there."""
    names: set[str] = set()
    for line in exposition_text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            if match := _DESCRIPTOR.match(line):
                names.add(match["name"])
                if match["what"] == "TYPE":
                    kind = (match["rest"] or "").strip().lower()
                    names.update(match["name"] + suffix for suffix in FAMILY_SUFFIXES.get(kind, ()))
                    # OpenMetrics names a counter family without _total, the classic text
                    # format with it: either way both spellings are the one counter.
                    if kind == "counter" and match["name"].endswith("_total"):
                        names.add(match["name"][: -len("_total")])
            continue
        if match := _SAMPLE_NAME.match(line + " ") or _QUOTED_SAMPLE_NAME.match(line):
            names.add(match["name"])
    return names


def missing(used: set[str], exposed: set[str]) -> set[str]:
    """The used names no exposition has (Prometheus' own series left out)."""
    return {name for name in used if name not in exposed and name not in SYNTHETIC}


def source_of(name: str) -> str | None:
    """Which exposition a name comes from (SOURCES); None for Prometheus' own series (up, ALERTS),
    UNKNOWN for a name no source claims."""
    if name in SYNTHETIC:
        return None
    for prefix, source in SOURCES:
        if name.startswith(prefix):
            return source
    return UNKNOWN


def check_against(exposition_by_source: dict[str, str], used: set[str]) -> dict[str, set[str]]:
    """{source: the used names its exposition lacks} for every source a used name comes from: an
    empty set is a pass. A source with no exposition given lacks all its names; names of no known
    source are reported under UNKNOWN (a typo in a prefix must not pass unseen)."""
    by_source: dict[str, set[str]] = {}
    for name in used:
        source = source_of(name)
        if source is not None:
            by_source.setdefault(source, set()).add(name)
    exposed = {source: exposed_names(text) for source, text in exposition_by_source.items()}
    return {source: missing(names, exposed.get(source, set())) for source, names in sorted(by_source.items())}
