"""The routing bench's pure parts (bench/routing_bench.py runs them on the sandbox): the arms
compared, the workload (tenants' conversations, each tenant with a long system prompt of its own;
one-shots; the order they are sent in), the arithmetic on vLLM's /metrics read before and after a
block, the table, and the issue's targets judged against round_robin and the ideal."""

from __future__ import annotations

import random

from gateway_standin import percentile


HIT_NAME = "vllm:prefix_cache_hits_total"


QUERY_NAME = "vllm:prefix_cache_queries_total"
SUCCESS_NAME = "vllm:request_success_total"


# The common system prompt: words the tiny model's tokenizer was trained on (tiny_model.CORPUS), so
# its length in tokens is predictable (~300; the bench prints the count it measures).
SYSTEM_PROMPT = (
    "You are the assistant of the fleet. The fleet serves language models on bare metal servers. "
    "Each server runs one or more instances of the inference engine, and every instance listens on its "
    "own port behind an API key. The operator declares the hosts, the graphics cards and the models in "
    "an inventory, and the deploy converges every host to that declaration: it installs the "
    "environment, writes the configuration, the environment file and the service unit, reloads the "
    "service manager only when a unit changed, and restarts an instance only when something it depends "
    "on changed. After the restart the deploy waits for the health endpoint, lists the models with the "
    "key, and asks for one token of completion to prove that the engine really answers. Graphics memory "
    "is shared between the weights, the activations and the key value cache; the cache holds the "
    "attention keys and values of every sequence in flight, and its size decides how many requests can "
    "run at once. Tensor parallelism splits each layer across several cards, pipeline parallelism splits "
    "the stack of layers into stages, and data parallelism runs whole copies side by side. When a card "
    "fails, the engine stops, the service manager restarts it, and the operator reads the journal to "
    "learn why. Logs, metrics, dashboards, alerts and rollbacks keep the fleet healthy through upgrades "
    "and reboots. Answer the user in short sentences."
)
WORDS = ("the fleet serves models on servers each instance listens on its port behind a key the operator "
         "declares hosts cards and models in an inventory deploy converges every host restart health "
         "token completion engine memory cache weights tensor pipeline data parallel stage card journal "
         "logs metrics alerts rollback upgrade reboot robot paint sea light water evening morning bread "
         "cheese apples coffee tea table window kitchen spring rain valley summer autumn winter snow").split()


# --- the workload (pure) -------------------------------------------------------------------------

def sentence(rng: random.Random, low: int, high: int) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(low, high))]
    return " ".join(words).capitalize() + "?"


def make_workload(seed: int, tag: str, conversations: int, turns: int, oneshot_share: float,
                  tenants: int = 1) -> dict:
    """One block's requests: `conversations` conversations of `turns` user messages, spread over
    `tenants` tenants in turn, each tenant's over a system prompt of its own (the common text behind
    a tag of the block and the tenant, so no block or tenant shares another's prefix), and as many
    unrelated one-shot prompts as make `oneshot_share` of all requests."""
    if not 0 <= oneshot_share < 1:
        raise ValueError("oneshot_share must be in [0, 1)")
    if tenants < 1:
        raise ValueError("tenants must be at least 1")
    rng = random.Random(f"{seed}:{tag}")
    conversation_requests = conversations * turns
    oneshots = round(conversation_requests * oneshot_share / (1 - oneshot_share))
    systems = [f"[{tag}] {SYSTEM_PROMPT}"] if tenants == 1 else [f"[{tag}-t{k}] {SYSTEM_PROMPT}"
                                                                 for k in range(tenants)]
    return {
        "tag": tag,
        "system": systems[0],
        "systems": systems,
        "conversations": [{"id": f"{tag}-c{i}", "tenant": i % tenants,
                           "turns": [sentence(rng, 8, 16) for _ in range(turns)]}
                          for i in range(conversations)],
        # Unrelated: no system prompt, a tag and words of their own.
        "oneshots": [f"[{tag}-o{i}] " + " ".join(sentence(rng, 10, 20) for _ in range(4))
                     for i in range(oneshots)],
    }


def plan_jobs(workload: dict, seed: int) -> list[tuple[str, int]]:
    """The order the client takes jobs in: ("conversation", i) (all its turns, one after the other)
    and ("oneshot", j), shuffled so the one-shots fall between the conversations."""
    jobs = [("conversation", i) for i in range(len(workload["conversations"]))]
    jobs += [("oneshot", j) for j in range(len(workload["oneshots"]))]
    random.Random(f"{seed}:{workload['tag']}:order").shuffle(jobs)
    return jobs


def turn_messages(system: str, users: list[str], replies: list[str]) -> list[dict]:
    """The messages of a conversation's next turn: the system prompt, every earlier user message and
    reply, then the newest user message (len(users) == len(replies) + 1)."""
    if len(users) != len(replies) + 1:
        raise ValueError("one more user message than replies")
    messages = [{"role": "system", "content": system}]
    for user, reply in zip(users[:-1], replies, strict=True):
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]
    messages.append({"role": "user", "content": users[-1]})
    return messages


# --- /metrics arithmetic (pure) ------------------------------------------------------------------

def counter_sum(text: str, name: str) -> float:
    """The sum of every sample of counter `name` in a Prometheus text exposition (all label sets)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        rest = line[len(name):]
        if rest[:1] not in ("{", " "):
            continue  # another metric whose name starts with this one
        value = rest.rsplit("}", 1)[-1].split()
        if value:
            total += float(value[0])
    return total


def metric_deltas(before: dict[str, str], after: dict[str, str]) -> dict[str, dict[str, float]]:
    """Per instance (host): the block's hits, queries and finished requests, from two /metrics texts."""
    out = {}
    for host in after:
        out[host] = {key: counter_sum(after[host], name) - counter_sum(before.get(host, ""), name)
                     for key, name in (("hits", HIT_NAME), ("queries", QUERY_NAME),
                                       ("requests", SUCCESS_NAME))}
    return out


def hit_rate(deltas: dict[str, dict[str, float]]) -> float | None:
    """All instances' prefix-cache hits over their queries (tokens), or None without a query."""
    hits = sum(d["hits"] for d in deltas.values())
    queries = sum(d["queries"] for d in deltas.values())
    return hits / queries if queries > 0 else None


def spread(deltas: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each instance's share of the block's finished requests."""
    total = sum(d["requests"] for d in deltas.values())
    return {host: (d["requests"] / total if total else 0.0) for host, d in deltas.items()}


def summarize(policy: str, blocks: list[dict]) -> dict:
    """One arm's blocks pooled: TTFT percentiles over all their requests, rates over their sums."""
    ttft = [t for b in blocks for t in b["ttft_ms"]]
    later = [t for b in blocks for t in b["ttft_later_turns_ms"]]
    oneshot = [t for b in blocks for t in b.get("ttft_oneshot_ms", [])]
    wall = sum(b["wall_s"] for b in blocks)
    deltas: dict[str, dict[str, float]] = {}
    for b in blocks:
        for host, d in b["metrics"].items():
            acc = deltas.setdefault(host, {"hits": 0.0, "queries": 0.0, "requests": 0.0})
            for key in acc:
                acc[key] += d[key]
    requests = sum(b["ok"] for b in blocks)
    tokens = sum(b["prompt_tokens"] + b["completion_tokens"] for b in blocks)
    return {"policy": policy, "blocks": len(blocks), "requests": requests,
            "errors": sum(b["errors"] for b in blocks),
            "ttft_p50_ms": percentile(ttft, 50), "ttft_p90_ms": percentile(ttft, 90),
            "ttft_p99_ms": percentile(ttft, 99), "ttft_later_turns_p50_ms": percentile(later, 50),
            "ttft_oneshot_p50_ms": percentile(oneshot, 50), "ttft_oneshot_p90_ms": percentile(oneshot, 90),
            "requests_per_s": requests / wall if wall else None,
            "tokens_per_s": tokens / wall if wall else None,
            "completion_tokens_per_s": sum(b["completion_tokens"] for b in blocks) / wall if wall else None,
            "prefix_cache_hit_rate": hit_rate(deltas), "spread": spread(deltas)}


def fmt(value: float | None, spec: str, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}{spec}}"


HEADER = (f"{'arm':<22} {'blocks':>6} {'req':>5} {'err':>4} {'TTFT p50':>9} {'p90':>8} {'later p50':>9} "
          f"{'1-shot p90':>10} {'req/s':>6} {'tok/s':>7} {'hit rate':>8}  spread over the instances")


def table_row(s: dict) -> str:
    share = " ".join(f"{round(100 * v):d}%" for _h, v in sorted(s["spread"].items()))
    hit = None if s["prefix_cache_hit_rate"] is None else 100 * s["prefix_cache_hit_rate"]
    return (f"{s['policy']:<22} {s['blocks']:>6} {s['requests']:>5} {s['errors']:>4} "
            f"{fmt(s['ttft_p50_ms'], '.0f', 7)} ms {fmt(s.get('ttft_p90_ms'), '.0f', 5)} ms "
            f"{fmt(s['ttft_later_turns_p50_ms'], '.0f', 6)} ms {fmt(s.get('ttft_oneshot_p90_ms'), '.0f', 7)} ms "
            f"{fmt(s['requests_per_s'], '.2f', 6)} {fmt(s['tokens_per_s'], '.0f', 7)} {fmt(hit, '.1f', 7)}%  {share}")


# --- the arms and the targets (pure) ---------------------------------------------------------------

#: The ideal: every request of a block on ONE instance, whose cache then holds every prefix the block
#: made (the most reuse there is). consistent_hash without a session header does exactly that with
#: vllm-router 0.1.17 (every chat request hashes to the same key), so the ideal is measured through
#: the same gateway, not estimated. Its TTFT is one instance's under the whole load: not a target.
IDEAL = "ideal"


def parse_arm(text: str) -> dict:
    """An arm of the bench: `POLICY` (clients send no session header), `POLICY+header` (each
    conversation sends its id as X-Session-ID), or `ideal`. Raises ValueError naming the forms."""
    name = text.strip()
    if name == IDEAL:
        return {"name": IDEAL, "policy": "consistent_hash", "header": False}
    policy, _, suffix = name.partition("+")
    if suffix not in ("", "header") or not policy:
        raise ValueError(f"arm {text!r}: write POLICY, POLICY+header or {IDEAL}")
    return {"name": name, "policy": policy, "header": suffix == "header"}


def judge(summaries: list[dict], baseline: str = "round_robin") -> dict[str, dict]:
    """Per arm, the targets against `baseline` and the ideal, each True/False/None (None: a figure
    is missing): hit rate at least 90 % of the ideal's; TTFT p90 at most half the baseline's; the
    one-shots' TTFT p90 no more than 10 % above the baseline's; no failed request."""
    by_name = {s["policy"]: s for s in summaries}
    base, ideal = by_name.get(baseline), by_name.get(IDEAL)

    def ratio(a, b):
        return None if a is None or b in (None, 0) else a / b

    out = {}
    for s in summaries:
        hit = ratio(s["prefix_cache_hit_rate"], ideal and ideal["prefix_cache_hit_rate"])
        p90 = ratio(s.get("ttft_p90_ms"), base and base.get("ttft_p90_ms"))
        oneshot = ratio(s.get("ttft_oneshot_p90_ms"), base and base.get("ttft_oneshot_p90_ms"))
        out[s["policy"]] = {
            "hit_rate_of_ideal": hit, "hit_rate_target": None if hit is None else hit >= 0.9,
            "ttft_p90_of_baseline": p90, "ttft_p90_target": None if p90 is None else p90 <= 0.5,
            "oneshot_p90_of_baseline": oneshot, "oneshot_target": None if oneshot is None else oneshot <= 1.1,
            "no_errors": s["errors"] == 0}
    return out
