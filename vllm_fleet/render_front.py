"""Render a host's front: nginx's config and unit (`templates/front.nginx.conf.j2`,
`templates/front.service.j2`), the clients' keys file and the TLS files. Pure: strings in, strings out.

The front is the one listener clients reach on every host: <vllm_bind_host>:<port> for each instance
(vLLM itself listens on 127.0.0.1:<backend_port>), the gateway's server block on the gateway host,
and the metrics listener with vllm_metrics.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_fleet import gateway as gw
from vllm_fleet.config import HostConfig, gateway_ports, monitoring_ports
from vllm_fleet.config.clients import FLEET_KEY_CLIENT, HOST_CLIENT, client_id
from vllm_fleet.host_layout import FRONT_UNIT
from vllm_fleet.monitoring.targets import PROMETHEUS_PREFIX
from vllm_fleet.plan import HostPlan
from vllm_fleet.templating import RenderedFile, Secrets, front_paths, front_secrets_dir, jinja_environment, nginx_string

FRONT_RUNTIME_DIR = "vllm-fleet-front"  # /run/<this>: pid file and nginx's temp dirs
NGINX = "/usr/sbin/nginx"

#: A pooling model's routes outside /v1/ (vllm/entrypoints/pooling: scoring, classify, pooling and
#: embed api_router.py, the Cohere-shaped /v2/rerank and /v2/embed included; /v1/embeddings, /v1/score
#: and /v1/rerank are under /v1/ already). vLLM's key guards /v2/ alone (its authenticate.py
#: GUARDED_PREFIX), so the front passes them to a pooling instance only, each with the /v1/ checks.
POOLING_ROUTES = ("/score", "/rerank", "/classify", "/pooling", "/v2/rerank", "/v2/embed")


def nginx_address(bind: str) -> str:
    """An address as nginx's `listen` takes it: IPv6 in brackets."""
    return f"[{bind}]" if ":" in bind else bind


def front_probe_address(bind: str) -> str:
    """Where the host itself reaches the front: loopback when it listens on every interface."""
    if bind in ("0.0.0.0", "::"):
        return "127.0.0.1" if bind == "0.0.0.0" else "::1"
    return bind


def _openai_error(message: str, kind: str, code: str) -> str:
    """An OpenAI-shaped error body as one nginx `return` token (ending in nginx's \\n escape).
    `message` may hold nginx variables ($vllm_fleet_client): `return` text interpolates them."""
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})
    return nginx_string(body, newline=True)


FRONT_ANSWERS = {
    "unauthorized": _openai_error("invalid or missing API key: send the header Authorization: Bearer <your key>",
                                  "invalid_request_error", "invalid_api_key"),
    "forbidden": _openai_error("client $vllm_fleet_client may not use model $vllm_fleet_model: it is not among "
                               "the client's models (vllm_api_clients)", "permission_error", "model_not_allowed"),
    "too_many": _openai_error("client $vllm_fleet_client is over its requests_per_minute: retry after "
                              "$vllm_fleet_retry_after s", "rate_limit_error", "rate_limit_exceeded"),
    "metrics_unauthorized": nginx_string('{"error": "the metrics token is required: send the header '
                                         'Authorization: Bearer <token> (vllm_metrics_token_env)"}', newline=True),
    "adapter_routes_refused": _openai_error("loading and unloading adapters is the deploy's (the instance's "
                                            "'adapters'), never a client's", "permission_error", "adapter_routes"),
    "plain_http": _openai_error("this port speaks HTTPS only: use https:// (and trust the fleet CA: "
                                "vllm-fleet tls ca INVENTORY)", "invalid_request_error", "https_required"),
}
KEYS_PLACEHOLDER = ("placeholder: the deploy writes the clients' keys here; until then every request "
                    "gets 401")
CERT_PLACEHOLDER = "# placeholder: the deploy writes the host's TLS certificate (chain) here\n"


def front_keys_file(host: HostConfig, secrets: Secrets | None) -> RenderedFile:
    """The nginx include that names the client of each request by its key, and holds the host's own
    key the front sends vLLM: 0640 root:<front user> (nginx runs as that user; no other service's
    user reads it). Without secrets (vllm-fleet render), a placeholder that refuses every request."""
    keys = secrets.keys_by_client(FLEET_KEY_CLIENT) if secrets else {}
    patterns = [(client_id(name), gw.key_pattern(keys[name])) for name in sorted(keys)]
    metrics_token = secrets.metrics_token if secrets else None
    if secrets and secrets.host_key:
        patterns.append((client_id(HOST_CLIENT), gw.key_pattern(secrets.host_key)))
    authorization = nginx_string(f"Bearer {secrets.host_key}" if secrets and secrets.host_key else "")
    content = jinja_environment().get_template("front-keys.nginx.conf.j2").render(
        host=host, front_config=front_paths(host)["config"], clients=patterns, host_authorization=authorization,
        metrics=host.settings.vllm_metrics is True,
        metrics_pattern=gw.key_pattern(metrics_token) if metrics_token else None,
        note=KEYS_PLACEHOLDER if secrets is None else "no API key was given: every request gets 401")
    return RenderedFile(front_paths(host)["keys"], content, mode="0640", group=host.settings.vllm_front_user,
                        secret=secrets is not None)


def front_tls_files(host: HostConfig, secrets: Secrets | None) -> list[RenderedFile]:
    """With vllm_tls: the front's certificate chain, its key (0640 root:<front user>, secret) and the
    CAs the host trusts. Without secrets (vllm-fleet render), placeholders."""
    if host.settings.vllm_tls is not True:
        return []
    paths, user = front_paths(host), host.settings.vllm_front_user
    tls = secrets.tls if secrets else None
    return [RenderedFile(paths["tls_cert"], tls.cert_pem if tls else CERT_PLACEHOLDER),
            RenderedFile(paths["tls_key"], tls.key_pem if tls else "# placeholder: the host's TLS key\n",
                         mode="0640", group=user, secret=secrets is not None),
            RenderedFile(paths["tls_trust"], tls.trust_pem if tls else "# placeholder: the CAs the host trusts\n")]


def front_metrics_context(host: HostConfig) -> dict[str, Any] | None:
    """What templates/front.nginx.conf.j2 needs for the metrics listener (None without vllm_metrics):
    its port, the loopback listeners behind it, and on the gateway and monitoring hosts the router's
    and Prometheus' own."""
    if host.settings.vllm_metrics is not True:
        return None
    ports = monitoring_ports(host.settings)
    return {"port": ports["metrics"], "exporter": ports["exporter"], "stub_status": ports["stub_status"],
            "node_exporter": ports["node_exporter"], "prometheus": ports.get("prometheus"),
            "prometheus_prefix": PROMETHEUS_PREFIX,
            "router": gateway_ports(host.settings)["metrics"] if host.settings.vllm_gateway is True else None}


def front_gateway_access(host: HostConfig, access: gw.GatewayAccess | None) -> dict[str, Any] | None:
    """Where an instance port takes /v1/ requests from, in a fleet with a gateway (`access`) and
    without vllm_direct_access: the gateway host, and this host's own checks (loopback, and the
    bind address the host probes itself at). None: from every client."""
    if access is None or host.settings.vllm_direct_access is True:
        return None
    own = () if host.settings.vllm_bind_host in ("0.0.0.0", "::") else (host.settings.vllm_bind_host,)
    allowed = tuple(dict.fromkeys(("127.0.0.1", "::1", *own, *access.sources)))
    return {"url": access.url, "allowed": allowed}


def instance_names(plan: HostPlan) -> dict[str, list[str]]:
    """The model names each instance serves: its served_model_name, then its adapters'."""
    return {inst.name: [inst.config.served_model_name, *(a.name for a in inst.config.adapters)]
            for inst in plan.instances}


def front_files(host: HostConfig, plan: HostPlan, gateway: dict[str, Any] | None = None,
                secrets: Secrets | None = None, gateway_access: gw.GatewayAccess | None = None,
                ) -> list[RenderedFile]:
    """nginx config + unit of the host's front: <vllm_bind_host>:<port> -> 127.0.0.1:<backend_port>,
    /v1/ and /health only, for the clients of host.api_clients (front_keys_file holds their keys),
    over HTTPS with vllm_tls (front_tls_files). `gateway` (gateway.nginx_context, on the fleet's
    gateway host): the gateway's server block goes into the same config. `gateway_access`: the
    fleet's gateway, whose requests alone an instance port takes (front_gateway_access). With
    vllm_metrics, /metrics on each instance port and the metrics listener (front_metrics_context).
    On a gateway with the "prefix" policy, the keyer script its config imports (gateway.prefix_keyer).
    No instances, no gateway and no metrics, no front."""
    metrics = front_metrics_context(host)
    if not plan.instances and not gateway and not metrics:
        return []
    paths = front_paths(host)
    jenv = jinja_environment()
    runtime_dir = f"/run/{FRONT_RUNTIME_DIR}"
    tls = {"cert": paths["tls_cert"], "key": paths["tls_key"]} if host.settings.vllm_tls is True else None
    access = front_gateway_access(host, gateway_access)
    gateway_only = _openai_error(
        f"this port takes requests from the fleet's gateway only: use {access['url']}", "permission_error",
        "gateway_only") if access else None
    names = [(c.id, c.name) for c in host.api_clients] + [(client_id(HOST_CLIENT), HOST_CLIENT)]
    names_by_instance = instance_names(plan)
    config = jenv.get_template("front.nginx.conf.j2").render(
        host=host, front_unit=FRONT_UNIT, instances=plan.instances, bind=nginx_address(host.settings.vllm_bind_host),
        runtime_dir=runtime_dir, worker_processes=2, max_body="64m", gateway=gateway, keys_file=paths["keys"],
        clients=host.api_clients, limited=[c for c in host.api_clients if c.requests_per_minute],
        client_names=names, host_client=HOST_CLIENT, host_client_id=client_id(HOST_CLIENT), tls=tls,
        metrics=metrics, gateway_access=access, gateway_only=gateway_only, pooling_routes=POOLING_ROUTES,
        instance_names=names_by_instance,
        client_names_by_instance={name: [(c, [n for n in served if c.may_use(n)]) for c in host.api_clients]
                                  for name, served in names_by_instance.items()},
        adapter_path=gw.ADAPTER_PATH, **FRONT_ANSWERS)
    unit = jenv.get_template("front.service.j2").render(
        host=host, front_config=paths["config"], runtime_dir_name=FRONT_RUNTIME_DIR, nginx=NGINX,
        secrets_dir=front_secrets_dir(host),
        bind=nginx_address(host.settings.vllm_bind_host))
    keyer = gw.prefix_keyer(host) if gateway else None
    return [RenderedFile(paths["config"], config, mode="0640", group=host.settings.vllm_front_user),
            RenderedFile(paths["unit"], unit), front_keys_file(host, secrets), *front_tls_files(host, secrets),
            *([keyer] if keyer else [])]
