"""The front bench's counting part, offline: the stand-in app it serves answers as vLLM does with
--enable-force-include-usage, and inside vllm-fleet's module every answer is counted (so the bench
measures the real counting path, not a wrapper that finds nothing to count)."""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
from pathlib import Path

from vllm_fleet.templating import jinja_environment

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_counting_benchs_app_is_counted_inside_the_module(tmp_path, monkeypatch):
    (tmp_path / "vllm_fleet_model_access.py").write_text(
        jinja_environment().get_template("vllm-model-access.py.j2").render())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("vllm_fleet_model_access", "usage_counting_app"):
        sys.modules.pop(name, None)
    app = importlib.import_module("usage_counting_app")
    module = sys.modules["vllm_fleet_model_access"]
    counted = []
    monkeypatch.setattr(module, "count", lambda client, usage: counted.append((client, usage)))

    async def one(target, stream):
        sent = []

        async def receive():
            return {"type": "http.request", "body": json.dumps({"stream": stream}).encode(), "more_body": False}

        async def send(message):
            sent.append(message)

        await target({"type": "http", "method": "POST", "path": "/v1/completions",
                      "headers": [(b"x-vllm-fleet-client", b"bench")]}, receive, send)
        return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")

    for stream in (False, True):
        alone, inside = asyncio.run(one(app.plain, stream)), asyncio.run(one(app.counted, stream))
        assert alone == inside  # the answer passes unchanged
    assert alone.endswith(b"data: [DONE]\n\n") and alone.count(b'"usage"') == app.STREAM_EVENTS + 1
    assert counted == [("bench", ("tiny-llama", 5, 0, 1)), ("bench", ("tiny-llama", 5, 0, app.STREAM_EVENTS))]
    for name in ("vllm_fleet_model_access", "usage_counting_app"):
        sys.modules.pop(name, None)
