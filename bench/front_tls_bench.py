"""Front bench: the latency the HTTPS front with its client-key check adds, against a plain-HTTP proxy.

Run as root (it boots one CPU sandbox host, sbx-cpu2, measures, and stops it):

    sudo .venv/bin/python bench/front_tls_bench.py [--requests N] [--concurrency 1,16] [--json]

Both paths end at one stand-in backend on the host (bench/gateway_standin.py on 127.0.0.1:8800, stdlib
only; it answers a 1-token completion at once), so the difference is the front alone:

- A, plain: nginx on <host>:8100 proxying /v1/ to the stand-in, the key passed through, no TLS, no
  access log: the front as it was without TLS and clients.
- B, the front as the deploy renders it (render_front.front_files) with `vllm_tls = True` and a client
  (`vllm_api_clients`), on <host>:8000: TLS 1.3 with a certificate from a fleet CA made for the
  bench, the client named by its key, its model checked, the host's own key put in its place, a JSON
  access-log line to the journal. The stand-in checks that key.

The client runs on this machine (gateway_standin.measure: real threads, each keeping its connections
open as a client library does; HTTPS checked against the bench's CA), crossing the bridge into the
host's network namespace on both paths. Blocks of A and B alternate (A B A B; half the threads start
with each). Printed per concurrency: p50/p99 of each path, what B adds at p50 and p99, and a paired
p50 (the median over adjacent A/B blocks of B's block median minus A's, which cancels slow drift).
Target: <= 1 ms added at p50 at concurrency 1.

Both nginx processes and the stand-in are stopped by their PID on every exit path, before the host
is stopped. Traffic goes to the sandbox host only; the keys are the bench's own constants.

The token counting (`--counting PYTHON`, no sandbox, no root): what vllm-fleet's module in vLLM's API
server (templates/vllm-model-access.py.j2, vLLM's --middleware) adds to each request, counting its
tokens by client. PYTHON is an environment with uvicorn and prometheus_client, as vLLM's own has
(e.g. a venv from the vLLM wheelhouse). Two uvicorn servers on 127.0.0.1 (uvloop, httptools, as vLLM
runs them) serve one SIMULATED stand-in ASGI app (bench/usage_counting_app.py: answers at once, with
vLLM's usage report): A, the app alone; B, the app inside the module, counting into prometheus_client.
The same A B A B blocks at concurrency 1 as above: a 1-token completion (JSON), then a stream of 16
chunks each carrying usage and its final usage chunk (time to the last byte). Target: <= 0.5 ms added
at p50 (paired), concurrency 1. Both servers are stopped by their PID on every exit path.

    .venv/bin/python bench/front_tls_bench.py --counting /tmp/vllm-env/bin/python [--requests N] [--json]
"""

from __future__ import annotations

import argparse
import runpy
import shlex
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import BENCH, GROUP_DATA, SANDBOX_INVENTORY, print_json
import gateway_standin as standin
from vllm_fleet import tls
from vllm_fleet.config import parse_host
from vllm_fleet.plan import plan_host
from vllm_fleet.render import Secrets
from vllm_fleet.render_front import front_files
from vllm_fleet.sandbox import harness, hosts, image

HOST = "sbx-cpu2"
STANDIN_PORT = 8800
PLAIN_PORT = 8100
FRONT_PORT = 8000
CLIENT_KEY = "sk-bench-client-5d1e"
REMOTE_DIR = "/run/vllm-fleet-bench"
TARGET_MS = 1.0
PLAIN_CONFIG = f"""worker_processes 2;
pid {REMOTE_DIR}/plain.pid;
error_log stderr warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    upstream standin {{ server 127.0.0.1:{STANDIN_PORT}; keepalive 32; }}
    server {{
        listen 0.0.0.0:{PLAIN_PORT};
        location /v1/ {{
            proxy_pass http://standin/v1/;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


def front_config(address: str, ca_dir: Path) -> dict[str, str]:
    """The rendered front of one instance whose vLLM port is the stand-in's: path -> content."""
    instance = dict(runpy.run_path(str(GROUP_DATA / "sandbox.py"))["vllm_instances"][0],
                    name="bench", served_model_name=standin.MODEL, port=FRONT_PORT)
    data = {"vllm_target": "cpu", "vllm_tls": True, "vllm_backend_port_offset": STANDIN_PORT - FRONT_PORT,
            "vllm_advertise_address": address, "vllm_instances": [instance],
            "vllm_api_clients": {"bench": {"key_env": "BENCH_KEY", "models": [standin.MODEL]}}}
    config = parse_host(HOST, data)
    cert, key = tls.issue_host_certificate(ca_dir, HOST, *tls.host_names(config))
    secrets = Secrets(client_keys=(("bench", CLIENT_KEY),), host_key=standin.API_KEY,
                      tls=tls.HostTls(cert, key, (ca_dir / tls.CA_CERT).read_text()))
    files = front_files(config, plan_host(config), secrets=secrets)
    return {f.path: f.content for f in files if not f.path.endswith(".service")}


def remote(sandbox, command: str, timeout: float = 60) -> str:
    proc = sandbox.run(HOST, command, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{HOST}: {command[:80]} failed: {(proc.stderr or proc.stdout).strip()[-800:]}")
    return proc.stdout


def push(sandbox, path: str, content: str) -> None:
    argv = sandbox.host(HOST).ssh_argv(f"install -d -m 0755 {shlex.quote(str(Path(path).parent))} && "
                                       f"umask 077 && cat > {shlex.quote(path)}")
    subprocess.run(argv, input=content.encode(), check=True, capture_output=True, timeout=60)


def start(sandbox, command: str, log: str) -> int:
    return int(remote(sandbox, f"nohup {command} > {log} 2>&1 < /dev/null & echo $!").strip())


def stop(sandbox, pid: int) -> None:
    sandbox.run(HOST, f"kill -TERM {pid} 2>/dev/null; for i in $(seq 50); do kill -0 {pid} 2>/dev/null || "
                      f"exit 0; sleep 0.1; done; kill -KILL {pid}")


def wait_port(sandbox, port: int) -> None:
    remote(sandbox, f"for i in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && exit 0; "
                    f"sleep 0.1; done; exit 1")


def fmt(value) -> str:
    return "-" if value is None else f"{value:7.2f}"


COUNTING_TARGET_MS = 0.5
COUNTING_PORTS = {"plain": 18101, "counted": 18102}


def _stream_block(target: tuple[str, int], n: int, conns: dict, out: list[float], errors: list[str]) -> None:
    """n streamed completions on this thread's kept-open connection; ms to the stream's last byte."""
    import http.client
    import json as jsonlib
    body = jsonlib.dumps({"model": standin.MODEL, "prompt": "Hello", "max_tokens": 16, "stream": True})
    for _ in range(n):
        conn = conns.get(target) or conns.setdefault(target, http.client.HTTPConnection(*target, timeout=60))
        started = time.perf_counter()
        try:
            conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json",
                                                          "X-Vllm-Fleet-Client": "bench"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as exc:
            errors.append(repr(exc))
            conn.close()
            conns.pop(target, None)
            continue
        if resp.status != 200 or not data.endswith(b"data: [DONE]\n\n"):
            errors.append(f"HTTP {resp.status} {data[-80:]!r}")
            continue
        out.append((time.perf_counter() - started) * 1000)


def measure_streams(plain: tuple[str, int], counted: tuple[str, int], total: int) -> dict:
    """A B A B blocks of streams at concurrency 1: p50/p99 of each, what B adds, the paired p50."""
    conns: dict = {}
    samples: dict[str, list[float]] = {"plain": [], "counted": []}
    pairs, errors = [], []
    for r in range(max(1, total // standin.BLOCK)):
        medians = {}
        for kind in (("plain", "counted") if r % 2 == 0 else ("counted", "plain")):
            block: list[float] = []
            _stream_block(plain if kind == "plain" else counted, standin.BLOCK, conns, block, errors)
            samples[kind] += block
            medians[kind] = standin.percentile(block, 50)
        if None not in medians.values():
            pairs.append(medians["counted"] - medians["plain"])
    for conn in conns.values():
        conn.close()
    a, b = standin.summary(samples["plain"]), standin.summary(samples["counted"])
    added = {"p50": None if a["p50"] is None or b["p50"] is None else b["p50"] - a["p50"],
             "p99": None if a["p99"] is None or b["p99"] is None else b["p99"] - a["p99"],
             "paired_p50": standin.percentile(pairs, 50), "pairs": len(pairs)}
    return {"plain": a, "counted": b, "added": added, "errors": len(errors), "error_examples": errors[:3]}


def counting_bench(python: str, requests: int, out) -> dict:
    """The counting's added latency (module docstring): two uvicorn servers of the stand-in app, the
    app alone and inside vllm-fleet's module, measured A B A B at concurrency 1."""
    from vllm_fleet.templating import jinja_environment

    result: dict = {"target_ms": COUNTING_TARGET_MS, "simulated": "stand-in app, no model", "runs": []}
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory() as tmp:
        module = Path(tmp) / "vllm_fleet_model_access.py"
        module.write_text(jinja_environment().get_template("vllm-model-access.py.j2").render())
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp}:{BENCH}"}
        try:
            for app, port in COUNTING_PORTS.items():
                procs.append(subprocess.Popen(
                    [python, "-m", "uvicorn", f"usage_counting_app:{app}", "--host", "127.0.0.1", "--port", str(port),
                     "--loop", "uvloop", "--http", "httptools", "--no-access-log", "--log-level", "warning"],
                    env=env, stdout=subprocess.DEVNULL, stderr=open(Path(tmp) / f"{app}.log", "w")))
            for app, port in COUNTING_PORTS.items():
                _wait_local(port, procs, Path(tmp) / f"{app}.log")
            plain, counted = ("127.0.0.1", COUNTING_PORTS["plain"]), ("127.0.0.1", COUNTING_PORTS["counted"])
            standin.measure([plain], counted, 1, 400)  # warm-up, not counted
            started = time.monotonic()
            run = standin.measure([plain], counted, 1, requests)
            json_run = {"kind": "completion (JSON)", "plain": run["direct"], "counted": run["gateway"],
                        "added": run["added"], "errors": run["errors"], "error_examples": run["error_examples"],
                        "wall_s": round(time.monotonic() - started, 1)}
            started = time.monotonic()
            stream_run = dict(measure_streams(plain, counted, requests), kind="stream (16 chunks + usage)",
                              wall_s=round(time.monotonic() - started, 1))
            for run in (json_run, stream_run):
                run["target_met"] = (run["errors"] == 0 and run["added"]["paired_p50"] is not None
                                     and run["added"]["paired_p50"] <= COUNTING_TARGET_MS)
                result["runs"].append(run)
                print(f"counting, {run['kind']:<28} concurrency 1: alone p50 {fmt(run['plain']['p50'])} p99 "
                      f"{fmt(run['plain']['p99'])} | counted p50 {fmt(run['counted']['p50'])} p99 "
                      f"{fmt(run['counted']['p99'])} | added p50 {fmt(run['added']['p50'])} p99 "
                      f"{fmt(run['added']['p99'])} paired p50 {fmt(run['added']['paired_p50'])} ms "
                      f"({run['added']['pairs']} pairs, {run['errors']} errors)", file=out, flush=True)
        finally:
            for proc in procs:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    met = all(r["target_met"] for r in result["runs"])
    result["target_met_at_concurrency_1"] = met
    print(f"target <= {COUNTING_TARGET_MS:g} ms added by the counting at p50 (paired, concurrency 1): "
          f"{'met' if met else 'NOT met'}", file=out)
    return result


def _wait_local(port: int, procs: list[subprocess.Popen], log: Path) -> None:
    import socket
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit(f"a counting server exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing answers on 127.0.0.1:{port}: {log.read_text()[-2000:]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="per path and concurrency")
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--counting", metavar="PYTHON",
                        help="measure only the token counting in vLLM's API server, with this python "
                             "(uvicorn and prometheus_client installed): no sandbox, no root")
    args = parser.parse_args(argv)
    out = sys.stderr if args.json else sys.stdout
    if args.counting:
        result = counting_bench(args.counting, args.requests, out)
        if args.json:
            print_json(result)
        return
    image.require_root()
    full = hosts.load(SANDBOX_INVENTORY)
    sandbox = harness.Sandbox(full.inventory, [h for h in full.hosts if h.name == HOST])
    address = sandbox.host(HOST).address
    pids: list[int] = []
    result = {"target_ms": TARGET_MS, "host": HOST, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        ca_dir = Path(tmp) / "ca"
        files = front_config(address, ca_dir)
        context = ssl.create_default_context(cafile=str(ca_dir / tls.CA_CERT))
        standin.TLS_TARGETS[(address, FRONT_PORT)] = context
        try:
            harness.up(sandbox, log=lambda line: print(f"  {line}", file=out))
            push(sandbox, f"{REMOTE_DIR}/gateway_standin.py", (BENCH / "gateway_standin.py").read_text())
            pids.append(start(sandbox, f"python3 -I {REMOTE_DIR}/gateway_standin.py serve --host 127.0.0.1 "
                                       f"--port {STANDIN_PORT} --lifetime-s 1800", f"{REMOTE_DIR}/standin.log"))
            push(sandbox, f"{REMOTE_DIR}/plain.conf", PLAIN_CONFIG)
            for path, content in files.items():
                push(sandbox, path, content)
            remote(sandbox, "install -d -m 0700 /run/vllm-fleet-front")
            pids.append(start(sandbox, f"/usr/sbin/nginx -c {REMOTE_DIR}/plain.conf -g 'daemon off;'",
                              f"{REMOTE_DIR}/plain.log"))
            pids.append(start(sandbox, "/usr/sbin/nginx -c /etc/vllm-fleet/front.conf -g 'daemon off;'",
                              f"{REMOTE_DIR}/front.log"))
            for port in (STANDIN_PORT, PLAIN_PORT, FRONT_PORT):
                wait_port(sandbox, port)
            plain, front = (address, PLAIN_PORT), (address, FRONT_PORT)
            standin.measure([plain], front, 4, 400, gateway_key=CLIENT_KEY)  # warm-up, not counted
            for concurrency in [int(c) for c in args.concurrency.split(",")]:
                started = time.monotonic()
                run = standin.measure([plain], front, concurrency, args.requests, gateway_key=CLIENT_KEY)
                run = {"concurrency": concurrency, "plain": run["direct"], "tls_front": run["gateway"],
                       "added": run["added"], "errors": run["errors"], "error_examples": run["error_examples"],
                       "wall_s": round(time.monotonic() - started, 1)}
                run["target_met"] = (concurrency != 1 or (run["errors"] == 0 and run["added"]["paired_p50"] is not None
                                                          and run["added"]["paired_p50"] <= TARGET_MS))
                result["runs"].append(run)
                print(f"concurrency {concurrency:2d}: plain p50 {fmt(run['plain']['p50'])} p99 {fmt(run['plain']['p99'])} | "
                      f"TLS front p50 {fmt(run['tls_front']['p50'])} p99 {fmt(run['tls_front']['p99'])} | added p50 "
                      f"{fmt(run['added']['p50'])} p99 {fmt(run['added']['p99'])} paired p50 "
                      f"{fmt(run['added']['paired_p50'])} ms ({run['added']['pairs']} pairs, {run['errors']} errors)",
                      file=out, flush=True)
        finally:
            for pid in reversed(pids):
                stop(sandbox, pid)
            harness.down(sandbox)
            print("sandbox host stopped", file=out)
    met = all(r["target_met"] for r in result["runs"])
    result["target_met_at_concurrency_1"] = met
    print(f"target <= {TARGET_MS:g} ms added at p50 (paired, concurrency 1): {'met' if met else 'NOT met'}", file=out)
    if args.json:
        print_json(result)


if __name__ == "__main__":
    main()
