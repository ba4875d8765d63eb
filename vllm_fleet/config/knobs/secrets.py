"""Secrets: where the workstation reads the API key, the clients' keys and the tokens (read before
any host is reached; vllm_fleet/fleet_secrets.py), and the API's clients (config/clients.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm_fleet.config.knobs.common import ENV_NAME, WORKSTATION_FILE
from vllm_fleet.config.schema import knob, section


@section("Secrets (read on the workstation before any host is reached; never written to the repo)", notes="""
    `vllm-fleet check INVENTORY` reads every one of them (all hosts, all clients) and reports every
    problem at once, connecting to no host; the deploy and rollout run the same check first. A file
    named here is read only if it is a regular file of the user running vllm-fleet (not a link, device
    or FIFO), of a bounded size, writable by no one else and, holding a secret, readable by no other
    user (0600 or 0640). A key file holds the key alone, on one line. Each secret has a variable or file
    of its own, and a value of its own (a client's key, the metrics token, the HF token).
    A key or token is refused (before any host changes) when it has whitespace around it, a byte order
    mark, a control or a non-ASCII character, when its nginx pattern would not fit in one nginx
    parameter (4095 bytes: up to 4081 letters and digits), or when it is shorter than 16 characters or
    has fewer than 5 different ones (a placeholder: `openssl rand -hex 32` makes a key).
    """)
@dataclass(frozen=True)
class SecretsKnobs:
    vllm_api_key_env: str = knob(
        "VLLM_FLEET_API_KEY", "environment variable holding the API key (a name in capitals)", **ENV_NAME,
        fix="vllm_api_key_env = 'VLLM_FLEET_API_KEY' (the variable's name; the key itself stays out of "
            "the inventory)")
    vllm_api_key_file: str | None = knob(
        None, "or a file on the workstation holding it alone (a path from / or ~)", **WORKSTATION_FILE,
        fix="vllm_api_key_file = '~/.config/vllm-fleet/api.key' (a file of this workstation, 0600, holding "
            "the key alone), or None")
    vllm_api_clients: dict[str, dict[str, Any]] = knob(
        {}, "a key per client, with its models and limit; {}: one key, the one above", kind="a dict of clients",
        shallow=True,
        fix='vllm_api_clients = {"ci": {"key_env": "CI_VLLM_KEY", "models": ["qwen2.5-7b"], '
            '"requests_per_minute": 60}}',
        notes="""
        The API's clients, each with its own key (fleet-wide: every host of a fleet with a gateway gives the
        same). {}: one client, "fleet-key", with the key above. Otherwise the key above is not used and
        each front and the gateway accept exactly these keys:
          vllm_api_clients = {
              "ci":       {"key_env": "CI_VLLM_KEY", "requests_per_minute": 60},
              "research": {"key_file": "~/.config/vllm-fleet/research.key", "models": ["qwen2.5-7b"]},
          }
        key_env / key_file: where the workstation reads the client's key (exactly one). models: the served
        names it may use (served_model_name, not the instance's name; one no instance of the fleet serves is
        refused, with the served name meant; others get 403 and never reach vLLM; GET /v1/models lists only
        these); absent: every model. requests_per_minute: beyond it, 429 with Retry-After (nginx's
        limit_req: the minute's requests at once, then one each 60/N s; counted per front and at the
        gateway). vLLM holds only the
        host's own key, so adding, rotating or revoking a client reloads nginx, never restarts vLLM. Each
        request is logged as one JSON line with the client's name (journalctl -t vllm_fleet_access).
        """)
    vllm_metrics_token_env: str = knob(
        "VLLM_FLEET_METRICS_TOKEN", "environment variable holding the metrics token", **ENV_NAME,
        fix="vllm_metrics_token_env = 'VLLM_FLEET_METRICS_TOKEN' (the variable's name; the token itself "
            "stays out of the inventory)",
        notes="""
        The metrics token: Prometheus' bearer token for every /metrics the fronts pass on (never an API
        key: a client key there gets 401, the metrics token on /v1/ gets 401). Required with vllm_metrics.
        """)
    vllm_hf_token_env: str = knob(
        "HF_TOKEN", "environment variable holding a Hugging Face token, if any", **ENV_NAME,
        fix="vllm_hf_token_env = 'HF_TOKEN' (the variable's name; the token itself stays out of the inventory)")
