"""The fleet gateway: one endpoint for every instance of the fleet (vllm-router behind the gateway
host's front; vllm_fleet/gateway.py renders it)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet import kinds
from vllm_fleet.config.knobs.common import BOOL, VERSION
from vllm_fleet.config.schema import knob, section

#: vllm-router's --health-failure-threshold is a u32 (its Rust router refuses a larger one).
ROUTER_U32_MAX = 2 ** 32 - 1
#: The vllm-router --policy values the gateway takes (docs/gateway.md). vllm-router 0.1.17
#: (`vllm-router --help`) also has kv_aware and sticky_least_loaded, left out: kv_aware scores the
#: instances by an index of their KV caches that 0.1.17 fills only in its single-model mode (static
#: --kv-event-source per worker, --worker-urls, one --kv-event-model), never in the IGW mode the gateway
#: runs it in, and vLLM's event port would listen unauthenticated on every interface
#: (docs/gateway.md, "kv_aware with vllm-router 0.1.17"); sticky_least_loaded pins a session to an instance until
#: the client ends it at the router's /finish_session (an admin endpoint no client reaches here) or
#: it idles out. "prefix" is the fleet's own: vllm-router's consistent_hash on a key the gateway's front
#: derives from each request's leading messages (gateway.router_policy, render_front.PREFIX_KEYER).
GATEWAY_POLICIES = ("round_robin", "cache_aware", "consistent_hash", "power_of_two", "random", "prefix")


@section("The fleet gateway: one endpoint for every instance of the fleet")
@dataclass(frozen=True)
class GatewayKnobs:
    vllm_advertise_address: str | None = knob(
        None, "where the gateway reaches this host's fronts (None: derived, see above)",
        check=kinds.connect_address_problem,
        fix="vllm_advertise_address = '10.0.0.11' (where the gateway reaches this host), "
            "or None (vllm_bind_host if it is one address, else ssh_hostname)",
        notes="""
        Where other hosts (the gateway) reach this host's fronts. None: vllm_bind_host when it is one
        address, else pyinfra's ssh_hostname, else the inventory name. Set it when the gateway reaches the
        host at another address than the deploy does (another network, NAT, a DNS name).
        """)
    vllm_gateway: bool = knob(
        False, "True on the host (or hosts, with vllm_gateway_address) that run the fleet's gateway", **BOOL,
        fix="vllm_gateway = True on the one host that runs the fleet's gateway (several: with "
            "vllm_gateway_address)",
        notes="""
        True on the host that runs the fleet's gateway: it runs vllm-router (PyPI vllm-router, IGW
        mode; unit vllm-fleet-gateway.service, the service user; installed into the host's versioned
        environment beside vLLM, so an air-gapped wheelhouse needs `vllm-fleet bundle --target T --extra
        vllm-router==X`, T the host's vllm_target and X vllm_gateway_version)
        with every instance of the fleet that serves a model as a backend, read from each host's plan:
        requests go only to instances serving the `model` they name, one picked by vllm_gateway_policy. The
        host needs no instances of its own. Clients use http(s)://<address>:<vllm_gateway_port>/v1 with their
        API key (vllm_api_clients), checked by the front's nginx there; GET /v1/models lists each served
        name once. vllm-router itself listens on 127.0.0.1:<vllm_gateway_port + vllm_backend_port_offset>
        (its admin API has no authentication) and its Prometheus metrics on 127.0.0.1 at the port after.
        One host without vllm_gateway_address; with it, two or more, each a whole gateway with the same
        backends, and keepalived moves the address between them (docs/gateway.md).
        """)
    vllm_gateway_port: int = knob(
        9000, "clients -> <vllm_bind_host>:this; must be none of the host's instance ports", low=1, high=65535,
        must="a port number (1-65535)")
    vllm_gateway_version: str = knob("0.1.17", "pinned vllm-router", **VERSION)
    vllm_gateway_health_interval_s: int = knob(
        2, "seconds between two health checks of each backend", low=1, high=86400,
        must="a number of seconds from 1 to 86400 (a backend that fails is dropped after this times "
             "vllm_gateway_failure_threshold)",
        notes="""
        A backend whose /health fails this many times in a row, checked every this many seconds, gets no
        more requests until it answers again (vllm-router's own defaults, 3 x 60 s, keep a dead one ~3 min).
        """)
    vllm_gateway_failure_threshold: int = knob(
        2, "failed health checks in a row that take a backend out", low=1, high=ROUTER_U32_MAX,
        must=f"a whole number from 1 to {ROUTER_U32_MAX} (vllm-router reads it as a u32)")
    vllm_gateway_drain_timeout_s: int = knob(
        60, "how long a batch's backends may finish their requests", low=1, high=86400,
        must="a number of seconds from 1 to 86400",
        notes="""
        `vllm-fleet rollout`: before a batch converges, its backends leave the gateway (no new request) and
        the requests they already have finish, waited for up to this long; they are put back once
        verified. The only healthy backend of a model is not drained (nothing else could serve it).
        """)
    vllm_direct_access: bool = knob(
        False, "True: clients may use this host's instance ports directly too", **BOOL,
        notes="""
        In a fleet with a gateway, the instance ports take /v1/ requests only from the gateway host (its
        vllm_advertise_address, which must then be an IP address: the fronts let that address in) and from
        the host's own checks; anyone else gets 403 naming the gateway's URL. So a client's
        requests_per_minute is counted once, at the gateway, not once more by every front it could reach.
        True: clients may use this host's instance ports directly too (each front then counts on its own).
        """)
    vllm_gateway_policy: str = knob(
        "prefix", "how vllm-router picks among the instances of a request's model",
        choices=GATEWAY_POLICIES,
        notes="""
        How vllm-router picks one of the instances that serve a request's model (every model: IGW mode).
        "prefix" (the default): the gateway's front keys each chat and completion request by a hash of its
        system messages and first user message (a completion: its prompt's start), which every turn of a
        conversation repeats, and the router sends each key to one instance on a ring: a conversation's
        turns reach the instance whose prefix cache holds its history, with nothing asked of the clients (a
        client's own X-Session-ID is used as sent); Debian's libnginx-mod-http-js on the gateway host
        (RHEL's own repositories have no njs: nginx.org's nginx-module-njs, else "round_robin"). On the
        sandbox's routing bench it kept 65 % of prompt tokens in vLLM's prefix cache against round_robin's
        52 %, with TTFT p90 at 43 % of round_robin's. It bounds no instance's load: a fleet whose traffic is
        a few long, busy conversations is better off with "round_robin" (each request to the next instance),
        as is one whose completions all begin with the same long template. Also "random", "power_of_two"
        (the less loaded of two), "consistent_hash" (only the client's X-Session-ID, or X-User-ID, picks the
        instance: a chat request without one hashes like every other, so such clients all land on one
        instance) and "cache_aware" (vllm-router's own default: in 0.1.17 it asks every instance of the
        model to render each request, which vLLM refuses without --enable-scale-out, and then picks by load
        alone). docs/gateway.md has the measurements.
        """)
    vllm_kv_events_port_offset: int | None = knob(
        None, "each instance's KV-event port = its port + this (None: none reserved)", low=1, high=65534,
        must="a whole number from 1 to 65534, or None",
        fix="vllm_kv_events_port_offset = 20000 (instance port 8000: events on 28000), or None",
        notes="""
        The port each instance of the host keeps for vLLM's KV-cache events (ZMQ), its port + this: checked
        against every other port of the host (instance ports, engine ports, the gateway's, monitoring).
        Only reserved so far: the gateway's kv_aware policy, which would subscribe to these events, is not
        offered yet (docs/gateway.md, "kv_aware with vllm-router 0.1.17"). Set it in the group data every
        instance host reads.
        """)
    vllm_gateway_address: str | None = knob(
        None, "the gateways' floating address clients use, with its subnet's prefix (None: no floating address)",
        check=kinds.floating_address_problem,
        fix="vllm_gateway_address = '10.0.0.100/24' (a free IPv4 address of the gateways' subnet, with the "
            "subnet's prefix length), or None",
        notes="""
        Two or more gateways behind one address: an IPv4 address of the gateways' own subnet, written with
        that subnet's prefix length ("10.0.0.100/24"), free (no host has it), set once in the group data
        every gateway reads. keepalived (Debian's package, on each gateway host) holds it on one gateway at
        a time, on vllm_gateway_interface, and moves it within seconds to another when the holder stops
        answering or its own readiness check fails (vllm-router and the front up, at least one backend
        healthy). Clients, and the gateways' certificates, use this address; each gateway's own address
        (vllm_advertise_address, an IPv4 address of the same subnet) is where the others reach it. None:
        one gateway, as without it.
        """)
    vllm_gateway_interface: str | None = knob(
        None, "the network interface the floating address lives on (each gateway's own)",
        check=lambda v: (f"{v!r} is not a network interface name" if not kinds.INTERFACE_RE.fullmatch(v) or v in (".", "..")
                         else "the loopback interface: keepalived refuses it, and no other host reaches it"
                         if v == "lo" else None),
        fix="vllm_gateway_interface = 'eth0' (the interface of the gateway's address on the clients' network, "
            "as `ip -br addr` shows it)",
        notes="""
        Where keepalived puts vllm_gateway_address on each gateway host: the interface of the host's own
        address on the gateways' subnet. Required with vllm_gateway_address; it may differ between gateways
        (host data), since each host names its own interfaces.
        """)
    vllm_gateway_vrrp_id: int = knob(
        51, "the VRRP virtual router id of the gateways' floating address", low=1, high=255,
        must="a whole number from 1 to 255 (VRRP's virtual_router_id)",
        notes="""
        The gateways' VRRP instance on their network: the same on every gateway, and no other VRRP router
        (another keepalived, a router pair) on that network may use it.
        """)
    vllm_gateway_priority: int | None = knob(
        None, "this gateway's VRRP priority (None: from the gateways' inventory order)", low=1, high=254,
        must="a whole number from 1 to 254, or None (255 is VRRP's address owner)",
        notes="""
        Which gateway takes the floating address when they start together: the highest. None: 200 for the
        first gateway of the inventory, 190 for the second, and so on. Once one holds the address it keeps it
        (keepalived's nopreempt) until it fails: a gateway coming back does not take the address back, so the
        address moves once per failure, not twice. Two gateways with one priority are refused.
        """)
