"""The alerts the fleet's Alertmanager holds now, asked on the monitoring host's loopback: firing ones,
and those held back (a host down inhibits its instances' alerts; a silence), each with its labels."""

import json

from vllm_fleet.payloads.probe.host import call

#: The labels a row shows, in its order (an alert has those its rule gives it).
SHOWN_LABELS = ("alertname", "severity", "host", "vllm_instance", "job", "instance", "name", "gpu", "path")


def firing_alerts(spec):
    """{"alerts": [{labels, summary, starts_at, state, inhibited_by, silenced_by}], "errors": [...]}
    from Alertmanager's API v2 on 127.0.0.1:spec["port"], sorted by alert name and host."""
    status, body = call(spec["port"], "/api/v2/alerts?active=true&silenced=true&inhibited=true", timeout=30)
    try:
        answer = json.loads(body) if status == 200 else None
    except ValueError:
        answer = None
    if not isinstance(answer, list):
        return {"alerts": [], "errors": [f"Alertmanager on 127.0.0.1:{spec['port']}: HTTP {status} {body[:200]}"]}
    alerts = []
    for alert in answer:
        labels = alert.get("labels") or {}
        state = alert.get("status") or {}
        alerts.append({"labels": {k: labels[k] for k in SHOWN_LABELS if k in labels},
                       "summary": (alert.get("annotations") or {}).get("summary", ""),
                       "starts_at": alert.get("startsAt"),
                       "state": "firing" if state.get("state") == "active" else state.get("state", "unknown"),
                       "inhibited_by": len(state.get("inhibitedBy") or []),
                       "silenced_by": len(state.get("silencedBy") or [])})
    alerts.sort(key=lambda a: (a["labels"].get("alertname", ""), a["labels"].get("host", ""),
                               a["labels"].get("vllm_instance", ""), a["labels"].get("instance", "")))
    return {"alerts": alerts, "errors": []}
