"""The token counting in vLLM's API server (templates/vllm-model-access.py.j2), run as an ASGI app
in-process around fake vLLM apps: JSON answers and event streams, hostile and broken ones, a stream
cut short, many requests at once. Every answer must reach the client byte for byte as the app sent it."""

from __future__ import annotations

import asyncio
import json
import types

import pytest

from vllm_fleet.templating import jinja_environment


class FakeCounter:
    """prometheus_client's Counter as the module uses it: labels(client, model).inc(n)."""

    def __init__(self):
        self.values: dict[tuple[str, str], float] = {}

    def labels(self, client, model):
        counter = self

        class Child:
            def inc(self, amount=1):
                if amount < 0:
                    raise ValueError("counters only go up")
                counter.values[(client, model)] = counter.values.get((client, model), 0) + amount

        return Child()


@pytest.fixture
def module():
    module = types.ModuleType("vllm_fleet_model_access")
    exec(jinja_environment().get_template("vllm-model-access.py.j2").render(), module.__dict__)
    module.COUNTERS = {kind: FakeCounter() for kind in ("prompt", "cached", "completion", "requests")}
    return module


def counted(module, kind="prompt"):
    return module.COUNTERS[kind].values


def usage(prompt, completion, cached=None, model="tiny-llama"):
    report = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}
    if cached is not None:
        report["prompt_tokens_details"] = {"cached_tokens": cached}
    return {"id": "cmpl-1", "object": "chat.completion", "created": 1, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}], "usage": report}


def sse(*events) -> list[bytes]:
    return [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]


def stream_events(prompt, completion, cached, model="tiny-llama", continuous=True):
    """What vLLM streams with --enable-force-include-usage: usage on every chunk (cumulative), then a
    chunk with no choices and the final usage."""
    events = []
    for i in range(1, completion + 1):
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model,
                 "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}]}
        if continuous:
            chunk["usage"] = {"prompt_tokens": prompt, "completion_tokens": i, "total_tokens": prompt + i}
        events.append(chunk)
    events.append({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [],
                   "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                             "prompt_tokens_details": {"cached_tokens": cached}}})
    return events


def app_sending(bodies: list[bytes], status=200, media=b"application/json", fail_after: int | None = None):
    async def app(scope, receive, send):
        await receive()
        await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", media)]})
        for i, body in enumerate(bodies):
            if fail_after is not None and i == fail_after:
                raise ConnectionResetError("the client went away")
            await send({"type": "http.response.body", "body": body, "more_body": i < len(bodies) - 1})
            await asyncio.sleep(0)
    return app


async def call(module, app, client: bytes | None = b"alice", method="POST", extra_headers=()):
    headers = [(b"content-type", b"application/json")] + list(extra_headers)
    if client is not None:
        headers.append((b"x-vllm-fleet-client", client))
    sent = []

    async def receive():
        return {"type": "http.request", "body": b'{"model": "tiny-llama"}', "more_body": False}

    async def send(message):
        sent.append(message)

    try:
        await module.ModelAccess(app)({"type": "http", "method": method, "path": "/v1/chat/completions",
                                       "headers": headers}, receive, send)
    except ConnectionResetError:
        pass
    return sent


def run(module, app, **kw):
    return asyncio.run(call(module, app, **kw))


def body_of(sent):
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_json_answer_counts_its_usage_under_the_client_and_model(module):
    answer = json.dumps(usage(12, 5, cached=8)).encode()
    sent = run(module, app_sending([answer[:10], answer[10:]]))
    assert body_of(sent) == answer
    assert counted(module) == {("alice", "tiny-llama"): 12}
    assert counted(module, "cached") == {("alice", "tiny-llama"): 8}
    assert counted(module, "completion") == {("alice", "tiny-llama"): 5}
    assert counted(module, "requests") == {("alice", "tiny-llama"): 1}
    run(module, app_sending([json.dumps(usage(3, 2)).encode()]))  # no prompt_tokens_details: 0 cached
    assert counted(module) == {("alice", "tiny-llama"): 15} and counted(module, "cached")[("alice", "tiny-llama")] == 8


def test_a_stream_counts_its_last_usage_once_whatever_the_chunking(module):
    events = stream_events(prompt=7, completion=4, cached=4)
    stream = b"".join(sse(*events))
    # Events split across body messages at every few bytes, and all in one message.
    for bodies in ([stream[i:i + 13] for i in range(0, len(stream), 13)], [stream]):
        sent = run(module, app_sending(bodies, media=b"text/event-stream; charset=utf-8"))
        assert body_of(sent) == stream
    assert counted(module) == {("alice", "tiny-llama"): 14}
    assert counted(module, "completion") == {("alice", "tiny-llama"): 8}
    assert counted(module, "cached") == {("alice", "tiny-llama"): 8}
    assert counted(module, "requests") == {("alice", "tiny-llama"): 2}


def test_a_stream_without_continuous_usage_and_the_responses_apis_final_event(module):
    run(module, app_sending(sse(*stream_events(5, 3, 0, continuous=False)), media=b"text/event-stream"))
    completed = {"type": "response.completed", "response": {
        "id": "r", "model": "tiny-llama", "output": [],
        "usage": {"input_tokens": 9, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 1}}}}
    events = [b"event: response.created\ndata: {\"type\":\"response.created\"}\n\n",
              b"event: response.completed\ndata: " + json.dumps(completed).encode() + b"\n\n"]
    run(module, app_sending(events, media=b"text/event-stream"))
    assert counted(module) == {("alice", "tiny-llama"): 14}
    assert counted(module, "completion") == {("alice", "tiny-llama"): 5}
    assert counted(module, "cached") == {("alice", "tiny-llama"): 1}


def test_without_the_fronts_header_the_request_counts_under_none_and_a_forged_value_under_invalid(module):
    answer = json.dumps(usage(2, 1)).encode()
    run(module, app_sending([answer]), client=None)
    for hostile in (b"alice bob", b"a" * 65, b"al\xc3\xafce", b"", b"../x", b"alice\r\nx: y", b"(none)"):
        run(module, app_sending([answer]), client=hostile)
    assert counted(module) == {("(none)", "tiny-llama"): 2, ("(invalid)", "tiny-llama"): 14}


def test_a_client_header_without_the_fronts_authorization_is_not_believed(module):
    """vLLM's loopback port answers its pooling routes without a key: a local process could name any
    client there. The front always sends the host's key, which only it and vLLM hold."""
    module.FRONT_AUTHORIZATION = b"Bearer host-key-1"
    answer = json.dumps(usage(5, 1)).encode()
    run(module, app_sending([answer]), extra_headers=[(b"authorization", b"Bearer host-key-1")])
    for other in ([], [(b"authorization", b"Bearer host-key-2")], [(b"authorization", b"Bearer host-key-1 ")]):
        run(module, app_sending([answer]), extra_headers=other)
    assert counted(module) == {("alice", "tiny-llama"): 5, ("(none)", "tiny-llama"): 15}


def test_errors_and_other_answers_are_not_counted_and_pass_unchanged(module):
    answer = json.dumps(usage(2, 1)).encode()
    for app in (app_sending([answer], status=400), app_sending([answer], status=500),
                app_sending([answer], media=b"text/plain")):
        assert body_of(run(module, app)) == answer
    assert body_of(run(module, app_sending([answer]), method="GET")) == answer
    assert counted(module) == {}


@pytest.mark.parametrize("body", [
    b"not json", b"{", b"[1, 2]", b'{"usage": null}', b'{"usage": [1]}', b'{"usage": {"prompt_tokens": "12"}}',
    b'{"usage": {"prompt_tokens": -1, "completion_tokens": 1}}', b'{"usage": {"prompt_tokens": true}}',
    b'{"usage": {"prompt_tokens": 1e3}}', b'{"usage": {"prompt_tokens": 99999999999999999999999}}',
    b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": "x"}}}',
    b"[" * 100000 + b"]" * 100000, b"\xff\xfe\x00",
])
def test_a_malformed_answer_counts_nothing_and_passes_unchanged(module, body):
    assert body_of(run(module, app_sending([body]))) == body
    assert body_of(run(module, app_sending([b"data: " + body + b"\n\n"], media=b"text/event-stream"))) == b"data: " + body + b"\n\n"
    assert counted(module) == {}


def test_odd_model_names_are_bounded_and_cached_tokens_never_exceed_the_prompt(module):
    run(module, app_sending([json.dumps(usage(4, 1, cached=9, model="m" * 300)).encode()]))
    run(module, app_sending([json.dumps(usage(4, 1, model="a b\n")).encode()]))
    assert counted(module) == {("alice", "(unknown)"): 8}
    assert counted(module, "cached") == {("alice", "(unknown)"): 4}


def test_a_huge_answer_is_counted_from_its_tail_without_being_held(module):
    answer = usage(30, 20, cached=10)
    answer["choices"][0]["message"]["content"] = "y" * (module.WHOLE_BODY_MAX + 1000)
    raw = json.dumps(answer, separators=(",", ":")).encode()
    bodies = [raw[i:i + 65536] for i in range(0, len(raw), 65536)]
    held = []

    class Watching(module.UsageCounting):
        def finish(self):
            held.append((self.chunks, len(self.tail)))
            super().finish()

    module.UsageCounting = Watching
    sent = run(module, app_sending(bodies))
    assert body_of(sent) == raw
    assert held[0] == (None, module.TAIL_MAX)  # at its end; the app's return finds it counted
    assert counted(module) == {("alice", "tiny-llama"): 30}
    assert counted(module, "cached") == {("alice", "tiny-llama"): 10}
    # An endless stream line (no event boundary) is dropped, not held.
    endless = [b"data: " + b"z" * 65536] * ((module.EVENT_MAX // 65536) + 4)
    run(module, app_sending(endless + [b"\n\n"], media=b"text/event-stream"))
    assert counted(module) == {("alice", "tiny-llama"): 30}


def test_a_huge_answer_whose_usage_comes_before_megabytes_of_logprobs_is_counted(module):
    """vLLM's chat answer writes prompt_logprobs (and prompt_token_ids) after its usage: a long prompt
    with prompt_logprobs makes an answer over WHOLE_BODY_MAX whose tail holds no usage."""
    answer = usage(41, 3, cached=8)
    answer["prompt_logprobs"] = [{"1": {"logprob": -0.5, "rank": 1, "decoded_token": 'x "usage": {'}}] * 140_000
    raw = json.dumps(answer, separators=(",", ":")).encode()
    assert len(raw) > module.WHOLE_BODY_MAX and b'"usage":{' not in raw[-module.TAIL_MAX:]
    # cut so that the usage key itself is split between two chunks
    at = raw.index(b'"usage":{') + 4
    bodies = [raw[:at]] + [raw[i:i + 65536] for i in range(at, len(raw), 65536)]
    assert body_of(run(module, app_sending(bodies))) == raw
    assert counted(module) == {("alice", "tiny-llama"): 41}
    assert counted(module, "cached") == {("alice", "tiny-llama"): 8}


def test_a_stream_cut_short_counts_the_usage_of_its_last_event_sent(module):
    bodies = sse(*stream_events(prompt=6, completion=10, cached=0))
    run(module, app_sending(bodies, media=b"text/event-stream", fail_after=4))  # 4 chunks: 4 tokens sent
    assert counted(module) == {("alice", "tiny-llama"): 6}
    assert counted(module, "completion") == {("alice", "tiny-llama"): 4}
    # Cut in the middle of an event: the last whole event counts.
    half = bodies[3][: len(bodies[3]) // 2]
    run(module, app_sending(bodies[:3] + [half, b"x"], media=b"text/event-stream", fail_after=4))
    assert counted(module, "completion") == {("alice", "tiny-llama"): 7}
    # Cut before any usage: nothing.
    run(module, app_sending(bodies, media=b"text/event-stream", fail_after=0))
    assert counted(module, "requests") == {("alice", "tiny-llama"): 2}


def test_the_app_cancelled_mid_stream_still_counts_once(module):
    bodies = sse(*stream_events(prompt=3, completion=5, cached=0))

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for body in bodies[:2]:
            await send({"type": "http.response.body", "body": body, "more_body": True})
        await asyncio.sleep(10)

    async def main():
        task = asyncio.ensure_future(call(module, app))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert counted(module, "completion") == {("alice", "tiny-llama"): 2}
    assert counted(module, "requests") == {("alice", "tiny-llama"): 1}


def test_concurrent_requests_are_each_counted_under_their_own_client(module):
    async def main():
        calls = []
        for i in range(60):
            client = [b"alice", b"bob", b"carol"][i % 3]
            if i % 2:
                app = app_sending(sse(*stream_events(prompt=10 + i, completion=3, cached=i % 5)),
                                  media=b"text/event-stream")
            else:
                raw = json.dumps(usage(10 + i, 3, cached=i % 5)).encode()
                app = app_sending([raw[:7], raw[7:20], raw[20:]])
            calls.append(call(module, app, client=client))
        await asyncio.gather(*calls)

    asyncio.run(main())
    expected = {}
    for i in range(60):
        key = (["alice", "bob", "carol"][i % 3], "tiny-llama")
        expected[key] = expected.get(key, 0) + 10 + i
    assert counted(module) == expected
    assert counted(module, "requests") == {key: 20 for key in expected}
    assert sum(counted(module, "completion").values()) == 180


def test_the_model_check_still_refuses_a_restricted_clients_other_model(module):
    answer = json.dumps(usage(2, 1)).encode()
    sent = run(module, app_sending([answer]), extra_headers=[(b"x-vllm-fleet-models", b"other-model")])
    assert sent[0]["status"] == 403 and counted(module) == {}


def test_outside_vllm_there_is_nothing_to_export_to_and_nothing_breaks():
    module = types.ModuleType("vllm_fleet_model_access")
    exec(jinja_environment().get_template("vllm-model-access.py.j2").render(), module.__dict__)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        assert module.COUNTERS is None
        answer = json.dumps(usage(2, 1)).encode()
        assert body_of(asyncio.run(call(module, app_sending([answer])))) == answer
    else:
        # With prometheus_client, the counters are the registry's, registered once per process.
        module.COUNTERS["prompt"].labels("alice", "m").inc(3)
        again = types.ModuleType("vllm_fleet_model_access")
        exec(jinja_environment().get_template("vllm-model-access.py.j2").render(), again.__dict__)
        assert again.COUNTERS["prompt"] is module.COUNTERS["prompt"]
        assert prometheus_client.REGISTRY.get_sample_value(
            "vllm_fleet_client_prompt_tokens_total", {"client": "alice", "model": "m"}) >= 3


# --- what the deploy renders for it: the flags, the module on every instance, the front's header

def _pooling_host(**settings):
    from support.pooling_models import BGE_M3, H200, QWEN3_0_6B
    from vllm_fleet.config import parse_host
    bge = {"name": "bge", "model": "BAAI/bge-m3", "served_model_name": "bge-m3", "port": 8000,
           "model_info": BGE_M3, "gpus": [0]}
    chat = {"name": "chat", "model": "Qwen/Qwen3-0.6B", "served_model_name": "qwen3", "port": 8001,
            "model_info": dict(QWEN3_0_6B, weights_gib=1.4), "gpus": [1]}
    return parse_host("gpu-1", {"gpus": [H200, H200], "vllm_instances": [bge, chat], **settings})


def test_every_instance_loads_the_counting_with_the_flags_its_usage_needs():
    from vllm_fleet.plan import plan_host
    from vllm_fleet.render import render_host
    config = _pooling_host(vllm_api_clients={"alice": {"key_env": "ALICE_KEY"}})
    plan = plan_host(config)
    for inst in plan.instances:
        assert inst.engine_args["middleware"] == "vllm_fleet_model_access.ModelAccess"
        assert inst.engine_args["enable-force-include-usage"] is True
        assert inst.engine_args["enable-prompt-tokens-details"] is True
        assert inst.env["PYTHONPATH"] == "/etc/vllm-fleet/python"
    files = {f.path: f.content for f in render_host(config, plan)}
    assert "class UsageCounting" in files["/etc/vllm-fleet/python/vllm_fleet_model_access.py"]
    front = files["/etc/vllm-fleet/front.conf"]
    # Every location that passes requests on to a vLLM (/v1/ and the pooling routes) sets the header,
    # so no client's own copy of it reaches vLLM; it is the client's name ($vllm_fleet_client), not its id or key.
    passes = front.count("proxy_set_header Authorization $vllm_fleet_vllm_authorization;")
    assert passes >= 3 and front.count("proxy_set_header X-Vllm-Fleet-Client $vllm_fleet_client;") == passes
    settings = {line.strip() for line in front.splitlines() if line.strip().startswith("proxy_set_header X-Vllm-Fleet-Client")}
    assert settings == {"proxy_set_header X-Vllm-Fleet-Client $vllm_fleet_client;"}
    assert "map $vllm_fleet_client_id $vllm_fleet_client {" in front  # the id's name, from the key map


@pytest.mark.parametrize("flag,value", [("middleware", "my.Middleware"), ("enable-force-include-usage", False),
                                        ("enable-prompt-tokens-details", "false")])
def test_engine_args_may_repeat_the_counting_flags_never_change_them(flag, value):
    from support.planning_fixtures import H100_80G, host_data, instance
    from vllm_fleet.config import ConfigErrors, parse_host
    from vllm_fleet.plan import plan_host
    llama = dict(name="llama", model="meta-llama/Meta-Llama-3-8B-Instruct", served_model_name="llama",
                 tokenizer=None, max_model_len=8192)
    config = parse_host("h1", host_data(gpus=[H100_80G], instances=[instance(**llama, engine_args={flag: value})]))
    with pytest.raises(ConfigErrors) as caught:
        plan_host(config)
    [error] = [e for e in caught.value.errors if e.key == f"engine_args.{flag}"]
    assert error.host == "h1" and error.instance == "llama" and "remove" in error.fix
    if flag != "middleware":
        same = parse_host("h1", host_data(gpus=[H100_80G], instances=[instance(**llama, engine_args={flag: True})]))
        assert plan_host(same).instances[0].engine_args[flag] is True
