"""Fidelity of vllm-fleet's rendered configs against the genuine vLLM 0.33.0 (a script; CI never runs it).

    .venv/bin/python bench/vllm_fidelity.py [--json] [--keep DIR]

Prepares once, in ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/vllm-fidelity-0.33.0/, a virtual environment
with the real vllm 0.33.0 wheel (installed without its dependencies), PyTorch 2.14.0 (the CUDA build) and
the pure packages vLLM imports at start, plus an empty libcuda.so.1 so that the CUDA build loads on a
machine without a GPU. Then, for every inventory in inventory/ and the variants below, it runs
`vllm-fleet render` and `vllm-fleet plan --json` and hands each rendered instance to a child process in
that environment, which:

- parses the YAML with vLLM's own `vllm serve` parser, built as `vllm`'s main() builds it, and given
  `serve --config FILE` as the unit's ExecStart gives it; it reports accepted or rejected (vLLM's
  message), the value every YAML key ends up with, whether each key is a whole flag name (no reliance
  on abbreviations) and whether every false arrives as False;
- runs `AsyncEngineArgs.from_cli_args(args).create_engine_config(OPENAI_API_SERVER)` as `vllm serve`
  does (vllm/entrypoints/cli/serve.py), with vLLM's CudaPlatform as the current platform and device
  0's name, memory and compute capability taken from the plan; the model's config.json comes from a
  local directory written from vllm_fleet/catalog.py's facts (the hub is not reachable here);
- builds the per-layer KV cache specs from that VllmConfig, groups them with vLLM's own
  get_global_kv_cache_groups and computes get_max_concurrency_for_kv_cache_config with the planner's
  number of blocks, against the planner's blocks per request and max concurrency;
- checks every environment variable name the unit and env file set against vllm/envs.py's names, or
  the allow-list below.

Exits 1 when anything disagrees or fails (the table says what), 0 when all agree.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

VLLM_VERSION = "0.33.0"
TORCH_VERSION = "2.14.0"
REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet") / f"vllm-fidelity-{VLLM_VERSION}"
VENV = CACHE / "venv"
WHEELS = CACHE / "wheels"
STUB = CACHE / "libcuda-stub"
MODELS = CACHE / "models"
READY = CACHE / "ready.json"

# Import names that differ from the distribution vLLM's METADATA requires.
DIST_OF_MODULE = {
    "PIL": "pillow", "cv2": "opencv-python-headless", "zmq": "pyzmq", "cpuinfo": "py-cpuinfo",
    "yaml": "pyyaml", "google": "protobuf", "openai_harmony": "oss-harmony", "jwt": "pyjwt",
    "pythonjsonlogger": "python-json-logger", "multipart": "python-multipart", "dotenv": "python-dotenv",
}
# What `vllm serve`'s parser and create_engine_config import (found by running them, then kept here so
# that a fresh cache needs one install, not one per missing module).
IMPORT_TIME_REQUIREMENTS = (
    "numpy", "pyyaml", "regex", "cachetools", "psutil", "requests", "tqdm", "pydantic", "msgspec",
    "cloudpickle", "pyzmq", "blake3", "py-cpuinfo", "transformers", "huggingface_hub", "tokenizers",
    "safetensors", "cbor2", "aiohttp", "oss-harmony", "openai", "pillow", "pybase64", "fastapi",
    "prometheus_client", "partial-json-parser", "xgrammar", "llguidance", "watchfiles", "orjson",
    "sentencepiece", "protobuf", "typing_extensions", "filelock", "einops", "setproctitle", "ijson",
    "python-json-logger", "prometheus-fastapi-instrumentator", "tiktoken", "jsonschema", "starlette",
    "multidict", "anthropic", "mistral_common", "lark", "gguf",
)
# Modules the parser / engine-config step reaches only through uvicorn (fastapi[standard]).
EXTRA_IMPORTS = ("uvloop", "uvicorn")

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


def log(message: str) -> None:
    print(f"[vllm-fidelity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- the cached environment ---------------------------------------------------------------------

def _sources():
    from vllm_fleet.commands.package_sources import workstation_sources
    return workstation_sources()


def _uv() -> str:
    here = Path(sys.executable).with_name("uv")
    found = str(here) if here.exists() else shutil.which("uv")
    if not found:
        sys.exit("uv not found beside this Python or on PATH: run it with the checkout's .venv/bin/python")
    return found


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> str:
    log(f"{what}: {shlex.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''}")
    started = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    log(f"{what}: done in {time.monotonic() - started:.0f} s")
    return proc.stdout


def _uv_install(packages: list[str], what: str, no_deps: bool = False) -> None:
    sources = _sources()
    cmd = [_uv(), "pip", "install", "-p", str(VENV / "bin" / "python"), *sources.uv_args()]
    if no_deps:
        cmd.append("--no-deps")
    _run(cmd + packages, what, env=sources.uv_environment())


def _wheel() -> Path:
    found = sorted(WHEELS.glob(f"vllm-{VLLM_VERSION}-*.whl"))
    if found:
        return found[0]
    sources = _sources()
    WHEELS.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "pip", "download", "--no-deps", f"vllm=={VLLM_VERSION}", "-d", str(WHEELS),
          *sources.pip_args()], f"downloading the vllm {VLLM_VERSION} wheel (~340 MB)")
    return sorted(WHEELS.glob(f"vllm-{VLLM_VERSION}-*.whl"))[0]


def _requirements(wheel: Path) -> dict[str, str]:
    """The wheel's Requires-Dist, unconditional and for this machine: normalized name -> requirement."""
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"vllm-{VLLM_VERSION}.dist-info/METADATA").decode()
    wanted: dict[str, str] = {}
    for line in meta.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line.split(":", 1)[1].strip().partition(";")
        if "extra ==" in marker or ('platform_machine == "s390x"' in marker and "!=" not in marker):
            continue
        name = re.split(r"[\s<>=!~\[;(]", req.strip(), maxsplit=1)[0]
        wanted[_normalize(name)] = req.strip()
    return wanted


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(p for p in (str(STUB), env.get("LD_LIBRARY_PATH", "")) if p)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               VLLM_CACHE_ROOT=str(CACHE / "vllm-cache"), VLLM_CONFIG_ROOT=str(CACHE / "vllm-config"),
               HF_HOME=str(CACHE / "hf"), PYTHONWARNINGS="ignore", VLLM_LOGGING_LEVEL="ERROR")
    env.pop("PYTHONPATH", None)
    return env


PROBE = ("import vllm.entrypoints.cli.serve, vllm.engine.arg_utils, vllm.v1.core.kv_cache_planning, "
         "vllm.v1.core.kv_cache_utils, vllm.platforms.cuda, vllm.v1.executor.multiproc_executor, "
         # the model classes create_engine_config inspects (the architectures the inventories use)
         "vllm.model_executor.models.gemma3_mm, vllm.model_executor.models.llama, "
         "vllm.model_executor.models.qwen2")


def prepare() -> None:
    """The genuine vLLM in its own environment, once (about 7 GB)."""
    if READY.exists() and (VENV / "bin" / "python").exists():
        return
    CACHE.mkdir(parents=True, exist_ok=True)
    if not (VENV / "bin" / "python").exists():
        _run([_uv(), "venv", "-p", sys.executable, str(VENV)], "creating the environment")
    wheel = _wheel()
    requirements = _requirements(wheel)
    _uv_install([f"torch=={TORCH_VERSION}"], f"installing PyTorch {TORCH_VERSION} (CUDA build, ~5 GB with its CUDA libraries)")
    _uv_install([str(wheel)], f"installing vllm {VLLM_VERSION} without its dependencies", no_deps=True)
    _build_stub()
    initial = [requirements.get(_normalize(name), name) for name in IMPORT_TIME_REQUIREMENTS]
    _uv_install(initial + list(EXTRA_IMPORTS), "installing the packages vLLM imports at start")
    # A multi-node instance's `distributed-executor-backend: ray` makes ParallelConfig import Ray; the
    # nodes get the Ray vllm-fleet pins (vllm_ray_version), so this environment gets it too.
    from vllm_fleet.settings import Settings
    _uv_install([f"ray=={Settings.defaults()['vllm_ray_version']}"], "installing Ray (the multi-node backend)")
    # Whatever else an import asks for: its requirement from the wheel's METADATA where it is one.
    for _ in range(40):
        proc = subprocess.run([str(VENV / "bin" / "python"), "-c", PROBE], env=_child_env(),
                              capture_output=True, text=True)
        missing = re.search(r"No module named '([^'.]+)", proc.stderr)
        if proc.returncode == 0:
            break
        if not missing:
            sys.exit(f"importing vLLM failed for another reason than a missing module:\n{proc.stderr[-4000:]}")
        module = missing.group(1)
        dist = DIST_OF_MODULE.get(module, module)
        _uv_install([requirements.get(_normalize(dist), dist)], f"installing {dist} (vLLM imports {module})")
    else:
        sys.exit("vLLM still misses modules after 40 installs")
    READY.write_text(json.dumps({"vllm": VLLM_VERSION, "torch": TORCH_VERSION, "wheel": wheel.name}) + "\n")
    log(f"environment ready: {VENV} ({_du(CACHE)})")


def _build_stub() -> None:
    """libcuda.so.1 with no GPU behind it: every driver function vLLM's extensions link against,
    each answering CUDA_ERROR_NO_DEVICE (PyTorch itself opens libcuda lazily and asks nothing)."""
    site = next((VENV / "lib").glob("python3*/site-packages"))
    symbols: set[str] = set()
    for lib in (site / "vllm").rglob("*.so"):
        listing = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True).stdout
        symbols.update(m for m in re.findall(r"\bU (cu[A-Z]\w*)", listing))
    STUB.mkdir(parents=True, exist_ok=True)
    source = STUB / "libcuda_stub.c"
    source.write_text("/* libcuda.so.1 without a GPU: each driver call vLLM links against fails as no device. */\n"
                      + "".join(f"int {name}(void) {{ return 100; }}\n" for name in sorted(symbols)))
    _run(["gcc", "-shared", "-fPIC", "-o", str(STUB / "libcuda.so.1"), str(source)],
         f"building the libcuda.so.1 stub ({len(symbols)} driver functions)")


def _du(path: Path) -> str:
    total = sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())
    return f"{total / 1e9:.1f} GB"


# --- the cases ----------------------------------------------------------------------------------

_A100_40G = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0}
_A100_80G = {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "compute_capability": 8.0}
_RTX_4090D = {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9}
_H100_80G = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": 9.0}
_B200 = {"name": "NVIDIA B200", "memory_mib": 183359, "compute_capability": 10.0}
_GEMMA_GGUF = {
    "name": "gemma",
    "model": "/data/vllm/models/gemma-3-12b-it-qat-q4_0-gguf/gemma-3-12b-it-q4_0.gguf",
    "tokenizer": "google/gemma-3-12b-it",
    "served_model_name": "gemma3-12b-q4",
    "port": 8000,
    "max_model_len": 16384,
    "max_num_seqs": 64,
    "engine_args": {"language-model-only": True},
}

# Variants of the example inventories, each a host list written to a temporary inventory.
VARIANTS: dict[str, tuple[str, list]] = {
    "pp-uneven": ("the mixed box as one instance: PP=3 over 4090 D + 2xA100, uneven layers", [
        ("gpu-mixed-pp", {"ssh_hostname": "10.0.0.41", "placement": "single-instance",
                          "gpus": [_RTX_4090D, _A100_40G, _A100_40G], "vllm_instances": [_GEMMA_GGUF]})]),
    "tp-consumer": ("2x RTX 4090 D, TP=2 with NCCL_P2P_DISABLE", [
        ("gpu-4090x2", {"ssh_hostname": "10.0.0.42", "gpus": [_RTX_4090D, _RTX_4090D], "vllm_instances": [{
            "name": "qwen14b", "model": "Qwen/Qwen2.5-14B-Instruct", "served_model_name": "qwen2.5-14b",
            "port": 8000, "max_model_len": 4096}]})]),
    "dp": ("2x H100, Qwen2.5-7B: data parallel", [
        ("gpu-h100x2", {"ssh_hostname": "10.0.0.43", "gpus": [_H100_80G, _H100_80G], "vllm_instances": [{
            "name": "qwen7b", "model": "Qwen/Qwen2.5-7B-Instruct", "served_model_name": "qwen2.5-7b",
            "port": 8000, "max_model_len": 32768}]})]),
    "engine-false": ("user engine_args with a false: enable-prefix-caching False", [
        ("gpu-a100-80", {"ssh_hostname": "10.0.0.44", "gpus": [_A100_80G], "vllm_instances": [{
            "name": "llama8b", "model": "meta-llama/Meta-Llama-3-8B-Instruct", "served_model_name": "llama-3-8b",
            "port": 8000, "max_model_len": 8192,
            "engine_args": {"enable-prefix-caching": False, "enforce-eager": True}}]})]),
    "gguf-h100": ("GGUF Gemma-3 with its tokenizer on one H100 (8192-token scheduler tier)", [
        ("gpu-h100-gguf", {"ssh_hostname": "10.0.0.45", "gpus": [_H100_80G], "vllm_instances": [
            dict(_GEMMA_GGUF, max_model_len=32768)]})]),
    "b200-tier": ("one B200: the 16384-token scheduler tier from 160 GiB; Gemma-3-27B's 10 full + 52 sliding layers", [
        ("gpu-b200", {"ssh_hostname": "10.0.0.46", "gpus": [_B200], "vllm_instances": [{
            "name": "gemma27b", "model": "google/gemma-3-27b-it", "served_model_name": "gemma3-27b",
            "port": 8000, "max_model_len": 32768}]})]),
}


def _write_variants(root: Path) -> list[tuple[str, Path, str]]:
    cases = []
    for name, (what, hosts) in VARIANTS.items():
        path = root / f"{name.replace('-', '_')}.py"
        path.write_text(f'"""{what} (written by bench/vllm_fidelity.py)."""\n\nhosts = {hosts!r}\n')
        cases.append((name, path, what))
    return cases


def _fleet(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("vllm-fleet")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "vllm_fleet.cli"]
    return subprocess.run(cmd + list(args), cwd=REPO, capture_output=True, text=True)


def _runtime_of(unit: Path) -> str:
    """The environment the unit's ExecStart runs vllm from (cuda-0.33.0-..., cpu-0.32.0-...)."""
    m = re.search(r"^ExecStart=\S*/envs/([^/]+)/bin/vllm\b", unit.read_text(), re.M)
    return m.group(1) if m else "?"


def _environment_of(unit: Path, env_file: Path | None) -> dict[str, str]:
    names: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line[len("Environment="):]):
                key, _, value = word.partition("=")
                names[key] = value
    if env_file and env_file.exists():
        for line in env_file.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                names[key.strip()] = "<env file>"
    return names


# --- the model configs the hub would give ---------------------------------------------------------

# What catalog.ModelInfo does not hold: each family's config.json fields beyond the shape.
_FAMILY = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 500000.0,
              "rms_norm_eps": 1e-05, "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128009},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_theta": 1000000.0,
              "rms_norm_eps": 1e-06, "hidden_act": "silu", "use_sliding_window": False, "sliding_window": 131072,
              "max_window_layers": 70, "bos_token_id": 151643, "eos_token_id": 151645},
}
# google/gemma-3-*-it as published: a multimodal Gemma3ForConditionalGeneration around the text model.
_GEMMA3_VISION = {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
                  "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}


def _model_config(model: str) -> dict | None:
    from vllm_fleet import catalog
    info = catalog.lookup(model)
    if info is None:
        return None
    text = {"hidden_size": info.hidden_size, "intermediate_size": info.intermediate_size,
            "num_hidden_layers": info.num_hidden_layers, "num_attention_heads": info.num_attention_heads,
            "num_key_value_heads": info.num_key_value_heads, "head_dim": info.head_dim,
            "vocab_size": info.vocab_size, "max_position_embeddings": info.max_position_embeddings,
            "tie_word_embeddings": info.tie_word_embeddings,
            "torch_dtype": "bfloat16" if info.dtype == "gguf" else info.dtype}
    lowered = model.lower()
    if "gemma-3" in lowered:
        text.update(model_type="gemma3_text", sliding_window=info.sliding_window,
                    sliding_window_pattern=info.sliding_window_pattern, query_pre_attn_scalar=info.head_dim,
                    rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=1000000.0,
                    rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-06)
        return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                "text_config": text, "vision_config": _GEMMA3_VISION, "mm_tokens_per_image": 256,
                "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
                "eos_token_id": [1, 106], "torch_dtype": "bfloat16"}
    family = "llama" if "llama" in lowered else "qwen2" if "qwen2" in lowered else None
    return {**_FAMILY[family], **text} if family else None


def _model_dir(model: str) -> tuple[Path | None, str]:
    """A local directory with the model's config.json, and what it stands for."""
    from vllm_fleet import catalog
    if model.rstrip("/").endswith("tiny-llama"):
        from vllm_fleet.sandbox import tiny_model
        target = MODELS / "tiny-llama"
        target.mkdir(parents=True, exist_ok=True)
        for name, data in tiny_model.build_files().items():
            if name.endswith(".json") or name.endswith(".jinja"):
                (target / name).write_bytes(data)
        return target, "the sandbox tiny-llama's config.json (vllm_fleet.sandbox.tiny_model)"
    config = _model_config(model)
    if config is None:
        return None, f"{model}: not in vllm_fleet/catalog.py, no config.json to write"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", model.strip("/"))[-80:]
    target = MODELS / slug
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    what = "config.json from vllm_fleet/catalog.py"
    if catalog.is_gguf(model):
        what += " (GGUF file not here: the base model's config, as vllm-gguf-plugin would read it)"
    return target, what


# --- the planner's side -------------------------------------------------------------------------

def _planner_kv(inst: dict) -> dict:
    """Blocks and concurrency as the plan states them (reasons) or vllm_fleet.catalog computes them."""
    from vllm_fleet import catalog
    text = " ".join(inst.get("reasons", []))
    out: dict = {"blocks": None, "blocks_per_request": None, "max_num_batched_tokens": None,
                 "concurrent_batches": None}
    if inst.get("kv_cache_tokens"):
        out["blocks"] = inst["kv_cache_tokens"] // catalog.KV_BLOCK_SIZE
    if m := re.search(r"request takes (\d+) blocks", text):
        out["blocks_per_request"] = int(m.group(1))
    if m := re.search(r"(\d+) concurrent batches .*? x max_num_batched_tokens (\d+)", text):
        out["concurrent_batches"], out["max_num_batched_tokens"] = int(m.group(1)), int(m.group(2))
    info = catalog.lookup(inst["model"])
    if out["blocks_per_request"] is None and info is not None and inst.get("max_model_len"):
        groups = catalog.KvGroups.of(info)
        in_flight = (out["concurrent_batches"] or 0) * (out["max_num_batched_tokens"] or 0)
        out["blocks_per_request"] = groups.blocks_per_request(inst["max_model_len"], in_flight)
    if info is not None:
        full, sliding = info.attention_layers()
        out["layers"] = {"full": full, "sliding": sliding, "window": info.sliding_window,
                         "kv_heads": info.num_key_value_heads, "head_dim": info.head_dim}
    return out


def collect(work: Path, only: set[str] | None) -> tuple[list[dict], list[dict]]:
    """Render and plan every case; one job per rendered vLLM instance (and Ray unit)."""
    cases = [(p.stem, p, "example inventory") for p in sorted((REPO / "inventory").glob("*.py"))]
    cases += _write_variants(work / "variants")
    jobs, failures = [], []
    for name, path, what in cases:
        if only and name not in only:
            continue
        out = work / "rendered" / name
        render = _fleet("render", str(path), "--out", str(out))
        plan = _fleet("plan", str(path), "--json")
        if render.returncode or plan.returncode:
            failures.append({"case": name, "error": (render.stderr or plan.stderr).strip()[-800:]})
            continue
        fleet = json.loads(plan.stdout)
        for host in fleet["hosts"]:
            etc = out / host["name"] / "etc"
            for inst in host["instances"]:
                yaml_path = etc / "vllm-fleet" / f"{inst['name']}.yaml"
                unit = etc / "systemd" / "system" / inst["unit"]
                if not yaml_path.exists():
                    failures.append({"case": name, "error": f"{yaml_path} not rendered"})
                    continue
                gpus = {g["index"]: g for g in host["gpus"]}
                visible = [int(i) for i in (inst["cuda_visible_devices"] or "").split(",") if i]
                device0 = gpus.get(visible[0]) if visible else None
                model_dir, model_what = _model_dir(inst["model"])
                jobs.append({
                    "case": name, "host": host["name"], "instance": inst["name"], "target": host["target"],
                    "file": str(yaml_path.relative_to(work / "rendered")), "yaml": str(yaml_path),
                    "env": _environment_of(unit, etc / "vllm-fleet" / f"{inst['name']}.env"),
                    "runtime": _runtime_of(unit), "device0": device0, "model_dir": str(model_dir) if model_dir else None,
                    "model_what": model_what, "plan": {k: inst.get(k) for k in (
                        "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                        "pp_layer_partition", "max_model_len", "kv_cache_tokens", "max_concurrency", "nodes")},
                    "planner_kv": _planner_kv(inst),
                })
            ray_unit = etc / "systemd" / "system" / "vllm-fleet-ray.service"
            if ray_unit.exists():
                jobs.append({"case": name, "host": host["name"], "instance": None, "ray_unit": True,
                             "file": str(ray_unit.relative_to(work / "rendered")),
                             "env": _environment_of(ray_unit, None)})
    return jobs, failures


def control_jobs(work: Path) -> list[dict]:
    """What vLLM does with a plain YAML false (the form vllm-fleet must not render): shown, not judged."""
    path = work / "controls" / "plain-false.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("model: /models/none\nenable-prefix-caching: false\nenforce-eager: false\n")
    return [{"case": "control", "file": "controls/plain-false.yaml", "yaml": str(path), "env": {},
             "control": True, "device0": None, "model_dir": None, "model_what": "control"}]


# --- the child: runs inside the genuine vLLM's environment ----------------------------------------

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
    cls.get_device_total_memory = classmethod(lambda _cls, device_id=0: device["memory_mib"] * 1024 * 1024)
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
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
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
    kinds: dict[str, int] = {}
    for g in groups:
        kind = type(g.kv_cache_spec).__name__
        kinds[kind] = kinds.get(kind, 0) + 1
    result["kv"] = {
        "layout": layout.name, "groups": kinds, "group_size": len(groups[0].layer_names) if groups else 0,
        "vllm_blocks_per_request": per_request, "vllm_max_concurrency": concurrency,
        "planner_blocks": planner["blocks"], "planner_blocks_per_request": planner["blocks_per_request"],
        "planner_max_concurrency": job["plan"].get("max_concurrency"),
    }


# --- judging and the report ---------------------------------------------------------------------

def judge(job: dict, res: dict) -> dict:
    """Agreement per column; `problems` lists every disagreement in words."""
    problems: list[str] = []
    row = {"file": job["file"], "case": job["case"], "model": job.get("model_what", "-")}
    if res.get("env_unknown"):
        problems.append("unknown env: " + ", ".join(res["env_unknown"]))
    row["env"] = "ok" if not res.get("env_unknown") else "unknown: " + ",".join(res["env_unknown"])
    row["env"] += f" ({res.get('env_checked', 0)} names)"
    if job.get("ray_unit"):
        row.update(parse="(Ray unit)", falses="-", engine="-", kv="-", model="-")
        row["problems"] = problems + res.get("errors", [])
        return row
    for err in res.get("errors", []):
        problems.append(err)
    parse = res.get("parse", {})
    if not parse.get("accepted"):
        row["parse"] = "REJECTED: " + parse.get("error", "?")
        problems.append(row["parse"])
    else:
        row["parse"] = "accepted"
        if job.get("runtime") and not job["runtime"].startswith(f"cuda-{VLLM_VERSION}"):
            row["parse"] += f" (the host runs {job['runtime']}; checked against vllm {VLLM_VERSION})"
        bad = res.get("not_whole_flags", []) + res.get("value_mismatch", [])
        if bad:
            row["parse"] += " but " + "; ".join(bad)
            problems.extend(bad)
    if res.get("false_bad"):
        row["falses"] = "WRONG: " + "; ".join(res["false_bad"])
        problems.append(row["falses"])
    else:
        row["falses"] = f"ok ({res.get('falses', 0)})" if parse.get("accepted") else "-"
    engine = res.get("engine", {})
    plan = job.get("plan", {})
    if "skipped" in engine:
        row["engine"] = "skipped: " + engine["skipped"]
    elif "error" in engine:
        row["engine"] = "ERROR: " + engine["error"]
        problems.append(row["engine"])
    elif engine:
        diffs = []
        for key, short in (("tensor_parallel_size", "TP"), ("pipeline_parallel_size", "PP"),
                           ("data_parallel_size", "DP")):
            if plan.get(key) != engine.get(key):
                diffs.append(f"{short} plan {plan.get(key)} vLLM {engine.get(key)}")
        planned_tokens = job["planner_kv"].get("max_num_batched_tokens")
        if planned_tokens is not None and planned_tokens != engine["max_num_batched_tokens"]:
            diffs.append(f"max_num_batched_tokens plan {planned_tokens} vLLM {engine['max_num_batched_tokens']}")
        batches = job["planner_kv"].get("concurrent_batches")
        if batches is not None and batches != engine["max_concurrent_batches"]:
            diffs.append(f"concurrent batches plan {batches} vLLM {engine['max_concurrent_batches']}")
        if plan.get("max_model_len") != engine["max_model_len"]:
            diffs.append(f"max_model_len plan {plan.get('max_model_len')} vLLM {engine['max_model_len']}")
        backend = engine.get("yaml_backend")
        if backend and backend != engine["distributed_executor_backend"]:
            diffs.append(f"backend rendered {backend} vLLM {engine['distributed_executor_backend']}")
        summary = (f"TP{engine['tensor_parallel_size']} PP{engine['pipeline_parallel_size']} "
                   f"DP{engine['data_parallel_size']} {engine['distributed_executor_backend']} "
                   f"mnbt {engine['max_num_batched_tokens']} seqs {engine['max_num_seqs']} "
                   f"async {engine['async_scheduling']} V2 {engine['v2_model_runner']} "
                   f"batches {engine['max_concurrent_batches']} prefix-caching {engine['enable_prefix_caching']}")
        row["engine"] = ("agree: " if not diffs else "DIFFER: " + "; ".join(diffs) + " | ") + summary
        problems.extend(diffs)
    else:
        row["engine"] = "-"
    kv = res.get("kv", {})
    if "vllm_max_concurrency" in kv:
        planner_c, vllm_c = kv["planner_max_concurrency"], kv["vllm_max_concurrency"]
        exact = (kv["planner_blocks"] / kv["planner_blocks_per_request"]
                 if kv["planner_blocks_per_request"] else planner_c)
        ratio = exact / vllm_c if exact and vllm_c else None
        same_blocks = kv["planner_blocks_per_request"] == kv["vllm_blocks_per_request"]
        same_c = planner_c is not None and abs(planner_c - round(vllm_c, 2)) <= 0.005
        row["kv"] = (f"{'agree' if same_blocks and same_c else 'DIFFER'}: blocks/request planner "
                     f"{kv['planner_blocks_per_request']} vLLM {kv['vllm_blocks_per_request']}; concurrency "
                     f"planner {planner_c} vLLM {vllm_c:.2f} (ratio {ratio:.3f}) on {kv['planner_blocks']} blocks; "
                     f"vLLM's groups {_groups_text(kv)}"
                     if ratio else f"vLLM {vllm_c:.2f}, planner {planner_c}")
        if not (same_blocks and same_c):
            problems.append("KV: " + row["kv"])
    elif "skipped" in kv:
        row["kv"] = "skipped: " + kv["skipped"]
    else:
        row["kv"] = "-"
    row["problems"] = problems
    return row


def _groups_text(kv: dict) -> str:
    kinds = " + ".join(f"{n} {kind.replace('AttentionSpec', '').replace('Spec', '')}"
                       for kind, n in kv.get("groups", {}).items())
    return f"{kinds} of {kv.get('group_size')} layers"


def table(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        mark = "OK  " if not row["problems"] else "FAIL"
        lines.append(f"{mark} {row['file']}  [{row['case']}]")
        for col in ("parse", "falses", "env", "model", "engine", "kv"):
            if row[col] == "-" and col in ("falses", "model", "engine", "kv"):
                continue
            lines.append(f"       {col:<7} {row[col]}")
        shown = " ".join(str(row[col]) for col in ("parse", "falses", "env", "engine", "kv"))
        for problem in row["problems"]:
            if problem not in shown:
                lines.append(f"       error   {problem}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--keep", metavar="DIR", help="render into DIR and keep it (default: a temporary one)")
    parser.add_argument("--only", action="append", help="only this case (an inventory stem or a variant)")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.child:
        _child(*opts.child)
        return 0
    sys.path.insert(0, str(REPO))
    prepare()
    with tempfile.TemporaryDirectory(prefix="vllm-fidelity-") as tmp:
        work = Path(opts.keep) if opts.keep else Path(tmp)
        (work / "variants").mkdir(parents=True, exist_ok=True)
        jobs, failures = collect(work, set(opts.only) if opts.only else None)
        jobs += control_jobs(work)
        job_file, out_file = work / "jobs.json", work / "results.json"
        job_file.write_text(json.dumps(jobs, indent=1))
        log(f"checking {len(jobs)} rendered files with vLLM {VLLM_VERSION} (one child process)")
        proc = subprocess.run([str(VENV / "bin" / "python"), str(Path(__file__).resolve()), "--child",
                               str(job_file), str(out_file)], env=_child_env(), capture_output=True, text=True)
        if proc.returncode or not out_file.exists():
            sys.exit(f"the vLLM child failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
        results = json.loads(out_file.read_text())
    controls = [(job, res) for job, res in zip(jobs, results) if job.get("control")]
    rows = [judge(job, res) for job, res in zip(jobs, results) if not job.get("control")]
    bad = failures or any(r["problems"] for r in rows)
    if opts.json:
        json.dump({"vllm": VLLM_VERSION, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "rows": rows, "results": results, "jobs": jobs, "render_failures": failures,
                   "agree": not bad}, sys.stdout, indent=1, default=str)
        print()
    else:
        print(f"vLLM {VLLM_VERSION} fidelity of vllm-fleet's rendered configs "
              f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
        print(table(rows))
        for job, res in controls:
            parsed = ", ".join(f"{k['key']}: {k['yaml']!r} -> {k.get('dest')}={k['parsed']!r}"
                               for k in res.get("keys", []) if k["key"] != "model")
            print(f"control (not judged) {job['file']}: a plain YAML false, as vLLM's own loader passes it: "
                  f"{parsed or res.get('parse')}")
        for failure in failures:
            print(f"FAIL render/plan [{failure['case']}]: {failure['error']}")
        print(f"{sum(1 for r in rows if not r['problems'])}/{len(rows)} files agree"
              + (f", {len(failures)} cases failed to render" if failures else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
