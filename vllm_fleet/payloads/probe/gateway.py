"""The fleet gateway on its host: checked as clients and vllm-router see it, its state for `status`,
backends taken out of the router and put back, and the wait for a drained backend's last requests."""

import json
import subprocess
import time
import urllib.parse

from vllm_fleet.payloads.probe.host import api_key, call, metrics, served_models, show
from vllm_fleet.payloads.probe.journal import journal, unit_failure


def check_gateway(spec):
    """The fleet gateway as clients and the router see it: vllm-router healthy on loopback with every
    backend registered; at the front, 401 without the key and the fleet's models with it."""
    res = {"name": "gateway", "unit": spec["unit"], "ok": False, "checks": {}}
    deadline = time.time() + spec.get("timeout_s", 60)
    while True:  # a router just reloaded registers its workers within seconds (ExecReload)
        status, body = call(spec["router_port"], "/workers")
        try:
            have = {w.get("url") for w in json.loads(body).get("workers", [])} if status == 200 else set()
        except (ValueError, AttributeError):
            have = set()
        missing = [url for url in spec["urls"] if url not in have]
        if not missing or time.time() > deadline:
            break
        time.sleep(1)
    # The router answers with its workers. One missing is reported, not failed: a rollout drains
    # the batch's backends (this host's too) while the batch converges; the unit's ExecStartPost
    # fails the start itself when it cannot register them.
    res["checks"]["router_workers"] = status == 200
    res["not_registered"] = missing
    if status != 200:
        res["error"] = f"vllm-router on 127.0.0.1:{spec['router_port']} answered {status}: {body[:200]}"
        return _gateway_failed(spec, res)
    address, port, ca = spec["address"], spec["port"], spec.get("ca")
    status = call(port, "/v1/models", address=address, ca=ca)[0]
    res["checks"]["key_required"] = status == 401
    if status != 401:
        res["error"] = f"the gateway on {address}:{port} answered {status} for /v1/models without the key"
        return _gateway_failed(spec, res)
    key = api_key(spec["env_file"]) if spec.get("env_file") else None
    if key:
        status, models, body = served_models(port, key, address, ca)
        res["checks"]["models"] = sorted(models) == sorted(spec["models"])
        if not res["checks"]["models"]:
            res["error"] = (f"the gateway's /v1/models answered {status} with {sorted(models)}, "
                            f"expected {sorted(spec['models'])}: {body[:200]}")
            return _gateway_failed(spec, res)
    res["ok"] = all(res["checks"].values())
    return res


def _gateway_failed(spec, res):
    res["journal"] = journal(spec["unit"])
    return res


def gateway_status(spec):
    """The gateway as the manifest describes it and vllm-router sees it now: unit state, and each
    backend with the router's health verdict (None: not registered)."""
    try:
        with open(spec["manifest"]) as f:
            gateway = json.load(f).get("gateway")
    except (OSError, ValueError):
        gateway = None
    if not gateway:
        return None
    props = show(gateway["unit"], "ActiveState", "SubState", "Result", "NRestarts")
    entry = {"unit": gateway["unit"], "url": gateway["url"], "version": gateway.get("version"),
             "state": f"{props['ActiveState']}/{props['SubState']}", "active": props["ActiveState"] == "active"}
    port = int(gateway["router"].rsplit(":", 1)[1])
    status, body = call(port, "/workers", timeout=10)
    workers = {}
    if status == 200:
        workers = {w.get("url"): w for w in json.loads(body).get("workers", [])}
    else:
        entry["error"] = f"vllm-router answered {status} on 127.0.0.1:{port}/workers: {body[:200]}"
    entry["backends"] = [dict(b, registered=b["url"] in workers,
                              healthy=workers[b["url"]].get("is_healthy") if b["url"] in workers else None)
                         for b in gateway["backends"]]
    if not entry["active"]:
        entry["failure"] = unit_failure(gateway["unit"], props, lines=40)
    if gateway.get("floating"):
        entry["floating"] = floating_status(gateway["floating"])
    return entry


def floating_status(floating):
    """Whether this gateway holds the floating address now (on its interface, as `ip addr` shows it)
    and the state of the VRRP daemon's unit, which moves it. `holds` is None when `ip` could not be asked."""
    props = show(floating["unit"], "ActiveState", "SubState")
    out = {"address": floating["address"], "interface": floating["interface"], "unit": floating["unit"],
           "state": f"{props['ActiveState']}/{props['SubState']}", "holds": None}
    try:
        proc = subprocess.run(["ip", "-o", "-4", "addr", "show", "dev", floating["interface"]],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        out["error"] = f"ip addr: {exc}"
        return out
    if proc.returncode != 0:
        out["error"] = f"ip addr show dev {floating['interface']}: {proc.stderr.strip()[:200]}"
        return out
    held = [f.split("/")[0] for line in proc.stdout.splitlines() for i, f in enumerate(line.split())
            if i > 0 and line.split()[i - 1] == "inet"]
    out["holds"] = floating["address"] in held
    return out


def gateway_workers(spec):
    """Take backends out of vllm-router (no new request goes to them) or put them back."""
    port, out = spec["router_port"], {"removed": [], "added": [], "errors": []}
    for url in spec.get("remove", []):
        status, body = call(port, "/workers/" + urllib.parse.quote(url, safe=""), method="DELETE", timeout=10)
        ok = 200 <= status < 300
        (out["removed"] if ok else out["errors"]).append(url if ok else f"DELETE {url}: {status} {body[:200]}")
    for worker in spec.get("add", []):
        status, body = call(port, "/workers", body=worker, timeout=10)
        ok = 200 <= status < 300
        (out["added"] if ok else out["errors"]).append(
            worker["url"] if ok else f"POST {worker['url']}: {status} {body[:200]}")
    return out


def wait_idle(spec):
    """Wait until the vLLM instances on `ports` have no request running or waiting (the ones the
    gateway sent before they were drained), or the time is up; report what was still in flight."""
    started, deadline = time.time(), time.time() + spec["timeout_s"]
    while True:
        busy = {}
        for port in spec["ports"]:
            m = metrics(port)
            n = int(m.get("num_requests_running", 0) + m.get("num_requests_waiting", 0))
            if n:
                busy[str(port)] = n
        if not busy or time.time() > deadline:
            return {"in_flight": busy, "seconds": round(time.time() - started, 1)}
        time.sleep(0.2)
