"""What every rendered file is made with (pure): the file itself, the secrets it may hold, the
templates' jinja environment and the quoting rules its filters apply.

render.py (the instances', Ray's and the front's files) and gateway.py (the gateway's) both build on
this module, so neither imports the other for it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2

from vllm_fleet.host_layout import host_layout
from vllm_fleet.kinds import LINE_BREAKING

if TYPE_CHECKING:
    from vllm_fleet.config import HostConfig

TEMPLATES = Path(__file__).resolve().parent / "templates"  # package data (the root templates/ links here)


@dataclass(frozen=True)
class Secrets:
    """Secret values, read on the workstation at deploy time; never in host data or the repo.

    api_key: the fleet key (vllm_api_key_env) of a fleet without vllm_api_clients; client_keys: each
    configured client's key, by client name; host_key: the host's own key (host_keys.host_key), the
    only one vLLM holds; tls: the host's certificate, key and trusted CAs (vllm_tls); metrics_token:
    what the fleet's Prometheus sends for /metrics (vllm_metrics), never an API key."""

    api_key: str | None = None
    hf_token: str | None = None
    client_keys: tuple[tuple[str, str], ...] = ()
    host_key: str | None = None
    tls: Any = None  # tls.HostTls
    metrics_token: str | None = None  # vllm_metrics_token_env: Prometheus' bearer token for /metrics
    #: The alert receivers' secrets on the monitoring host, ((receiver, key), value): key is url_env,
    #: token_env or password_env (vllm_alert_receivers); only Alertmanager's config holds them.
    alert_secrets: tuple[tuple[tuple[str, str], str], ...] = ()

    def pairs(self, placeholders: bool) -> list[tuple[str, str]]:
        """(name, value) for an instance's env file. `placeholders`: for `vllm-fleet render`, which
        must show where secrets go without knowing them. vLLM holds the host's own key (the front
        checks the clients' keys and passes requests on with it). The HF token is not among them: the
        deploy downloads everything an instance loads beforehand (hub.env, root-only, for downloads
        only) and units start with HF_HUB_OFFLINE=1, so the serving process never needs it, and a
        rotated token restarts nothing."""
        if placeholders:
            return [("VLLM_API_KEY", "<secret: filled in at deploy time>")]
        return [("VLLM_API_KEY", self.host_key)] if self.host_key else []

    def keys_by_client(self, fleet_key_client: str) -> dict[str, str]:
        """Every client's key by client name: the configured clients', else the fleet key's."""
        if self.client_keys:
            return dict(self.client_keys)
        return {fleet_key_client: self.api_key} if self.api_key else {}

    def fingerprint(self) -> str:
        """A digest that changes when vLLM's key changes (so the unit restarts), revealing nothing.
        Clients' keys are not in it: the front checks them, and a change reloads it only."""
        material = json.dumps([self.host_key]).encode()
        return hashlib.sha256(b"vllm-fleet-secrets\0" + material).hexdigest()[:16]


@dataclass(frozen=True)
class RenderedFile:
    path: str  # absolute path on the host
    content: str
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    secret: bool = False  # content holds secret values: never print or diff it


def front_secrets_dir(host: HostConfig) -> str:
    """HostLayout.front_secrets_dir of the host."""
    return host_layout(host).front_secrets_dir


def front_paths(host: HostConfig) -> dict[str, str]:
    """HostLayout.front of the host."""
    return host_layout(host).front


# --- EnvironmentFile quoting: ONE rule, used by the writer (here) and the reader (the probe's
# env_unquote, which runs on the host with the stdlib alone and so keeps its own copy of the set
# below; tests/render/test_render.py checks that the two agree).
# It is systemd's own (src/basic/env-file.c, parse_env_file_internal): inside '...' every character
# is literal, backslashes included; inside "..." a backslash escapes only " \ ` $ (before any other
# character it stays); unquoted, a backslash escapes the next character and trailing blanks go.
ENV_FILE_ESCAPED = '"\\`$'


def env_quote(value: str) -> str:
    """An EnvironmentFile value that systemd reads back as exactly `value` (no line breaks)."""
    if "\n" in value or "\r" in value or "\0" in value:
        raise ValueError("an EnvironmentFile value cannot hold a line break or NUL")
    if "'" not in value:
        return "'" + value + "'"
    return '"' + "".join("\\" + c if c in ENV_FILE_ESCAPED else c for c in value) + '"'


def _systemd_line(text: Any) -> str:
    """A value as one line of a unit: systemd ends a line at \\n, \\r and NUL, so a value holding
    one (or any other control character) is unrepresentable and refused, whatever config let past."""
    text = str(text)
    if LINE_BREAKING.search(text):
        raise ValueError(f"{text!r} cannot be written into a systemd unit: it holds a control character")
    return text


def nginx_string(text: str, newline: bool = False) -> str:
    """One nginx config token holding exactly `text`: double-quoted, with '\\' and '"' escaped
    (ngx_conf_file.c unescapes \\\\, \\" and \\' and keeps any other backslash; '$' in a map's key is
    not a variable, and nothing else is special inside quotes). `newline`: ended by nginx's own \\n
    escape (a `return` body that ends its line)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + ("\\n" if newline else "") + '"'


def _nginx_quote(text: Any) -> str:
    """nginx_string for a template value, refusing what one line of nginx's config cannot hold."""
    return nginx_string(_systemd_line(text))


def _systemd_quote(text: str) -> str:
    """Quote one Environment= assignment: systemd unquotes "..." and expands % specifiers."""
    escaped = _systemd_line(text).replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return f'"{escaped}"'


@functools.cache
def jinja_environment() -> jinja2.Environment:
    """One environment a process: it caches the compiled templates (compiling the six of a host
    took ~0.1 s of CPU, for every host of a run, before the no-op had sent a command)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.filters["systemd_quote"] = _systemd_quote
    # free text in a directive (Description=): systemd expands % specifiers there too
    env.filters["systemd_text"] = lambda text: _systemd_line(text).replace("%", "%%")
    env.filters["systemd_comment"] = _systemd_line  # a comment: one line, no specifiers
    env.filters["nginx_quote"] = _nginx_quote
    env.filters["env_quote"] = env_quote  # the host probe reads it back with env_unquote
    return env
