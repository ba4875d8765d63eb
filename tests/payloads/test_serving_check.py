"""The verification probe asks an instance for what it serves: a completion from a generating
instance, an embedding (a classification, a pooling result) from a pooling one; an answer without
the vector is a failure. Against a local HTTP server that answers as vLLM does and records the paths."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_fleet.payloads.probe import instances

ANSWERS = {
    "/v1/completions": {"choices": [{"text": " world"}]},
    "/v1/embeddings": {"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}]},
    "/classify": {"data": [{"index": 0, "label": "LABEL_0", "probs": [1.0], "num_classes": 1}]},
    "/pooling": {"data": [{"index": 0, "object": "pooling", "data": [0.5]}]},
}


@pytest.fixture
def engine():
    """A stand-in vLLM on 127.0.0.1: /v1/models names 'm'; the routes answer ANSWERS, or `broken` ones."""
    seen: list[tuple[str, dict]] = []
    broken: dict[str, dict] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer(200, {"data": [{"id": "m", "max_model_len": 512}]})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, body))
            if self.path in broken:
                self.answer(200, broken[self.path])
            elif self.path in ANSWERS:
                self.answer(200, ANSWERS[self.path])
            else:
                self.answer(404, {"detail": "Not Found"})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], seen, broken
    server.shutdown()
    server.server_close()


def spec(port, task):
    return {"port": port, "served_model_name": "m", "env_file": "/nonexistent", "task": task,
            "max_model_len": None, "front_port": None, "gpu_bus_ids": []}


@pytest.mark.parametrize("task, path, check", [("generate", "/v1/completions", "completion"),
                                               ("embed", "/v1/embeddings", "embedding"),
                                               ("classify", "/classify", "classification"),
                                               ("pooling", "/pooling", "pooling")])
def test_each_instance_is_asked_for_what_it_serves(engine, task, path, check):
    port, seen, _broken = engine
    res = {"checks": {}}
    instances.check_serving(spec(port, task), res)
    assert res["ok"] and res["checks"][check] is True, res
    assert [p for p, _ in seen] == [path] and seen[0][1]["model"] == "m"


def test_a_pooling_instance_is_never_asked_for_a_completion(engine):
    port, seen, _broken = engine
    res = {"checks": {}}
    instances.check_serving(spec(port, "embed"), res)
    assert "completion" not in res["checks"] and all(p != "/v1/completions" for p, _ in seen)


def test_an_embedding_answer_without_a_vector_fails_naming_the_route(engine):
    port, _seen, broken = engine
    broken["/v1/embeddings"] = {"data": [{"embedding": []}]}
    res = {"checks": {}}
    instances.check_serving(spec(port, "embed"), res)
    assert not res.get("ok") and res["checks"]["embedding"] is False and "/v1/embeddings" in res["error"]


def test_a_generating_check_against_a_pooling_model_fails_as_vllm_answers_it(engine):
    port, _seen, _broken = engine
    ANSWERS_BEFORE = dict(ANSWERS)
    try:
        del ANSWERS["/v1/completions"]  # a pooling model's vLLM has no /v1/completions
        res = {"checks": {}}
        instances.check_serving(spec(port, "generate"), res)
        assert not res.get("ok") and "404" in res["error"] and "/v1/completions" in res["error"]
    finally:
        ANSWERS.update(ANSWERS_BEFORE)
