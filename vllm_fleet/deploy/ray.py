"""Steps 8 and 9 on the nodes of a multi-node instance: this host's Ray node (the head restarted
before its workers rejoin), the wait for every node before the head's vLLM starts, and the
cluster's verification."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from pyinfra import host, logger
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python, server

from vllm_fleet.facts import batch as facts
from vllm_fleet.facts import ray_cluster
from vllm_fleet.connect import remote
from vllm_fleet.operations.managed import systemd_service
from vllm_fleet.facts.state import NewestMtime, UnitState
from vllm_fleet.host_layout import RAY_UNIT, host_layout

from .managed import ray_freshness_paths
from .state import Deployment, record_failure

# The workers whose Ray unit _join_cluster (re)started in a run (by State, like state._FAILURES): its
# python.call always "runs", and rollout counts it as a change only then (ray_worker_restarted).
_RAY_RESTARTED: "weakref.WeakKeyDictionary[Any, set[str]]" = weakref.WeakKeyDictionary()


def ray_worker_restarted(state, host_name: str) -> bool:
    return host_name in _RAY_RESTARTED.get(state, set())


def ray_service(deployment: Deployment) -> Callable[[], bool]:
    """7 (nodes of a multi-node instance). This host's Ray node. Returns whether it is restarted
    (a callable, known at execution): the head's vLLM then restarts too.

    The head first (its operations come first, so they run on every head before any worker's):
    restarted when its unit or the environment changed, else started if it is not running. Stop,
    then start (not `restart`): vLLM's unit Requires= Ray's, so stopping Ray stops vLLM, while
    `restart` would restart vLLM at once, before the workers are back; vLLM is started again by its
    own operation once the cluster has every node (wait_for_cluster).

    Then each worker, restarted when its own unit or the environment changed, or when it is not in
    the head's cluster now (the head restarted: a worker of the old head would take a minute to
    notice and rejoin; or it is stopped). Started only after the head's restart, never joining a head
    that is going down."""
    role = deployment.plan.ray
    if role is None:
        return lambda: False
    unit = RAY_UNIT
    unit_state = facts.get(host, UnitState, unit=unit)
    running = unit_state["running"]
    # A process older than its unit or environment: an earlier deploy stopped before restarting it.
    stale = (bool(unit_state["main_pid"]) and unit_state["started"] is not None
             and unit_state["started"] < facts.get(host, NewestMtime, paths=ray_freshness_paths(deployment.config)))
    files_changed = deployment.changes.restarts(unit)  # its unit or the environment (handlers.HANDLERS)

    def restart():
        return stale or files_changed()

    if role.is_head:
        # One operation, right after daemon-reload like the workers' own: pyinfra runs operations
        # that become ready together in the order of the deploy's code lines (pyinfra/api/state.py
        # get_op_order), so this one runs on the head before the workers' below.
        why = "its unit or environment changed" if running else "it was not running"
        server.shell(name=f"(Re)start {unit}, the Ray head ({why})", _if=lambda: restart() or not running,
                     commands=[_ray_restart(unit)])
        systemd_service(name=f"Ensure {unit} is enabled and running", unit=unit, running=True, enabled=True,
                        _if=lambda: running and not restart())
        return lambda: restart() or not running
    spec = cluster_spec(deployment, 0, only_this_node=True)  # is this worker in the head's cluster now?
    python.call(name=f"Ray worker {unit} of {role.instance}: in the cluster of {role.head}, else (re)started",
                function=_join_cluster, spec=spec, restart=restart, running=running)
    return restart


def _ray_restart(unit: str) -> str:
    return (f"systemctl stop {unit}; systemctl reset-failed {unit} 2>/dev/null; "
            f"systemctl enable --quiet {unit} && systemctl start {unit}")


def _join_cluster(state, host, spec: dict[str, Any], restart, running: bool) -> None:  # at execution
    """A worker: (re)start its Ray unit when its unit or the environment changed, when it was not
    running, or when the head's cluster does not list it alive (one probe, no wait)."""
    if restart():
        why = "its unit or environment changed"
    elif not running:
        why = "it was not running"
    else:
        result = ray_cluster.check(host, spec)
        if result["ok"]:
            return
        why = (f"the Ray head at {spec['head_address']} does not list it: "
               f"{result.get('error') or 'the head restarted or the worker left'}")
    ok, _out, err = remote.run(host, _ray_restart(RAY_UNIT))
    if not ok:
        raise OperationError(f"host {host.name}: could not start {RAY_UNIT}: {err.strip()[-500:]}")
    logger.info(f"{host.print_prefix}(re)started {RAY_UNIT}, the Ray worker of {spec['instance']} ({why})")
    _RAY_RESTARTED.setdefault(host.state, set()).add(host.name)


def cluster_spec(deployment: Deployment, timeout_s: int, only_this_node: bool = False) -> dict[str, Any]:
    """What ray_cluster's probe checks: every node (or this one) alive at its address with the GPUs
    the tool declared to Ray (`ray start --num-gpus`), waiting at most `timeout_s`, or
    vllm_verify_timeout_s when that is set and shorter."""
    config = deployment.config
    bound = config.settings.vllm_verify_timeout_s
    return ray_cluster.spec(deployment.plan.ray, config, env_prefix=host_layout(config).current,
                            timeout_s=int(min(timeout_s, bound)) if bound else timeout_s,
                            only_this_node=only_this_node)


def wait_for_cluster(state, host, spec: dict[str, Any]) -> None:  # runs at execution, on the head
    result = ray_cluster.check(host, spec)
    if not result["ok"]:
        text = ray_cluster.failure_text(host.name, spec, result)
        record_failure(host, text)
        raise OperationError(text + "\n  vLLM's unit was not started; run the deploy again once every node is up")
    logger.info(f"{host.print_prefix}{ray_cluster.success_text(spec)}")


def verify_ray_node(state, host, spec: dict[str, Any]) -> None:  # runs at execution
    """The head: the cluster has every node, alive at its address, with its GPUs. A worker: the
    head's cluster has it (asked of the head's GCS from the worker, so it holds in a run without
    the head too): `spec` names only this node then."""
    result = ray_cluster.check(host, spec)
    if not result["ok"]:
        text = ray_cluster.failure_text(host.name, spec, result)
        record_failure(host, text)
        raise OperationError(text)
    if spec["is_head"]:
        logger.info(f"{host.print_prefix}verified {ray_cluster.success_text(spec)}")
    else:
        logger.info(f"{host.print_prefix}verified the Ray worker of {spec['instance']}: alive in the cluster of "
                    f"{spec['head']} ({spec['head_address']})")
