"""No line-breaking or control character from a host's data reaches a unit, nginx or YAML, and host
names are names: each case an attacker's review got through `vllm-fleet plan` and render, refused
with an error naming host, instance and key (exit 2 from the CLI, no traceback)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support.planning_fixtures import host_data, instance, parse_errors
from vllm_fleet.config import parse_host

REPO = Path(__file__).resolve().parents[2]
INJECTION = "[Service]{0}ExecStartPre=+/bin/sh -c 'id > /root/pwned'{0}X="


@pytest.mark.parametrize("breaker", ["\n", "\r", "\x00", "\x1b", "\u2028", "\u2029", "\x85", "\t"])
def test_an_env_value_that_breaks_a_line_is_refused(breaker):
    data = host_data(instances=[instance(name="q", env={"VLLM_LOGGING_LEVEL": "INFO" + INJECTION.format(breaker)})])
    [err] = parse_errors(data, "h1")
    assert (err.host, err.instance, err.key) == ("h1", "q", "env.VLLM_LOGGING_LEVEL")


@pytest.mark.parametrize("field, value, key", [
    ("served_model_name", "qwen\x00[Service]\x00ExecStartPre=+/usr/sbin/reboot\x00[Unit]", "served_model_name"),
    ("name", "q\n", "name"),  # a trailing newline passed `re.match(...$)`
    ("engine_args", {"uvicorn-log-level\n": "info"}, "engine_args (a key)"),
    ("engine_args", {"uvicorn-log-level": ["info", "--host\r0.0.0.0"]}, "engine_args.uvicorn-log-level[1]"),
])
def test_instance_fields_with_control_characters_are_refused(field, value, key):
    errors = parse_errors(host_data(instances=[instance(**{field: value})]), "h1")
    assert any(e.key == key and e.host == "h1" for e in errors), [e.located() for e in errors]


@pytest.mark.parametrize("knob, value", [
    ("vllm_service_user", "root\n"),
    ("vllm_bind_host", "fe80::1%x\n[Service]\nExecStartPre=+reboot\n#"),
    ("vllm_advertise_address", "10.0.0.1\r"),
    ("vllm_private_interface", "eth1\n"),
    ("vllm_version", "0.33.0\n"),
    ("vllm_extra_packages", ["ray==2.60.0\n"]),
])
def test_host_knobs_with_control_characters_are_refused(knob, value):
    errors = parse_errors(host_data(**{knob: value}), "h1")
    assert any(e.key.startswith(knob) and e.instance is None for e in errors), [e.located() for e in errors]


def test_a_gpu_name_with_a_newline_is_refused():
    data = host_data()
    data["gpus"][0]["name"] = "NVIDIA A100-SXM4-40GB\n[Service]\nExecStartPre=+/usr/bin/id"
    assert [e.key for e in parse_errors(data, "h1")] == ["gpus[0].name"]


@pytest.mark.parametrize("name", ["h1\n[Service]\nExecStartPre=+/usr/bin/id\n#", "/srv/x", "../../x", "/",
                                  "[/bold]", "fe80::1%eth0", "", "a b"])
def test_host_names_that_are_not_names_are_refused(name):
    [err] = parse_errors(host_data(), name)
    assert err.key == "host name"


@pytest.mark.parametrize("name", ["gpu-a100-01", "10.0.0.5", "2001:db8::1", "@local", "box.example.org"])
def test_host_names_people_use_are_accepted(name):
    assert parse_host(name, host_data()).name == name


def test_plan_refuses_with_exit_2_and_no_traceback(tmp_path):
    inv = tmp_path / "hostile.py"
    inv.write_text(
        "from support.planning_fixtures import host_data, instance\n"
        "box = [('h1', host_data(instances=[instance(name='q', env={'X': 'INFO\\r[Service]\\rExecStartPre=+/bin/id'})]))]\n"
        "named = [('h2\\n[Service]', host_data())]\n")
    done = subprocess.run([sys.executable, "-m", "vllm_fleet.cli", "plan", str(inv)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert "host h1, instance q, key env.X" in done.stderr and "key host name" in done.stderr
    assert "Traceback" not in done.stderr and "ExecStartPre" not in done.stdout


def test_a_percent_in_the_served_name_stays_text_in_the_unit():
    """`%Z` in Description= is a systemd specifier (systemd dropped the line); doubled, it is text."""
    from vllm_fleet.plan import plan_host
    from vllm_fleet.render import Secrets, render_host

    host = parse_host("h1", host_data(placement="single-instance",
                                      instances=[instance(served_model_name="qwen-100%Z")]))
    unit = next(f.content for f in render_host(host, plan_host(host), Secrets("k", None))
                if f.path.endswith("vllm-gemma.service"))
    assert "Description=vLLM qwen-100%%Z (vllm-fleet instance gemma)" in unit
