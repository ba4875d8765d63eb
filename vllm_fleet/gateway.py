"""The fleet gateway: one authenticated endpoint for every instance of the fleet. Pure: no I/O.

vllm-router (PyPI `vllm-router`, a Rust binary wheel) in IGW mode routes each request to the
backends serving the `model` it names, picking one of them by the host's vllm_gateway_policy
(settings.GATEWAY_POLICIES), and drops a backend whose /health fails. It checks no client key and
its admin API (/workers) has no authentication, so it listens on 127.0.0.1 only, behind the host's
front (nginx, render_front.front_files), which checks the client's key and passes only /v1/... and GET
/health. Its backends are every planned instance of the fleet that serves a model, reached at their
own host's front (http(s)://<advertise address>:<port>, which checks the client again, its models
there included, and passes /v1/ and GET /health). With vllm_tls on a
backend's host the router speaks HTTPS to it and checks its certificate against the CAs of
<vllm_config_dir>/trust.pem (SSL_CERT_FILE in the router's unit).

On the gateway host (config key vllm_gateway; one per fleet, or several behind the floating address
vllm_gateway_address, each with the same files and with keepalived moving the address: floating_files;
config.check_fleet):

    GATEWAY_UNIT                              vllm-router, as the service user (gateway.service.j2)
    <vllm_config_dir>/gateway-workers.json    the backends, posted to the router after each start
    <vllm_config_dir>/gateway-register.py     the script that posts them (stdlib only)
    <vllm_config_dir>/gateway-models.json     GET /v1/models as OpenAI clients expect it (nginx serves it)
    <vllm_config_dir>/gateway-models-<client>.json   the same for a client limited to some models
    <vllm_config_dir>/front.conf              + the gateway's server block (render_front.front_files), whose
                                              client check is the front's (front-keys.conf)

Example:

    fleet = Fleet.load("inventory/prod.py")
    backends = fleet.gateway_backends()
    gateway = fleet.gateway()
    files = gateway_files(gateway, backends, render.environment_prefix(gateway, spec), secrets)

vllm-router is installed into the host's own versioned environment (render.environment_spec adds
gateway_packages to it): built aside, from the wheelhouse on air-gapped hosts, switched atomically,
like vLLM. Its dependencies (fastapi, uvicorn, aiohttp, ...) are unpinned and vLLM's already.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config import HostConfig, check_fleet, gateway_ports, gateway_priorities
from vllm_fleet.config.clients import ApiClient
from vllm_fleet.host_layout import GATEWAY_UNIT, host_layout
from vllm_fleet.plan import FleetPlan
from vllm_fleet.templating import RenderedFile, front_paths, jinja_environment, nginx_string

GATEWAY_RUNTIME_DIR = "vllm-fleet-gateway"  # /run/<this>: the router's working directory and HOME
GATEWAY_PACKAGE = "vllm-router"
REGISTER_TIMEOUT_S = 60  # ExecStartPost: vllm-router answers /health ~1 s after its start
STOP_TIMEOUT_S = 30  # SIGTERM lets the requests in flight finish (~2 s measured), then SIGKILL
#: The path prefix of an adapter's worker URL on its instance's front (fleet_backends).
ADAPTER_PATH = "/vllm-fleet-adapter"


@dataclass(frozen=True)
class Backend:
    """One instance the gateway sends a model's requests to."""

    host: str
    instance: str
    served_model_name: str
    url: str  # the instance's front on its host: http(s)://<advertise address>:<port>
    max_model_len: int

    def as_dict(self) -> dict[str, Any]:
        return {"host": self.host, "instance": self.instance, "model": self.served_model_name,
                "url": self.url}


@dataclass(frozen=True)
class GatewayMember:
    """One gateway behind the floating address: its host, its own address (where the other gateways'
    keepalived reach it) and its VRRP priority (config.gateway_priorities)."""

    name: str
    address: str
    priority: int


@dataclass(frozen=True)
class GatewayAccess:
    """What each backend's front knows of the fleet's gateways: the addresses their requests come
    from (each gateway host's vllm_advertise_address: check_fleet makes it an IP address when some
    front takes /v1/ from the gateways only) and the URL its clients use (the floating address's,
    with one); `members`: the gateways behind the floating address, each gateway's keepalived peers."""

    sources: tuple[str, ...]
    url: str
    members: tuple[GatewayMember, ...] = ()


def gateway_access(*configs: HostConfig) -> GatewayAccess:
    """The GatewayAccess of the fleet's gateway hosts, in inventory order (one without a floating
    address; check_fleet refuses more then)."""
    addresses = [c.advertise_address for c in configs]
    floating = [c for c in configs if c.settings.vllm_gateway_address is not None]
    priorities = gateway_priorities(floating)
    members = tuple(GatewayMember(c.name, c.advertise_address, priorities[c.name]) for c in floating)
    return GatewayAccess(sources=tuple(dict.fromkeys(a for a in addresses if kinds.ip_literal(a))),
                         url=gateway_url(configs[0]), members=members)


def url_host(address: str) -> str:
    """An address as a URL takes it: IPv6 in brackets."""
    return f"[{address}]" if ":" in address else address


def fleet_backends(configs: list[HostConfig], fleet_plan: FleetPlan) -> list[Backend]:
    """Every planned instance of every host, in inventory order: the same plans the deploy makes, so
    the gateway's backends are never a second list to maintain. An instance serves its
    served_model_name (`served-model-name` cannot be set in engine_args) and each of its adapters'
    names, each a backend of its own."""
    by_name = {c.name: c for c in configs}
    out = []
    for host_plan in fleet_plan.hosts:
        config = by_name[host_plan.name]
        address, scheme = url_host(config.advertise_address), "https" if config.settings.vllm_tls is True else "http"
        for inst in host_plan.instances:
            url = f"{scheme}://{address}:{inst.port}"
            out.append(Backend(host=host_plan.name, instance=inst.name,
                               served_model_name=inst.config.served_model_name,
                               url=url, max_model_len=inst.max_model_len))
            # vllm-router keeps one model per worker URL: each adapter of the instance is a worker of
            # its own at a URL of its own, a path on the same front that the front passes on as the
            # instance's own /v1/ and /health (ADAPTER_PATH in templates/front.nginx.conf.j2).
            out += [Backend(host=host_plan.name, instance=inst.name, served_model_name=adapter.name,
                            url=f"{url}{ADAPTER_PATH}/{adapter.token}", max_model_len=inst.max_model_len)
                    for adapter in inst.config.adapters]
    return out


def find_gateway(configs: list[HostConfig]) -> HostConfig | None:
    """The first host with vllm_gateway = True, or None. Two of them without a floating address, or
    gateways that disagree: ConfigErrors (check_fleet)."""
    gateways = find_gateways(configs)
    return gateways[0] if gateways else None


def find_gateways(configs: list[HostConfig]) -> list[HostConfig]:
    """Every host with vllm_gateway = True, in inventory order, checked together (check_fleet)."""
    check_fleet(configs)
    return [c for c in configs if c.settings.vllm_gateway is True]


def gateway_paths(config: HostConfig) -> dict[str, str]:
    """HostLayout.gateway of the host."""
    return host_layout(config).gateway


def client_models_path(config: HostConfig, client: str) -> str:
    """HostLayout.client_models of the host: GET /v1/models for a client limited to some models."""
    return host_layout(config).client_models(client)


#: vllm_gateway_policy values that are not vllm-router's own, and the --policy each runs the router with.
#: "prefix": the front sets X-Session-ID from the request's leading messages (render_front: the keyer),
#: and vllm-router's consistent_hash puts each key on one instance of a ring.
ROUTER_POLICY = {"prefix": "consistent_hash"}


#: The requests the "prefix" policy keys (OpenAI's chat and completion routes: the ones with a prompt
#: whose prefix vLLM caches), the named location the keyer passes them on from, the largest body it
#: reads (by its Content-Length, decided before nginx reads the body: nginx holds that much in memory
#: there, a larger body goes on unkeyed and unread, as does one whose client sent its own session key:
#: a long conversation's text is well under it, a request with inline images may not be), and a
#: completion prompt's characters it keys on (a growing prompt keeps its key once longer than that;
#: prompts that share that many leading characters share an instance). The keyer looks at no more than
#: PREFIX_MAX_ITEMS messages, and of a message's list of parts as many: its work stays small whatever
#: a body holds (a message of two million tiny parts is keyed on its first 64).
PREFIX_PATHS = ("/v1/chat/completions", "/v1/completions")
PREFIX_LOCATION = "@vllm_fleet_gateway_keyed"
PREFIX_BODY_BYTES = 4_000_000
PREFIX_BODY_BUFFER = f"{-(-PREFIX_BODY_BYTES // (1 << 20))}m"  # nginx's client_body_buffer_size there
PREFIX_PROMPT_CHARS = 1024
PREFIX_MAX_ITEMS = 64
#: A client's own X-Session-ID is used as it sent it when it looks like a session id; anything else
#: (control characters, spaces, a value longer than this) is dropped and the request keyed as if it had
#: sent none: the router logs the key it routes on.
CLIENT_SESSION_PATTERN = "^[A-Za-z0-9._:-]{1,128}$"


def body_length_pattern(most: int) -> str:
    """A PCRE matching the decimal numbers 1 .. `most` as nginx's $content_length holds them (no sign,
    no leading zero), for a `most` of the form d * 10^k: the keyer's gate, decided before nginx reads
    a body."""
    digits = str(most)
    lead, zeros = int(digits[0]), len(digits) - 1
    if digits[1:] != "0" * zeros or zeros < 1:
        raise ValueError(f"{most} is not a digit followed by zeros")
    shorter = f"[1-9][0-9]{{0,{zeros - 1}}}"
    same_length = f"[1-{lead - 1}][0-9]{{{zeros}}}|" if lead > 1 else ""
    return f"(?:{shorter}|{same_length}{digits})"


def prefix_keyer(config: HostConfig) -> RenderedFile | None:
    """The front's keyer script (templates/front-prefix-key.js.j2) on a gateway with the "prefix"
    policy; None elsewhere. Read by nginx as it loads its config: a change reloads the front."""
    if not prefix_routing(config):
        return None
    script = jinja_environment().get_template("front-prefix-key.js.j2").render(
        prompt_chars=PREFIX_PROMPT_CHARS, keyed_location=PREFIX_LOCATION, body_bytes=PREFIX_BODY_BYTES,
        max_items=PREFIX_MAX_ITEMS)
    return RenderedFile(front_paths(config)["prefix_key"], script)


def router_policy(config: HostConfig) -> str:
    """vllm-router's --policy for the host's vllm_gateway_policy."""
    policy = config.settings.vllm_gateway_policy
    return ROUTER_POLICY.get(policy, policy)


def prefix_routing(config: HostConfig) -> bool:
    """Whether the gateway's front keys requests by their prefix (vllm_gateway_policy = "prefix")."""
    return config.settings.vllm_gateway is True and config.settings.vllm_gateway_policy == "prefix"


def gateway_packages(config: HostConfig) -> list[str]:
    """What the gateway adds to the host's environment (vllm-router pulls its own dependencies)."""
    return [f"{GATEWAY_PACKAGE}=={config.settings.vllm_gateway_version}"]


def router_url(config: HostConfig) -> str:
    """vllm-router's own listener (loopback: its admin API is there too)."""
    return f"http://127.0.0.1:{gateway_ports(config.settings)['router']}"


def gateway_url(config: HostConfig) -> str:
    """What clients use: the floating address (vllm_gateway_address) or else the gateway host's
    address, and the gateway port, with /v1."""
    scheme = "https" if config.settings.vllm_tls is True else "http"
    address = floating_ip(config) or config.advertise_address
    return f"{scheme}://{url_host(address)}:{config.settings.vllm_gateway_port}/v1"


def floating_ip(config: HostConfig) -> str | None:
    """The floating address without its prefix length ("10.0.0.100"), or None without one."""
    address = config.settings.vllm_gateway_address
    return address.split("/", 1)[0] if address else None


def workers_json(backends: list[Backend]) -> str:
    """The router's workers: one per backend, with its served name as model_id (given explicitly:
    the router's own detection asks /v1/models without the key and files it under 'unknown')."""
    workers = [{"url": b.url, "model_id": b.served_model_name, "host": b.host, "instance": b.instance}
               for b in backends]
    return json.dumps(workers, indent=2) + "\n"


def models_json(backends: list[Backend], client: ApiClient | None = None) -> str:
    """GET /v1/models as OpenAI clients parse it: each served name once (those `client` may use), sorted.
    max_model_len: the smallest among the name's backends (what any of them accepts)."""
    lengths: dict[str, int] = {}
    for b in backends:
        if client is not None and not client.may_use(b.served_model_name):
            continue
        lengths[b.served_model_name] = min(lengths.get(b.served_model_name, b.max_model_len), b.max_model_len)
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "vllm-fleet",
             "max_model_len": lengths[name]} for name in sorted(lengths)]
    return json.dumps({"object": "list", "data": data}, indent=2) + "\n"


def register_command(config: HostConfig, env_prefix: str) -> str:
    """The ExecStartPost=/ExecReload= line: the environment's python runs the registration script."""
    paths = gateway_paths(config)
    return (f"{env_prefix}/bin/python -I {paths['register']} {router_url(config)} {paths['workers']} "
            f"{REGISTER_TIMEOUT_S}")


def gateway_files(config: HostConfig, backends: list[Backend], env_prefix: str) -> list[RenderedFile]:
    """Every file of the gateway host's gateway: unit, workers list, registration script, and the
    models lists (all, and one per client limited to some models). The server block clients reach is
    in the front's nginx config (render_front.front_files with gateway=nginx_context(config)), whose
    client check is the front's: a changed key takes a front reload; a changed workers list a
    `systemctl reload` of GATEWAY_UNIT; a models list none (nginx reads it per request)."""
    paths = gateway_paths(config)
    jenv = jinja_environment()
    unit = jenv.get_template("gateway.service.j2").render(
        host=config, version=config.settings.vllm_gateway_version, ports=gateway_ports(config.settings),
        bind=config.settings.vllm_bind_host, backends=backends, paths=paths, env_prefix=env_prefix,
        policy=router_policy(config), register_command=register_command(config, env_prefix),
        start_timeout_s=REGISTER_TIMEOUT_S + 30, stop_timeout_s=STOP_TIMEOUT_S, runtime_dir_name=GATEWAY_RUNTIME_DIR,
        trust_file=front_paths(config)["tls_trust"] if any(b.url.startswith("https:") for b in backends) else None)
    script = jenv.get_template("gateway-register.py.j2").render(host=config, unit=GATEWAY_UNIT)
    return [RenderedFile(paths["unit"], unit),
            RenderedFile(paths["workers"], workers_json(backends)),
            RenderedFile(paths["register"], script),
            RenderedFile(paths["models"], models_json(backends)),
            *[RenderedFile(client_models_path(config, c.name), models_json(backends, c))
              for c in config.api_clients if c.models is not None]]


# --- the client side, in the host's front (render_front.front_files) -------------------------------------

def nginx_regex_literal(text: str) -> str:
    """`text` as a PCRE pattern matching exactly it: a backslash before every ASCII character that
    is not a letter, digit or '_' (PCRE: an escaped non-alphanumeric is always literal; '$' and '.'
    would otherwise be an anchor and a wildcard)."""
    return "".join("\\" + c if c.isascii() and not (c.isalnum() or c == "_") else c for c in text)


#: The longest parameter nginx's config parser reads (ngx_conf_file.c: a token must fit in its
#: NGX_CONF_BUFFER of 4096 bytes), quotes included: measured with Debian's nginx 1.22, `nginx -t` of
#: the key file (tests/sandbox/test_gateway_sandbox.py measures it again on the sandbox's gateway host).
NGINX_MAX_PARAMETER_BYTES = 4095


def key_length_problem(api_key: str) -> str | None:
    """Whether the key's pattern (key_pattern) fits in one nginx parameter: a key of letters, digits
    and '_' may have 4081 characters; other punctuation takes three bytes of the pattern each
    (escaped for PCRE, then for nginx's quotes), '"' and '\\' four."""
    size = len(key_pattern(api_key).encode())
    if size <= NGINX_MAX_PARAMETER_BYTES:
        return None
    return (f"is {len(api_key)} characters long: the gateway's nginx pattern for it would be {size} bytes, "
            f"more than the {NGINX_MAX_PARAMETER_BYTES} nginx reads as one parameter")


def key_pattern(api_key: str) -> str:
    """The nginx map key that matches exactly "Authorization: Bearer <api_key>", case-sensitively."""
    if not api_key or any(ord(c) < 0x20 or ord(c) == 0x7F for c in api_key):
        raise ValueError("the API key is empty or has a control character (an HTTP header cannot carry it)")
    return nginx_string("~^" + nginx_regex_literal("Bearer " + api_key) + "$")


def nginx_context(config: HostConfig, clients: tuple[ApiClient, ...]) -> dict[str, Any]:
    """What templates/front.nginx.conf.j2 needs for the gateway's server block."""
    ports = gateway_ports(config.settings)
    return {"unit": GATEWAY_UNIT, "port": ports["port"], "router_port": ports["router"],
            "models_file": gateway_paths(config)["models"],
            "prefix_key": front_paths(config)["prefix_key"] if prefix_routing(config) else None,
            "prefix_paths": PREFIX_PATHS, "prefix_location": PREFIX_LOCATION, "prefix_body_buffer": PREFIX_BODY_BUFFER,
            "prefix_body_lengths": body_length_pattern(PREFIX_BODY_BYTES),
            "client_session_pattern": CLIENT_SESSION_PATTERN,
            "client_models_files": [(c.id, client_models_path(config, c.name)) for c in clients
                                    if c.models is not None]}


def gateway_manifest(config: HostConfig, backends: list[Backend],
                     access: GatewayAccess | None = None) -> dict[str, Any]:
    """The gateway as `plan --json` (and later status/rollout) show it: host, client URL, the router's
    loopback URL and metrics port, its routing (vllm_gateway_policy and the router's --policy for it),
    and every backend; with a floating address, `floating`
    (floating_manifest, from `access`: the fleet's gateways)."""
    ports = gateway_ports(config.settings)
    out = {"host": config.name, "url": gateway_url(config), "unit": GATEWAY_UNIT,
           "router": router_url(config), "metrics_port": ports["metrics"],
           "version": config.settings.vllm_gateway_version,
           "policy": config.settings.vllm_gateway_policy, "router_policy": router_policy(config),
           "models": sorted({b.served_model_name for b in backends}),
           "backends": [b.as_dict() for b in backends]}
    if config.settings.vllm_gateway_address is not None:
        out["floating"] = floating_manifest(config, access)
    return out


# --- two or more gateways behind one floating address: keepalived ---------------------------------

KEEPALIVED_UNIT = "keepalived.service"  # Debian's package's own unit, reading KEEPALIVED_CONFIG
KEEPALIVED_PACKAGE = "keepalived"
#: VRRP's advert interval: VRRPv3 takes fractions of a second. A backup takes the address when it
#: has heard no advert for 3 intervals and its skew (priority-weighted, under one interval): 1.5-2 s
#: after the holder dies.
VRRP_ADVERT_S = 0.5
#: The readiness check (vrrp_script): every CHECK_INTERVAL_S, CHECK_FALL failures in a row take the
#: address off the host (FAULT: it advertises priority 0, a backup takes over at once), CHECK_RISE
#: successes give it back its place. Each of the check's two requests waits CHECK_REQUEST_TIMEOUT_S.
CHECK_INTERVAL_S, CHECK_FALL, CHECK_RISE = 1, 2, 2
CHECK_REQUEST_TIMEOUT_S = 0.8
CHECK_TIMEOUT_S = 2  # keepalived kills a check running longer (it then counts as a failure)
CHECK_PYTHON = "/usr/bin/python3"  # the OS's (Debian's python3): keepalived runs it by its full path


def floating_paths(config: HostConfig) -> dict[str, str]:
    """HostLayout.floating of the host: keepalived's config and the readiness check it runs."""
    return host_layout(config).floating


def _members(config: HostConfig, access: GatewayAccess | None) -> tuple[GatewayMember, ...]:
    """The gateways behind the floating address (`access`, the fleet's), or this host alone."""
    if access is not None and any(m.name == config.name for m in access.members):
        return access.members
    return gateway_access(config).members


def floating_manifest(config: HostConfig, access: GatewayAccess | None = None) -> dict[str, Any]:
    """The floating address as the plan and the manifest show it: the address, this gateway's
    interface and priority, and every gateway behind the address (its own address, its priority)."""
    members = _members(config, access)
    own = next(m for m in members if m.name == config.name)
    return {"address": floating_ip(config), "cidr": config.settings.vllm_gateway_address,
            "interface": config.settings.vllm_gateway_interface, "vrrp_id": config.settings.vllm_gateway_vrrp_id,
            "priority": own.priority, "unit": KEEPALIVED_UNIT,
            "gateways": [{"host": m.name, "address": m.address, "priority": m.priority} for m in members]}


def floating_files(config: HostConfig, access: GatewayAccess | None = None) -> list[RenderedFile]:
    """keepalived's config and its readiness check on a gateway host with a floating address
    (vllm_gateway_address); nothing otherwise. `access`: the fleet's gateways (Fleet.gateway_access),
    each other one a unicast peer; without it, this host alone (no peer: keepalived then takes the
    address as the only gateway). A changed file reloads keepalived (SIGHUP: the holder keeps the
    address through it)."""
    settings = config.settings
    if settings.vllm_gateway is not True or settings.vllm_gateway_address is None:
        return []
    paths, jenv = floating_paths(config), jinja_environment()
    members = _members(config, access)
    own = next(m for m in members if m.name == config.name)
    check = jenv.get_template("gateway-check.py.j2").render(
        host=config, user=settings.vllm_gateway_check_user, router_port=gateway_ports(settings)["router"],
        port=settings.vllm_gateway_port, tls=settings.vllm_tls is True, request_timeout_s=CHECK_REQUEST_TIMEOUT_S,
        fall=CHECK_FALL, rise=CHECK_RISE)
    conf = jenv.get_template("keepalived.conf.j2").render(
        host=config, address=settings.vllm_gateway_address, interface=settings.vllm_gateway_interface,
        members=members, peers=[m.address for m in members if m.name != config.name], own_address=own.address,
        user=settings.vllm_gateway_check_user, python=CHECK_PYTHON, check_script=paths["check"],
        interval_s=CHECK_INTERVAL_S, timeout_s=CHECK_TIMEOUT_S, fall=CHECK_FALL, rise=CHECK_RISE,
        vrrp_id=settings.vllm_gateway_vrrp_id, priority=own.priority, advert_s=VRRP_ADVERT_S)
    return [RenderedFile(paths["keepalived"], conf.rstrip("\n") + "\n"),
            RenderedFile(paths["check"], check.rstrip("\n") + "\n")]
