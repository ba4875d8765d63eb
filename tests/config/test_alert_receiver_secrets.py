"""The alert receivers' secrets, read on the workstation before any host is touched (fleet_secrets):
each named variable required, a url_env an http(s) URL, none with a control character or whitespace
around it, none another secret's value, none shown in a message; and read only for the monitoring
host, into Alertmanager's config alone."""

from __future__ import annotations

import pytest

from support.planning_fixtures import host_data
from vllm_fleet.config import parse_host
from vllm_fleet.config.fleet_checks import secret_sources
from vllm_fleet.fleet_secrets import SecretReader

METRICS_TOKEN = "mt-" + "9f" * 16
RECEIVERS = {"ops": {"url": "https://hooks.example.org/a", "token_env": "OPS_HOOK_TOKEN"},
             "chat": {"url_env": "CHAT_HOOK_URL"},
             "mail": {"to": "oncall@example.org", "from": "alerts@example.org", "smarthost": "mail.example.org:587",
                      "auth_username": "alerts", "password_env": "SMTP_PASSWORD"}}
GOOD = {"VLLM_FLEET_API_KEY": "sk-" + "a1b2c3d4" * 4, "VLLM_FLEET_METRICS_TOKEN": METRICS_TOKEN,
        "OPS_HOOK_TOKEN": "hook-token-71c9e2a4", "CHAT_HOOK_URL": "https://chat.example.org/hooks/T0K-9a8b",
        "SMTP_PASSWORD": "pass word-4b7d"}


def _monitor(monitoring=True):
    return parse_host("mon", host_data(placement="single-instance", vllm_metrics=True, vllm_monitoring=monitoring,
                                       vllm_alert_receivers=RECEIVERS))


def _read(environ, config=None):
    reader = SecretReader(environ)
    secrets = reader.host(config or _monitor())
    return secrets, reader.errors()


def test_every_receivers_secret_is_read_for_alertmanager():
    secrets, errors = _read(GOOD)
    assert errors == []
    assert dict(secrets.alert_secrets) == {("ops", "token_env"): GOOD["OPS_HOOK_TOKEN"],
                                           ("chat", "url_env"): GOOD["CHAT_HOOK_URL"],
                                           ("mail", "password_env"): GOOD["SMTP_PASSWORD"]}


def test_a_host_that_is_not_the_monitor_reads_no_receiver_and_needs_none():
    config = _monitor(monitoring=False)
    assert config.alert_receivers == ()
    secrets, errors = _read({k: v for k, v in GOOD.items() if not k.startswith(("OPS", "CHAT", "SMTP"))}, config)
    assert errors == [] and secrets.alert_secrets == ()


@pytest.mark.parametrize("variable, value, words", [
    ("OPS_HOOK_TOKEN", None, "$OPS_HOOK_TOKEN is not set"),
    ("OPS_HOOK_TOKEN", "tok\nen-71c9e2a4", "control character"),
    ("SMTP_PASSWORD", " padded-password ", "whitespace"),
    ("CHAT_HOOK_URL", "file:///etc/shadow", "not an http:// or https:// URL"),
    ("CHAT_HOOK_URL", "https://chat.example.org/a b", "a character a URL does not carry"),
    ("CHAT_HOOK_URL", "https://chat.еxample.org/hooks", "outside ASCII"),
    ("OPS_HOOK_TOKEN", METRICS_TOKEN, "the same value as the metrics token"),
], ids=["unset", "line-break", "whitespace", "file-url", "space-in-url", "lookalike-url", "metrics-token-reused"])
def test_a_bad_secret_is_refused_naming_host_and_key_never_its_value(variable, value, words):
    environ = dict(GOOD)
    if value is None:
        del environ[variable]
    else:
        environ[variable] = value
    secrets, errors = _read(environ)
    assert secrets is None
    (error,) = [e for e in errors if variable in e.message or "metrics token" in e.message]
    knob = {"OPS_HOOK_TOKEN": "ops.token_env", "SMTP_PASSWORD": "mail.password_env", "CHAT_HOOK_URL": "chat.url_env"}
    assert error.host == "mon" and error.key.endswith(knob[variable]) or error.key == "vllm_metrics_token_env"
    assert words in error.message, error.message
    text = f"{error.message} {error.fix}"
    if value and value.strip():
        assert value not in text and value.strip() not in text


def test_one_variable_for_two_secrets_is_refused_before_anything_is_read():
    sources = secret_sources(_monitor())
    assert ("alert receiver ops's token", "$OPS_HOOK_TOKEN", "vllm_alert_receivers.ops.token_env") in sources
    assert ("alert receiver mail's password", "$SMTP_PASSWORD", "vllm_alert_receivers.mail.password_env") in sources
