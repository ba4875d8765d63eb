"""The gateway bench's two ends, stdlib only: an instant OpenAI-compatible stand-in backend, and the
client that times direct against gateway requests.

bench/gateway_bench.py copies this one file to the sandbox hosts (Debian's python3 runs it there, no
environment needed) and imports it on this machine, so both clients run the same code.

    python3 gateway_standin.py serve --host 10.213.7.12 --port 8800 --model tiny-llama --label sbx-cpu2
        One line of JSON once it listens ({"ready": true, "pid": ..., "port": ...}); on SIGTERM or
        SIGINT (or after --lifetime-s) one line with the requests it answered, then exit 0. Answers:
          GET  /health          200, empty (as vLLM's)
          GET  /v1/models       OpenAI's list shape with the served name
          POST /v1/completions  a fixed 1-token completion; 401 without the bench key, 404 for another
                                model (as vLLM); its system_fingerprint names the stand-in (--label),
                                so a client can tell which backend answered
          POST /v1/chat/completions  the same, in the chat shape
        HTTP/1.1 with keep-alive (nginx and vllm-router keep their upstream connections open).

    python3 gateway_standin.py measure --direct H:P,H:P,H:P --gateway H:P --concurrency 16 --requests 2000
                                       [--route completions|chat]
        One JSON document: `measure()`'s result.

The key is the bench's own constant (API_KEY, never a real one): it is in this file, never in argv.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import math
import os
import signal
import ssl
import sys
import threading
import time

API_KEY = "sk-bench-gateway"  # the bench deploys its sandbox fleet with this key (bench only)
MODEL = "tiny-llama"
FINGERPRINT = "vllm-fleet-stand-in"  # system_fingerprint prefix of every stand-in completion
BLOCK = 20  # requests per thread per block before switching between direct and gateway
MAX_HEAD = 65536


# --- the stand-in backend -----------------------------------------------------------------------

def _json_bytes(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _error(message: str, kind: str, code: int) -> bytes:
    """vLLM's error shape (OpenAI's)."""
    return _json_bytes({"error": {"message": message, "type": kind, "param": None, "code": code}})


class StandIn:
    """What the stand-in answers, without sockets: respond() maps a parsed request to a response.
    Every body is built once, so a completion costs a header check and a small JSON parse."""

    def __init__(self, model: str = MODEL, label: str = "", api_key: str | None = API_KEY,
                 max_model_len: int = 1024) -> None:
        self.model = model
        self.label = label
        self.fingerprint = f"{FINGERPRINT} {label}".strip()
        self._auth = None if api_key is None else f"Bearer {api_key}"
        self.counts: dict[str, int] = {}
        self._models = _json_bytes({"object": "list", "data": [{
            "id": model, "object": "model", "created": 0, "owned_by": FINGERPRINT, "root": model,
            "parent": None, "max_model_len": max_model_len}]})
        self._completion = _json_bytes({
            "id": "cmpl-vllm-fleet-stand-in", "object": "text_completion", "created": 0, "model": model,
            "choices": [{"index": 0, "text": " world", "logprobs": None, "finish_reason": "length",
                         "stop_reason": None}],
            "usage": {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1},
            "system_fingerprint": self.fingerprint})
        self._chat = _json_bytes({
            "id": "chatcmpl-vllm-fleet-stand-in", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": " world"},
                         "logprobs": None, "finish_reason": "length", "stop_reason": None}],
            "usage": {"prompt_tokens": 1, "total_tokens": 2, "completion_tokens": 1},
            "system_fingerprint": self.fingerprint})
        self._unauthorized = _error("Unauthorized", "Unauthorized", 401)
        self._not_found = _json_bytes({"detail": "Not Found"})

    def respond(self, method: str, target: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """(status, JSON body) for one request; `headers` have lower-case names."""
        path = target.split("?", 1)[0]
        status, payload = self._route(method, path, headers, body)
        key = f"{method} {path} {status}"
        self.counts[key] = self.counts.get(key, 0) + 1
        return status, payload

    def _route(self, method: str, path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        if path == "/health" and method == "GET":
            return 200, b""
        if path.startswith("/v1/") and self._auth is not None and headers.get("authorization") != self._auth:
            return 401, self._unauthorized
        if path == "/v1/models" and method == "GET":
            return 200, self._models
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            try:
                request = json.loads(body or b"null")
            except ValueError:
                return 400, _error("the body is not JSON", "BadRequestError", 400)
            model = request.get("model") if isinstance(request, dict) else None
            if model != self.model:
                return 404, _error(f"The model `{model}` does not exist.", "NotFoundError", 404)
            return 200, self._completion if path == "/v1/completions" else self._chat
        return 404, self._not_found


REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}


def response_bytes(status: int, payload: bytes, keep_alive: bool) -> bytes:
    head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(payload)}\r\n"
            f"connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n")
    return head.encode("latin-1") + payload


def parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    """(method, target, version, headers with lower-case names) of a request head ending in CRLFCRLF."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return method, target, version, headers


def wants_keep_alive(version: str, headers: dict[str, str]) -> bool:
    connection = headers.get("connection", "").lower()
    if version == "HTTP/1.0":
        return "keep-alive" in connection
    return "close" not in connection


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        chunks = []
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                return b"".join(chunks)
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length = int(headers.get("content-length") or 0)
    return await reader.readexactly(length) if length else b""


async def _serve_connection(app: StandIn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            method, target, version, headers = parse_head(head)
            if headers.get("expect", "").lower() == "100-continue":
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = await _read_body(reader, headers)
            status, payload = app.respond(method, target, headers, body)
            keep = wants_keep_alive(version, headers)
            writer.write(response_bytes(status, payload, keep))
            await writer.drain()
            if not keep:
                break
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, ValueError):
        pass  # the peer closed, or sent what no client of the bench sends
    finally:
        writer.close()


async def serve(app: StandIn, host: str, port: int, lifetime_s: float | None = None,
                ready=None) -> dict[str, int]:
    """Serve until SIGTERM/SIGINT or lifetime_s; `ready(port)` once listening. Returns app.counts."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(lambda r, w: _serve_connection(app, r, w), host, port,
                                        limit=MAX_HEAD, backlog=1024)
    if ready is not None:
        ready(server.sockets[0].getsockname()[1])
    try:
        await asyncio.wait_for(stop.wait(), lifetime_s)
    except asyncio.TimeoutError:
        pass
    server.close()
    return app.counts


# --- the client ---------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summary(values: list[float]) -> dict[str, float | int | None]:
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "mean": sum(values) / len(values) if values else None}


def parse_target(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


def fingerprint_of(body: bytes) -> str:
    """The system_fingerprint of a completion ("-" when it has none: a real vLLM's is null)."""
    marker = b'"system_fingerprint":'
    at = body.find(marker)
    if at < 0:
        return "-"
    rest = body[at + len(marker):].lstrip()
    if not rest.startswith(b'"'):
        return "-"
    return rest[1:rest.find(b'"', 1)].decode("utf-8", "replace")


#: What each --route sends: its path, and the body for a model. "chat" is a conversation's fourth turn
#: under a 2,000-character system prompt (about what a team's assistant sends), so a gateway that keys
#: requests by their leading messages (vllm_gateway_policy = "prefix") parses and hashes a body of the
#: size it meets in use; "completions" is a one-word prompt, the smallest request there is.
ROUTES = ("completions", "chat")
SYSTEM_PROMPT = ("You are the support assistant of a team that runs its own inference servers. Answer in "
                 "short paragraphs, cite the runbook section you rely on, and say when you are unsure. ") * 12


def request_path(route: str) -> str:
    return {"completions": "/v1/completions", "chat": "/v1/chat/completions"}[route]


def request_body(model: str = MODEL, route: str = "completions", conversation: int = 0) -> str:
    """The body a client thread sends: each thread its own `conversation` (a chat's first question, a
    completion's prompt), so a gateway that routes by the leading messages spreads the threads as it
    would a team's conversations instead of sending them all to one instance."""
    if route == "completions":
        return json.dumps({"model": model, "prompt": f"Hello {conversation}", "max_tokens": 1})
    turns = [("user", f"How do I see which GPUs an instance uses? (conversation {conversation})"),
             ("assistant", "Its unit sets CUDA_VISIBLE_DEVICES; `vllm-fleet plan` prints it per instance."),
             ("user", "And after a rollout, how do I know every host converged?"),
             ("assistant", "The rollout prints each batch's hosts and their verification; `vllm-fleet status` too."),
             ("user", "Hello")]
    messages = [{"role": "system", "content": SYSTEM_PROMPT}] + [{"role": r, "content": c} for r, c in turns]
    return json.dumps({"model": model, "messages": messages, "max_tokens": 1})


#: Targets spoken to over HTTPS, with the context that checks their certificates (measure(tls=...)).
TLS_TARGETS: dict[tuple[str, int], ssl.SSLContext] = {}


def _run_block(targets: list[tuple[str, int]], n: int, conns: dict, body: str, headers,
               out: list[float], errors: list[str], served: dict[str, int], timeout: float,
               path: str = "/v1/completions") -> None:
    """n requests (POST `path`), rotating over targets, each on this thread's kept-open connection to
    it. `headers`: a dict, or a function of the target giving its dict (a key per path)."""
    for i in range(n):
        target = targets[i % len(targets)]
        conn = conns.get(target)
        if conn is None:
            context = TLS_TARGETS.get(target)
            conn = conns[target] = (http.client.HTTPSConnection(*target, timeout=timeout, context=context)
                                    if context else http.client.HTTPConnection(*target, timeout=timeout))
        started = time.perf_counter()
        try:
            conn.request("POST", path, body, headers(target) if callable(headers) else headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{target[0]}:{target[1]}: {exc!r}")
            conn.close()
            conns.pop(target, None)
            continue
        elapsed = (time.perf_counter() - started) * 1000
        if resp.status != 200:
            errors.append(f"{target[0]}:{target[1]}: HTTP {resp.status} {data[:120]!r}")
            continue
        out.append(elapsed)
        name = fingerprint_of(data)
        served[name] = served.get(name, 0) + 1


def measure(direct: list[tuple[str, int]], gateway: tuple[str, int], concurrency: int, total: int,
            block: int = BLOCK, model: str = MODEL, api_key: str = API_KEY, timeout: float = 60.0,
            gateway_key: str | None = None, route: str = "completions") -> dict:
    """`concurrency` threads, each alternating blocks of `block` direct and gateway requests (A B A B;
    half the threads start with each kind), about `total` requests of each kind in all. Each thread
    keeps its connections open. Latency in ms, from sending the request to the body's last byte.
    `route`: what each request is (ROUTES: a one-word completion, or a chat turn of 2.6 kB).

    Returns {"concurrency", "requests_per_kind", "direct": summary, "gateway": summary,
    "added": {p50, p99, paired_p50, paired_p10, paired_p90, pairs}, "errors", "error_examples",
    "served_by": {kind: {fingerprint: count}}, "wall_s"}. added.p50/p99: gateway's minus direct's;
    paired_*: over each thread's adjacent (direct, gateway) block pair, the gateway block's median
    minus the direct block's, so slow drift in the hosts' load cancels out."""
    rounds = max(1, total // (block * concurrency))
    path = request_path(route)
    plain = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
    other = dict(plain, Authorization=f"Bearer {gateway_key}") if gateway_key else plain

    def headers(target):  # the gateway path may take a key of its own (a client's, at a front)
        return other if target == gateway else plain
    samples: dict[str, list[float]] = {"direct": [], "gateway": []}
    served: dict[str, dict[str, int]] = {"direct": {}, "gateway": {}}
    pairs: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()

    def worker(offset: int) -> None:
        conns: dict = {}
        local_errors: list[str] = []
        local_served: dict[str, dict[str, int]] = {"direct": {}, "gateway": {}}
        shift = offset % len(direct)
        rotated = direct[shift:] + direct[:shift]
        body = request_body(model, route, offset)
        try:
            for r in range(rounds):
                order = ("direct", "gateway") if (r + offset) % 2 == 0 else ("gateway", "direct")
                blocks: dict[str, list[float]] = {}
                for kind in order:
                    local: list[float] = []
                    _run_block(rotated if kind == "direct" else [gateway], block, conns, body, headers,
                               local, local_errors, local_served[kind], timeout, path)
                    blocks[kind] = local
                with lock:
                    for kind, local in blocks.items():
                        samples[kind].extend(local)
                    if blocks["direct"] and blocks["gateway"]:
                        pairs.append(percentile(blocks["gateway"], 50) - percentile(blocks["direct"], 50))
        finally:
            for conn in conns.values():
                conn.close()
            with lock:
                errors.extend(local_errors)
                for kind, counts in local_served.items():
                    for name, n in counts.items():
                        served[kind][name] = served[kind].get(name, 0) + n

    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result = {"concurrency": concurrency, "route": route, "requests_per_kind": rounds * block * concurrency,
              "direct": summary(samples["direct"]), "gateway": summary(samples["gateway"])}
    result["added"] = added(result["direct"], result["gateway"], pairs)
    result.update(errors=len(errors), error_examples=errors[:5], served_by=served,
                  wall_s=round(time.monotonic() - started, 3))
    return result


def added(direct: dict, gateway: dict, pairs: list[float]) -> dict:
    def minus(q: str) -> float | None:
        return None if direct[q] is None or gateway[q] is None else gateway[q] - direct[q]

    return {"p50": minus("p50"), "p99": minus("p99"), "paired_p50": percentile(pairs, 50),
            "paired_p10": percentile(pairs, 10), "paired_p90": percentile(pairs, 90), "pairs": len(pairs)}


# --- command line -------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run a stand-in backend")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, required=True, help="0: any free port (printed)")
    s.add_argument("--model", default=MODEL)
    s.add_argument("--label", default="", help="names this stand-in in its completions")
    s.add_argument("--lifetime-s", type=float, default=None, help="exit after this long at the latest")
    m = sub.add_parser("measure", help="time direct against gateway requests (JSON on stdout)")
    m.add_argument("--direct", required=True, help="HOST:PORT[,HOST:PORT...]: rotated over")
    m.add_argument("--gateway", required=True, help="HOST:PORT")
    m.add_argument("--concurrency", type=int, default=1)
    m.add_argument("--requests", type=int, default=2000, help="per kind")
    m.add_argument("--block", type=int, default=BLOCK)
    m.add_argument("--warmup", type=int, default=0, help="requests per kind first, at concurrency 4, not counted")
    m.add_argument("--model", default=MODEL)
    m.add_argument("--route", choices=ROUTES, default="completions")
    args = parser.parse_args(argv)
    if args.command == "serve":
        app = StandIn(args.model, args.label)

        def ready(port: int) -> None:
            print(json.dumps({"ready": True, "pid": os.getpid(), "host": args.host, "port": port,
                              "label": args.label}), flush=True)

        counts = asyncio.run(serve(app, args.host, args.port, args.lifetime_s, ready))
        print(json.dumps({"stopped": True, "pid": os.getpid(), "counts": counts}), flush=True)
        return
    direct = [parse_target(t) for t in args.direct.split(",") if t.strip()]
    gateway = parse_target(args.gateway)
    if args.warmup:
        measure(direct, gateway, 4, args.warmup, args.block, args.model, route=args.route)
    result = measure(direct, gateway, args.concurrency, args.requests, args.block, args.model, route=args.route)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
