"""Runs ON a host (python3, stdlib only): checks of vLLM instances for `verify` and `status`.

vllm-fleet sends this file's source over SSH (`python3 -c SOURCE MODE JSON`); nothing is installed.
The API key is read here from the root-only env file, so it never travels on a command line.
Prints one line `VLLM_FLEET_PROBE <json>` as its result.

    verify [checks]   wait for /health, then /v1/models with the key, a 1-token completion, and the
                      unit's processes on its GPUs; the journal of any failing instance
    status [units]    read-only: unit state and uptime, /health, /version, served models, /metrics,
                      sha256 of the managed files, and the GPUs
"""

import hashlib
import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

RESULT_PREFIX = "VLLM_FLEET_PROBE "


# --- EnvironmentFile quoting: the reader of the one rule whose writer is env_quote in
# vllm_fleet/templating.py (this file runs on the host with the stdlib alone, so it keeps its own
# copy of the escaped set; tests/test_render.py checks that the two agree).
# It is systemd's own (src/basic/env-file.c, parse_env_file_internal): inside '...' every character
# is literal, backslashes included; inside "..." a backslash escapes only " \ ` $ (before any other
# character it stays); unquoted, a backslash escapes the next character and trailing blanks go.
_DOUBLE_QUOTE_ESCAPED = '"\\`$'


def env_unquote(raw):
    """The value of one `NAME=raw` line as systemd's parser gives it (single-line values)."""
    out, state, i = [], "pre", 0
    while i < len(raw):
        c = raw[i]
        if state in ("pre", "value"):
            if c == "'":
                end = raw.find("'", i + 1)
                end = len(raw) if end < 0 else end
                out.append(raw[i + 1:end])
                i, state = end + 1, "pre"
                continue
            if c == '"':
                i += 1
                while i < len(raw) and raw[i] != '"':
                    if raw[i] == "\\" and i + 1 < len(raw):
                        nxt = raw[i + 1]
                        out.append(nxt if nxt in _DOUBLE_QUOTE_ESCAPED else "\\" + nxt)
                        i += 2
                        continue
                    out.append(raw[i])
                    i += 1
                i, state = i + 1, "pre"
                continue
            if c == "\\" and i + 1 < len(raw):
                out.append(raw[i + 1])
                i, state = i + 2, "value"
                continue
            if state == "pre" and c in " \t" and not out:
                i += 1
                continue
            out.append(c)
            state = "value"
            i += 1
        else:
            i += 1
    return "".join(out).rstrip(" \t") if state == "value" else "".join(out)


def api_key(env_file):
    try:
        with open(env_file) as f:
            for line in f:
                if line.startswith("VLLM_API_KEY="):
                    return env_unquote(line.rstrip("\n").split("=", 1)[1])
    except OSError:
        return None
    return None


# Straight to the address: a proxy from the environment must not catch a check of this host.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


_TLS = {}


def _tls_opener(ca):
    """An opener speaking HTTPS that trusts only the CAs in `ca` and checks the certificate's names."""
    if ca not in _TLS:
        import ssl
        context = ssl.create_default_context(cafile=ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        _TLS[ca] = urllib.request.build_opener(urllib.request.ProxyHandler({}),
                                               urllib.request.HTTPSHandler(context=context))
    return _TLS[ca]


def call(port, path, key=None, body=None, timeout=30, address="127.0.0.1", method=None, ca=None):
    """One request; `ca`: over HTTPS, checked against the CA file `ca`."""
    host = f"[{address}]" if ":" in address else address
    req = urllib.request.Request(f"{'https' if ca else 'http'}://{host}:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"}, method=method)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with (_tls_opener(ca) if ca else _OPENER).open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)


def show(unit, *props):
    out = subprocess.run(["systemctl", "show", unit, *[f"--property={p}" for p in props]],
                         capture_output=True, text=True).stdout
    values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return {p: values.get(p, "") for p in props}


def served_models(port, key, address="127.0.0.1", ca=None):
    status, body = call(port, "/v1/models", key, address=address, ca=ca)
    if status != 200:
        return status, {}, body
    return status, {m["id"]: m for m in json.loads(body).get("data", [])}, body


def nvidia_smi(*args):
    """nvidia-smi's output, or "" on a host without it (CPU hosts)."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True)
    except OSError:
        return ""
    return out.stdout if out.returncode == 0 else ""


def journal(unit, lines=40):
    return subprocess.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
                          capture_output=True, text=True).stdout


def unit_pids(unit):
    cgroup = show(unit, "ControlGroup")["ControlGroup"]
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/systemd", "/sys/fs/cgroup/unified"):
        try:
            with open(f"{root}{cgroup}/cgroup.procs") as f:
                return {int(p) for p in f.read().split()}
        except OSError:
            continue
    pid = show(unit, "MainPID")["MainPID"]
    return {int(pid)} if pid.isdigit() and pid != "0" else set()


def gpu_bus_ids_of(pids):
    buses = set()
    for line in nvidia_smi("--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[0].isdigit() and int(parts[0]) in pids:
            buses.add(parts[1].lower())
    return buses


def how_it_ended(unit, since):
    """How the unit's main process last ended: 'killed by signal KILL', 'exit status 1'.

    Read from systemd's own journal line ("Main process exited, code=killed, status=9/KILL"): once
    Restart= has started a new process, the unit's ExecMain* properties describe that one.
    """
    out = subprocess.run(["journalctl", "-u", unit, "--since", f"@{int(since)}", "--no-pager", "-o", "cat"],
                         capture_output=True, text=True).stdout
    found = re.findall(r"Main process exited, code=(\w+), status=(\S+)", out)
    if found:
        code, status = found[-1]
        if code in ("killed", "dumped"):
            return f"killed by signal {status.split('/')[-1].rstrip('.')}"
        return f"exit status {status.split('/')[0].rstrip('.')}"
    props = show(unit, "Result", "ExecMainCode", "ExecMainStatus")
    if props["ExecMainCode"] in ("2", "3") and props["ExecMainStatus"].isdigit():  # CLD_KILLED, CLD_DUMPED
        try:
            return f"killed by signal {signal.Signals(int(props['ExecMainStatus'])).name.removeprefix('SIG')}"
        except ValueError:
            pass
    return f"result {props['Result'] or 'unknown'}"


def restarted_since(spec, restarts0, since, pid0=None):
    """An error text when the unit restarted since NRestarts was restarts0, or its main process pid0
    is gone though systemd has not restarted it yet (Restart= waits RestartSec first), else None."""
    props = show(spec["unit"], "NRestarts", "MainPID")
    now = props["NRestarts"]
    if now != restarts0:
        return (f"the service restarted during verification (NRestarts {restarts0} -> {now}; its main "
                f"process was {how_it_ended(spec['unit'], since)}): it is not stable")
    if pid0 and pid0 != "0" and props["MainPID"] != pid0:
        return (f"the service's main process (pid {pid0}) died during verification (it was "
                f"{how_it_ended(spec['unit'], since)}; systemd restarts it after RestartSec): it is not stable")
    return None


def restart_pending(props):
    """Whether systemd will start a new process of the unit without being asked: it waits out
    RestartSec (SubState auto-restart); or its main process is gone while the unit is still
    activating (killed while ExecStartPost= waited for /health: that start fails once the wait sees
    it) or deactivating (what was left of the process group being stopped): Restart= follows both.
    A unit stopped on purpose ends inactive, and one whose restarts ran out failed: neither waits."""
    return props["SubState"] == "auto-restart" or (props["ActiveState"] in ("activating", "deactivating")
                                                   and props["MainPID"] in ("", "0"))


def settle_pending_restart(spec):
    """A unit whose process died is restarted by systemd (restart_pending): a verification that
    starts before that restart waits for the new start to begin, so it judges the new process, and
    that restart is not taken for one during the checks."""
    deadline = time.time() + min(int(spec["timeout_s"]), 300)
    while restart_pending(show(spec["unit"], "SubState", "ActiveState", "MainPID")) and time.time() < deadline:
        time.sleep(1)


def wait_healthy(spec, res, restarts0):
    """Poll /health; give up early when the unit restarts or fails (Restart=always loops)."""
    start = time.time()
    last_note = 0.0
    while time.time() - start < spec["timeout_s"]:
        if call(spec["port"], "/health", timeout=5)[0] == 200:
            res["seconds_to_healthy"] = round(time.time() - start, 1)
            return True
        state = show(spec["unit"], "ActiveState", "NRestarts")
        if state["NRestarts"] != restarts0 or state["ActiveState"] in ("failed", "inactive"):
            res["error"] = (f"the service exited while starting (state {state['ActiveState']}, main "
                            f"process {how_it_ended(spec['unit'], start)})")
            return False
        if time.time() - last_note > 15:
            print(f"{spec['name']}: waiting for /health ({int(time.time() - start)} s of "
                  f"{spec['timeout_s']} s)", file=sys.stderr, flush=True)
            last_note = time.time()
        time.sleep(2)
    res["error"] = f"/health did not answer 200 within {spec['timeout_s']} s"
    return False


UNIT_ACTIVE_WAIT_S = 30  # ExecStartPost's poll (2 s) plus its python's start, with room to spare


def wait_active(spec, res):
    """True once the unit is active; False (with the reason in res) when it leaves activating for
    another state, or is still activating after UNIT_ACTIVE_WAIT_S."""
    deadline = time.time() + UNIT_ACTIVE_WAIT_S
    while True:
        state = show(spec["unit"], "ActiveState")["ActiveState"]
        if state == "active":
            return True
        if state != "activating" or time.time() > deadline:
            res["error"] = (f"vLLM answers, but systemd has not finished starting {spec['unit']} "
                            f"(ActiveState {state} after {UNIT_ACTIVE_WAIT_S} s)" if state == "activating"
                            else f"vLLM answered, then {spec['unit']} went {state}")
            return False
        time.sleep(0.5)


def verify_one(spec):
    res = {"name": spec["name"], "unit": spec["unit"], "ok": False, "checks": {}}
    settle_pending_restart(spec)
    restarts0, since = show(spec["unit"], "NRestarts")["NRestarts"], time.time()
    res["checks"]["health"] = wait_healthy(spec, res, restarts0)
    pid0 = show(spec["unit"], "MainPID")["MainPID"]  # the process the checks below talk to
    if not res["checks"]["health"]:
        return res
    check_serving(spec, res)  # fills res['checks'], res['error'] and res['ok']
    if res["ok"]:
        # vLLM answers before systemd calls the start done: ExecStartPost polls /health every 2 s.
        # Verified means the unit's start job finished too (an instance still "activating" can
        # still be failed by its start timeout), so wait for it, bounded.
        res["checks"]["unit_active"] = wait_active(spec, res)
        res["ok"] = res["checks"]["unit_active"]
    # A crash between the checks (killed, OOM) is a failure even when systemd brought it back.
    restarted = restarted_since(spec, restarts0, since, pid0)
    res["checks"]["stable"] = restarted is None
    if restarted:
        res["error"] = f"{restarted}; before that: {res['error']}" if res.get("error") else restarted
        res["ok"] = False
    return res


def check_serving(spec, res):
    """/v1/models with the key, max_model_len, 401 without the key, a completion, GPU processes."""
    key = api_key(spec["env_file"])
    status, models, body = served_models(spec["port"], key)
    served = models.get(spec["served_model_name"])
    res["checks"]["models"] = served is not None
    if served is None:
        res["error"] = f"/v1/models answered {status} without {spec['served_model_name']!r}: {body[:200]}"
        return
    res["checks"]["max_model_len"] = (not spec.get("max_model_len")
                                      or served.get("max_model_len") == spec["max_model_len"])
    if not res["checks"]["max_model_len"]:
        res["error"] = f"max_model_len is {served.get('max_model_len')}, planned {spec['max_model_len']}"
        return
    if key:
        res["checks"]["key_required"] = call(spec["port"], "/v1/models")[0] == 401
    status, body = call(spec["port"], "/v1/completions", key,
                        {"model": spec["served_model_name"], "prompt": "Hello", "max_tokens": 1},
                        timeout=120)
    res["checks"]["completion"] = status == 200
    if status != 200:
        res["error"] = f"a 1-token completion answered {status}: {body[:200]}"
        return
    if spec.get("front_port") and not check_front(spec, key, res):
        return
    if spec.get("gpu_bus_ids"):
        wanted = {b.lower() for b in spec["gpu_bus_ids"]}
        missing = wanted - gpu_bus_ids_of(unit_pids(spec["unit"]))
        res["checks"]["gpu_processes"] = not missing
        if missing:
            res["error"] = f"no process of {spec['unit']} on GPU(s) {sorted(missing)}"
            return
    res["ok"] = all(res["checks"].values())


def check_front(spec, key, res):
    """What clients meet at the front: /v1 with the key, nothing but /v1/ and /health without it."""
    front, address, ca = spec["front_port"], spec.get("front_address") or "127.0.0.1", spec.get("front_ca")
    status, _models, body = served_models(front, key, address, ca)
    res["checks"]["front_models"] = status == 200
    if status != 200:
        res["error"] = (f"the front on {address}:{front} answered {status} for /v1/models with the host's key "
                        f"{'over HTTPS ' if ca else ''}(is vllm-fleet-front.service running?): {body[:200]}")
        return False
    status = call(front, "/v1/models", address=address, ca=ca)[0]
    res["checks"]["front_key_required"] = status == 401
    if status != 401:
        res["error"] = f"the front on {address}:{front} answered {status} for /v1/models without a key (expected 401)"
        return False
    status = call(front, "/invocations", body={}, address=address, ca=ca)[0]  # vLLM answers it WITHOUT a key
    res["checks"]["front_guards"] = status == 404
    if status != 404:
        res["error"] = f"the front passed /invocations on port {front} (answered {status}, expected 404)"
        return False
    if ca:  # HTTPS only: plain HTTP there is answered 400, never served
        status, body = call(front, "/v1/models", key, address=address)
        res["checks"]["front_https_only"] = status == 400
        if status != 400:
            res["error"] = f"the front on {address}:{front} answered plain HTTP with {status} (expected 400): {body[:200]}"
            return False
    return True


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
    return entry


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


def verify(specs):
    results = []
    for spec in specs:
        res = verify_one(spec)
        if not res["ok"]:
            res["journal"] = journal(spec["unit"])
        results.append(res)
    return results


def sha256_of(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def metrics(port):
    status, body = call(port, "/metrics", timeout=10)
    out = {}
    if status != 200:
        return out
    for line in body.splitlines():
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            if line.startswith(name + "{") or line.startswith(name + " "):
                out[name.split(":", 1)[1]] = out.get(name.split(":", 1)[1], 0.0) + float(line.split()[-1])
    return out


FAILING_STATES = ("failed", "auto-restart")  # ActiveState failed, or SubState between restarts


def unit_failure(unit, props, lines=200):
    """Why a unit is failed or waiting to restart: systemd's Result (exit-code, timeout,
    start-limit-hit, ...), its restart count and the journal's last lines (the workstation
    diagnoses them); None for a unit that is not failing."""
    if props["ActiveState"] != "failed" and props["SubState"] not in FAILING_STATES:
        return None
    return {"result": props.get("Result") or show(unit, "Result")["Result"], "restarts": props["NRestarts"],
            "journal": journal(unit, lines).splitlines()}


def requests_by_client(since="-1h"):
    """The front's access log (one JSON line per request, journald tag vllm_fleet_access) counted by
    client and status class: {client: {"2xx": n, "4xx": n, ...}}; "" is a request with no known key."""
    out = subprocess.run(["journalctl", "-t", "vllm_fleet_access", "--since", since, "-o", "cat", "--no-pager"],
                         capture_output=True, text=True).stdout
    counts = {}
    for line in out.splitlines():
        try:
            entry = json.loads(line)
            klass = f"{int(entry['status']) // 100}xx"
        except (ValueError, KeyError, TypeError):
            continue
        per = counts.setdefault(str(entry.get("client", "")), {})
        per[klass] = per.get(klass, 0) + 1
    return counts


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
            entry["metrics"] = metrics(port)
        instances[name] = entry
    front = manifest.get("front") or spec.get("front")
    return {"gpus": gpus, "manifest": bool(manifest),
            "environment": manifest.get("environment", {}).get("prefix"), "instances": instances,
            "front": front_status(front) if front else None}


def verify_with_gateway(spec):
    """The instances' verification, then the gateway's (no wait: its router kept running), in one
    remote command: what the gateway host's deploy runs when nothing restarts or reloads the router."""
    instances = verify(spec["instances"])
    try:
        gateway = check_gateway(spec["gateway"])
    except Exception as exc:  # the gateway's own failure, reported as its verification's, not the instances'
        gateway = {"ok": False, "unit": spec["gateway"].get("unit"), "error": f"the gateway check failed: {exc!r}"}
    return {"instances": instances, "gateway": gateway}


def main(argv):
    mode, payload = argv[1], json.loads(argv[2])
    modes = {"verify": verify, "status": status, "gateway": check_gateway, "gateway-status": gateway_status,
             "gateway-workers": gateway_workers, "wait-idle": wait_idle,
             "verify-with-gateway": verify_with_gateway}
    if mode not in modes:
        sys.exit(f"host_probe: unknown mode {mode!r} (known: {', '.join(modes)})")
    result = modes[mode](payload)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv)
