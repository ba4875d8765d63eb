"""The instance unit's lifecycle (templates/vllm.service.j2, render.unit_lifecycle): a start completes
only when vLLM's /health answers (Type=exec + ExecStartPost), a hung load is stopped at the start
timeout, and a crash loop ends in a failed unit after StartLimitBurst starts within an interval
sized to the load time. No systemd runs here: the values are checked as rendered, the health wait
is run as a program against a local HTTP server, and where `systemd-analyze` exists, systemd's own
parser checks the unit and unquotes the ExecStartPost= program."""

from __future__ import annotations

import http.server
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vllm_fleet.config import load_inventory, parse_host
from vllm_fleet.plan import plan_host
from vllm_fleet.render import STOP_MARGIN_S, render_host, start_timeout_s, unit_lifecycle

ROOT = Path(__file__).resolve().parents[2]


def _units(inventory: str, host_name: str):
    hosts = {name: data for name, data, _groups in load_inventory(ROOT / "inventory" / inventory, cwd=ROOT)}
    config = parse_host(host_name, hosts[host_name])
    plan = plan_host(config)
    files = {f.path: f.content for f in render_host(config, plan, backends=[])}  # the gateway's aside
    return {inst.name: (inst, files[f"/etc/systemd/system/{inst.unit_name}"]) for inst in plan.instances}


@pytest.fixture(scope="module")
def tiny():
    return _units("sandbox.py", "sbx-cpu1")["tiny"]


@pytest.fixture(scope="module")
def llama70b():
    return _units("prod.py", "gpu-h100-01")["llama70b"]


def directives(unit: str) -> dict[str, dict[str, list[str]]]:
    """{section: {key: [values]}} of a unit file (comments dropped)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for line in unit.splitlines():
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            out[section] = {}
        elif line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            out[section].setdefault(key, []).append(value)
    return out


def one(unit: str, section: str, key: str) -> str:
    (value,) = directives(unit)[section][key]
    return value


def health_wait_argv(unit: str) -> list[str]:
    """The ExecStartPost= argv as systemd unquotes it (systemd.syntax(7): "..." groups one
    argument, C escapes such as \\n are decoded). The program uses none of " \\ $ %: checked."""
    line = one(unit, "Service", "ExecStartPost")
    match = re.fullmatch(r'(\S+) -I -c "([^"]*)" (\d+) (\d+)', line)
    assert match, line
    program = match.group(2)
    assert not set(program.replace("\\n", "")) & set('"\\$%'), "systemd would unescape/expand these"
    return [match.group(1), "-I", "-c", program.replace("\\n", "\n"), match.group(3), match.group(4)]


@pytest.mark.parametrize("which", ["tiny", "llama70b"])
def test_unit_lifecycle_is_sized_to_the_load_time(which, request):
    inst, unit = request.getfixturevalue(which)
    timeout = start_timeout_s(inst)
    life = unit_lifecycle(inst)
    restart = int(one(unit, "Service", "RestartSec"))
    assert one(unit, "Service", "Type") == "exec"
    assert one(unit, "Service", "Restart") == "always"  # vLLM exits 0 when its engine dies
    assert int(one(unit, "Service", "TimeoutStartSec")) == timeout == life["start_timeout_s"]
    # vLLM lets the requests in flight finish for --shutdown-timeout; systemd waits that and a margin.
    stop = int(one(unit, "Service", "TimeoutStopSec"))
    assert inst.engine_args["shutdown-timeout"] == 30 and stop == 30 + STOP_MARGIN_S == life["stop_timeout_s"]
    assert one(unit, "Service", "KillMode") == "mixed"
    assert one(unit, "Service", "EnvironmentFile") == f"/etc/vllm-fleet/{inst.name}.env"
    assert one(unit, "Service", "ProtectSystem") == "strict" and one(unit, "Service", "NoNewPrivileges") == "yes"
    # The start limit belongs to [Unit] (systemd.unit(5)); in [Service] systemd 252 ignores it.
    assert "StartLimitBurst" not in directives(unit)["Service"]
    burst = int(one(unit, "Unit", "StartLimitBurst"))
    interval = int(one(unit, "Unit", "StartLimitIntervalSec"))
    assert burst == 3 and 10 <= restart <= 60
    # `burst` failing cycles (load until the timeout, stop, pause) and the refused attempt after
    # them fall inside one interval, so a load that hangs every time ends in start-limit-hit too.
    assert interval > burst * (timeout + stop + restart)
    assert interval <= burst * (timeout + stop + restart) + 120  # and not much more
    argv = health_wait_argv(unit)
    assert argv[0] == "/usr/bin/python3"
    assert int(argv[4]) == inst.backend_port != inst.port  # vLLM itself, not the front
    assert int(argv[5]) == timeout - 15  # gives up (with its reason) before TimeoutStartSec


def test_tiny_and_70b_numbers(tiny, llama70b):
    """The numbers the two units get (start timeout = 300 s + 20 s per GiB of weights; stop timeout =
    the 30 s vLLM lets requests finish + 60 s)."""
    t_inst, t_unit = tiny
    l_inst, l_unit = llama70b
    assert one(t_unit, "Service", "TimeoutStartSec") == "300"
    assert one(t_unit, "Service", "RestartSec") == "15"
    assert one(t_unit, "Unit", "StartLimitIntervalSec") == str(3 * (300 + 90 + 15) + 60)
    weights = l_inst.config.model_info.weights_gib
    assert weights > 120  # 70B parameters in 16-bit
    timeout = int(300 + 20 * weights)
    assert one(l_unit, "Service", "TimeoutStartSec") == str(timeout)
    assert one(l_unit, "Service", "RestartSec") == "60"
    assert one(l_unit, "Unit", "StartLimitIntervalSec") == str(3 * (timeout + 90 + 60) + 60)


# --- the health wait, run as the unit runs it -------------------------------------------------------

class _Health(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self):  # noqa: N802
        code = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args):
        pass


def _serve(answers):
    handler = type("H", (_Health,), {"answers": list(answers)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _run_wait(unit, port, limit, env=None):
    argv = health_wait_argv(unit)
    argv[0] = sys.executable
    argv[4], argv[5] = str(port), str(limit)
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env or {})
    return out, time.monotonic() - start


def test_health_wait_completes_on_the_first_200(tiny):
    server = _serve([503, 503, 200])  # the engine dead (503) at first, then up
    try:
        out, took = _run_wait(tiny[1], server.server_address[1], 30)
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    assert took < 15


def test_health_wait_gives_up_with_its_reason(tiny):
    server = _serve([200])
    port = server.server_address[1]
    server.shutdown()
    server.server_close()  # nothing listens: connection refused, as while vLLM loads
    out, took = _run_wait(tiny[1], port, 3)
    assert out.returncode == 1
    assert f"127.0.0.1:{port}/health did not answer 200 within 3 s" in out.stderr
    assert 3 <= took < 10


def test_health_wait_stops_when_vllm_is_gone(tiny):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out, took = _run_wait(tiny[1], 9, 60, env={"MAINPID": str(dead.pid)})  # systemd sets $MAINPID
    assert out.returncode == 1 and f"vLLM (pid {dead.pid}) exited before" in out.stderr
    assert took < 10


# --- systemd's own parser, where systemd-analyze is installed ----------------------------------------

def _analyzable(unit: str, tmp_path: Path, name: str) -> Path:
    """The unit with binaries this machine has (verify checks that ExecStart= is executable)."""
    text = re.sub(r"(?m)^ExecStart=.*$", "ExecStart=/bin/true", unit)
    if not Path("/usr/bin/python3").exists():
        text = text.replace("ExecStartPost=/usr/bin/python3 ", "ExecStartPost=/bin/true ")
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
@pytest.mark.parametrize("which", ["tiny", "llama70b"])
def test_systemd_analyze_verify_accepts_the_unit(which, request, tmp_path):
    inst, unit = request.getfixturevalue(which)
    path = _analyzable(unit, tmp_path, f"vllm-{inst.name}.service")
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_unquotes_the_health_wait_into_the_program(tiny, tmp_path):
    """systemd-analyze prints an ExecStartPost= word with an unknown escape as it decoded it: with a
    '\\q' in front, its warning shows the program exactly as systemd hands it to python3."""
    unit = tiny[1].replace('-I -c "import', '-I -c "\\qimport', 1)
    path = _analyzable(unit, tmp_path, "vllm-probe.service")
    out = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    match = re.search(r'Ignoring unknown escape sequences: "\\qimport(.*)"\s*$', out.stderr, re.S)
    assert match, out.stderr
    decoded = "import" + match.group(1)
    assert decoded == health_wait_argv(tiny[1])[3]
    compile(decoded, "ExecStartPost", "exec")
