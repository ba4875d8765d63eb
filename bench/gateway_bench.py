"""Gateway bench: the latency the fleet gateway adds to a request, against direct requests.

Run as root (it boots the 3 CPU sandbox hosts, deploys them with the gateway on sbx-cpu1, and
stops them): `sudo .venv/bin/python bench/gateway_bench.py [--requests 300]`

The same 1-token completion of the tiny model, sent from this machine:
- direct: to the instances' own fronts (nginx on each host), the client rotating over the three;
- gateway: to sbx-cpu1:9000 (nginx with the key check, then vllm-router, which rotates over the
  same three fronts).
So the difference is the gateway's hop (its nginx + vllm-router + one more connection). At
concurrency 1 and 16, blocks of direct and gateway requests alternate (A B A B ...); each thread
keeps its HTTP connections open, as a client library does. Printed: p50 and p99 of each, and the
p50/p99 added by the gateway (the target is <= 2 ms at p50).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vllm_fleet.sandbox import assets, harness  # noqa: E402

CPU_HOSTS = {"sbx-cpu1": "10.213.7.11", "sbx-cpu2": "10.213.7.12", "sbx-cpu3": "10.213.7.13"}
GATEWAY = ("10.213.7.11", 9000)
API_KEY = "sk-bench-gateway"
BODY = json.dumps({"model": "tiny-llama", "prompt": "Hello", "max_tokens": 1})
BLOCK = 20  # requests per thread per block before switching between direct and gateway


def _run_block(targets: list[tuple[str, int]], n: int, conns: dict, out: list[float], errors: list[str]) -> None:
    for i in range(n):
        target = targets[i % len(targets)]
        conn = conns.get(target) or http.client.HTTPConnection(*target, timeout=60)
        conns[target] = conn
        started = time.perf_counter()
        try:
            conn.request("POST", "/v1/completions", BODY, {"Content-Type": "application/json",
                                                          "Authorization": f"Bearer {API_KEY}"})
            resp = conn.getresponse()
            resp.read()
            if resp.status != 200:
                errors.append(f"{target}: {resp.status}")
                continue
        except (OSError, http.client.HTTPException) as exc:
            errors.append(f"{target}: {exc!r}")
            conns.pop(target, None)
            continue
        out.append((time.perf_counter() - started) * 1000)


def measure(concurrency: int, total: int) -> dict[str, dict[str, float]]:
    direct_targets = [(address, 8000) for address in CPU_HOSTS.values()]
    samples: dict[str, list[float]] = {"direct": [], "gateway": []}
    errors: list[str] = []
    rounds = max(1, total // (BLOCK * concurrency))

    def worker(offset: int) -> None:
        conns: dict = {}
        for r in range(rounds):
            order = ("direct", "gateway") if (r + offset) % 2 == 0 else ("gateway", "direct")
            for kind in order:
                local: list[float] = []
                rotated = direct_targets[offset % 3:] + direct_targets[:offset % 3]
                _run_block(rotated if kind == "direct" else [GATEWAY], BLOCK, conns, local, errors)
                with lock:
                    samples[kind].extend(local)

    lock = threading.Lock()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print(f"    {len(errors)} error(s), e.g. {errors[0]}")
    return {kind: {"n": len(v), "p50": statistics.median(v), "p99": statistics.quantiles(v, n=100)[98]}
            for kind, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400, help="per kind and concurrency")
    args = parser.parse_args()
    harness.require_root()
    full = harness.load(REPO / "inventory" / "sandbox.py")
    sandbox = harness.Sandbox(full.inventory, [h for h in full.hosts if h.name in CPU_HOSTS])
    try:
        harness.up(sandbox, log=lambda line: print(f"  {line}"))
        _tiny, wheelhouse = assets.prepare(log=lambda line: print(f"  {line}"))
        env = dict(os.environ, VLLM_FLEET_API_KEY=API_KEY, VLLM_FLEET_WHEELHOUSE=str(wheelhouse))
        print("deploying the 3 CPU hosts (the gateway on sbx-cpu1) ...")
        proc = subprocess.run([sys.executable, "-m", "pyinfra", "-y", "inventory/sandbox.py", "deploy.py",
                               "--limit", "cpu_hosts"], cwd=REPO, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"deploy failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
        measure(4, 200)  # warm-up: connections, the router's health state, vLLM's first batches
        print(f"\n{'concurrency':>11} {'kind':>8} {'n':>5} {'p50 ms':>8} {'p99 ms':>8}")
        for concurrency in (1, 16):
            result = measure(concurrency, args.requests)
            for kind in ("direct", "gateway"):
                r = result[kind]
                print(f"{concurrency:>11} {kind:>8} {r['n']:>5} {r['p50']:>8.2f} {r['p99']:>8.2f}")
            added = {q: result["gateway"][q] - result["direct"][q] for q in ("p50", "p99")}
            print(f"{concurrency:>11} {'added':>8} {'':>5} {added['p50']:>8.2f} {added['p99']:>8.2f}")
    finally:
        harness.down(sandbox)
        print("sandbox hosts stopped")


if __name__ == "__main__":
    main()
