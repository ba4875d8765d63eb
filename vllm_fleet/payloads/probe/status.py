"""`status`: read-only, what the host runs now: units, health, versions, served models, metrics, the
managed files' sha256, the GPUs and the front."""

import json

from vllm_fleet.payloads.probe.host import (api_key, call, metrics, metrics_text, nvidia_smi, served_models, sha256_of,
                                            show)
from vllm_fleet.payloads.probe.journal import requests_by_client, unit_failure
from vllm_fleet.payloads.probe.usage import usage_from_exposition


def front_status(front):
    """State of the host's front unit (nginx) from the manifest's "front" entry (or the plan's), and
    its requests of the last hour by client."""
    props = show(front["unit"], "ActiveState", "SubState", "Result", "NRestarts")
    entry = {"unit": front["unit"], "state": f"{props['ActiveState']}/{props['SubState']}",
             "active": props["ActiveState"] == "active", "bind": front.get("bind"),
             "tls": bool(front.get("tls")), "requests_last_hour": requests_by_client()}
    failure = unit_failure(front["unit"], props, lines=40)
    if failure:
        entry["failure"] = failure
    return entry


def status(spec):
    manifest = {}
    try:
        with open(spec["manifest"]) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        pass
    gpus = []
    query = nvidia_smi("--query-gpu=index,name,memory.used,memory.total,utilization.gpu",
                       "--format=csv,noheader,nounits")
    for line in query.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 5 and parts[0].isdigit():
            gpus.append({"index": int(parts[0]), "name": parts[1], "memory_used_mib": int(float(parts[2])),
                         "memory_total_mib": int(float(parts[3])),
                         "utilization_pct": float(parts[4]) if parts[4].replace(".", "").isdigit() else None})
    instances = {}
    names = set(manifest.get("instances", {})) | set(spec.get("instances", {}))
    for name in sorted(names):
        info = manifest.get("instances", {}).get(name) or spec["instances"][name]
        paths = spec["instances"].get(name, {}).get("paths", {})
        unit = info.get("unit", f"vllm-{name}.service")
        props = show(unit, "ActiveState", "SubState", "ActiveEnterTimestampMonotonic", "MainPID", "NRestarts",
                     "Result")
        with open("/proc/uptime") as f:
            now = float(f.read().split()[0])
        started = int(props["ActiveEnterTimestampMonotonic"] or 0) / 1e6
        port = info.get("backend_port") or info.get("port")  # vLLM itself, on loopback
        health = call(port, "/health", timeout=5)[0] if port else 0
        entry = {"unit": unit, "state": f"{props['ActiveState']}/{props['SubState']}",
                 "uptime_s": round(now - started) if started and props["ActiveState"] == "active" else None,
                 "main_pid": props["MainPID"], "restarts": props["NRestarts"], "port": port,
                 "health": health == 200, "deployed_config_hash": info.get("config_hash"),
                 "result": props["Result"],
                 "files_sha256": {kind: sha256_of(path) for kind, path in paths.items()}}
        failure = unit_failure(unit, props)
        if failure:
            entry["failure"] = failure
        if health == 200:
            version = call(port, "/version", timeout=5)
            entry["vllm_version"] = json.loads(version[1]).get("version") if version[0] == 200 else None
            env_file = f"{spec['config_dir']}/{name}.env"  # read here: the key never leaves the host
            _, models, _ = served_models(port, api_key(env_file))
            entry["served_models"] = sorted(models)
            text = metrics_text(port)
            entry["metrics"] = metrics(port, text)
            entry["usage"] = usage_from_exposition(text)
        instances[name] = entry
    front = manifest.get("front") or spec.get("front")
    return {"gpus": gpus, "manifest": bool(manifest),
            "environment": manifest.get("environment", {}).get("prefix"), "instances": instances,
            "front": front_status(front) if front else None}
