"""Arbitrary text in every string field of a host's data, one field at a time, through parse, the
fleet check, the planner and render: each example is either refused with errors that name the host,
the instance and the field, or it renders files whose structure is the one a benign value gives
(the systemd directives, nginx's statements, the engine YAML's keys and the flags vLLM's parser reads
from it), with the text arriving unchanged where it lands; and it takes at most SECONDS_PER_EXAMPLE.

The generative side of tests/input_boundary/test_text_boundary.py and tests/input_boundary/test_input_boundary.py. The fields are
enumerated from the schema where it has types: every knob annotated str, str | None or list[str]
(Settings), every text key of an instance (InstanceConfig) and of a declared GPU (GpuSpec); so a new
one is covered as soon as it exists (test_every_text_knob_has_a_benign_value says when it needs a
benign example). Listed in tests/support/boundary_fields.py: a GPU's compute_capability (text or a number), the values inside env
and engine_args (one value, a switch's, a list item, JSON), the keys of every dict (the host's data,
an instance, env, engine_args and its JSON, model_info, a GPU), the host name and an instance's
nodes. Left out: the knobs gpus and vllm_instances themselves, lists of records whose strings are
the fields above."""

from __future__ import annotations

import ast
import contextlib
import functools
import json
import re
import signal
from collections import Counter
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from support.boundary_fields import (
    BENIGN_KNOBS,
    CASES,
    FIELDS,
    TEXT_KNOBS,
    Field,
    instance_name,
    normalised_flag,
    render,
    text_kind,
)
from support.boundary_hosts import base_data
from support.figures import report
from support.rendered_structure import (
    SYSTEMD_LINE_END,
    continues,
    deduplicated,
    json_shape,
    nginx_structure,
    unit_structure,
    vllm_flags_read,
)

from vllm_fleet import kinds
from vllm_fleet.config import ConfigError, ConfigErrors
from vllm_fleet.config.settings import TYPES, Settings
from vllm_fleet.render import RenderedFile

EXAMPLES_PER_CASE = 30
COUNTS: Counter = Counter()

# --- Text ------------------------------------------------------------------------------------------

# What ends a line or a token somewhere (systemd, nginx, YAML, a shell, a terminal), what systemd,
# nginx or a shell substitutes, and ordinary text around them; "\udcff" is a byte that is no UTF-8,
# as Python reads it with surrogateescape.
SPECIAL = list("\n\r\x00\x1b\x85\t\u2028\u2029\ufeff%'\"\\$[];{}# =-`*~&|<>!?():,@\udcff")
ORDINARY = list("abcxyzABCXYZ0189_./+é日")
PIECES = st.text(alphabet=st.sampled_from(SPECIAL + ORDINARY), max_size=12)
NEAR_ANYWHERE = ("", " ", "--host=0.0.0.0", "%Z", "%%", "a\\", "\\", "$HOME", "${X}", "x;y", "{", "}",
                 "[Service]", "x\nExecStartPre=+/bin/id", "'", '"', "#", ";", "true", "null", "yes", "1e3",
                 "a: b", "- x", "*a", "&a", "!!python/object/apply:os.system ['id']", "::", "0.0.0.0",
                 "127.0.0.1", "/", "/etc", "..", "/var/lib/vllm-fleet/x y", "\ufeffx", "x\u2028y")


@st.composite
def mutated(draw, benign: str) -> str:
    """The benign value with a piece put in, in front, at the end or in place of its tail."""
    piece = draw(PIECES)
    at = draw(st.integers(0, len(benign)))
    how = draw(st.sampled_from(["insert", "replace tail"]))
    return benign[:at] + piece + (benign[at:] if how == "insert" else "")


@st.composite
def long_text(draw, benign: str) -> str:
    unit = draw(st.text(alphabet=st.sampled_from(SPECIAL + ORDINARY), min_size=1, max_size=4))
    size = draw(st.integers(1000, 6000))
    return (benign + unit * size)[:size]


def texts(field: Field) -> st.SearchStrategy[str]:
    benign = field.benign if isinstance(field.benign, str) else ""
    return st.one_of(PIECES, st.text(max_size=16), mutated(benign), long_text(benign))


# --- The two outcomes ------------------------------------------------------------------------------

def assert_refused_where_it_is(errors: list[ConfigError], name: str, kind: str, field: Field, text: Any) -> None:
    where = [e.located() for e in errors]
    assert errors, "ConfigErrors without an error"
    hosts = {name, repr(name)} if field.name == "host name" else {name}
    for e in errors:
        assert e.host in hosts, where
        assert isinstance(e.key, str) and e.key, where
        for part in (e.host, e.instance, e.key, e.message, e.fix):
            # The CLI prints these: no control character of the input reaches the terminal, and
            # no byte that is no UTF-8 (printing it would crash the CLI).
            assert part is None or not kinds.LINE_BREAKING.search(part), ("control character", where)
            assert part is None or is_utf8(part), ("not UTF-8", where)
    if field.instance:
        label = instance_name(kind)
        if field.name == "instance name":
            label = text if text and not kinds.LINE_BREAKING.search(text) and is_utf8(text) else "#0"
        assert any(e.instance == label and field.blames(e.key, text) for e in errors), (label, where)
    else:
        assert any(e.instance is None and field.blames(e.key, text) for e in errors), where


def is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


SYSTEMD_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,250}\.service")  # unit_name_is_valid, 255 in all


def assert_same_structure(got: list[RenderedFile], baseline: list[RenderedFile], field: Field, text: Any) -> None:
    paths = [f.path for f in got]
    assert len(set(paths)) == len(paths), ("two files at one path", paths)
    assert len(got) == len(baseline), ([f.path for f in baseline], paths)
    for path in paths:  # Linux's NAME_MAX and PATH_MAX
        assert all(0 < len(part.encode("utf-8", "surrogatepass")) <= 255 for part in path.split("/")[1:]), path
        assert len(path.encode("utf-8", "surrogatepass")) < 4096, path
    for mine, base in zip(got, baseline, strict=True):
        assert mine.path.rsplit(".", 1)[-1] == base.path.rsplit(".", 1)[-1], (mine.path, base.path)
        content = mine.content
        assert is_utf8(content), (mine.path, "not UTF-8: the file cannot go to the host")
        if mine.path.endswith(".service"):
            assert SYSTEMD_UNIT_NAME.fullmatch(mine.path.rsplit("/", 1)[1]), mine.path
            assert "\x00" not in content and "\r" not in content, mine.path
            lines = SYSTEMD_LINE_END.split(content)
            assert not any(continues(line) for line in lines), (mine.path, "a line continues into the next")
            directives = [(s, d) for s, d, _w, _p in unit_structure(content)]
            assert directives == [(s, d) for s, d, _w, _p in unit_structure(base.content)], mine.path
            assert unit_structure(content) == unit_structure(base.content), mine.path
        elif mine.path.endswith(".conf"):
            assert nginx_structure(content) == nginx_structure(base.content), mine.path
        elif mine.path.endswith(".yaml"):
            config, expected = yaml.safe_load(content), yaml.safe_load(base.content)
            keys, flags = list(expected), vllm_flags_read(expected)
            if field.name == "instance engine_args flag name":  # the text is a flag name there
                renamed_flag = normalised_flag(text)
                keys = deduplicated([renamed_flag if k == field.benign else k for k in keys])
                flags = deduplicated([renamed_flag if f == field.benign else f for f in flags])
            assert list(config) == keys, mine.path
            assert vllm_flags_read(config) == flags, mine.path
        elif mine.path.endswith(".json"):
            assert json_shape(json.loads(content)) == json_shape(json.loads(base.content)), mine.path
        elif mine.path.endswith(".env"):
            names = [line.split("=", 1)[0] for line in content.splitlines() if line and not line.startswith("#")]
            assert names == [line.split("=", 1)[0] for line in base.content.splitlines()
                             if line and not line.startswith("#")], mine.path
        elif mine.path.endswith(".py"):
            ast.parse(content)
        elif mine.path.endswith(".js"):  # the gateway's keyer: no knob's text reaches it
            assert content == base.content, mine.path
        else:
            raise AssertionError(f"{mine.path}: a kind of file this test does not read")
    if field.lands:
        field.lands({f.path: f.content for f in got}, text)


@functools.cache
def baseline(kind: str, field_name: str) -> list[RenderedFile]:
    field = next(f for f in FIELDS if f.name == field_name and kind in f.kinds)
    name, data = (kind, base_data(kind)) if field.benign is None else field.put(kind, base_data(kind), field.benign)
    return render(name, data)


# --- The tests ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def figures_line():
    yield
    if COUNTS["examples"]:
        report(f"boundary property test: {COUNTS['examples']} examples over {len({f.name for f in FIELDS})} fields: "
               f"{COUNTS['refused']} refused with a located error, {COUNTS['rendered']} rendered with the "
               "expected directives")


#: What parse, plan and render of one host may take, at most (a few milliseconds are usual): more is
#: a pattern backtracking without end, which would hang `vllm-fleet plan`.
SECONDS_PER_EXAMPLE = 10


@contextlib.contextmanager
def time_limit(seconds: float):
    def stop(signum, frame):
        raise TimeoutError(f"took more than {seconds} s")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def refused_where_it_is_or_rendered_alike(kind: str, field: Field, text: Any) -> None:
    """The property, for one text in one field of one host."""
    COUNTS["examples"] += 1
    name, host = field.put(kind, base_data(kind), text)
    try:
        with time_limit(SECONDS_PER_EXAMPLE):
            files = render(name, host)
    except ConfigErrors as exc:
        assert_refused_where_it_is(exc.errors, name, kind, field, text)
        COUNTS["refused"] += 1
        return
    except ConfigError as exc:
        assert_refused_where_it_is([exc], name, kind, field, text)
        COUNTS["refused"] += 1
        return
    assert_same_structure(files, baseline(kind, field.name), field, text)
    COUNTS["rendered"] += 1


IDS = [f"{kind}: {f.name}" for kind, f in CASES]


@pytest.mark.parametrize("kind, field", CASES, ids=IDS)
@settings(max_examples=EXAMPLES_PER_CASE, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(data=st.data())
def test_text_in_a_field_is_refused_where_it_is_or_renders_the_benign_structure(kind, field, data):
    text = data.draw(texts(field), label="text")
    assume(not field.other_value(text))
    refused_where_it_is_or_rendered_alike(kind, field, text)


@pytest.mark.parametrize("kind, field", CASES, ids=IDS)
def test_near_misses_are_refused_where_they_are_or_render_the_benign_structure(kind, field):
    """Every near miss, in every run: generated text seldom hits one exactly. From the benign value:
    a name longer than a path's may be, thousands of digits, and a run of letters that fails at its
    end (what makes a pattern of nested repetitions backtrack)."""
    benign = field.benign if isinstance(field.benign, str) else ""
    derived = (benign + "/" + "x" * 300, benign + "0" * 5000, benign + "a" * 40 + "!")
    for text in NEAR_ANYWHERE + field.near + derived:
        if not field.other_value(text):
            refused_where_it_is_or_rendered_alike(kind, field, text)


def test_every_text_knob_has_a_benign_value():
    """A new text knob whose default is None or [] needs a valid example in BENIGN_KNOBS."""
    for knob in TEXT_KNOBS:
        benign = BENIGN_KNOBS.get(knob, Settings.defaults()[knob])
        assert isinstance(benign, str), f"add a valid value of {knob} to BENIGN_KNOBS"
        assert Settings.problem(knob, [benign] if text_kind(TYPES[knob]) == "list" else benign) is None, knob


@pytest.mark.parametrize("kind, field", CASES, ids=IDS)
def test_the_benign_value_renders(kind, field):
    files = baseline(kind, field.name)
    assert any(f.path.endswith(".service") for f in files)
    if field.lands and field.benign is not None:
        field.lands({f.path: f.content for f in files}, field.benign)


def test_the_readers_see_an_injected_directive():
    """The structure readers catch what the property is about (else every example would pass)."""
    unit = "[Service]\nUser=vllm\nDescription=x\n"
    assert unit_structure(unit) != unit_structure("[Service]\nUser=vllm\nDescription=x\rExecStartPre=+/bin/id\n")
    assert unit_structure(unit) != unit_structure("[Service]\nUser=vllm\nDescription=%x\n")
    assert continues("Description=x\\") and not continues("Description=x\\\\")
    conf = "events {\n}\nhttp {\n    listen 1.2.3.4:80;\n}\n"
    assert nginx_structure(conf) != nginx_structure(conf.replace("80;", "80; include /x;"))
    assert nginx_structure(conf) == nginx_structure(conf.replace("80;", "80; # x; y {"))
    assert nginx_structure('a "x;y";') == [(0, "a", 1, ";")]
    table = "geo $g {\n    10.0.0.11 1;\n}\n"  # an entry's address is data, a keyword is not
    assert nginx_structure(table) == nginx_structure(table.replace("10.0.0.11", "0.0.0.1"))
    assert nginx_structure(table) != nginx_structure(table.replace("10.0.0.11", "default"))
    assert nginx_structure(table) != nginx_structure(table.replace("10.0.0.11", "include"))
    assert vllm_flags_read({"enforce-eager": True, "port": 1}) == ["enforce-eager", "port"]
    assert vllm_flags_read({"enforce-eager": "--host=0.0.0.0"}) == ["enforce-eager", "host"]
    assert vllm_flags_read({"enforce-eager": "true"}) == ["enforce-eager", ("<stray argument>", "true")]
    assert vllm_flags_read({"uvicorn-log-level": "-x", "port": 1}) == [
        "uvicorn-log-level", ("<no value>", "uvicorn-log-level"), "x", ("<no value>", "x"), "port"]
    assert vllm_flags_read({"allowed-media-domains": ["a", "b"], "port": -1}) == ["allowed-media-domains", "port"]
