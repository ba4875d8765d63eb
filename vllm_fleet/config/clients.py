"""The API's clients (vllm_api_clients): who may call the fleet, with which key, for which models, how
often. Pure: the keys themselves are read on the workstation before any host is reached
(vllm_fleet/fleet_secrets.py), never here.

    vllm_api_clients = {
        "ci":       {"key_env": "CI_VLLM_KEY", "requests_per_minute": 6},
        "research": {"key_file": "~/.config/vllm-fleet/research.key", "models": ["qwen2.5-7b"]},
    }

Each front and the gateway accept exactly these keys (render_front.front_files): a client asking for a model
outside `models` gets 403 and its request never reaches vLLM; over `requests_per_minute` it gets 429 with
Retry-After. Without vllm_api_clients the fleet has one client, FLEET_KEY_CLIENT, whose key comes from
vllm_api_key_env / vllm_api_key_file.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config.errors import Checker, named_entries

#: The client of a fleet without vllm_api_clients: the key of vllm_api_key_env / vllm_api_key_file.
FLEET_KEY_CLIENT = "fleet-key"
#: The host's own client: the key it generated for its vLLM instances (deploy.access), which the
#: verification and status use on the host. No configured client may take this name.
HOST_CLIENT = "vllm-fleet"
RESERVED_CLIENT_NAMES = (FLEET_KEY_CLIENT, HOST_CLIENT)
#: Words nginx reads as keywords where a name could stand (a map's `default`, `hostnames`, `include`,
#: `volatile`). The fronts never use a client's name as a map key (client_id), but a name that is a
#: keyword of the tool it passes through means two things: it is refused, in any case.
NGINX_KEYWORDS = ("default", "hostnames", "include", "volatile")
CLIENT_KEYS = ("key_env", "key_file", "models", "requests_per_minute")
#: nginx's limit_req counts requests per minute in whole requests; more than this is no limit at all.
MAX_REQUESTS_PER_MINUTE = 60_000
EXAMPLE = '{"ci": {"key_env": "CI_VLLM_KEY", "models": ["qwen2.5-7b"], "requests_per_minute": 60}}'


@dataclass(frozen=True)
class ApiClient:
    """One client of the fleet's API. `models` None: every model; `requests_per_minute` None: no limit."""

    name: str
    key_env: str | None = None
    key_file: str | None = None
    models: tuple[str, ...] | None = None
    requests_per_minute: int | None = None

    @property
    def id(self) -> str:
        """The client as the fronts' nginx maps know it (client_id)."""
        return client_id(self.name)

    def may_use(self, served_model_name: str) -> bool:
        return self.models is None or served_model_name in self.models

    def retry_after_s(self) -> int:
        """What a 429 tells the client to wait: the time one request's slot takes to come back."""
        return max(1, -(-60 // self.requests_per_minute)) if self.requests_per_minute else 1

    def source(self) -> str:
        return f"${self.key_env}" if self.key_env else f"the file {self.key_file}"

    def as_dict(self) -> dict[str, Any]:
        """As plan --json and status show it: where its key comes from, never the key."""
        return {"name": self.name, "key_env": self.key_env, "key_file": self.key_file,
                "models": list(self.models) if self.models is not None else None,
                "requests_per_minute": self.requests_per_minute}


def client_id(name: str) -> str:
    """What the fronts' nginx maps key a client by: "c" and 16 hex digits of a hash of its name.
    nginx matches a map's plain keys case-insensitively and reads some words there as keywords
    (`default`, `include`), so a name used as a key could share another client's permissions or
    break the config; an id of lower-case hex is always one literal key of its own. The name
    itself reaches nginx only as a quoted value (what the access log and error answers print)."""
    return "c" + hashlib.sha256(b"vllm-fleet client\0" + name.encode()).hexdigest()[:16]


def fleet_key_client(key_env: str, key_file: str | None) -> ApiClient:
    return ApiClient(FLEET_KEY_CLIENT, key_env=key_env, key_file=key_file)


def parse_api_clients(check: Checker, raw: Any, key_env: str, key_file: str | None) -> tuple[ApiClient, ...]:
    """vllm_api_clients as checked ApiClients, sorted by name; {} (the default): the fleet key's client.
    Every problem is reported on `check` with the client's key path (vllm_api_clients.<name>.<key>)."""
    if raw is None or raw == {}:
        return (fleet_key_client(key_env, key_file),)
    if not isinstance(raw, dict):
        check.error(f"expected a dict of clients, got {type(raw).__name__}", key="vllm_api_clients",
                    fix=f"vllm_api_clients = {EXAMPLE}")
        return ()
    clients = []
    for key, name, spec in named_entries(check, raw, "vllm_api_clients", "client", client_name_problem,
                                         fix="name the client like 'ci' or 'research-team'",
                                         why_one=": logs, status and nginx would take them for one client"):
        client = _parse_client(check, key, name, spec)
        if client is not None:
            clients.append(client)
    if not clients and not check.errors:
        check.error("vllm_api_clients names no client", key="vllm_api_clients",
                    fix=f"vllm_api_clients = {EXAMPLE}, or leave it unset for the one key of vllm_api_key_env")
    return tuple(sorted(clients, key=lambda c: c.name))


def client_name_problem(name: Any) -> str | None:
    """A client's name: letters, digits, '-' and '_', not vllm-fleet's own clients' nor a keyword of
    nginx, in any case (a name differing from one only in case is refused too)."""
    if kinds.name_problem(name):
        return f"client name {name!r} is not a name: letters, digits, '-' and '_', at most 64"
    lowered = name.lower()
    for reserved in RESERVED_CLIENT_NAMES:
        if lowered == reserved:
            role = "the fleet key without clients" if reserved == FLEET_KEY_CLIENT else "the host key of verification and status"
            same = "" if name == reserved else f" (written {name!r})"
            return f"client name {reserved!r}{same} is vllm-fleet's own: {role}"
    if lowered in NGINX_KEYWORDS:
        return f"client name {name!r} is a keyword of nginx's config ({lowered}), which the fronts' checks pass through"
    return None


def _parse_client(check: Checker, key: str, name: str, spec: Any) -> ApiClient | None:
    if not isinstance(spec, dict):
        check.error(f"expected a dict, got {type(spec).__name__}", key=key,
                    fix=f'vllm_api_clients = {{"{name}": {{"key_env": "{name.upper().replace("-", "_")}_KEY"}}}}')
        return None
    errors = len(check.errors)
    check.unknown_keys(spec, CLIENT_KEYS, instance=None, prefix=f"{key}.")
    key_env, key_file = spec.get("key_env"), spec.get("key_file")
    if (key_env is None) == (key_file is None):
        check.error("give the client's key as exactly one of key_env or key_file", key=key,
                    fix=f'{{"key_env": "{name.upper().replace("-", "_")}_KEY"}} (a variable on the '
                        'workstation) or {"key_file": "<a file of this workstation holding the key alone>"}')
    if key_env is not None and kinds.secret_env_name_problem(key_env):
        # The value is not shown: it may be the key itself, written where its name belongs.
        check.error("key_env (not shown: it may be the key itself) is not the name of an environment "
                    "variable in capitals (A-Z, digits and _)", key=f"{key}.key_env",
                    fix="key_env = 'CI_VLLM_KEY' (the variable's name)")
    if key_file is not None:
        # The value is not shown: it may be the key itself, written where its file's path belongs.
        problem = (kinds.workstation_path_problem(key_file) if isinstance(key_file, str)
                   else f"is a {type(key_file).__name__}, not a path (not shown: it may be the key itself)")
        if problem:
            check.error(f"key_file {problem}", key=f"{key}.key_file",
                        fix=f"key_file = '~/.config/vllm-fleet/{name}.key' (a file of this workstation, 0600, "
                            "holding the key alone)")
    models = spec.get("models")
    if models is not None:
        if not isinstance(models, (list, tuple)) or isinstance(models, str):
            check.error(f"models must be a list of served model names, got {type(models).__name__}",
                        key=f"{key}.models", fix='"models": ["qwen2.5-7b"] (or leave it out: every model)')
            models = None
        else:
            for position, model in enumerate(models):
                problem = kinds.served_name_problem(model)
                if problem:
                    check.error(f"models[{position}]: {problem}", key=f"{key}.models",
                                fix="a served_model_name of the fleet (not an instance's name), e.g. 'qwen2.5-7b'")
            models = tuple(dict.fromkeys(m for m in models if isinstance(m, str)))
    limit = spec.get("requests_per_minute")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                              or not 1 <= limit <= MAX_REQUESTS_PER_MINUTE):
        check.error(f"requests_per_minute must be a whole number from 1 to {MAX_REQUESTS_PER_MINUTE}, "
                    f"got {limit!r}", key=f"{key}.requests_per_minute",
                    fix='"requests_per_minute": 60 (or leave it out: no limit)')
    if len(check.errors) > errors:
        return None
    return ApiClient(name, key_env=key_env, key_file=key_file, models=models, requests_per_minute=limit)
