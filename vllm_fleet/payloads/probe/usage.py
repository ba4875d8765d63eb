"""Tokens by client: the counters vllm-fleet's module in vLLM exports (templates/vllm-model-access.py.j2),
read from an instance's /metrics text (totals since that vLLM started), or from the fleet's Prometheus
on the monitoring host (their increase over a window), beside vLLM's own token counters."""

import json
import re
import urllib.parse

from vllm_fleet.payloads.probe.host import call

# Each client counter's kind, by its name in the exposition (prometheus_client adds _total).
USAGE_COUNTERS = {"vllm_fleet_client_prompt_tokens_total": "prompt",
                  "vllm_fleet_client_cached_prompt_tokens_total": "cached",
                  "vllm_fleet_client_completion_tokens_total": "completion",
                  "vllm_fleet_client_usage_requests_total": "requests"}
# vLLM's own counters the client figures reconcile with.
VLLM_COUNTERS = {"vllm:prompt_tokens_total": "prompt", "vllm:generation_tokens_total": "generation",
                 "vllm:prompt_tokens_cached_total": "cached"}
USAGE_KINDS = ("prompt", "cached", "completion", "requests")
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _unescape(value):
    return re.sub(r'\\(.)', lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def usage_from_exposition(text):
    """{"clients": {client: {model: {prompt, cached, completion, requests}}}, "vllm": {prompt,
    generation, cached}} from a Prometheus text exposition; absent counters are absent."""
    clients, own = {}, {}
    for line in (text or "").splitlines():
        if not line or line.startswith("#"):
            continue
        found = SAMPLE.match(line)
        if not found:
            continue
        name, labels, value = found.groups()
        try:
            number = float(value)
        except ValueError:
            continue
        if name in USAGE_COUNTERS:
            pairs = {k: _unescape(v) for k, v in LABEL.findall(labels or "")}
            row = clients.setdefault(pairs.get("client", ""), {}).setdefault(
                pairs.get("model", ""), dict.fromkeys(USAGE_KINDS, 0))
            row[USAGE_COUNTERS[name]] += int(number)
        elif name in VLLM_COUNTERS:
            own[VLLM_COUNTERS[name]] = own.get(VLLM_COUNTERS[name], 0) + int(number)
    return {"clients": clients, "vllm": own}


def _window(since):
    if not re.match(r"^[0-9]{1,6}[smhdw]$", since or ""):
        raise ValueError(f"not a window: {since!r}")
    return since


def window_increase(name, since):
    """PromQL: each series' increase over the window. increase() leaves out a series' first sample
    (it has nothing before it), and a client's series first appears with its first request's tokens
    already in it: a series that did not exist at the window's start counts its last value whole."""
    return f"(last_over_time({name}[{since}]) unless {name} offset {since}) or increase({name}[{since}])"


def prometheus_usage(spec):
    """The increase of every client counter and of vLLM's own over spec["since"], summed over the
    fleet by client and model (vLLM's by model), asked of the Prometheus on this host's loopback
    (spec["port"], spec["prefix"]): no token needed there, none sent over the network."""
    since = _window(spec["since"])
    clients, own, errors = {}, {}, []
    queries = [(name, kind, "client") for name, kind in USAGE_COUNTERS.items()] + [
        (name, kind, None) for name, kind in VLLM_COUNTERS.items()]
    for name, kind, by in queries:
        expr = f"sum by (client, model) ({window_increase(name, since)})" if by else f"sum({window_increase(name, since)})"
        status, body = call(spec["port"], f"{spec['prefix']}/api/v1/query?" + urllib.parse.urlencode({"query": expr}),
                            timeout=60)
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {}
        if status != 200 or answer.get("status") != "success":
            errors.append(f"{name}: HTTP {status} {str(answer.get('error') or body)[:200]}")
            continue
        for series in answer["data"]["result"]:
            value = round(float(series["value"][1]))
            if by:
                labels = series["metric"]
                row = clients.setdefault(labels.get("client", ""), {}).setdefault(
                    labels.get("model", ""), dict.fromkeys(USAGE_KINDS, 0))
                row[kind] += value
            else:
                own[kind] = own.get(kind, 0) + value
    return {"clients": clients, "vllm": own, "errors": errors}
