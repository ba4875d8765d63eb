"""The typed settings model (vllm_fleet/settings.py): every host-level knob with its type, default and
doc in one place, group_data/all.py in step with it, and its errors (unknown knobs, wrong types)."""

from __future__ import annotations

import ast
import dataclasses
import typing
import io
import tokenize
from pathlib import Path

import pytest

from planning_fixtures import host_data
from vllm_fleet.config import HOST_DEFAULTS, ConfigErrors, parse_host
from vllm_fleet.settings import KNOBS, PYINFRA_PREFIXES, TYPES, Settings, describe

ROOT = Path(__file__).resolve().parent.parent
ALL_PY = ROOT / "group_data" / "all.py"


def group_data_all() -> tuple[str, list[ast.Assign]]:
    text = ALL_PY.read_text()
    return text, [node for node in ast.parse(text).body if isinstance(node, ast.Assign)]


def knob_assignments() -> list[ast.Assign]:
    """group_data/all.py's assignments of vllm-fleet knobs (pyinfra's own keys, ssh_..., left out)."""
    return [node for node in group_data_all()[1] if not node.targets[0].id.startswith(PYINFRA_PREFIXES)]


def problems(data: dict) -> list:
    with pytest.raises(ConfigErrors) as info:
        Settings.from_data(data, host="box")
    return info.value.errors


# --- group_data/all.py is the documented copy of the model -----------------------------------------

def test_group_data_all_defines_exactly_the_models_knobs_in_its_order():
    names = [node.targets[0].id for node in knob_assignments()]
    missing, extra = set(KNOBS) - set(names), set(names) - set(KNOBS)
    assert not missing, f"knobs of Settings not in group_data/all.py: {sorted(missing)}"
    assert not extra, f"knobs in group_data/all.py that Settings lacks (add a field): {sorted(extra)}"
    assert names == list(KNOBS), "group_data/all.py and Settings list the knobs in the same order"


def test_group_data_all_gives_each_knob_the_models_default():
    documented = {node.targets[0].id: ast.literal_eval(node.value) for node in knob_assignments()}
    defaults = Settings.defaults()
    wrong = {k: (documented[k], defaults[k]) for k in KNOBS if documented[k] != defaults[k]
             or type(documented[k]) is not type(defaults[k])}
    assert not wrong, f"(group_data/all.py, Settings) defaults differ: {wrong}"
    assert HOST_DEFAULTS == defaults and list(HOST_DEFAULTS) == list(KNOBS)


def test_each_knob_in_group_data_all_is_documented_by_a_comment():
    """A comment on the knob's line, or a comment block right above it (or above the knobs it is
    grouped with, no blank line between). A section rule (`# --- Planner ---`) is no documentation."""
    text, assigns = group_data_all()
    comments = {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(text).readline)
                if tok.type == tokenize.COMMENT}
    assigned = {line for node in assigns for line in range(node.lineno, node.end_lineno + 1)}
    undocumented = []
    for node in knob_assignments():
        if node.lineno in comments:
            continue
        line = node.lineno - 1
        while line in assigned:
            line -= 1
        comment = comments.get(line, "")
        if not comment or comment.startswith("# ---"):
            undocumented.append(node.targets[0].id)
    assert not undocumented, f"knobs without a comment in group_data/all.py: {undocumented}"


# --- The model itself ----------------------------------------------------------------------------

@pytest.mark.parametrize("knob", KNOBS)
def test_each_knob_has_a_type_a_default_that_passes_its_own_check_and_a_one_line_doc(knob):
    doc = Settings.doc(knob)
    assert doc.strip() and "\n" not in doc
    assert knob in TYPES and describe(TYPES[knob])
    assert Settings.problem(knob, Settings.defaults()[knob]) is None


def test_no_data_is_every_default_and_reads_like_a_dict():
    settings = Settings.from_data({})
    assert dataclasses.asdict(settings) == HOST_DEFAULTS
    assert settings["vllm_gateway_port"] == settings.vllm_gateway_port == 9000
    with pytest.raises(KeyError):
        settings["vllm_port"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.vllm_root = "/srv"  # type: ignore[misc]


def test_a_host_config_holds_typed_settings_and_has_no_string_lookup():
    host = parse_host("box", host_data(vllm_root="/srv/vllm", vllm_ray_port=6400, ssh_user="deploy"))
    assert isinstance(host.settings, Settings)
    assert host.settings.vllm_root == "/srv/vllm" and host.settings.vllm_ray_port == 6400
    assert host.settings.vllm_advertise_address == "box"  # resolved: no bind address, no ssh_hostname
    with pytest.raises(KeyError):
        host.settings["ssh_user"]  # pyinfra's keys pass through, but are no knob
    with pytest.raises(TypeError):
        host["vllm_root"]  # knobs are read typed, through settings: no string lookups on the host


# --- Unknown knobs name the closest known one ----------------------------------------------------

@pytest.mark.parametrize("knob", KNOBS)
def test_an_unknown_knob_names_the_closest_known_one(knob):
    typo = knob[:len(knob) // 2] + knob[len(knob) // 2 + 1:]  # a letter dropped in the middle
    errs = problems({typo: 1})
    assert [(e.key, e.message, e.fix) for e in errs] == [(typo, f"unknown key '{typo}'", f"did you mean '{knob}'?")]


def test_unknown_knobs_through_parse_host_are_all_reported_and_pyinfra_keys_pass():
    with pytest.raises(ConfigErrors) as info:
        parse_host("box", host_data(vllm_gatway_port=9001, placment="auto", vllm_nonsense_xyz=1,
                                    ssh_user="deploy", _sudo=True, sandbox_gpus=[], something_else=1))
    found = {e.key: e.fix for e in info.value.errors}
    assert found == {"vllm_gatway_port": "did you mean 'vllm_gateway_port'?",
                     "placment": "did you mean 'placement'?",
                     "vllm_nonsense_xyz": "see group_data/all.py for every knob"}


# --- Type errors name the knob and the expected type ---------------------------------------------

@pytest.mark.parametrize("knob, value, message", [
    ("vllm_version", 0.33, "expected str, got float 0.33"),
    ("vllm_wheelhouse", 5, "expected str or None, got int 5"),
    # A knob that names a secret's source never shows its value: it may be the secret itself.
    ("vllm_api_key_file", ["key.txt"], "expected str or None, got list (the value is not shown: it may be "
                                       "the secret itself)"),
    ("vllm_hf_token_env", 123456789012345678, "expected str, got int (the value is not shown: it may be "
                                              "the secret itself)"),
    ("vllm_root", None, "expected str, got NoneType None"),
    ("vllm_gateway_port", "9000", "must be a port number (1-65535), got '9000'"),
    ("vllm_backend_port_offset", True, "must be a positive integer, got True"),
    ("vllm_verify", "yes", "must be True or False, got 'yes'"),
    ("vllm_gpu_memory_utilization", "0.9", "must be a fraction in (0, 1], got '0.9'"),
    ("vllm_extra_packages", "ray", "must be a list of pip requirement strings, got 'ray'"),
    ("vllm_verify_timeout_s", "600", "must be None or a number of seconds above 0, got '600'"),
    ("gpus", "A100", "expected a list of GPUs, got str"),
    ("vllm_instances", {"name": "a"}, "expected a list, got dict"),
])
def test_a_wrong_type_names_the_knob_and_the_expected_type(knob, value, message):
    errs = problems({knob: value})
    assert [(e.host, e.key, e.message) for e in errs] == [("box", knob, message)]
    assert errs[0].fix


@pytest.mark.parametrize("knob", KNOBS)
def test_every_knob_refuses_a_value_of_no_type_it_takes(knob):
    """A dict is no knob's type (a list none of the dict knobs'): each knob reports it once, naming
    what it takes, with a fix."""
    wrong = ["x"] if typing.get_origin(TYPES[knob]) is dict else {"x": 1}
    errs = problems({knob: wrong})
    assert [e.key for e in errs] == [knob] and errs[0].fix
    rule = dataclasses.fields(Settings)[KNOBS.index(knob)].metadata
    if "choices" in rule:
        assert all(str(choice) in errs[0].message for choice in rule["choices"]), errs[0].message
    elif "must" in rule:
        assert errs[0].message.startswith(f"must be {rule['must']}, got ")
    else:
        assert errs[0].message.startswith(f"expected {rule.get('kind') or describe(TYPES[knob])}, "
                                          f"got {type(wrong).__name__}")


def test_all_problems_are_reported_together():
    errs = problems({"vllm_gateway_port": 0, "vllm_root": "opt", "placement": "splt", "vllm_verify": 1,
                     "vllm_typo_knob": 2})
    assert {e.key for e in errs} == {"vllm_gateway_port", "vllm_root", "placement", "vllm_verify", "vllm_typo_knob"}
    assert next(e for e in errs if e.key == "placement").fix == "did you mean 'split'?"


def test_a_secret_written_where_its_variables_name_belongs_is_not_echoed():
    errs = problems({"vllm_api_key_env": "sk-live-1234"})
    assert [e.key for e in errs] == ["vllm_api_key_env"] and "sk-live-1234" not in errs[0].located()
