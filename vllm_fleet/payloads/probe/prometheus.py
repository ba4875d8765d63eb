"""Instant queries of the fleet's Prometheus, asked on the monitoring host's loopback (no token
there, nothing over the network): what a canary rollout compares (monitoring/canary_queries.py)."""

import json
import urllib.parse

from vllm_fleet.payloads.probe.host import call

MAX_QUERIES = 64


def instant_queries(spec):
    """{"results": {name: Prometheus' result vector}, "errors": {name: why}} for spec["queries"]
    ({name: PromQL}), asked of the Prometheus at 127.0.0.1:spec["port"] under spec["prefix"]."""
    queries = spec.get("queries") or {}
    if not isinstance(queries, dict) or len(queries) > MAX_QUERIES:
        return {"results": {}, "errors": {"*": "queries: a mapping of at most %d names" % MAX_QUERIES}}
    results, errors = {}, {}
    for name, expr in queries.items():
        status, body = call(spec["port"], spec["prefix"] + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}),
                            timeout=60)
        try:
            answer = json.loads(body)
        except ValueError:
            answer = {}
        if status != 200 or not isinstance(answer, dict) or answer.get("status") != "success":
            error = answer.get("error") if isinstance(answer, dict) else None
            errors[name] = "HTTP %s %s" % (status, str(error or body)[:300])
            continue
        data = answer.get("data") or {}
        if data.get("resultType") != "vector":
            errors[name] = "not a vector: %r" % data.get("resultType")
            continue
        results[name] = data.get("result") or []
    return {"results": results, "errors": errors}
