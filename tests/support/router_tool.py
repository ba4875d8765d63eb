"""vllm-router's own argument parsing, for the tests: the gateway unit's ExecStart arguments go through
exactly what `vllm-router ARGS` does before it serves, and nothing after.

PyPI's vllm-router is a wheel whose console script is Python (vllm_router.launch_router:main) around
a Rust extension (vllm_router_rs, PyO3). Its main() parses the arguments with argparse
(parse_router_args: RouterArgs' options, their types and choices), then launch_router() checks them
(RouterArgs._validate_router_args) and builds the Rust router from them (Router.from_args), where
every number becomes the Rust field's own type (a u64, u32 or u16: a value outside it is an
OverflowError), and only then calls start(). The check below runs those three steps in a child
process and stops before start(): nothing listens.

The wheel is fetched with `pip download --no-deps` into ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/
vllm-router-<version>/ and unpacked there (never installed). launch_router imports setproctitle (it
names the process) and the mini load balancer (aiohttp, fastapi, uvicorn: a debugging mode the
gateway does not use) at its top: the child gives it stand-ins for those two, so the wheel alone is
enough; the parsing, the checks and the Rust types are the wheel's own.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from support.debian_tool import ToolUnavailable, cache_root

#: The child: one JSON list of argument lists on stdin, one JSON list of results out ("" when the
#: router took the arguments, else what it said).
CHILD = r"""
import contextlib, io, json, sys, types
sys.modules["setproctitle"] = types.SimpleNamespace(setproctitle=lambda title: None)
sys.modules["vllm_router.mini_lb"] = types.SimpleNamespace(MiniLoadBalancer=None)
from vllm_router.launch_router import parse_router_args
from vllm_router.router import Router

results = []
for argv in json.load(sys.stdin):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            args = parse_router_args(argv)
        args._validate_router_args()
        Router.from_args(args)  # the Rust router, built and dropped: start() is never called
        results.append("")
    except SystemExit as exc:  # argparse's error(): usage and message on stderr, exit status 2
        results.append(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}")
    except Exception as exc:
        results.append(f"{type(exc).__name__}: {exc}")
print(json.dumps(results))
"""


def package_dir(version: str) -> Path:
    """The unpacked wheel of vllm-router `version` (fetched on first use)."""
    base = cache_root() / f"vllm-router-{version}"
    marker = base / "vllm_router" / "launch_router.py"
    if marker.is_file():
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    with open(base.parent / f".vllm-router-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not marker.is_file():
            _fetch(version, base)
    return base


def _fetch(version: str, base: Path) -> None:
    with tempfile.TemporaryDirectory(dir=base.parent) as work:
        download = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                                   "-d", work, f"vllm-router=={version}"], capture_output=True, text=True)
        wheels = sorted(Path(work).glob("vllm_router-*.whl"))
        if download.returncode != 0 or not wheels:
            raise ToolUnavailable(f"`pip download vllm-router=={version}` failed:\n{download.stderr}")
        staged = Path(work) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as wheel:
            wheel.extractall(staged)
        for library in staged.rglob("*.so*"):
            library.chmod(0o755)
        if base.exists():
            shutil.rmtree(base)
        staged.rename(base)


def parse(version: str, argvs: list[list[str]]) -> list[str]:
    """What vllm-router `version` says of each argument list: "" when it takes them, else its message."""
    if not argvs:
        return []
    path = f"import sys\nsys.path.insert(0, {str(package_dir(version))!r})\n"
    child = subprocess.run([sys.executable, "-I", "-c", path + CHILD], input=json.dumps(argvs), capture_output=True,
                           text=True, timeout=120)
    if child.returncode != 0:
        raise RuntimeError(f"vllm-router's parser could not be run:\n{child.stdout}{child.stderr}")
    return json.loads(child.stdout.splitlines()[-1])
