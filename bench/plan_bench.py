"""Planning speed: 1,000 hosts of mixed GPU layouts and models. Target: < 1 s. Prints figures.

    python bench/plan_bench.py [--hosts N]
"""

from __future__ import annotations

import argparse
import random
import time

from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.plan import plan_host

LAYOUTS = [
    [("NVIDIA GeForce RTX 4090 D", 24564), ("NVIDIA A100-SXM4-40GB", 40960), ("NVIDIA A100-SXM4-40GB", 40960)],
    [("NVIDIA A100-SXM4-40GB", 40960)] * 2,
    [("NVIDIA H100 80GB HBM3", 81559)] * 8,
    [("NVIDIA GeForce RTX 3090", 24576)] * 4,
    [("NVIDIA A100-SXM4-80GB", 81920)] * 4 + [("NVIDIA L40S", 46068)] * 4,
    [("Tesla T4", 15360)] * 2,
]
MODELS = [
    ("google/gemma-3-12b-it", 16384), ("Qwen/Qwen2.5-7B-Instruct", 32768),
    ("Qwen/Qwen2.5-14B-Instruct", 8192), ("meta-llama/Meta-Llama-3-70B-Instruct", 8192),
    ("meta-llama/Meta-Llama-3-8B-Instruct", 8192), ("Qwen/Qwen2.5-72B-Instruct", 8192),
]


def fleet(count: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        layout = rng.choice(LAYOUTS)
        model, max_len = rng.choice(MODELS)
        out.append({
            "gpus": [{"name": n, "memory_mib": m} for n, m in layout],
            "placement": rng.choice(["auto", "auto", "single-instance", "split"]),
            "vllm_instances": [{"name": f"m{i}", "model": model, "served_model_name": "m",
                                "port": 8000, "max_model_len": max_len}],
        })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=1000)
    args = parser.parse_args()
    data = fleet(args.hosts)
    start = time.perf_counter()
    hosts = [parse_host(f"h{i}", d) for i, d in enumerate(data)]
    parsed = time.perf_counter()
    planned = rejected = instances = 0
    for host in hosts:
        try:
            instances += len(plan_host(host).instances)
            planned += 1
        except ConfigErrors:
            rejected += 1
    done = time.perf_counter()
    print(f"hosts: {args.hosts}  planned: {planned}  rejected (does not fit etc.): {rejected}  "
          f"instances: {instances}")
    print(f"validate: {parsed - start:.3f} s   plan: {done - parsed:.3f} s   total: {done - start:.3f} s "
          f"(target < 1 s)  per host: {(done - start) / args.hosts * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
