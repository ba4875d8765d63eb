"""The ASGI apps the front bench's counting part serves with uvicorn (bench/front_tls_bench.py
--counting): `plain`, a stand-in answering as vLLM does at once (a 1-token completion with its usage;
with "stream": true, STREAM_EVENTS chunks each carrying usage and a final usage-only chunk, as
--enable-force-include-usage makes vLLM stream), and `counted`, the same app inside vllm-fleet's
module (vllm_fleet_model_access.ModelAccess, imported from PYTHONPATH as vLLM's --middleware does).
SIMULATED: no model runs; the difference between the two is the counting alone."""

import json

import vllm_fleet_model_access

STREAM_EVENTS = 16


def _usage(completion):
    return {"prompt_tokens": 5, "completion_tokens": completion, "total_tokens": 5 + completion,
            "prompt_tokens_details": {"cached_tokens": 0}}


async def plain(scope, receive, send):
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    request = json.loads(body or b"{}")
    if request.get("stream"):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        for i in range(1, STREAM_EVENTS + 1):
            chunk = {"id": "cmpl-bench", "object": "text_completion", "created": 1, "model": "tiny-llama",
                     "choices": [{"index": 0, "text": "x", "finish_reason": None}], "usage": _usage(i)}
            await send({"type": "http.response.body", "body": b"data: " + json.dumps(chunk).encode() + b"\n\n",
                        "more_body": True})
        final = {"id": "cmpl-bench", "object": "text_completion", "created": 1, "model": "tiny-llama",
                 "choices": [], "usage": _usage(STREAM_EVENTS)}
        await send({"type": "http.response.body", "body": b"data: " + json.dumps(final).encode() + b"\n\n",
                    "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        return
    answer = json.dumps({"id": "cmpl-bench", "object": "text_completion", "created": 1, "model": "tiny-llama",
                         "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                         "usage": _usage(1), "served_by": "standin"}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]})
    await send({"type": "http.response.body", "body": answer})


counted = vllm_fleet_model_access.ModelAccess(plain)
