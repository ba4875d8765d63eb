"""Verify instances on a host over SSH: health, models, a real completion, GPU processes.

The checks run ON the host (the probe payload, vllm_fleet/payloads/probe, bundled into the command's
text), so they reach instances bound anywhere on it, and the API key is read there from the root-only
env file: it is never on a command line, in pyinfra's output or in a log. On failure the unit's journal is read and matched
against known causes.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

from vllm_fleet import payloads
from vllm_fleet.payloads.probe.host import RESULT_PREFIX

PROBE_SOURCE = payloads.script(payloads.PROBE)

# Known failure causes: (pattern in the journal, diagnosis with the fix).
DIAGNOSES: list[tuple[str, str]] = [
    # The unit's start timeout first: the SIGTERM it causes is not "killed".
    (r"did not answer 200 within \d+ s of starting",
     "the model load hung or is slower than the unit's start timeout (TimeoutStartSec, sized to the "
     "weights): the start was stopped. Look for a stuck download or a GPU that does not answer "
     "(nvidia-smi); a slow disk needs a larger start_timeout_s on the instance"),
    (r"restarted during verification|died during verification|"
     r"exited while starting \(state \w+, main process killed by signal",
     "the vLLM process died while being verified and systemd restarted it: if something killed it (an "
     "operator, the OOM killer: `journalctl -k | grep -i oom`), run the deploy again, which changes "
     "nothing and verifies again; if it keeps dying, read the journal below"),
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
    (r"no process of \S+ on GPU",
     "the engine does not run on the planned GPUs: no CUDA-capable vLLM on this host (a CPU build, or "
     "simulated GPUs as in the sandbox), or the driver hides them; check `nvidia-smi` and the env's vllm"),
    (r"does not appear to have a file named|No such file or directory|Repo id must be|"
     r"is not a local folder and is not a valid model identifier|HFValidationError|"
     r"Can't load tokenizer|OSError: .*(not found|does not exist)",
     "missing model or tokenizer path: check 'model' / 'tokenizer' on the host (or model_source)"),
    # Last: only when nothing above names the cause of the failed starts.
    (r"start-limit-hit|Start request repeated too quickly|start of the service was attempted too often",
     "a crash loop, ended: the instance failed to start several times in a row and systemd stopped "
     "retrying (Result=start-limit-hit); the first failure's cause is in the journal below. Fix it and "
     "deploy again: the deploy resets the unit and starts it"),
]


def diagnose(journal: str) -> str | None:
    for pattern, text in DIAGNOSES:
        if re.search(pattern, journal, re.IGNORECASE):
            return text
    return None




#: What a verification can ask an instance for (the probe's SERVING_REQUESTS).
SERVED_TASKS = ("generate", "embed", "classify", "pooling")


@dataclass
class InstanceCheck:
    name: str
    unit: str
    port: int  # where vLLM itself listens (127.0.0.1 on the host)
    served_model_name: str
    max_model_len: int | None
    env_file: str
    timeout_s: int
    gpu_bus_ids: list[str] = field(default_factory=list)
    front_port: int | None = None  # where clients connect, through the host's front (None: no front)
    front_address: str = "127.0.0.1"  # where the host itself reaches the front
    front_ca: str | None = None  # the front speaks HTTPS (vllm_tls): the host's file of trusted CAs
    #: What proves it serves: "generate" (a completion), or a pooling instance's task ("embed": an
    #: embedding, "classify", "pooling"): plan.runner / plan.pooling_task.
    task: str = "generate"
    adapters: list[str] = field(default_factory=list)  # its LoRA adapters' names: each listed and answering

    def as_spec(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "port": self.port, "front_port": self.front_port,
                "front_address": self.front_address, "front_ca": self.front_ca,
                "served_model_name": self.served_model_name, "max_model_len": self.max_model_len,
                "env_file": self.env_file, "timeout_s": self.timeout_s, "task": self.task,
                "gpus": bool(self.gpu_bus_ids), "gpu_bus_ids": self.gpu_bus_ids, "adapters": self.adapters}


def host_probe_command(mode: str, payload: Any) -> str:
    """A shell command running the probe on the host in `mode` ("verify", "status", ...: its main)."""
    return (f"python3 -c {shlex.quote(PROBE_SOURCE)} {mode} "
            f"{shlex.quote(json.dumps(payload, sort_keys=True))}")


def parse_host_probe(text: str) -> Any:
    """The probe's result, or None when it printed none (python3 missing, SSH dropped, ...)."""
    for line in reversed(text.splitlines()):
        if line.startswith(RESULT_PREFIX):
            return json.loads(line.removeprefix(RESULT_PREFIX))
    return None


def printed_result(text: str) -> bool:
    """Whether the probe printed its result line at all (a result of None, `null`, included): tells
    "nothing to report" apart from "the probe did not run"."""
    return any(line.startswith(RESULT_PREFIX) for line in text.splitlines())


def probe_command(checks: list[InstanceCheck]) -> str:
    """One shell command that runs every check on the host and prints a JSON result line."""
    return host_probe_command("verify", [c.as_spec() for c in checks])


def parse_probe_output(text: str) -> list[dict[str, Any]]:
    return with_diagnosis(parse_host_probe(text) or [])


def with_diagnosis(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The instances' results, each failed one with the diagnosis of its journal and error."""
    for res in results:
        if not res.get("ok"):
            res["diagnosis"] = diagnose(res.get("journal", "") + "\n" + res.get("error", ""))
    return results


def format_failure(host: str, res: dict[str, Any]) -> str:
    lines = [f"host {host}, instance {res['name']}: verification failed: {res.get('error')}"]
    if res.get("diagnosis"):
        lines.append(f"  diagnosis: {res['diagnosis']}")
    journal = [ln for ln in res.get("journal", "").splitlines() if ln.strip()][-15:]
    if journal:
        lines.append(f"  last journal lines of {res['unit']}:")
        lines.extend(f"    {ln}" for ln in journal)
    return "\n".join(lines)
