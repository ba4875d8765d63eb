"""Gateway bench: the latency the fleet gateway adds to a request, against direct requests.

Run as root (it boots the 3 CPU sandbox hosts, deploys them with the gateway on sbx-cpu1, measures,
and stops them):

    sudo .venv/bin/python bench/gateway_bench.py [--backend stand-in|vllm|both] [--client ...]
        [--route completions|chat] [--policy round_robin,prefix --rounds 2] [--json]

The same 1-token request (each client thread its own) is sent direct and through the gateway; at
concurrency 1 and 16, blocks of direct and gateway requests alternate (A B A B ...; half the threads
start with each), each thread keeps its HTTP connections open as a client library does. Printed for
each backend, client and concurrency: p50 and p99 of each path, the p50/p99 the gateway adds, a
paired p50 (the median over adjacent direct/gateway blocks of the gateway block's median minus the
direct block's, which cancels slow drift in the hosts' load, with its 10-90 % spread), and whether
the target, <= 2 ms added at p50, is met. --json: one JSON document on stdout, progress on stderr.

--route completions (the default): a one-word /v1/completions prompt. --route chat: a conversation's
    fourth turn under a 2,000-character system prompt (2.6 kB of JSON) to /v1/chat/completions, the
    request a gateway keying by leading messages reads whole (vllm_gateway_policy = "prefix").
--policy P1,P2,...: the gateway's vllm_gateway_policy for each measurement, switched by a deploy
    with `--data vllm_gateway_policy=P` (as an operator would), in the order given, --rounds times
    (A B A B). Each policy's added p50 is the median of its rounds' paired p50s; a policy's routing
    cost is that minus round_robin's, per client and concurrency (round_robin must be one of them),
    judged against <= 0.5 ms at p50: the figure for what the policy does per request beyond picking
    the next instance (for "prefix": the front's njs reading and hashing the body, the router's ring).

--backend stand-in (the default: the gateway's own overhead, the figure the target is about).
    The deployed vLLMs answer in 100-1000 ms on 2 shared cores, with noise far above 2 ms, so the
    backend is replaced by a stand-in that answers at once (bench/gateway_standin.py, stdlib only,
    copied to each CPU host and run there with Debian's python3 on <host address>:8800):
    GET /health, GET /v1/models (OpenAI-shaped, the served name), POST /v1/completions (a fixed
    1-token completion; it checks the key and the model, as vLLM does).
    - direct:  client -> stand-in on the backend host (<host>:8800), rotating over the 3 hosts;
    - gateway: client -> sbx-cpu1:9000 (the gateway's nginx: key check) -> vllm-router on
      127.0.0.1:19000 -> stand-in (<host>:8800), the router rotating over the same 3.
    So "added" is exactly the gateway's hop: its nginx, vllm-router, and the connection from the
    gateway host to the backend. Neither path has the backend host's own front (nginx on :8000):
    in the fleet both paths go through it, so it is no part of what the gateway adds.
    How the router routes to the stand-ins: its admin API (loopback on sbx-cpu1, reached over SSH)
    is made to hold exactly the stand-ins by the deployed registration script itself
    (gateway-register.py with a stand-in workers file: DELETE the deployed workers, POST the
    stand-ins). Afterwards `systemctl reload vllm-fleet-gateway.service` runs the same script with
    the deployed workers file (its ExecReload=), which puts the deployed workers back; the bench
    checks the router's list against that file. The real vLLMs keep running, idle (no request or
    health check reaches them meanwhile). Every gateway answer must come from a stand-in (the
    completion's system_fingerprint names it), else the run is marked invalid.
--backend vllm: the deployed CPU vLLMs, direct to each host's front (<host>:8000, nginx -> vLLM)
    against the gateway (sbx-cpu1:9000 -> vllm-router -> the same fronts); the first figures were
    taken so (dominated by the vLLMs' noise). --backend both: stand-in first, then vllm.

--client workstation: the client runs on this machine (`gateway_standin.py measure`, a process of
    its own on real threads: this one is gevent-patched by pyinfra's inventory loader), each
    request crossing this machine's bridge into the hosts' network namespaces. --client
    gateway-host: the same script runs on sbx-cpu1 (the gateway host; over SSH, its result one
    JSON line), so the client reaches the gateway's nginx over loopback and the workstation<->
    namespace hop is gone from both paths; its direct requests reach sbx-cpu1's stand-in over
    loopback and the other two over the bridge, as the router's do. --client both (the default)
    prints both. Before each measurement: a warm-up at concurrency 4, not counted.

Everything the bench starts is stopped by its PID (stand-ins: SIGTERM, SIGKILL after 5 s, each
checked to be the stand-in first), on every exit path, before the sandbox hosts are stopped; each
stand-in also exits on its own after --lifetime-s. Traffic goes to the sandbox hosts only. The key
is the bench's own constant (gateway_standin.API_KEY): in the deploy's environment and in the
copied script, never in argv or the output.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from urllib.parse import urlsplit

from benchlib import BENCH, REPO, SANDBOX_INVENTORY, print_json
from gateway_bench_standins import (
    REMOTE_SCRIPT,
    BenchError,
    Fleet,
    StandIns,
    last_json_line,
    push,
    remote,
    target_text,
)
import gateway_standin as standin
from vllm_fleet.sandbox import harness, hosts, image

INVENTORY = SANDBOX_INVENTORY
CPU_GROUP = "cpu_hosts"
TARGET_MS = 2.0
ROUTING_TARGET_MS = 0.5  # a policy's added p50 beyond round_robin's
BACKENDS = ("stand-in", "vllm")
CLIENTS = ("workstation", "gateway-host")
DEFAULT_REQUESTS = {"stand-in": 2000, "vllm": 400}
WARMUP = {"stand-in": 400, "vllm": 200}  # requests per kind at concurrency 4 before measuring


def load_fleet(cpu_hosts: list[str]) -> Fleet:
    from vllm_fleet import fleet as inventory_fleet
    from vllm_fleet.gateway import gateway_paths, router_url
    from vllm_fleet.host_layout import GATEWAY_UNIT

    loaded = inventory_fleet.Fleet.load(INVENTORY)
    gateway = loaded.gateway()
    if gateway is None or gateway.name not in cpu_hosts:
        raise BenchError(f"{INVENTORY}: the gateway must be one of {cpu_hosts}")
    backends = [b for b in loaded.gateway_backends() if b.host in cpu_hosts]
    models = sorted({b.served_model_name for b in backends})
    if len(models) != 1 or len({b.host for b in backends}) != len(backends):
        raise BenchError(f"expected one instance per CPU host serving one model; got "
                         f"{[b.as_dict() for b in backends]}")
    fronts = {}
    for b in backends:
        url = urlsplit(b.url)
        fronts[b.host] = (url.hostname, url.port)
    paths = gateway_paths(gateway)
    return Fleet(gateway_host=gateway.name, gateway=(fronts[gateway.name][0], gateway.settings.vllm_gateway_port),
                 router=router_url(gateway), unit=GATEWAY_UNIT, workers_file=paths["workers"],
                 register_script=paths["register"], model=models[0], backends=fronts)


def paths_text(backend: str, fleet: Fleet) -> dict[str, str]:
    """What each path of a run goes through, in words (printed and in the JSON)."""
    gw = target_text(fleet.gateway)
    if backend == "stand-in":
        ends = ", ".join(target_text(t) for t in fleet.standins().values())
        return {"direct": f"client -> stand-in ({ends}, rotated)",
                "gateway": f"client -> {gw} (nginx key check) -> vllm-router {fleet.router} -> stand-in "
                           f"({ends}, round robin)"}
    ends = ", ".join(target_text(t) for t in fleet.backends.values())
    return {"direct": f"client -> the host's front ({ends}, rotated; nginx -> vLLM)",
            "gateway": f"client -> {gw} (nginx key check) -> vllm-router {fleet.router} -> the same "
                       "fronts (round robin)"}


# --- measuring -----------------------------------------------------------------------------------

def measure_argv(direct: list[tuple[str, int]], gateway: tuple[str, int], concurrency: int, requests: int,
                 warmup: int, model: str, route: str = "completions") -> list[str]:
    """The arguments of `gateway_standin.py measure` after the script's path."""
    return ["measure", "--direct", ",".join(map(target_text, direct)), "--gateway", target_text(gateway),
            "--concurrency", str(concurrency), "--requests", str(requests), "--warmup", str(warmup),
            "--model", model, "--route", route]


def measure_on(sandbox, host: str | None, direct: list[tuple[str, int]], gateway: tuple[str, int],
               concurrency: int, requests: int, warmup: int, model: str, route: str = "completions") -> dict:
    """`gateway_standin.py measure` in a process of its own: here (host None; this process is
    gevent-patched once pyinfra's inventory loader is imported, so its threads would be greenlets)
    or on a sandbox host (the copied script, over SSH). Both run the same code on real threads."""
    args = measure_argv(direct, gateway, concurrency, requests, warmup, model, route)
    if host is None:
        proc = subprocess.run([sys.executable, "-I", str(BENCH / "gateway_standin.py"), *args],
                              capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise BenchError(f"the client failed ({proc.returncode}): {proc.stderr.strip()[-1500:]}")
        out = proc.stdout
    else:
        out = remote(sandbox, host, shlex.join(["python3", "-I", REMOTE_SCRIPT, *args]), timeout=1800,
                     what="the client on the gateway host")
    result = last_json_line(out)
    if result is None:
        raise BenchError(f"{host or 'this machine'}: the client printed no result: {out[-500:]}")
    return result


def judge(run: dict, backend: str) -> dict:
    """Adds target_met and, for stand-in runs, whether every answer came from a stand-in."""
    added_p50 = run["added"]["p50"]
    run["target_met"] = added_p50 is not None and added_p50 <= TARGET_MS
    if backend == "stand-in":
        elsewhere = sum(n for kind in ("direct", "gateway") for name, n in run["served_by"][kind].items()
                        if not name.startswith(standin.FINGERPRINT))
        run["answered_by_other_than_stand_ins"] = elsewhere
        run["valid"] = elsewhere == 0 and run["errors"] == 0
    else:
        run["valid"] = run["errors"] == 0
    return run


def fmt(value: float | None, width: int = 8) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.2f}"


HEADER = (f"{'policy':>15} {'backend':>8} {'client':>12} {'c':>3} {'kind':>8} {'n':>5} {'p50 ms':>8} "
          f"{'p99 ms':>8}")


def table_rows(run: dict) -> list[str]:
    """The printed lines of one run: direct, gateway, added (with the paired p50 and the verdict)."""
    head = f"{run.get('policy', '-'):>15} {run['backend']:>8} {run['client']:>12} {run['concurrency']:>3}"
    lines = [f"{head} {kind:>8} {run[kind]['n']:>5} {fmt(run[kind]['p50'])} {fmt(run[kind]['p99'])}"
             for kind in ("direct", "gateway")]
    a = run["added"]
    verdict = "met" if run["target_met"] else "NOT met"
    notes = [f"paired p50 {fmt(a['paired_p50'], 0)} [{fmt(a['paired_p10'], 0)}, {fmt(a['paired_p90'], 0)}]",
             f"<= {TARGET_MS:g} ms at p50: {verdict}"]
    if run["errors"]:
        notes.append(f"{run['errors']} error(s), e.g. {run['error_examples'][0]}")
    if run.get("answered_by_other_than_stand_ins"):
        notes.append(f"INVALID: {run['answered_by_other_than_stand_ins']} answers not from a stand-in")
    lines.append(f"{head} {'added':>8} {'':>5} {fmt(a['p50'])} {fmt(a['p99'])}  " + "; ".join(notes))
    return lines


def run_backend(backend: str, sandbox, fleet: Fleet, clients: list[str], concurrencies: list[int],
                requests: int, log, route: str = "completions", policy: str | None = None,
                round_no: int = 1) -> list[dict]:
    if backend == "stand-in":
        direct = list(fleet.standins().values())
    else:
        direct = list(fleet.backends.values())
    log(f"{backend}: direct = {paths_text(backend, fleet)['direct']}")
    log(f"{backend}: gateway = {paths_text(backend, fleet)['gateway']}")
    log(HEADER)
    # Warm-up: connections, nginx's and the router's upstream pools, the router's health state.
    measure_on(sandbox, None, direct, fleet.gateway, 4, WARMUP[backend], 0, fleet.model, route)
    runs = []
    for concurrency in concurrencies:
        for client in clients:
            host = fleet.gateway_host if client == "gateway-host" else None
            result = measure_on(sandbox, host, direct, fleet.gateway, concurrency, requests,
                                WARMUP[backend] // 4, fleet.model, route)
            run = judge({"backend": backend, "client": client, "policy": policy, "round": round_no, **result},
                        backend)
            runs.append(run)
            for line in table_rows(run):
                log(line)
    return runs


def deploy(log, policy: str | None = None) -> None:
    """The CPU hosts deployed as an operator would; with `policy`, as `--data vllm_gateway_policy=`."""
    from vllm_fleet.sandbox import assets

    _tiny, wheelhouse = assets.prepare(log=log)
    env = dict(os.environ, VLLM_FLEET_API_KEY=standin.API_KEY, VLLM_FLEET_WHEELHOUSE=str(wheelhouse))
    data = [] if policy is None else ["--data", f"vllm_gateway_policy={policy}"]
    log(f"deploying the 3 CPU hosts (the gateway on sbx-cpu1{f', policy {policy}' if policy else ''}) ...")
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "inventory/sandbox.py", "deploy.py",
                           "--limit", CPU_GROUP, *data], cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BenchError(f"deploy failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    log(f"deployed in {time.monotonic() - started:.0f} s")


def routing_costs(runs: list[dict]) -> list[dict]:
    """Per backend, client and concurrency: each policy's added p50 (the median of its rounds' paired
    p50s) and, beside round_robin's, its routing cost (the difference), judged against ROUTING_TARGET_MS
    at concurrency 1. Empty unless round_robin and another policy were measured."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for run in runs:
        paired = run["added"]["paired_p50"]
        if run.get("policy") and paired is not None and run["valid"]:
            key = (run["backend"], run["client"], run["concurrency"])
            groups.setdefault(key, {}).setdefault(run["policy"], []).append(paired)
    out = []
    for (backend, client, concurrency), by_policy in sorted(groups.items()):
        if "round_robin" not in by_policy or len(by_policy) < 2:
            continue
        base = standin.percentile(by_policy["round_robin"], 50)
        for policy, values in by_policy.items():
            if policy == "round_robin":
                continue
            added_p50 = standin.percentile(values, 50)
            cost = added_p50 - base
            out.append({"backend": backend, "client": client, "concurrency": concurrency, "policy": policy,
                        "rounds": len(values), "added_p50": added_p50, "round_robin_added_p50": base,
                        "routing_cost_p50": cost,
                        "target_met": cost <= ROUTING_TARGET_MS if concurrency == 1 else None})
    return out


def cost_rows(costs: list[dict]) -> list[str]:
    lines = [f"{'policy':>15} {'backend':>8} {'client':>12} {'c':>3} {'added p50':>10} {'rr p50':>8} "
             f"{'cost p50':>9}"]
    for c in costs:
        verdict = "" if c["target_met"] is None else (
            f"  <= {ROUTING_TARGET_MS:g} ms: {'met' if c['target_met'] else 'NOT met'}")
        lines.append(f"{c['policy']:>15} {c['backend']:>8} {c['client']:>12} {c['concurrency']:>3} "
                     f"{fmt(c['added_p50'], 10)} {fmt(c['round_robin_added_p50'])} "
                     f"{fmt(c['routing_cost_p50'], 9)}{verdict}")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=(*BACKENDS, "both"), default="stand-in",
                        help="stand-in: instant backends, the gateway's own overhead (default); vllm: the "
                             "deployed CPU vLLMs; both: stand-in, then vllm")
    parser.add_argument("--client", choices=(*CLIENTS, "both"), default="both",
                        help="where the client runs: this machine, sbx-cpu1 (the gateway host), or both")
    parser.add_argument("--requests", type=int, default=None,
                        help=f"per kind, client and concurrency (default {DEFAULT_REQUESTS['stand-in']} with "
                             f"stand-ins, {DEFAULT_REQUESTS['vllm']} with vLLM)")
    parser.add_argument("--concurrency", default="1,16", help="comma-separated (default 1,16)")
    parser.add_argument("--route", choices=standin.ROUTES, default="completions",
                        help="completions: a one-word prompt (default); chat: a 2.6 kB conversation turn")
    parser.add_argument("--policy", default=None,
                        help="comma-separated vllm_gateway_policy values, each deployed in turn (default: "
                             "the inventory's); with round_robin among them, the others' routing cost")
    parser.add_argument("--rounds", type=int, default=1, help="times through --policy, A B A B (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout, progress on stderr")
    args = parser.parse_args(argv)
    args.backends = list(BACKENDS) if args.backend == "both" else [args.backend]
    args.clients = list(CLIENTS) if args.client == "both" else [args.client]
    try:
        args.concurrencies = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--concurrency {args.concurrency!r}: expected numbers, e.g. 1,16")
    if not args.concurrencies or min(args.concurrencies) < 1 or (args.requests is not None and args.requests < 1):
        parser.error("--concurrency and --requests must be positive")
    from vllm_fleet.config.knobs.gateway import GATEWAY_POLICIES

    args.policies = [p.strip() for p in args.policy.split(",") if p.strip()] if args.policy else [None]
    unknown = [p for p in args.policies if p is not None and p not in GATEWAY_POLICIES]
    if unknown or len(set(args.policies)) != len(args.policies):
        parser.error(f"--policy {args.policy!r}: each of {', '.join(GATEWAY_POLICIES)}, once")
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    out = sys.stderr if args.json else sys.stdout

    def log(line: str) -> None:
        print(line, file=out, flush=True)

    image.require_root()
    full = hosts.load(INVENTORY)
    cpu_hosts = [h.name for h in full.hosts if CPU_GROUP in h.groups]
    fleet = load_fleet(cpu_hosts)
    sandbox = harness.Sandbox(full.inventory, [h for h in full.hosts if h.name in cpu_hosts])
    result: dict = {"target_ms": TARGET_MS, "routing_target_ms": ROUTING_TARGET_MS, "route": args.route,
                    "gateway_host": fleet.gateway_host, "model": fleet.model,
                    "paths": {b: paths_text(b, fleet) for b in args.backends}, "runs": []}
    sublog = lambda line: log(f"  {line}")  # noqa: E731
    schedule = [(r, p) for r in range(1, args.rounds + 1) for p in args.policies]
    try:
        harness.up(sandbox, log=sublog)
        deploy(sublog, schedule[0][1])
        push(sandbox, fleet.gateway_host, REMOTE_SCRIPT, (BENCH / "gateway_standin.py").read_bytes())
        for backend in args.backends:
            requests = args.requests or DEFAULT_REQUESTS[backend]
            if backend == "vllm":
                for i, (round_no, policy) in enumerate(schedule):
                    if i:
                        deploy(sublog, policy)
                    result["runs"] += run_backend(backend, sandbox, fleet, args.clients, args.concurrencies,
                                                  requests, log, args.route, policy, round_no)
                continue
            for host in fleet.standins():
                if host != fleet.gateway_host:
                    push(sandbox, host, REMOTE_SCRIPT, (BENCH / "gateway_standin.py").read_bytes())
            standins = StandIns(sandbox, fleet, log)
            try:
                standins.start()
                for i, (round_no, policy) in enumerate(schedule):
                    if i:
                        # The deploy restarts the router with the deployed workers: the stand-ins go back in.
                        deploy(sublog, policy)
                    standins.route_to_standins()
                    result["runs"] += run_backend(backend, sandbox, fleet, args.clients, args.concurrencies,
                                                  requests, log, args.route, policy, round_no)
            finally:
                for step in (standins.restore, standins.stop):  # each tried, whatever the other did
                    try:
                        step()
                    except Exception as exc:  # noqa: BLE001 - the hosts are stopped next in any case
                        log(f"teardown: {step.__name__} failed: {exc!r}")
                result.update(standins.report)
    finally:
        harness.down(sandbox)
        log("sandbox hosts stopped")
    standin_runs = [r for r in result["runs"] if r["backend"] == "stand-in"]
    if standin_runs:
        met = all(r["target_met"] and r["valid"] for r in standin_runs if r["concurrency"] == 1)
        result["target_met_at_concurrency_1"] = met
        log(f"target <= {TARGET_MS:g} ms added at p50 (stand-in backends, concurrency 1, every client): "
            f"{'met' if met else 'NOT met'}")
    result["routing_costs"] = routing_costs(result["runs"])
    if result["routing_costs"]:
        log(f"routing cost (a policy's added p50 minus round_robin's; median over {args.rounds} round(s)):")
        for line in cost_rows(result["routing_costs"]):
            log(line)
    if args.json:
        print_json(result)


if __name__ == "__main__":
    try:
        main()
    except (BenchError, harness.SandboxError) as exc:
        sys.exit(f"gateway bench: {exc}")
