"""The gateway bench's stand-ins on the sandbox hosts (bench/gateway_bench.py measures through them):
the fleet the bench reads from the plan, the stand-in script pushed, started and stopped by its PID
on each CPU host, the router pointed at them and restored to its deployed workers."""

from __future__ import annotations

import http.client
import json
import shlex
import subprocess
import time
from dataclasses import dataclass, field


STANDIN_PORT = 8800  # on each CPU host's own address; none of the fleet's ports (8000, 9000, 18000, 19000-1)


STANDIN_LIFETIME_S = 1800  # a stand-in exits on its own after this, whatever happens to the bench
REMOTE_DIR = "/run/vllm-fleet-bench"  # on the hosts (tmpfs, 0700 root); gone with the hosts
REMOTE_SCRIPT = f"{REMOTE_DIR}/gateway_standin.py"


class BenchError(RuntimeError):
    pass


@dataclass
class Fleet:
    """What the bench needs of the deployed fleet, from the same plan as the deploy."""

    gateway_host: str
    gateway: tuple[str, int]  # where clients reach the gateway (its nginx)
    router: str  # vllm-router's loopback URL on the gateway host (its admin API too)
    unit: str
    workers_file: str
    register_script: str
    model: str
    backends: dict[str, tuple[str, int]] = field(default_factory=dict)  # CPU host -> its front

    def standins(self) -> dict[str, tuple[str, int]]:
        """CPU host -> where its stand-in listens: the host's own address, STANDIN_PORT."""
        return {host: (address, STANDIN_PORT) for host, (address, _port) in self.backends.items()}


def target_text(target: tuple[str, int]) -> str:
    return f"{target[0]}:{target[1]}"


# --- on the hosts ------------------------------------------------------------------------------

def remote(sandbox, host: str, command: str, timeout: float = 60, what: str | None = None) -> str:
    """A command on a sandbox host (root, over SSH); its stdout, or BenchError with its stderr."""
    proc = sandbox.run(host, command, timeout=timeout)
    if proc.returncode != 0:
        raise BenchError(f"{host}: {what or command} failed ({proc.returncode}): "
                         f"{(proc.stderr or proc.stdout).strip()[-1500:]}")
    return proc.stdout


def push(sandbox, host: str, path: str, content: bytes) -> None:
    """A file onto a host, over SSH's stdin (so nothing of it is in any argv), 0600 in REMOTE_DIR."""
    argv = sandbox.host(host).ssh_argv(f"install -d -m 0700 {REMOTE_DIR} && umask 077 && "
                                       f"cat > {shlex.quote(path)}")
    proc = subprocess.run(argv, input=content, capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise BenchError(f"{host}: copying {path} failed: {proc.stderr.decode(errors='replace').strip()}")


def standin_command(address: str, port: int, model: str, label: str, log: str) -> str:
    """Start one stand-in in the background, detached from the SSH session; prints its PID."""
    argv = ["python3", "-I", REMOTE_SCRIPT, "serve", "--host", address, "--port", str(port),
            "--model", model, "--label", label, "--lifetime-s", str(STANDIN_LIFETIME_S)]
    return f"nohup {shlex.join(argv)} > {shlex.quote(log)} 2>&1 < /dev/null & echo $!"


def stop_command(pid: int, log: str) -> str:
    """SIGTERM the stand-in with this PID (only if that PID still is a stand-in), SIGKILL after 5 s;
    then print its log (its last line counts what it answered)."""
    return (f"if grep -qsa gateway_standin.py /proc/{pid}/cmdline; then "
            f"kill -TERM {pid}; for i in $(seq 50); do kill -0 {pid} 2>/dev/null || break; sleep 0.1; done; "
            f"if kill -0 {pid} 2>/dev/null; then kill -KILL {pid}; echo SIGKILLED >&2; fi; fi; "
            f"cat {shlex.quote(log)} 2>/dev/null; true")


def workers_json(standins: dict[str, tuple[str, int]], model: str) -> str:
    """The stand-ins as gateway-register.py reads a workers file."""
    return json.dumps([{"url": f"http://{a}:{p}", "model_id": model, "host": host, "instance": "stand-in"}
                       for host, (a, p) in standins.items()], indent=2) + "\n"


def router_workers(listing: str) -> dict[str, tuple[str | None, bool]]:
    """{url: (model_id, is_healthy)} of vllm-router's GET /workers answer."""
    return {w["url"]: (w.get("model_id"), bool(w.get("is_healthy", True)))
            for w in json.loads(listing).get("workers", [])}


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


def http_ok(target: tuple[str, int], path: str = "/health", timeout: float = 1.0) -> bool:
    conn = http.client.HTTPConnection(*target, timeout=timeout)
    try:
        conn.request("GET", path)
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


class StandIns:
    """The stand-ins on the CPU hosts and the router pointed at them; restore() and stop() undo both
    and are safe to call in any state (what failed is logged, not raised: the teardown goes on)."""

    def __init__(self, sandbox, fleet: Fleet, log) -> None:
        self.sandbox, self.fleet, self.log = sandbox, fleet, log
        self.pids: dict[str, int] = {}
        self.swapped = False
        self.report: dict = {"stand_ins": {}, "restored": None}

    def start(self) -> None:
        started_err = {}
        for host, (address, port) in self.fleet.standins().items():
            command = standin_command(address, port, self.fleet.model, host, self._log_path(host))
            proc = self.sandbox.run(host, command, timeout=60)
            if proc.returncode != 0 or not proc.stdout.strip().isdigit():
                raise BenchError(f"{host}: starting the stand-in failed ({proc.returncode}): {proc.stderr.strip()}")
            self.pids[host] = int(proc.stdout.strip())
            started_err[host] = proc.stderr.strip()
        deadline = time.monotonic() + 20
        for host, target in self.fleet.standins().items():
            while not http_ok(target):
                if time.monotonic() > deadline:
                    text = self.sandbox.run(host, f"cat {self._log_path(host)}").stdout
                    raise BenchError(f"{host}: the stand-in did not answer on {target_text(target)}: "
                                     f"{started_err[host]}\n{text[-1500:]}")
                time.sleep(0.1)
            ready = last_json_line(remote(self.sandbox, host, f"head -n 1 {self._log_path(host)}"))
            if ready and ready.get("pid") and ready["pid"] != self.pids[host]:
                self.pids[host] = ready["pid"]  # the stand-in's own word on its PID
        where = [f"{h} {target_text(t)} (pid {self.pids[h]})" for h, t in self.fleet.standins().items()]
        self.log(f"stand-ins answering: {', '.join(where)}")

    def route_to_standins(self) -> None:
        """The router's workers := the stand-ins, by the deployed registration script."""
        fleet, gw = self.fleet, self.fleet.gateway_host
        path = f"{REMOTE_DIR}/standin-workers.json"
        push(self.sandbox, gw, path, workers_json(fleet.standins(), fleet.model).encode())
        self.swapped = True  # from here on, restore() reloads the unit whatever happens
        out = remote(self.sandbox, gw, f"python3 -I {shlex.quote(fleet.register_script)} {fleet.router} "
                                       f"{path} 30", what="registering the stand-ins")
        self.log(f"router: {out.strip()}")
        have = router_workers(remote(self.sandbox, gw, f"curl -sf {fleet.router}/workers"))
        want = {f"http://{a}:{p}" for a, p in fleet.standins().values()}
        if set(have) != want or not all(model == fleet.model and healthy for model, healthy in have.values()):
            raise BenchError(f"the router's workers are {have}, not the healthy stand-ins {sorted(want)}")

    def restore(self) -> None:
        """`systemctl reload` of the gateway unit (its ExecReload= makes the router's workers those of
        the deployed file again); checked against that file; a restart if the reload did not do it."""
        if not self.swapped:
            return
        fleet, gw = self.fleet, self.fleet.gateway_host
        for action in ("reload", "restart"):
            proc = self.sandbox.run(gw, f"systemctl {action} {fleet.unit}", timeout=120)
            check = self.sandbox.run(gw, f"cat {fleet.workers_file}; echo @@; curl -sf {fleet.router}/workers",
                                     timeout=60)
            try:
                file_part, listing = check.stdout.split("@@\n", 1)
                want = {w["url"] for w in json.loads(file_part)}
                have = set(router_workers(listing))
            except (ValueError, KeyError) as exc:
                want, have = {"?"}, {f"unreadable: {exc!r}"}
            if proc.returncode == 0 and have == want:
                self.swapped = False
                self.report["restored"] = {"by": f"systemctl {action} {fleet.unit}", "workers": sorted(have)}
                self.log(f"router restored ({action}): its {len(have)} deployed workers")
                return
            self.log(f"router not restored by {action} ({proc.returncode}: {proc.stderr.strip()[-300:]}; "
                     f"workers {sorted(have)}, deployed {sorted(want)})")
        self.report["restored"] = {"by": None, "error": "neither reload nor restart restored the workers"}

    def stop(self) -> None:
        for host in list(self.pids):
            try:
                proc = self.sandbox.run(host, stop_command(self.pids[host], self._log_path(host)), timeout=30)
            except subprocess.TimeoutExpired:
                self.log(f"{host}: stopping the stand-in (pid {self.pids[host]}) timed out; the host's stop ends it")
                self.report["stand_ins"][host] = {"pid": self.pids.pop(host), "counts": None, "killed": None}
                continue
            final = last_json_line(proc.stdout) or {}
            self.report["stand_ins"][host] = {"pid": self.pids.pop(host), "counts": final.get("counts"),
                                              "killed": "SIGKILLED" in proc.stderr}
            if proc.returncode != 0 or not final.get("stopped"):
                self.log(f"{host}: the stand-in (pid {self.report['stand_ins'][host]['pid']}) had stopped "
                         f"before, or its stop failed: {(proc.stderr + proc.stdout).strip()[-500:]}")
        for host in self.fleet.standins():
            self.sandbox.run(host, f"rm -rf {REMOTE_DIR}/standin-*", timeout=30)

    def _log_path(self, host: str) -> str:
        return f"{REMOTE_DIR}/standin-{host}.log"
