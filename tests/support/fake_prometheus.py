"""A stand-in for Prometheus' instant-query API (GET <prefix>/api/v1/query?query=...) on the
loopback, for the probes that ask the fleet's Prometheus. Each test says how a query is answered.

    with serving(lambda query: ({"status": "success", "data": {...}}, 200)) as (port, asked):
        ...   # asked: "<path> <query>" of each request, in order
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: The answer to one query: Prometheus' JSON body and the HTTP status.
Answer = Callable[[str], tuple[dict, int]]


@contextmanager
def serving(answer: Answer) -> Iterator[tuple[int, list[str]]]:
    """A fake Prometheus on 127.0.0.1 for the block: its port, and the requests it was asked."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)["query"][0]
            asked.append(f"{url.path} {query}")
            body, code = answer(query)
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], asked
    finally:
        server.shutdown()
        server.server_close()


def bad_data() -> tuple[dict, int]:
    """Prometheus' answer to a query it cannot parse."""
    return {"status": "error", "errorType": "bad_data", "error": "parse error"}, 400


def vector(result: list[dict]) -> tuple[dict, int]:
    return {"status": "success", "data": {"resultType": "vector", "result": result}}, 200
