"""What vLLM's KV-cache events and vllm-router's kv_aware policy ask of the fleet. Pure: no I/O.

vllm-router 0.1.17's kv_aware keeps an index of each worker's KV cache, fed by the events each vLLM
publishes over ZMQ, and asks a worker's /v1/chat/completions/render (/v1/completions/render) for a
request's token ids, which it looks up there (docs/gateway.md, "kv_aware with vllm-router 0.1.17",
has what was measured). It fills that index only in its single-model mode, from one static source
per worker: the gateway's IGW mode never subscribes. So vllm_gateway_policy does not offer kv_aware
yet; these are the pieces it will need, each checked against the tool that reads it:

    engine_flags(port, block_size)     the `vllm serve` flags of an instance that publishes its events
    ENGINE_ENV                         the variable that makes those events carry whole block hashes
    event_endpoint(address, port)      where the router connects to one instance's events
    router_flags(sources, ...)         vllm-router's flags that subscribe to every instance

vLLM's publisher binds only a wildcard endpoint (tcp://*:PORT: every interface of the host); given a
host address it connects there instead (vllm/distributed/kv_events.py, _is_bind_endpoint). The port
has no TLS nor credential on either side, so each instance host must close it to every address but
the gateways' before the policy is offered.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from vllm_fleet import kinds

#: The ZMQ topic the events go out under (vllm-router subscribes to every topic).
TOPIC = "kv-events"
#: vLLM's block hash over CBOR, not pickle: the one of its algorithms another program can compute
#: again from the tokens (sha256, its default, hashes a Python pickle).
HASH_ALGO = "sha256_cbor"
#: The events carry each block's whole 32-byte hash: vLLM's default (1) sends its last 8 bytes as an
#: integer, where two blocks can share a key. vllm-router 0.1.17 takes either ("KV wire hash must be
#: bytes or an unsigned integer").
ENGINE_ENV = {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}
#: vllm-router's --kv-event-block-size default. vLLM's CPU attention takes multiples of 32 only ("No
#: common block size for 16 (CPU_ATTN: [MultipleOf(32)])"): the fleet states one size for both sides.
ROUTER_DEFAULT_BLOCK_SIZE = 16


def engine_flags(event_port: int, block_size: int) -> dict[str, Any]:
    """The flags (YAML keys of the engine config) of an instance publishing its KV-cache events on
    `event_port`, for a router whose --kv-event-block-size is `block_size`: the events (kv-events-config,
    a JSON object vLLM's KVEventsConfig reads), the block size stated rather than left to the attention
    backend, prefix caching on, the render routes the router asks for token ids (enable-scale-out:
    without it vLLM answers 403 there and the router decides on load alone)."""
    if not 1 <= event_port <= 65535:
        raise ValueError(f"event port {event_port} is not a port number")
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{event_port}",
              "topic": TOPIC}
    return {"kv-events-config": json.dumps(config, separators=(",", ":")), "block-size": block_size,
            "enable-prefix-caching": True, "prefix-caching-hash-algo": HASH_ALGO, "enable-scale-out": True}


def event_endpoint(address: str, port: int) -> str:
    """tcp://HOST:PORT where the router connects to one instance's events: `address` an IP literal
    (IPv6 in brackets) or a host name, never a wildcard (the router refuses one)."""
    if kinds.connect_address_problem(address):
        raise ValueError(f"{address!r} is not an address the router can connect to")
    host = f"[{address}]" if ":" in address else address
    return f"tcp://{host}:{port}"


def router_flags(sources: Sequence[tuple[str, str]], block_size: int, model: str) -> list[str]:
    """vllm-router's flags that subscribe to every worker's events in its single-model mode: each
    worker URL (--worker-urls, which static sources need) and its event endpoint (--kv-event-source
    URL=ENDPOINT), the block size, and the model identity they share. `sources`: (worker URL,
    event_endpoint) pairs, one per worker."""
    if not sources:
        raise ValueError("kv_aware needs at least one worker and its event endpoint")
    urls = [url for url, _ in sources]
    if len(set(urls)) != len(urls):
        raise ValueError("a worker URL is listed twice (vllm-router refuses a duplicate --kv-event-source)")
    out = ["--worker-urls", *urls]
    for url, endpoint in sources:
        out += ["--kv-event-source", f"{url}={endpoint}"]
    return [*out, "--kv-event-block-size", str(block_size), "--kv-event-model", model]
