"""A host's rollback for `vllm-fleet rollout`: before a host changes, its managed files, its
`current` environment link and its unit list are copied aside, root-only, on the host
(`snapshot_command`); a host that fails is restored from that copy, restarted and verified again
(`roll_back`), the nodes of a multi-node instance as one (`roll_back_group`)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from vllm_fleet.environment import current_link
from vllm_fleet.facts.host import MANAGED_UNIT_FILES
from vllm_fleet.facts.verify import SERVED_TASKS, InstanceCheck, format_failure, parse_probe_output, probe_command
from vllm_fleet.render import front_paths, instance_paths
from vllm_fleet.render_front import front_probe_address
from vllm_fleet.host_layout import RAY_UNIT, host_layout


def snapshot_command(config) -> str:
    """Copy the managed files and the `current` link target aside, root-only, on the host."""
    snap = shlex.quote(host_layout(config).rollback_dir)
    conf = shlex.quote(config.settings.vllm_config_dir)
    cur = shlex.quote(current_link(config.settings.vllm_root))
    # `cd /`: coreutils 9.1's `cp -a --parents` fails on absolute sources from any other cwd.
    return (f"set -e; cd /; rm -rf {snap}.new; install -d -m 0700 {snap}.new/files; "
            f"for f in $({MANAGED_UNIT_FILES}) $(ls -d {conf}/*.yaml {conf}/*.env {conf}/front.conf {conf}/manifest.json 2>/dev/null); "
            f"do cp -a --parents \"$f\" {snap}.new/files/; done; "
            f"(readlink {cur} || true) > {snap}.new/current; "
            f"({MANAGED_UNIT_FILES} || true) | xargs -r -n1 basename > {snap}.new/units; "
            f"rm -rf {snap} && mv {snap}.new {snap}; cat {conf}/manifest.json 2>/dev/null || echo '{{}}'")


def restore_command(config, restart: bool = True) -> str:
    """Put the snapshot back: files, `current`, units; stop instances the snapshot did not have.
    `restart`: then restart the snapshot's units (restart_command); a node group's rollback
    restarts them later, once every node has its files back."""
    snap = shlex.quote(host_layout(config).rollback_dir)
    conf = shlex.quote(config.settings.vllm_config_dir)
    envs = shlex.quote(str(Path(current_link(config.settings.vllm_root)).parent))
    return (f"set -e; test -d {snap}; "
            f"for u in $({MANAGED_UNIT_FILES} | xargs -r -n1 basename); do "
            f"grep -qx \"$u\" {snap}/units || systemctl disable --now \"$u\" || true; done; "
            f"rm -f $({MANAGED_UNIT_FILES}) {conf}/*.yaml {conf}/*.env {conf}/front.conf {conf}/manifest.json; "
            # File by file: copying the tree onto / would also copy its directories' modes onto /.
            f"(cd {snap}/files && find . -type f | while read -r f; do cp -p \"$f\" \"/${{f#./}}\"; done); "
            f"if [ -s {snap}/current ]; then ln -sfn \"$(cat {snap}/current)\" {envs}/.current.tmp && "
            f"mv -T {envs}/.current.tmp {envs}/current; fi; "
            f"systemctl daemon-reload" + (f"; {restart_command(config)}" if restart else ""))


def restart_command(config) -> str:
    """Restart the snapshot's units. A node's Ray unit first and blocking (its old processes gone,
    the new one started), so a worker restarted after its head joins the new head, never the old."""
    snap = shlex.quote(host_layout(config).rollback_dir)
    return (f"set -e; if grep -qx {RAY_UNIT} {snap}/units; then systemctl reset-failed {RAY_UNIT} 2>/dev/null; "
            f"systemctl enable {RAY_UNIT} && systemctl restart {RAY_UNIT}; fi; "
            f"for u in $(grep -vx {RAY_UNIT} {snap}/units || true); do systemctl reset-failed \"$u\" 2>/dev/null; "
            f"systemctl enable \"$u\" && systemctl restart --no-block \"$u\"; done")


def checks_from_manifest(config, manifest: dict[str, Any]) -> list[InstanceCheck]:
    return [InstanceCheck(name=name, unit=info["unit"], port=info.get("backend_port") or info["port"],
                          front_port=info["port"] if info.get("backend_port") else None,
                          front_address=front_probe_address((manifest.get("front") or {}).get("bind", "0.0.0.0")),
                          front_ca=front_paths(config)["tls_trust"] if (manifest.get("front") or {}).get("tls") else None,
                          served_model_name=info["served_model_name"],
                          max_model_len=info.get("max_model_len") or None,
                          env_file=instance_paths(config, name)["env"],
                          timeout_s=int(info.get("start_timeout_s", 600)),
                          gpu_bus_ids=list(info.get("gpu_bus_ids") or []),
                          task=info.get("task") if info.get("task") in SERVED_TASKS else "generate")
            for name, info in manifest.get("instances", {}).items()]


def manifest_summary(manifest: dict[str, Any]) -> dict[str, Any]:
    return {"environment": (manifest.get("environment") or {}).get("prefix"),
            "config_hash": {n: i.get("config_hash") for n, i in manifest.get("instances", {}).items()}}


def roll_back(host, config, before: dict[str, Any], restore: bool = True) -> tuple[bool, str]:
    """Restore the host's snapshot and restart its units (`restore`: False when that is done
    already), then verify the instances it had."""
    from vllm_fleet.connect.remote import run

    if restore:
        ok, _out, err = run(host, restore_command(config), timeout=300)
        if not ok:
            return False, f"restore failed: {err.strip()[-500:]}"
    checks = checks_from_manifest(config, before)
    if not checks:
        return True, "restored (no instance before)"
    ok, out, err = run(host, probe_command(checks), timeout=max(c.timeout_s for c in checks) + 120)
    results = parse_probe_output(out)
    failed = [r for r in results if not r.get("ok")]
    if not results or failed:
        return False, "\n".join(format_failure(host.name, r) for r in failed) or err[-500:]
    return True, "restored and verified"


def roll_back_group(hosts: list, configs: list, befores: list[dict[str, Any]]) -> tuple[bool, str]:
    """Roll a node group back as one (hosts in group order, the head first): every node's files
    first, nothing restarted; then the head's units (Ray, then its vLLM, which waits for its
    placement group until the workers are back), then each worker's Ray, joining the restarted head;
    then the cluster (every node the snapshots had, alive with its GPUs) and the head's instances
    are verified."""
    from vllm_fleet.facts import ray_cluster
    from vllm_fleet.connect.remote import run

    for host, config in zip(hosts, configs, strict=True):
        ok, _out, err = run(host, restore_command(config, restart=False), timeout=300)
        if not ok:
            return False, f"restore failed on {host.name}: {err.strip()[-500:]}"
    for host, config in zip(hosts, configs, strict=True):
        ok, _out, err = run(host, restart_command(config), timeout=300)
        if not ok:
            return False, f"restart failed on {host.name}: {err.strip()[-500:]}"
    head, head_config, head_before = hosts[0], configs[0], befores[0]
    rays = [b.get("ray") for b in befores]
    if all(rays):  # the group existed before this rollout: its cluster is back
        spec = ray_cluster.group_spec(
            instance=rays[0]["instance"], head=rays[0]["head"], head_address=rays[0]["head_address"],
            nodes={host.name: {"address": r["address"], "gpus": len(r["gpus"])}
                   for host, r in zip(hosts, rays, strict=True)},
            config=head_config, env_prefix=current_link(head_config.settings.vllm_root),
            timeout_s=ray_cluster.JOIN_TIMEOUT_S)
        res = ray_cluster.check(head, spec)
        if not res["ok"]:
            return False, ray_cluster.failure_text(head.name, spec, res)
    ok, message = roll_back(head, head_config, head_before, restore=False)
    return ok, message + (" (the Ray cluster of every node verified)" if all(rays) else "")
