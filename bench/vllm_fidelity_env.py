"""The cached environment of bench/vllm_fidelity.py: the genuine vLLM 0.33.0 wheel (without its
dependencies), PyTorch's CUDA build, the pure packages vLLM imports at start and an empty libcuda.so.1,
prepared once under ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/vllm-fidelity-0.33.0/ (`prepare`), and the
environment its child runs with (`child_env`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
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

def log(message: str) -> None:
    print(f"[vllm-fidelity {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _sources():
    from vllm_fleet.package_sources import workstation_sources
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


def child_env() -> dict[str, str]:
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
    from vllm_fleet.config import Settings
    _uv_install([f"ray=={Settings.defaults()['vllm_ray_version']}"], "installing Ray (the multi-node backend)")
    # Whatever else an import asks for: its requirement from the wheel's METADATA where it is one.
    for _ in range(40):
        proc = subprocess.run([str(VENV / "bin" / "python"), "-c", PROBE], env=child_env(),
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
