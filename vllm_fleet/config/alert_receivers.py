"""Who the fleet's alerts reach (vllm_alert_receivers): webhooks and mail, through the Alertmanager on
the monitoring host. Pure: the secrets (a webhook's whole URL or bearer token, the smarthost's
password) are read on the workstation before any host is reached (vllm_fleet/fleet_secrets.py),
never here. The knob's notes (config/knobs/monitoring.py, vllm_alert_receivers) show every kind of
receiver, with its keys.

Every value here ends up in alertmanager.yml (monitoring/alerting.py): each is refused unless it is
plain ASCII of the few characters its kind has (no line break, quote or space that could close a
YAML scalar or start a mail header; no look-alike letters), and a webhook's URL in the inventory
carries no credentials (a user:password or a query string: those go in url_env or token_env).
"""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config.errors import Checker, named_entries

WEBHOOK_KEYS = ("url", "url_env", "token_env")
EMAIL_KEYS = ("to", "from", "smarthost", "auth_username", "password_env", "require_tls")
RECEIVER_KEYS = WEBHOOK_KEYS + EMAIL_KEYS
#: More receivers than this is a list nobody reads: an inventory gone wrong.
MAX_RECEIVERS = 32
URL_MAX_CHARS = 2048
#: A URL's characters, as RFC 3986 allows them unencoded, less those YAML, a shell or a log line
#: could read as something else (quotes, spaces, backslashes, braces) and less `@` (userinfo).
_URL_CHARS = re.compile(r"[A-Za-z0-9._~:/?#\[\]!$&()*+,;=%-]+")
_HOST_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_DNS_NAME = re.compile(rf"(?=.{{1,253}}$){_HOST_LABEL}(\.{_HOST_LABEL})*")
#: A mail address as a receiver needs one: no display name, no quoting, no comment, no second
#: address (a comma), nothing a mail header could be continued with.
_MAILBOX = re.compile(r"[A-Za-z0-9._%+-]{1,64}@" + _DNS_NAME.pattern[len("(?=.{1,253}$)"):])
_USERNAME = re.compile(r"[A-Za-z0-9._@+=-]{1,128}")
#: Alertmanager's receiver that sends nothing: the route's root when the fleet has no receiver.
NO_RECEIVER = "vllm-fleet-none"
EXAMPLE = '{"ops-hook": {"url": "https://hooks.example.org/alertmanager"}}'


@dataclass(frozen=True)
class AlertReceiver:
    """One receiver: a webhook (url or url_env, optional token_env) or a mailbox (to, from, smarthost,
    optional auth_username with password_env)."""

    name: str
    url: str | None = None
    url_env: str | None = None
    token_env: str | None = None
    to: str | None = None
    sender: str | None = None
    smarthost: str | None = None
    auth_username: str | None = None
    password_env: str | None = None
    require_tls: bool = True

    @property
    def kind(self) -> str:
        return "email" if self.to else "webhook"

    def secret_envs(self) -> tuple[tuple[str, str], ...]:
        """(key, variable) of each secret the workstation reads for this receiver."""
        return tuple((key, env) for key, env in (("url_env", self.url_env), ("token_env", self.token_env),
                                                 ("password_env", self.password_env)) if env)

    def as_dict(self) -> dict[str, Any]:
        """As plan --json shows it: where its secrets come from, never a secret."""
        if self.kind == "webhook":
            return {"name": self.name, "kind": "webhook", "url": self.url, "url_env": self.url_env,
                    "token_env": self.token_env}
        return {"name": self.name, "kind": "email", "to": self.to, "from": self.sender,
                "smarthost": self.smarthost, "auth_username": self.auth_username,
                "password_env": self.password_env, "require_tls": self.require_tls}


def webhook_url_problem(url: Any, *, secret: bool = False) -> str | None:
    """Why `url` is no webhook URL Alertmanager should post to (None: it is). `secret`: the URL came
    from a secret (url_env), which may carry credentials and is never shown."""
    shown = "(not shown: it came from a secret)" if secret else repr(url)
    if not isinstance(url, str):
        return f"{'it' if secret else shown} is a {type(url).__name__}, not a URL"
    if len(url) > URL_MAX_CHARS:
        return f"{shown[:80]}... is {len(url)} characters long, more than {URL_MAX_CHARS}"
    if not secret and "@" in url:
        return f"{shown} has an '@': a user:password, which belongs in url_env or token_env, never the inventory"
    if not url.isascii() or not _URL_CHARS.fullmatch(url.replace("@", "a") if secret else url):
        return (f"{shown} has a character a URL does not carry as is: a space, quote, backslash, brace, "
                "control or non-ASCII character (percent-encode it)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"{shown} is not a URL ({exc})"
    if parts.scheme not in ("http", "https"):
        return f"{shown} is not an http:// or https:// URL (Alertmanager posts to a web server)"
    host = parts.hostname or ""
    if not (_DNS_NAME.fullmatch(host) or kinds.ip_literal(host)):
        return f"{shown} names no host name or IP address"
    if port == 0:
        return f"{shown} names port 0"
    if not secret and parts.query:
        return (f"{shown} has a query string, where webhooks carry their tokens: it would stand in "
                "alertmanager.yml and every diff")
    return None


def _smarthost_problem(value: Any) -> str | None:
    if not isinstance(value, str) or not value.isascii():
        return f"{value!r} is not host:port in plain ASCII"
    host, sep, port = value.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not kinds.ip_literal(host) or ":" not in host:
            return f"{value!r}: {host!r} in brackets is no IPv6 address"
    elif not (_DNS_NAME.fullmatch(host) or kinds.ip_literal(host) and ":" not in host):
        return f"{value!r} is not host:port (a host name or IP address, a colon, the port)"
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535 or port != str(int(port)):
        return f"{value!r} names no port from 1 to 65535 (Alertmanager needs it: 25, 465 or 587)"
    return None


def _mailbox_problem(value: Any) -> str | None:
    if isinstance(value, str) and value.isascii() and len(value) <= 254 and _MAILBOX.fullmatch(value):
        return None
    return (f"{value!r} is not one mail address (name@domain, in ASCII, without a display name, comma, "
            "space, quote or line break)")


def receiver_name_problem(name: Any) -> str | None:
    """A receiver's name: letters, digits, '-' and '_', not the receiver vllm-fleet keeps for itself."""
    if isinstance(name, str) and name.lower() == NO_RECEIVER:
        return f"receiver name {name!r} is vllm-fleet's own (the receiver that sends nothing)"
    if kinds.name_problem(name):
        return f"receiver name {name!r} is not a name of letters, digits, '-' and '_' (1-64)"
    return None


def parse_alert_receivers(check: Checker, raw: Any) -> tuple[AlertReceiver, ...]:
    """vllm_alert_receivers as checked AlertReceivers, sorted by name ({}: none). Every problem is
    reported on `check` with the receiver's key path (vllm_alert_receivers.<name>.<key>)."""
    if raw is None or raw == {}:
        return ()
    if not isinstance(raw, dict):
        check.error(f"expected a dict of receivers, got {type(raw).__name__}", key="vllm_alert_receivers",
                    fix=f"vllm_alert_receivers = {EXAMPLE}")
        return ()
    if len(raw) > MAX_RECEIVERS:
        check.error(f"{len(raw)} receivers, more than {MAX_RECEIVERS}", key="vllm_alert_receivers",
                    fix="name a few receivers (a team's webhook, its on-call mailbox); fan out behind them")
        return ()
    out = []
    for key, name, spec in named_entries(check, raw, "vllm_alert_receivers", "receiver", receiver_name_problem,
                                         fix="name the receiver like 'ops-hook' or 'oncall-mail'"):
        receiver = _parse_receiver(check, key, name, spec)
        if receiver is not None:
            out.append(receiver)
    return tuple(sorted(out, key=lambda r: r.name))


def _secret_env(check: Checker, key: str, spec: dict, field: str) -> str | None:
    value = spec.get(field)
    if value is not None and kinds.secret_env_name_problem(value):
        # Not shown: it may be the secret itself, written where its variable's name belongs.
        check.error(f"{field} (not shown: it may be the secret itself) is not the name of an environment "
                    "variable in capitals (A-Z, digits and _)", key=f"{key}.{field}",
                    fix=f"{field} = 'OPS_ALERTS_{field.removesuffix('_env').upper()}' (the variable's name, set on "
                        "the workstation)")
        return None
    return value


def _parse_receiver(check: Checker, key: str, name: str, spec: Any) -> AlertReceiver | None:
    if not isinstance(spec, dict):
        check.error(f"expected a dict, got {type(spec).__name__}", key=key, fix=f"vllm_alert_receivers = {EXAMPLE}")
        return None
    errors = len(check.errors)
    check.unknown_keys(spec, RECEIVER_KEYS, instance=None, prefix=f"{key}.")
    webhook = [k for k in WEBHOOK_KEYS if k in spec]
    email = [k for k in EMAIL_KEYS if k in spec]
    if webhook and email:
        check.error(f"a receiver is a webhook or a mailbox, not both: it has {', '.join(webhook)} and "
                    f"{', '.join(email)}", key=key, fix="split it into two receivers, one of each kind")
        return None
    if not webhook and not email:
        check.error("the receiver names neither a webhook (url or url_env) nor a mailbox (to)", key=key,
                    fix='{"url": "https://hooks.example.org/alertmanager"} or {"to": "oncall@example.org", '
                        '"from": "alerts@example.org", "smarthost": "mail.example.org:587"}')
        return None
    if webhook:
        url = spec.get("url")
        if ("url" in spec) == ("url_env" in spec):
            check.error("give the webhook as exactly one of url (in the inventory) or url_env (a secret: a "
                        "URL with a token in it)", key=key, fix='"url": "https://hooks.example.org/alertmanager"')
        elif url is not None:
            problem = webhook_url_problem(url)
            if problem:
                check.error(f"url {problem}", key=f"{key}.url",
                            fix='"url": "https://hooks.example.org/alertmanager" (a token goes in token_env, or '
                                "the whole URL in url_env)")
        url_env, token_env = _secret_env(check, key, spec, "url_env"), _secret_env(check, key, spec, "token_env")
        if len(check.errors) > errors:
            return None
        return AlertReceiver(name, url=url, url_env=url_env, token_env=token_env)
    for field in ("to", "from"):
        if field not in spec:
            check.error(f"a mail receiver needs {field}", key=f"{key}.{field}",
                        fix=f'"{field}": "{"oncall" if field == "to" else "alerts"}@example.org"')
        else:
            problem = _mailbox_problem(spec[field])
            if problem:
                check.error(f"{field}: {problem}", key=f"{key}.{field}",
                            fix=f'"{field}": "{"oncall" if field == "to" else "alerts"}@example.org" (one address; '
                                "a list of people is a receiver each, or a mailing list)")
    if "smarthost" not in spec:
        check.error("a mail receiver needs the smarthost that relays its mail", key=f"{key}.smarthost",
                    fix='"smarthost": "mail.example.org:587"')
    else:
        problem = _smarthost_problem(spec["smarthost"])
        if problem:
            check.error(f"smarthost {problem}", key=f"{key}.smarthost", fix='"smarthost": "mail.example.org:587"')
    username = spec.get("auth_username")
    if username is not None and not (isinstance(username, str) and _USERNAME.fullmatch(username)):
        check.error(f"auth_username {username!r} is not a user name of ASCII letters, digits and . _ @ + = - "
                    "(1-128)", key=f"{key}.auth_username", fix='"auth_username": "alerts"')
    password_env = _secret_env(check, key, spec, "password_env")
    if ("auth_username" in spec) != ("password_env" in spec):
        check.error("auth_username and password_env go together (the smarthost's login)", key=key,
                    fix='"auth_username": "alerts", "password_env": "SMTP_PASSWORD" (or neither)')
    require_tls = spec.get("require_tls", True)
    if not isinstance(require_tls, bool):
        check.error(f"require_tls must be True or False, got {require_tls!r}", key=f"{key}.require_tls",
                    fix='"require_tls": True (STARTTLS before the login and the mail; False only for a relay '
                        "on the monitoring host's own network)")
    if len(check.errors) > errors:
        return None
    return AlertReceiver(name, to=spec["to"], sender=spec["from"], smarthost=spec["smarthost"],
                         auth_username=username, password_env=password_env, require_tls=require_tls)
