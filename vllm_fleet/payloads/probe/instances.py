"""`verify`: each instance waited for and checked as clients meet it (health, models, a completion or,
for a pooling instance, the request it serves; the front, its processes on the planned GPUs), and
judged stable across the checks."""

import json
import sys
import time

from vllm_fleet.payloads.probe.host import api_key, call, nvidia_smi, served_models, show
from vllm_fleet.payloads.probe.journal import how_it_ended, journal


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


#: What proves an instance serves, by what it serves (the plan's task: "generate" for vLLM's generate
#: runner, else its pooling task): (check, words, vLLM's route, the request without the model).
SERVING_REQUESTS = {
    "generate": ("completion", "a 1-token completion", "/v1/completions", {"prompt": "Hello", "max_tokens": 1}),
    "embed": ("embedding", "an embedding", "/v1/embeddings", {"input": "Hello"}),
    "classify": ("classification", "a classification", "/classify", {"input": "Hello"}),
    "pooling": ("pooling", "a pooling request", "/pooling", {"input": "Hello"}),
}


def answered(check, body):
    """The answer holds what was asked for: a completion's choices, an embedding's vector, a
    classification's probabilities, a pooling result."""
    try:
        data = json.loads(body).get("data")
    except (ValueError, AttributeError):
        return False
    if check == "completion":
        return True  # its status says it: vLLM answers 200 only with the choices
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        return False
    value = data[0].get({"embedding": "embedding", "classification": "probs", "pooling": "data"}[check])
    return isinstance(value, list) and len(value) > 0


def check_serving(spec, res):
    """/v1/models with the key, max_model_len, 401 without the key, a completion (an embedding, a
    classification or a pooling request for a pooling instance), GPU processes."""
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
    check, what, path, request = SERVING_REQUESTS[spec.get("task") or "generate"]
    status, body = call(spec["port"], path, key, dict(request, model=spec["served_model_name"]), timeout=120)
    res["checks"][check] = status == 200 and answered(check, body)
    if not res["checks"][check]:
        res["error"] = f"{what} ({path}) answered {status}: {body[:200]}"
        return
    for adapter in spec.get("adapters") or ():
        # Each LoRA adapter: listed (loaded by the unit's loader), and answering a real completion.
        # The unit's loader loads them once /health answers, as its start's last step: a moment later.
        deadline = time.monotonic() + 60
        while adapter not in models and time.monotonic() < deadline:
            time.sleep(1)
            status, models, body = served_models(spec["port"], key)
        res["checks"]["adapters_listed"] = adapter in models
        if adapter not in models:
            res["error"] = f"/v1/models answered {status} without the adapter {adapter!r}: {body[:200]}"
            return
        status, body = call(spec["port"], "/v1/completions", key,
                            {"model": adapter, "prompt": "Hello", "max_tokens": 1}, timeout=120)
        res["checks"]["adapter_completion"] = status == 200
        if status != 200:
            res["error"] = f"a 1-token completion of the adapter {adapter!r} answered {status}: {body[:200]}"
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


def verify(specs):
    results = []
    for spec in specs:
        res = verify_one(spec)
        if not res["ok"]:
            res["journal"] = journal(spec["unit"])
        results.append(res)
    return results
