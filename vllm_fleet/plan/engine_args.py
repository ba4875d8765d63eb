"""The engine arguments and environment every planned instance gets, whatever its layout: the
model, the loopback backend port, the parallel sizes and memory knobs, the user's engine_args (never
contradicting a flag the planner set), CUDA device order, the GGUF plugin."""

from __future__ import annotations

import posixpath
from typing import Any

from vllm_fleet import kinds, vllm_flags
from vllm_fleet.config import ConfigError, ConfigErrors, HostConfig
from vllm_fleet.config.adapters import lora_rank, max_cpu_loras, max_loras
from vllm_fleet.environment import GGUF_PLUGIN
from vllm_fleet.host_layout import MODEL_ACCESS_MODULE, HostLayout
from vllm_fleet.plan.types import InstancePlan

BACKEND_HOST = "127.0.0.1"
# The flags the token counting needs (templates/vllm-model-access.py.j2): engine_args may repeat
# them, never change them.
USAGE_FLAGS = ("middleware", "enable-force-include-usage", "enable-prompt-tokens-details")


def add_engine_args_and_env(host_config: HostConfig, plans: list[InstancePlan]) -> None:
    """Completes each plan's engine_args, env, backend_port and packages from its layout and its
    instance's settings. Raises ConfigErrors where engine_args contradicts the planner."""
    conflicts: list[ConfigError] = []
    for plan in plans:
        inst = plan.config
        env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": plan.cuda_visible_devices}
        env.update(plan.env)
        env.update(inst.env)
        plan.env = env
        # vLLM's API key guards only /v1 (its own security guide): every other route would answer
        # anyone who reaches the port. So vLLM listens on loopback; the host's front (render.py)
        # passes only /v1/ and /health from <vllm_bind_host>:<port> to it.
        plan.backend_port = plan.port + host_config.settings.vllm_backend_port_offset
        args: dict[str, Any] = {
            "model": inst.model,
            "served-model-name": [inst.served_model_name],
            "host": BACKEND_HOST,
            "port": plan.backend_port,
            # On SIGTERM (a deploy's restart, a stop) vLLM stops taking requests and lets those in
            # flight finish for this long before it aborts them (its default, 0, aborts at once);
            # the unit's TimeoutStopSec leaves room for it (render.unit_lifecycle).
            "shutdown-timeout": host_config.settings.vllm_shutdown_timeout_s,
        }
        if inst.tokenizer:
            args["tokenizer"] = inst.tokenizer
        # vLLM resolves --runner auto / --convert auto alike (config/runner.py); a pooling instance
        # states them, so the YAML says what the plan and the verification assume.
        if plan.pooling or inst.runner != "auto":
            args["runner"] = plan.runner
        if plan.convert != "none" or inst.convert != "auto":
            args["convert"] = plan.convert
        if host_config.settings.vllm_target == "cuda":
            args.update({
                "tensor-parallel-size": plan.tensor_parallel_size,
                "pipeline-parallel-size": plan.pipeline_parallel_size,
                "data-parallel-size": plan.data_parallel_size,
                "gpu-memory-utilization": inst.gpu_memory_utilization,
            })
        if plan.max_model_len:
            args["max-model-len"] = plan.max_model_len
        if inst.max_num_seqs:
            args["max-num-seqs"] = inst.max_num_seqs
        if inst.max_num_batched_tokens:
            args["max-num-batched-tokens"] = inst.max_num_batched_tokens
        if plan.dtype != "auto":
            args["dtype"] = plan.dtype
        if inst.adapters:
            # The adapters themselves are not flags: vLLM loads them at run time, through its loopback
            # port (templates/vllm-adapters.py.j2), so that adding or removing one restarts nothing.
            # What sizes vLLM's LoRA buffers is fixed at its start: enable-lora and these two.
            args.update({"enable-lora": True, "max-lora-rank": lora_rank([a.rank for a in inst.adapters]),
                         "max-loras": max_loras(len(inst.adapters))})
            held = max_cpu_loras(len(inst.adapters))
            if held is not None:
                args["max-cpu-loras"] = held
            # Not the adapters' count nor names: a reason is in the unit, and a changed unit restarts vLLM.
            plan.reasons.append(
                f"--enable-lora --max-lora-rank {args['max-lora-rank']} --max-loras {args['max-loras']}: sized for "
                "the instance's adapters (at least rank 16 and 4 a batch, so that adding one rarely changes them; at "
                "most 16 a batch" + (f", --max-cpu-loras {args['max-cpu-loras']} keeps them all loaded" if
                                      "max-cpu-loras" in args else "") + "); "
                "vLLM's LoRA buffers are counted with the weights, before the KV cache")
            if plan.data_parallel_size > 1:
                # vLLM starts one API server per replica unless told otherwise, and refuses runtime
                # adapter loading with more than one (vllm/entrypoints/cli/serve.py:124-125, 315-318).
                args["api-server-count"] = 1
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"
        # vllm-fleet's module in vLLM's API server (root's, in a directory of its own): with adapters,
        # one port serves several names, and which of them a client may use is checked there, where
        # the request's body is parsed as vLLM parses it (the front passes the client's names in a
        # header); on every instance, it counts each request's tokens under the client the front
        # names, from vLLM's own usage report, which these two flags make complete: every stream
        # ends with its usage, and the usage holds the prompt's cached tokens.
        layout = HostLayout.of(host_config.settings)
        env["PYTHONPATH"] = posixpath.dirname(layout.model_access)
        args["middleware"] = f"{MODEL_ACCESS_MODULE}.ModelAccess"
        args["enable-force-include-usage"] = True
        args["enable-prompt-tokens-details"] = True
        for flag in USAGE_FLAGS:
            if flag in inst.engine_args and not _same_flag_value(inst.engine_args[flag], args[flag]):
                conflicts.append(ConfigError(
                    f"engine_args sets '{flag}' to {inst.engine_args[flag]!r}: vllm-fleet sets {flag} = "
                    f"{args[flag]!r} to count each client's tokens (and with adapters, to check which "
                    "names each client may use)", host=host_config.name, instance=inst.name,
                    key=f"engine_args.{flag}", fix=f"remove '{flag}' from engine_args"))
        args.update(plan.engine_args)
        # The planner's own flags (plan.engine_args) are decisions its reasons explain: an
        # engine_args entry may repeat one, never contradict it (the reasons would claim what vLLM
        # does not get).
        for flag, planned in plan.engine_args.items():
            if flag in inst.engine_args and not _same_flag_value(inst.engine_args[flag], planned):
                why = next((reason for reason in plan.reasons if f"--{flag}" in reason), "set by the planner")
                conflicts.append(ConfigError(
                    f"engine_args sets '{flag}' to {inst.engine_args[flag]!r}, but the planner sets "
                    f"{flag} = {planned!r} because: {why}",
                    host=host_config.name, instance=inst.name, key=f"engine_args.{flag}",
                    fix=f"remove '{flag}' from engine_args (the planner sets it), or change what makes "
                        "the planner set it (e.g. the GPUs or tensor_parallel_size)"))
        # A flag taking no value goes to the YAML as True or False whatever word engine_args used:
        # vLLM's config loader passes any other value as an argument of its own.
        args.update({flag: kinds.switch_value(value) if flag in vllm_flags.SWITCH_FLAGS else value
                     for flag, value in inst.engine_args.items()})
        plan.engine_args = args
        if inst.gguf and not any(pkg.startswith(GGUF_PLUGIN) for pkg in plan.packages):
            # Pinned like vLLM itself: part of the environment's spec and hash, so two hosts with
            # the same environment hold the same plugin build.
            plan.packages.append(f"{GGUF_PLUGIN}=={host_config.settings.vllm_gguf_plugin_version}")
    if conflicts:
        raise ConfigErrors(conflicts)


def _same_flag_value(given: Any, planned: Any) -> bool:
    """True when an engine_args value says what the planner's does (True and "true" alike)."""
    if isinstance(planned, bool):
        return kinds.switch_value(given) is planned
    if isinstance(given, bool):
        return False
    if isinstance(given, str) and isinstance(planned, str):
        return given.strip() == planned.strip()
    return given == planned
