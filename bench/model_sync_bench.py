"""Model sync bench: what a no-op deploy costs when the instance's model_source is large.

Run as root (it boots the 3 CPU sandbox hosts and stops them): `sudo .venv/bin/python bench/model_sync_bench.py`

1. A model directory of >= 4 GiB in >= 20 files: the tiny model (which vLLM loads) plus filler files
   vLLM never reads (`extra-NN.dat`; it loads *.safetensors). Made once, cached.
2. Converge the 3 CPU hosts onto it (the first sync, timed, with the bytes sent), then no-op deploys;
   then the same with the tiny model alone; runs alternate big/tiny after the first converge of each.
   The no-op difference (big - tiny), per host, is the figure: the target is <= 1 s per host.
3. One filler file changed in place (same size, same name): only that file is sent again (counted
   from the deploy's own log lines), and the instance restarts (its MainPID changes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from benchlib import CPU_HOSTS, GROUP_DATA, REPO, SANDBOX_INVENTORY, cpu_sandbox, deploy_env, inventory_dir
from vllm_fleet.sandbox import assets, harness, image

FILES, FILE_MIB = 20, 206  # 20 x 206 MiB = 4.02 GiB, plus the tiny model's own files
API_KEY = "sk-bench-model-sync"


def big_model_dir() -> Path:
    """The tiny model's files plus FILES filler files, each of distinct content; made once."""
    target = harness.cache_dir() / "bench" / f"big-model-{FILES}x{FILE_MIB}"
    if (target / ".complete").exists():
        return target
    tiny, _wheelhouse = assets.prepare(log=lambda line: print(f"  {line}"))
    target.mkdir(parents=True, exist_ok=True)
    for f in tiny.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    block = os.urandom(1 << 20)
    for i in range(FILES):
        with open(target / f"extra-{i:02d}.dat", "wb") as out:
            for mib in range(FILE_MIB):
                out.write(i.to_bytes(4, "little") + mib.to_bytes(4, "little") + block[8:])
    for f in target.iterdir():
        f.chmod(0o644)
    (target / ".complete").write_text("")
    return target


def inventory(tmp: Path, name: str, model_source: Path) -> Path:
    """inventory/sandbox.py's 3 CPU hosts with the instance's model taken from model_source."""
    d = inventory_dir(tmp, name)
    (d / "sandbox.py").write_text(textwrap.dedent(f"""
        import copy, runpy
        _base = runpy.run_path({str(SANDBOX_INVENTORY)!r})
        _group = runpy.run_path({str(GROUP_DATA / 'sandbox.py')!r})
        _inst = copy.deepcopy(_group["vllm_instances"][0])
        _inst.update(model_source={str(model_source)!r}, model="/var/lib/vllm-fleet/models/" + {name!r})
        cpu_hosts = [(n, dict(d, vllm_instances=[_inst])) for n, d in _base["cpu_hosts"]]
    """))
    return d / "sandbox.py"


def deploy(inv: Path, env: dict) -> tuple[float, str]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pyinfra", "-y", str(inv), "deploy.py"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:])
        raise SystemExit(f"deploy with {inv} failed")
    return seconds, proc.stdout + proc.stderr


def main_pids(sandbox) -> dict[str, str]:
    return {h: sandbox.run(h, "systemctl show -p MainPID --value vllm-tiny.service").stdout.strip()
            for h in CPU_HOSTS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="no-op runs of each kind (alternated)")
    args = parser.parse_args()
    image.require_root()
    big = big_model_dir()
    files = sorted(p for p in big.iterdir() if not p.name.startswith("."))
    size = sum(p.stat().st_size for p in files)
    print(f"model directory {big}: {len(files)} files, {size / 2**30:.2f} GiB")
    tiny = assets.tiny_model_dir()
    env = deploy_env(API_KEY)
    sandbox = cpu_sandbox()
    tmp = harness.cache_dir() / "bench" / "inventories"
    inv = {"big": inventory(tmp, "big", big), "tiny": inventory(tmp, "tiny", tiny)}
    try:
        harness.up(sandbox, log=lambda line: print(f"  {line}"))
        for kind in ("tiny", "big"):
            seconds, _out = deploy(inv[kind], env)
            print(f"first converge, {kind} model: {seconds:.1f} s for 3 hosts"
                  + (f" ({size / 2**30:.2f} GiB to each host, {3 * size / seconds / 2**20:.0f} MiB/s in all)"
                     if kind == "big" else ""))
        # No-ops in a row for each model (switching model paths changes the unit: not a no-op).
        noop: dict[str, list[float]] = {}
        for kind in ("big", "tiny"):
            deploy(inv[kind], env)  # converge onto it (the switch restarts the instance)
            noop[kind] = [deploy(inv[kind], env)[0] for _ in range(args.runs)]
        for kind in ("big", "tiny"):
            runs = noop[kind]
            print(f"no-op deploy, {kind} model: median {statistics.median(runs):.2f} s "
                  f"(min {min(runs):.2f}, max {max(runs):.2f}, {len(runs)} runs, 3 hosts, verification included)")
        diff = statistics.median(noop["big"]) - statistics.median(noop["tiny"])
        print(f"no-op difference big - tiny: {diff:+.2f} s for 3 hosts in parallel "
              f"({diff:+.2f} s per host; target <= 1 s per host)")

        deploy(inv["big"], env)  # onto the big model again
        before = main_pids(sandbox)
        victim = big / "extra-07.dat"
        with open(victim, "r+b") as f:  # same size, other bytes
            f.seek(12345)
            f.write(os.urandom(4096))
        seconds, out = deploy(inv["big"], env)
        lines = [line for line in out.splitlines() if "model sync" in line and ": sending " in line]
        sent = sorted({line.split(": sending ", 1)[1].split(" (")[0] for line in lines})
        after = main_pids(sandbox)
        restarted = [h for h in CPU_HOSTS if after[h] != before[h]]
        print(f"one file changed ({victim.name}, same size): deploy {seconds:.1f} s; {len(lines)} file "
              f"transfers for 3 hosts, of: {', '.join(sent) or 'nothing'}; instance restarted on "
              f"{len(restarted)} of 3 hosts")
    finally:
        harness.down(sandbox)


if __name__ == "__main__":
    main()
