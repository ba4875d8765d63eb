"""The child of bench/vllm_fidelity.py: runs inside the genuine vLLM's environment (its venv's python),
never in vllm-fleet's. `python vllm_fidelity_child.py JOBS.json RESULTS.json`: for each rendered file
in JOBS, vLLM's own `vllm serve` parser, its engine config and its KV cache arithmetic, written to
RESULTS. Imports nothing of vllm-fleet: what it compares with comes in the jobs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

# Variables a unit may set that vllm/envs.py does not define, by who reads them.
ENV_ALLOW = {
    "NCCL_": "NCCL", "TORCH_": "PyTorch", "PYTORCH_": "PyTorch", "HF_": "huggingface_hub",
    "RAY_": "Ray", "CUDA_": "CUDA runtime", "VLLM_FLEET_": "vllm-fleet",
}
ENV_ALLOW_EXACT = {
    "HOME": "the service user's home", "GLOO_SOCKET_IFNAME": "PyTorch's gloo",
    "OMP_NUM_THREADS": "OpenMP", "TOKENIZERS_PARALLELISM": "tokenizers",
    "TRANSFORMERS_OFFLINE": "transformers", "PATH": "systemd",
}


def _child(job_file: str, out_file: str) -> None:
    jobs = json.loads(Path(job_file).read_text())
    device: dict = {}

    import torch  # noqa: F401  (the CUDA build, loaded against the stub)
    import vllm.platforms as platforms
    from vllm.platforms import cuda as cuda_platform
    from vllm.platforms.interface import DeviceCapability

    cls = cuda_platform.CudaPlatform

    def capability(_cls, device_id: int = 0):
        major, _, minor = str(device["compute_capability"]).partition(".")
        return DeviceCapability(int(major), int(minor or 0))

    # Device 0 as the plan declares it; everything else of CudaPlatform is vLLM's own.
    cls.get_device_capability = classmethod(capability)
    cls.get_device_name = classmethod(lambda _cls, device_id=0: device["name"])
    # CUDA's total (torch's total_memory), which the plan states per GPU: nvidia-smi's less the driver's share.
    cls.get_device_total_memory = classmethod(
        lambda _cls, device_id=0: device.get("cuda_total_bytes") or device["memory_mib"] * 1024 * 1024)
    cls.is_fully_connected = classmethod(lambda _cls, ids: True)
    cls.device_count = classmethod(lambda _cls: device.get("count", 1))
    platforms.current_platform = cls()
    # Triton finds no active driver without a GPU, and vLLM then takes the V1 model runner; on the GPU
    # host Triton has CUDA's driver (vllm/triton_utils/importing.py), so HAS_TRITON holds there.
    import vllm.config.vllm as vllm_config_module
    vllm_config_module.HAS_TRITON = True
    import vllm.envs as envs
    import vllm.utils.torch_utils as torch_utils
    torch_utils.cuda_device_count_stateless = lambda: device.get("count", 1)

    from vllm.entrypoints.cli import serve as serve_cli
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    import yaml

    env_names = set(envs.environment_variables)
    results = []
    for job in jobs:
        result: dict = {"file": job["file"]}
        result["env_unknown"] = [k for k in job["env"] if k not in env_names and not _allowed(k)]
        result["env_checked"] = len(job["env"])
        if job.get("ray_unit"):
            results.append(result)
            continue
        device.clear()
        device.update(job["device0"] or {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960,
                                         "compute_capability": 8.0})
        device["count"] = max(1, len([i for i in job["env"].get("CUDA_VISIBLE_DEVICES", "").split(",") if i]))
        saved_env = {}
        for key, value in job["env"].items():
            if key.startswith("VLLM_") and key in env_names and key not in (
                    "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT", "VLLM_API_KEY", "VLLM_HOST_IP"):
                saved_env[key] = os.environ.get(key)
                os.environ[key] = value
        try:
            _child_one(job, result, serve_cli, FlexibleArgumentParser, yaml)
        except Exception as exc:  # reported, never hidden
            result.setdefault("errors", []).append(f"{type(exc).__name__}: {exc}"[:600])
        finally:
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
        results.append(result)
    Path(out_file).write_text(json.dumps(results, indent=1, default=str))


def _allowed(name: str) -> bool:
    return name in ENV_ALLOW_EXACT or any(name.startswith(prefix) for prefix in ENV_ALLOW)


def _serve_parser(serve_cli, FlexibleArgumentParser):
    """`vllm`'s top-level parser with its serve subcommand, as vllm/entrypoints/cli/main.py builds it."""
    parser = FlexibleArgumentParser(description="vLLM CLI")
    subparsers = parser.add_subparsers(required=False, dest="subparser")
    (cmd,) = serve_cli.cmd_init()
    serve_parser = cmd.subparser_init(subparsers)
    serve_parser.set_defaults(dispatch_function=cmd.cmd)
    return parser, serve_parser, cmd


def _child_one(job, result, serve_cli, FlexibleArgumentParser, yaml) -> None:
    parser, serve_parser, cmd = _serve_parser(serve_cli, FlexibleArgumentParser)
    result["allow_abbrev"] = {"top": parser.allow_abbrev, "serve": serve_parser.allow_abbrev}
    config = yaml.safe_load(Path(job["yaml"]).read_text())
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = parser.parse_args(["serve", "--config", job["yaml"]])
            cmd.validate(args)
    except SystemExit as exc:
        lines = [line for line in stderr.getvalue().splitlines() if "error:" in line]
        result["parse"] = {"accepted": False, "error": (lines[-1] if lines else f"exit {exc.code}")[-400:]}
        return
    except Exception as exc:
        result["parse"] = {"accepted": False, "error": f"{type(exc).__name__}: {exc}"[:400]}
        return
    result["parse"] = {"accepted": True}
    options = serve_parser._option_string_actions
    keys, false_bad, not_whole = [], [], []
    for key, value in config.items():
        action = options.get("--" + key)
        if action is None:
            not_whole.append(key)
            keys.append({"key": key, "yaml": value, "parsed": "<no such flag>"})
            continue
        parsed = getattr(args, action.dest, "<unset>")
        want = value
        if key.startswith("no-") and value is True and ("--" + key[3:]) in options \
                and options["--" + key[3:]] is action:
            want = False
        keys.append({"key": key, "dest": action.dest, "yaml": value, "parsed": parsed,
                     "same": _same(want, parsed)})
        if want is False and parsed is not False:
            false_bad.append(f"{key}: {parsed!r}")
    result["keys"] = keys
    result["false_bad"] = false_bad
    result["falses"] = sum(1 for k in keys if k.get("yaml") is False
                           or (k["key"].startswith("no-") and k.get("yaml") is True))
    result["not_whole_flags"] = not_whole
    result["value_mismatch"] = [f"{k['key']}: yaml {k['yaml']!r} -> {k['parsed']!r}" for k in keys
                                if k.get("same") is False]
    if job.get("control"):
        return
    false_dests = [k["dest"] for k in keys if "dest" in k and (
        k["yaml"] is False or (k["key"].startswith("no-") and k["yaml"] is True and k["parsed"] is False))]
    _engine(job, result, args, false_dests)


def _same(want, parsed) -> bool:
    if isinstance(want, bool) or want is None:
        return parsed is want
    if isinstance(want, list):
        return isinstance(parsed, list) and [str(w) for w in want] == [str(p) for p in parsed]
    if isinstance(want, (int, float)) and isinstance(parsed, (int, float)) and not isinstance(parsed, bool):
        return float(want) == float(parsed)
    if isinstance(want, dict):
        return want == (parsed if isinstance(parsed, dict) else getattr(parsed, "__dict__", parsed))
    return str(want) == str(parsed)


def _engine(job, result, args, false_dests: list[str]) -> None:
    if not job.get("model_dir"):
        result["engine"] = {"skipped": job["model_what"]}
        return
    import vllm
    from vllm.usage.usage_lib import UsageContext
    args.model = job["model_dir"]
    if getattr(args, "tokenizer", None):
        args.tokenizer = job["model_dir"]
    args.skip_tokenizer_init = True  # no tokenizer files here; it changes no parallel or scheduler default
    try:
        engine_args = vllm.AsyncEngineArgs.from_cli_args(args)
        for dest in false_dests:  # a false must still be False in EngineArgs
            if getattr(engine_args, dest, False) is not False:
                result["false_bad"].append(f"{dest}: EngineArgs has {getattr(engine_args, dest)!r}")
        config = engine_args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
    except Exception as exc:
        result["engine"] = {"error": f"{type(exc).__name__}: {exc}"[:600], "model": job["model_what"]}
        return
    par, sched = config.parallel_config, config.scheduler_config
    result["engine"] = {
        "model": job["model_what"],
        "tensor_parallel_size": par.tensor_parallel_size, "pipeline_parallel_size": par.pipeline_parallel_size,
        "data_parallel_size": par.data_parallel_size,
        "distributed_executor_backend": str(par.distributed_executor_backend),
        "max_num_batched_tokens": sched.max_num_batched_tokens, "max_num_seqs": sched.max_num_seqs,
        "async_scheduling": sched.async_scheduling, "v2_model_runner": config.use_v2_model_runner,
        "max_concurrent_batches": config.max_concurrent_batches, "max_in_flight_tokens": config.max_in_flight_tokens,
        "max_model_len": config.model_config.max_model_len, "block_size": config.cache_config.block_size,
        "yaml_backend": getattr(args, "distributed_executor_backend", None),
        "enable_prefix_caching": config.cache_config.enable_prefix_caching,
    }
    _kv(job, result, config)


def _kv(job, result, config) -> None:
    import torch
    from vllm.utils.math_utils import cdiv
    from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity, get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, SlidingWindowSpec

    planner = job["planner_kv"]
    if not planner.get("blocks"):
        result["kv"] = {"skipped": "the plan gives no KV-cache size"}
        return
    text = config.model_config.hf_text_config
    layers = text.num_hidden_layers
    types = getattr(text, "layer_types", None) or ["full_attention"] * layers
    window = getattr(text, "sliding_window", None)
    heads = config.model_config.get_num_kv_heads(config.parallel_config)
    head_size = config.model_config.get_head_size()
    dtype = config.model_config.dtype if config.cache_config.cache_dtype == "auto" else torch.float8_e4m3fn
    block = config.cache_config.block_size or 16
    pp = config.parallel_config.pipeline_parallel_size
    partition = job["plan"].get("pp_layer_partition") or [layers // pp + (1 if i < layers % pp else 0)
                                                          for i in range(pp)]
    stages, start = [], 0
    for count in partition:
        stage = {}
        for i in range(start, start + count):
            name = f"model.layers.{i}.self_attn.attn"
            if types[i] == "sliding_attention" and window:
                stage[name] = SlidingWindowSpec(block_size=block, num_kv_heads=heads, head_size=head_size,
                                                dtype=dtype, sliding_window=window)
            else:
                stage[name] = FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=head_size,
                                                dtype=dtype)
        stages.append(stage)
        start += count
    # As the engine core does before grouping (vllm/v1/engine/core.py): resolve the layout from what the
    # workers' attention backends support; CUDA's FlashAttention declares none, so vLLM's default order.
    layout = resolve_kv_cache_layout(config, [[x.name for x in get_supported_kv_cache_layouts([])]],
                                     [spec for stage in stages for spec in stage.values()])
    groups = get_global_kv_cache_groups(config, stages)
    kv_config = KVCacheConfig(num_blocks=planner["blocks"], kv_cache_tensors=[], kv_cache_groups=groups)
    per_request = sum(cdiv(g.kv_cache_spec.max_memory_usage_bytes(config), g.kv_cache_spec.page_size_bytes)
                      for g in groups)
    concurrency = get_max_concurrency_for_kv_cache_config(config, kv_config)
    size, _ = get_kv_cache_capacity(config, kv_config)  # what vLLM logs as 'GPU KV cache size'
    kinds: dict[str, int] = {}
    for g in groups:
        kind = type(g.kv_cache_spec).__name__
        kinds[kind] = kinds.get(kind, 0) + 1
    result["kv"] = {
        "layout": layout.name, "groups": kinds, "group_size": len(groups[0].layer_names) if groups else 0,
        "vllm_blocks_per_request": per_request, "vllm_max_concurrency": concurrency,
        "planner_blocks": planner["blocks"], "planner_blocks_per_request": planner["blocks_per_request"],
        "planner_max_concurrency": job["plan"].get("max_concurrency"),
        "vllm_kv_cache_size": size, "planner_kv_cache_size": job["plan"].get("kv_cache_tokens"),
    }


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
