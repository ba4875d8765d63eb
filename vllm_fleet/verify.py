"""Verify instances on a host over SSH: health, models, a real completion, GPU processes.

The checks run ON the host (a small python3 probe fed over SSH's stdin), so they reach instances
bound anywhere on it, and the API key is read there from the root-only env file: it is never on a
command line, in pyinfra's output or in a log. On failure the unit's journal is read and matched
against known causes.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

# Known failure causes: (pattern in the journal, diagnosis with the fix).
DIAGNOSES: list[tuple[str, str]] = [
    (r"World size \(\d+\) is larger than the number of available GPUs",
     "world size vs GPUs: TP x PP x DP exceeds the GPUs in CUDA_VISIBLE_DEVICES; re-plan with "
     "`vllm-fleet plan` and deploy again (a stale unit? daemon-reload)"),
    (r"CUDA out of memory|OutOfMemoryError|No available memory for the cache blocks|"
     r"larger than the available KV cache",
     "CUDA out of memory: lower max_model_len or gpu_memory_utilization, or free the GPU "
     "(another process holds memory: nvidia-smi)"),
    (r"gguf.*(not supported|Unknown quantization|plugin)|Unknown quantization method: gguf",
     "GGUF without its plugin: install vllm-gguf-plugin in the environment"),
    (r"No CUDA GPUs are available|Failed to infer device type|NVIDIA driver|"
     r"Found no NVIDIA driver|libcuda\.so|CUDA driver initialization failed|cudaGetDeviceCount",
     "no CUDA GPUs available to the service: check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES, "
     "and that the unit's user can open /dev/nvidia*"),
    (r"unrecognized arguments?:?\s*(\S+)|error: argument",
     "unrecognized argument: a key in engine_args is not a flag of this vLLM version"),
    (r"Address already in use|address already in use",
     "port in use: another process listens on the instance's port (ss -ltnp)"),
    (r"does not appear to have a file named|No such file or directory|Repo id must be|"
     r"is not a local folder and is not a valid model identifier|HFValidationError|"
     r"Can't load tokenizer|OSError: .*(not found|does not exist)",
     "missing model or tokenizer path: check 'model' / 'tokenizer' on the host (or model_source)"),
]


def diagnose(journal: str) -> str | None:
    for pattern, text in DIAGNOSES:
        if re.search(pattern, journal, re.IGNORECASE):
            return text
    return None


# Runs on the host under python3 (stdlib only). argv[1]: JSON list of instance checks.
PROBE = r'''
import json, os, subprocess, sys, time, urllib.request, urllib.error

def api_key(env_file):
    try:
        for line in open(env_file):
            if line.startswith("VLLM_API_KEY="):
                return line.split("=", 1)[1].strip().strip("'\"")
    except OSError:
        return None

def call(port, path, key=None, body=None, timeout=30):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", "Bearer " + key)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(exc)

def show(unit, prop):
    return subprocess.run(["systemctl", "show", "-p", prop, "--value", unit],
                          capture_output=True, text=True).stdout.strip()

def check(spec):
    res = {"name": spec["name"], "unit": spec["unit"], "ok": False, "checks": {}}
    start = time.time()
    restarts0 = show(spec["unit"], "NRestarts")
    status = 0
    last_note = 0.0
    while time.time() - start < spec["timeout_s"]:
        status, _ = call(spec["port"], "/health", timeout=5)
        if status == 200:
            break
        state = show(spec["unit"], "ActiveState")
        if show(spec["unit"], "NRestarts") != restarts0 or state in ("failed", "inactive"):
            res["error"] = f"the service exited while starting (state {state})"
            return res
        if time.time() - last_note > 15:
            print(f"{spec['name']}: waiting for /health ({int(time.time() - start)}s of "
                  f"{spec['timeout_s']}s, unit {state})", file=sys.stderr, flush=True)
            last_note = time.time()
        time.sleep(2)
    res["checks"]["health"] = status == 200
    res["seconds_to_healthy"] = round(time.time() - start, 1)
    if status != 200:
        res["error"] = f"/health did not answer 200 within {spec['timeout_s']}s"
        return res
    key = api_key(spec["env_file"])
    status, body = call(spec["port"], "/v1/models", key)
    models = {}
    if status == 200:
        models = {m["id"]: m for m in json.loads(body).get("data", [])}
    served = models.get(spec["served_model_name"])
    res["checks"]["models"] = served is not None
    res["checks"]["max_model_len"] = bool(served) and (
        not spec.get("max_model_len") or served.get("max_model_len") == spec["max_model_len"])
    if not res["checks"]["models"]:
        res["error"] = f"/v1/models answered {status} without {spec['served_model_name']!r}: {body[:200]}"
        return res
    if not res["checks"]["max_model_len"]:
        res["error"] = (f"max_model_len is {served.get('max_model_len')}, planned "
                        f"{spec['max_model_len']}")
        return res
    if key:
        unauth, _ = call(spec["port"], "/v1/models")
        res["checks"]["key_required"] = unauth == 401
    status, body = call(spec["port"], "/v1/completions", key,
                        {"model": spec["served_model_name"], "prompt": "Hello", "max_tokens": 1},
                        timeout=120)
    res["checks"]["completion"] = status == 200
    if status != 200:
        res["error"] = f"a 1-token completion answered {status}: {body[:200]}"
        return res
    if spec.get("gpus"):
        pid = show(spec["unit"], "MainPID")
        cgroup = show(spec["unit"], "ControlGroup")
        pids = set()
        try:
            pids = {int(p) for p in open(f"/sys/fs/cgroup{cgroup}/cgroup.procs").read().split()}
        except OSError:
            pids = {int(pid)} if pid.isdigit() else set()
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id",
                               "--format=csv,noheader"], capture_output=True, text=True).stdout
        buses = {line.split(",")[1].strip().lower() for line in apps.splitlines()
                 if line.count(",") >= 1 and line.split(",")[0].strip().isdigit()
                 and int(line.split(",")[0]) in pids}
        wanted = {b.lower() for b in spec["gpu_bus_ids"]}
        res["checks"]["gpu_processes"] = wanted <= buses
        if not res["checks"]["gpu_processes"]:
            res["error"] = f"GPUs without a process of the unit: {sorted(wanted - buses)}"
            return res
    res["ok"] = all(res["checks"].values())
    return res

results = []
for spec in json.loads(sys.argv[1]):
    res = check(spec)
    if not res["ok"]:
        res["journal"] = subprocess.run(["journalctl", "-u", spec["unit"], "-n", "40", "--no-pager",
                                         "-o", "cat"], capture_output=True, text=True).stdout
    results.append(res)
print("VLLM_FLEET_VERIFY " + json.dumps(results))
'''


@dataclass
class InstanceCheck:
    name: str
    unit: str
    port: int
    served_model_name: str
    max_model_len: int | None
    env_file: str
    timeout_s: int
    gpu_bus_ids: list[str] = field(default_factory=list)

    def as_spec(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "port": self.port,
                "served_model_name": self.served_model_name, "max_model_len": self.max_model_len,
                "env_file": self.env_file, "timeout_s": self.timeout_s,
                "gpus": bool(self.gpu_bus_ids), "gpu_bus_ids": self.gpu_bus_ids}


def probe_command(checks: list[InstanceCheck]) -> str:
    """One shell command that runs every check on the host and prints a JSON result line."""
    spec = json.dumps([c.as_spec() for c in checks])
    return f"python3 -c {shlex.quote(PROBE)} {shlex.quote(spec)}"


def parse_probe_output(text: str) -> list[dict[str, Any]]:
    for line in reversed(text.splitlines()):
        if line.startswith("VLLM_FLEET_VERIFY "):
            results = json.loads(line.removeprefix("VLLM_FLEET_VERIFY "))
            for res in results:
                if not res.get("ok"):
                    res["diagnosis"] = diagnose(res.get("journal", "") + "\n" + res.get("error", ""))
            return results
    return []


def format_failure(host: str, res: dict[str, Any]) -> str:
    lines = [f"host {host}, instance {res['name']}: verification failed: {res.get('error')}"]
    if res.get("diagnosis"):
        lines.append(f"  diagnosis: {res['diagnosis']}")
    journal = [ln for ln in res.get("journal", "").splitlines() if ln.strip()][-15:]
    if journal:
        lines.append(f"  last journal lines of {res['unit']}:")
        lines.extend(f"    {ln}" for ln in journal)
    return "\n".join(lines)
