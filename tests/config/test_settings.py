"""The typed settings model (vllm_fleet/config/settings.py, its knobs declared in config/knobs/): every
host-level knob with its type, default and doc in one place, and its errors (unknown knobs, wrong
types). group_data/all.py, written from it, is tests/config/test_reference.py's."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from support.planning_fixtures import host_data
from vllm_fleet.config import HOST_DEFAULTS, ConfigErrors, parse_host
from vllm_fleet.config.schema import describe
from vllm_fleet.config.settings import DECLARED, KNOBS, TYPES, Settings


def problems(data: dict) -> list:
    with pytest.raises(ConfigErrors) as info:
        Settings.from_data(data, host="box")
    return info.value.errors


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
    rule = DECLARED[knob].rule
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
