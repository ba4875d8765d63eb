"""The routing bench's offline parts: the arms, the workload generator (tenants), the /metrics and
percentile arithmetic, the summary, its table and the targets, and the client against a local
streaming stand-in (loopback ports this test starts and stops; no sandbox host is booted here)."""

from __future__ import annotations

import http.server
import itertools
import json
import sys
import threading
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import routing_bench as pb  # noqa: E402
import routing_workload as pw  # noqa: E402


# --- the workload ---------------------------------------------------------------------------------

def test_every_conversation_of_a_block_shares_the_one_system_prompt_and_one_shots_do_not():
    w = pw.make_workload(1, "r1-cache_aware", conversations=8, turns=3, oneshot_share=0.2)
    assert w["system"].startswith("[r1-cache_aware] ") and w["system"].endswith(pw.SYSTEM_PROMPT)
    firsts = [pw.turn_messages(w["system"], c["turns"][:1], []) for c in w["conversations"]]
    assert {m[0]["content"] for m in firsts} == {w["system"]}  # the very same prefix, every conversation
    assert all(m[0]["role"] == "system" for m in firsts)
    assert not any(pw.SYSTEM_PROMPT[:40] in o for o in w["oneshots"])
    assert len({c["id"] for c in w["conversations"]}) == 8


def test_the_one_shot_share_is_of_all_requests():
    w = pw.make_workload(1, "t", conversations=16, turns=4, oneshot_share=0.2)
    assert len(w["oneshots"]) == 16  # 16 / (64 + 16) = 20 %
    assert pw.make_workload(1, "t", 4, 2, 0.0)["oneshots"] == []
    with pytest.raises(ValueError):
        pw.make_workload(1, "t", 4, 2, 1.0)


def test_blocks_do_not_share_a_prefix_and_the_same_tag_gives_the_same_block():
    a, b = pw.make_workload(1, "r1-round_robin", 4, 2, 0.2), pw.make_workload(1, "r2-round_robin", 4, 2, 0.2)
    assert a["system"][:4] != b["system"][:4]  # the tag comes first: another block's cache never matches
    assert pw.make_workload(1, "r1-round_robin", 4, 2, 0.2) == a
    assert pw.plan_jobs(a, 1) == pw.plan_jobs(a, 1)


def test_each_turn_carries_the_previous_ones_and_their_replies():
    users = ["first?", "second?", "third?"]
    replies = ["one", "two"]
    turns = [pw.turn_messages("SYS", users[:n + 1], replies[:n]) for n in range(3)]
    for shorter, longer in itertools.pairwise(turns):
        assert longer[:len(shorter)] == shorter  # the earlier turn is a prefix of the next
        assert len(longer) == len(shorter) + 2  # + its reply and the new user message
    assert turns[2] == [{"role": "system", "content": "SYS"},
                        {"role": "user", "content": "first?"}, {"role": "assistant", "content": "one"},
                        {"role": "user", "content": "second?"}, {"role": "assistant", "content": "two"},
                        {"role": "user", "content": "third?"}]
    with pytest.raises(ValueError):
        pw.turn_messages("SYS", ["a?"], ["too many"])


def test_jobs_are_every_conversation_and_one_shot_once_mixed():
    w = pw.make_workload(3, "t", 10, 2, 0.2)
    jobs = pw.plan_jobs(w, 3)
    assert sorted(jobs) == sorted([("conversation", i) for i in range(10)] + [("oneshot", j) for j in range(5)])
    kinds = [k for k, _ in jobs]
    assert kinds != sorted(kinds) and kinds != sorted(kinds, reverse=True)  # interleaved


# --- /metrics and percentiles ---------------------------------------------------------------------

BEFORE = """\
# HELP vllm:prefix_cache_queries Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 1000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 200.0
vllm:prefix_cache_hits_created{engine="0",model_name="tiny-llama"} 1.7e9
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-llama"} 10.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny-llama"} 2.0
"""


def metrics(queries: float, hits: float, length: float, stop: float = 2.0) -> str:
    return (BEFORE.replace("1000.0", str(queries)).replace("} 200.0", f"}} {hits}")
            .replace("} 10.0", f"}} {length}").replace("} 2.0", f"}} {stop}"))


def test_counter_sum_adds_every_label_set_of_that_name_only():
    assert pw.counter_sum(BEFORE, pw.QUERY_NAME) == 1000.0
    assert pw.counter_sum(BEFORE, pw.HIT_NAME) == 200.0  # not the _created sample
    assert pw.counter_sum(BEFORE, pw.SUCCESS_NAME) == 12.0  # both finished_reason label sets
    assert pw.counter_sum("vllm:prefix_cache_hits_total 5\n", pw.HIT_NAME) == 5.0  # no labels
    assert pw.counter_sum("", pw.HIT_NAME) == 0.0


def test_hit_rate_is_the_deltas_hits_over_queries_of_all_instances():
    before = {"sbx-cpu1": BEFORE, "sbx-cpu2": metrics(0, 0, 0, 0)}
    after = {"sbx-cpu1": metrics(1600, 650, 16), "sbx-cpu2": metrics(400, 50, 4, 0)}
    deltas = pw.metric_deltas(before, after)
    assert deltas == {"sbx-cpu1": {"hits": 450.0, "queries": 600.0, "requests": 6.0},
                      "sbx-cpu2": {"hits": 50.0, "queries": 400.0, "requests": 4.0}}
    assert pw.hit_rate(deltas) == pytest.approx(500 / 1000)  # not the mean of 75 % and 12.5 %
    assert pw.spread(deltas) == {"sbx-cpu1": pytest.approx(0.6), "sbx-cpu2": pytest.approx(0.4)}
    assert pw.hit_rate({"h": {"hits": 0.0, "queries": 0.0, "requests": 0.0}}) is None
    assert pw.spread({"h": {"hits": 0.0, "queries": 0.0, "requests": 0.0}}) == {"h": 0.0}


def block(policy, ttft, later, wall, hits, queries, ok=4, errors=0):
    return {"policy": policy, "ttft_ms": ttft, "ttft_later_turns_ms": later, "wall_s": wall, "ok": ok,
            "errors": errors, "prompt_tokens": 300 * ok, "completion_tokens": 16 * ok,
            "metrics": {"sbx-cpu1": {"hits": hits, "queries": queries, "requests": ok / 2},
                        "sbx-cpu2": {"hits": 0.0, "queries": queries, "requests": ok / 2}}}


def test_summary_pools_a_policys_blocks():
    s = pw.summarize("cache_aware", [block("cache_aware", [10.0, 20.0], [20.0], 2.0, 100.0, 200.0),
                                     block("cache_aware", [30.0, 40.0], [40.0], 2.0, 300.0, 200.0, errors=1)])
    assert s["blocks"] == 2 and s["requests"] == 8 and s["errors"] == 1
    assert s["ttft_p50_ms"] == pytest.approx(25.0)  # percentile over all 4 samples, like numpy's
    assert s["ttft_p99_ms"] == pytest.approx(39.7)
    assert s["ttft_later_turns_p50_ms"] == pytest.approx(30.0)
    assert s["requests_per_s"] == pytest.approx(2.0)  # 8 requests in 4 s
    assert s["tokens_per_s"] == pytest.approx(8 * 316 / 4)
    assert s["prefix_cache_hit_rate"] == pytest.approx(400 / 800)
    assert s["spread"] == {"sbx-cpu1": pytest.approx(0.5), "sbx-cpu2": pytest.approx(0.5)}
    row = pw.table_row(s)
    assert row.startswith("cache_aware") and "50.0%" in row and "50% 50%" in row
    empty = pw.summarize("random", [])
    assert empty["ttft_p50_ms"] is None and empty["prefix_cache_hit_rate"] is None
    assert pw.table_row(empty).split()[:4] == ["random", "0", "0", "0"]


# --- the client against a local streaming stand-in -------------------------------------------------

class Streamer(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Streamer.seen.append((self.headers.get(pb.SESSION_HEADER), body))
        if self.headers.get("Authorization") != f"Bearer {pb.API_KEY}":
            payload = b'{"error": "unauthorized"}'
            self.send_response(401)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        chunks = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]},
                  {"choices": [{"delta": {"content": "hel"}}]}, {"choices": [{"delta": {"content": "lo"}}]},
                  {"choices": [], "usage": {"prompt_tokens": 7 * len(body["messages"]), "completion_tokens": 2}}]
        data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def streamer():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Streamer)
    Streamer.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address
    server.shutdown()
    server.server_close()


def spec(address, workload, key=pb.API_KEY):
    return {"gateway": list(address), "model": "tiny-llama", "api_key": key, "seed": 1, "max_tokens": 2,
            "session_header": True, "workload": workload, "concurrency": 3, "timeout_s": 30}


def test_the_client_streams_every_turn_with_the_replies_so_far_and_the_session_header(streamer):
    w = pw.make_workload(1, "t", conversations=3, turns=3, oneshot_share=0.25)
    result = pb.run_client(spec(streamer, w))
    assert result["ok"] == 9 + 3 and result["errors"] == 0 and not result["timed_out"]
    assert len(result["ttft_ms"]) == 12 and len(result["ttft_later_turns_ms"]) == 6
    assert len(result["ttft_oneshot_ms"]) == 3
    assert result["completion_tokens"] == 24 and result["max_prompt_tokens"] == 7 * 6
    by_session: dict = {}
    for session, body in Streamer.seen:
        assert body["stream"] and body["ignore_eos"] and body["stream_options"] == {"include_usage": True}
        by_session.setdefault(session, []).append(body["messages"])
    assert len(by_session[None]) == 3  # the one-shots: no header, no system prompt
    assert all(m[0]["role"] == "user" for m in by_session[None])
    for c in w["conversations"]:
        turns = by_session[c["id"]]
        assert [t[-1]["content"] for t in turns] == c["turns"]
        assert turns[2][4] == {"role": "assistant", "content": "hello"}  # the reply, as streamed


def test_the_client_counts_refused_requests_as_errors(streamer):
    result = pb.run_client(spec(streamer, pw.make_workload(1, "t", 2, 2, 0.0), key="wrong"))
    assert result["ok"] == 0 and result["errors"] == 2  # a conversation stops at its first failed turn
    assert "HTTP 401" in result["error_examples"][0]


def test_arms_are_a_policy_with_or_without_the_header_or_the_ideal():
    assert pw.parse_arm("cache_aware+header") == {"name": "cache_aware+header", "policy": "cache_aware", "header": True}
    assert pw.parse_arm(" round_robin ") == {"name": "round_robin", "policy": "round_robin", "header": False}
    assert pw.parse_arm("ideal") == {"name": "ideal", "policy": "consistent_hash", "header": False}
    for bad in ("cache_aware+cookie", "+header", ""):
        with pytest.raises(ValueError, match="POLICY"):
            pw.parse_arm(bad)


def test_a_policy_the_fleet_refuses_is_reported_with_its_reason_and_not_run():
    args = pb.parse_args(["--arms", "round_robin,kv_aware+header, cache_aware"])
    assert [a["name"] for a in args.arm_list] == ["round_robin", "cache_aware"]
    assert "vllm_gateway_policy" in args.refused["kv_aware"] and "kv_aware" in args.refused["kv_aware"]
    with pytest.raises(SystemExit):
        pb.parse_args(["--arms", "kv_aware"])  # nothing left to run
    with pytest.raises(SystemExit):
        pb.parse_args(["--arms", "round_robin,round_robin"])
    with pytest.raises(SystemExit):
        pb.parse_args(["--tenants", "0"])


def test_tenants_each_have_a_system_prompt_of_their_own_and_conversations_take_them_in_turn():
    w = pw.make_workload(1, "r1-x", conversations=8, turns=2, oneshot_share=0.0, tenants=4)
    assert len(w["systems"]) == 4 and len({s[:12] for s in w["systems"]}) == 4  # no common first tokens
    assert all(s.endswith(pw.SYSTEM_PROMPT) for s in w["systems"])
    assert [c["tenant"] for c in w["conversations"]] == [0, 1, 2, 3, 0, 1, 2, 3]
    with pytest.raises(ValueError):
        pw.make_workload(1, "t", 4, 2, 0.0, tenants=0)


def test_the_targets_are_judged_against_round_robin_and_the_ideal():
    def summary(name, hit, p90, oneshot, errors=0):
        return {"policy": name, "prefix_cache_hit_rate": hit, "ttft_p90_ms": p90, "ttft_oneshot_p90_ms": oneshot,
                "errors": errors}
    verdict = pw.judge([summary("round_robin", 0.6, 1000.0, 100.0), summary("prefix", 0.76, 450.0, 108.0),
                        summary("cache_aware", 0.5, 600.0, 150.0, errors=2), summary("ideal", 0.8, 3000.0, 400.0)])
    assert verdict["prefix"] == {"hit_rate_of_ideal": pytest.approx(0.95), "hit_rate_target": True,
                                 "ttft_p90_of_baseline": pytest.approx(0.45), "ttft_p90_target": True,
                                 "oneshot_p90_of_baseline": pytest.approx(1.08), "oneshot_target": True,
                                 "no_errors": True}
    assert verdict["cache_aware"]["hit_rate_target"] is False and verdict["cache_aware"]["ttft_p90_target"] is False
    assert verdict["cache_aware"]["oneshot_target"] is False and verdict["cache_aware"]["no_errors"] is False
    assert verdict["round_robin"]["ttft_p90_target"] is False  # 1.0x its own
    lone = pw.judge([summary("cache_aware", 0.5, None, None)])  # no baseline, no ideal: nothing to judge
    assert lone["cache_aware"]["hit_rate_target"] is None and lone["cache_aware"]["ttft_p90_target"] is None


def test_each_conversation_is_sent_over_its_own_tenants_system_prompt(streamer):
    w = pw.make_workload(1, "t", conversations=4, turns=1, oneshot_share=0.0, tenants=2)
    pb.run_client(dict(spec(streamer, w), session_header=False))
    sent = {body["messages"][-1]["content"]: body["messages"][0]["content"] for _session, body in Streamer.seen}
    for c in w["conversations"]:
        assert sent[c["turns"][0]] == w["systems"][c["tenant"]]
    assert {session for session, _body in Streamer.seen} == {None}  # no header: the arm without it


def test_the_kill_block_counts_failures_against_the_requests_in_flight_at_the_kill():
    timeline = [(0.0, 1.0, True), (0.5, 2.5, False), (1.5, 2.2, False), (2.1, 2.4, True), (2.6, 3.0, False)]
    assert pb.kill_outcome(timeline, 2.0) == {"requests": 5, "failed": 3, "in_flight": 2, "failed_started_after": 1}
    with pytest.raises(SystemExit):
        pb.parse_args(["--kill-instance", "sbx-gpu1"])
