"""Step 8: daemon-reload only if a unit changed; a multi-node instance's Ray nodes (ray.py); restart
only the instances whose files, environment or model changed; then the front; then the exporters,
Alertmanager and Prometheus (vllm_metrics, vllm_monitoring)."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.operations import python, server, systemd

from vllm_fleet.facts import batch as facts
from vllm_fleet.facts import ray_cluster
from vllm_fleet.facts.state import NewestMtime, UnitState
from vllm_fleet.operations.managed import systemd_service
from vllm_fleet.host_layout import ALERTMANAGER_UNIT, EXPORTER_UNIT, NODE_EXPORTER_UNIT, PROMETHEUS_UNIT
from vllm_fleet.host_layout import FRONT_UNIT

from . import ray
from .handlers import run_handlers
from .managed import freshness_paths
from .state import Deployment


def services(deployment: Deployment) -> None:
    """8. daemon-reload only if a unit changed; restart an instance only if its files or env changed.

    "Changed" includes a change an interrupted deploy made without restarting: a process older than
    its files (or a unit systemd has not reloaded) is restarted (or reloaded) by the next run.
    """
    config, plan, changes = deployment.config, deployment.plan, deployment.changes
    units = {inst.name: facts.get(host, UnitState, unit=inst.unit_name) for inst in plan.instances}
    newest = {inst.name: facts.get(host, NewestMtime, paths=freshness_paths(config, inst))
              for inst in plan.instances}
    pending_reload = [name for name, unit_state in units.items() if unit_state["need_daemon_reload"]]
    # The other services' units too (the front's, the gateway's, Ray's, the monitoring's): a run
    # stopped between writing them and daemon-reload.
    pending_reload += [unit for unit, service in changes.services.items() if service.service != "instance"
                       and facts.get(host, UnitState, unit=unit)["need_daemon_reload"]]
    if changes.unit_files() or pending_reload:
        if pending_reload:
            logger.info(f"{host.print_prefix}systemd has not loaded the unit of {', '.join(pending_reload)} "
                        "(an earlier deploy stopped before daemon-reload)")
        units_changed = changes.any_unit_file_changed()
        systemd.daemon_reload(name="systemd daemon-reload (a unit changed)",
                              _if=lambda: bool(pending_reload) or units_changed())
    ray_restarted = ray.ray_service(deployment)
    state = host.state
    workers = plan.ray.nodes[1:] if plan.ray is not None and plan.ray.is_head else ()

    def group_restarted() -> bool:  # at execution: the workers' join ran before the head's operations below
        """This head's Ray, or a worker's (ray._join_cluster), was (re)started in this run: vLLM's
        pipeline stages there are gone, so the head's vLLM restarts too."""
        return ray_restarted() or any(ray.ray_worker_restarted(state, worker) for worker in workers)

    decided = []
    for inst in plan.instances:
        unit_state = units[inst.name]
        if unit_state["main_pid"] and unit_state["started"] is None:
            logger.warning(f"{host.print_prefix}could not read when {inst.unit_name}'s process started: "
                           "not checked for being older than its files")
        stale = (bool(unit_state["main_pid"]) and unit_state["started"] is not None
                 and unit_state["started"] < newest[inst.name])
        if stale:
            logger.info(f"{host.print_prefix}{inst.unit_name} runs since before its files changed (an "
                        "earlier deploy stopped before restarting it): it will be restarted")
        files_changed = changes.restarts(inst.unit_name)
        on_ray = bool(inst.nodes)  # the head of a multi-node instance: Ray restarted, vLLM restarts

        def needs_restart(stale=stale, files_changed=files_changed, on_ray=on_ray):
            return stale or files_changed() or (on_ray and group_restarted())

        decided.append((inst, unit_state["running"], needs_restart))
    for inst, running, changed in decided:
        if inst.nodes:
            # Started only once the cluster has every node (vLLM would otherwise wait for the
            # placement group of a missing node): the workers' Ray units (re)started in the operation
            # before this one, on their hosts. Before the loop: one such operation a host, wherever
            # the instance is in the host's list (see below).
            python.call(name=f"Wait for every node of {inst.name}'s Ray cluster ({', '.join(inst.nodes)})",
                        function=ray.wait_for_cluster,
                        spec=ray.cluster_spec(deployment, ray_cluster.JOIN_TIMEOUT_S),
                        _if=lambda changed=changed, running=running: changed() or not running)
    for inst, running, changed in decided:
        unit = inst.unit_name
        # The unit's start job lasts until vLLM is healthy (ExecStartPost): started --no-block, so
        # the instances of a host load in parallel and verification watches them (with the journal
        # when one fails). `stop` first, blocking: the old process has let go of its port before
        # anything (the front) binds it. reset-failed: the deploy's own restarts must not count
        # toward the start limit that ends a crash loop, and a unit that ended failed starts again.
        server.shell(name=f"Restart {unit} (its config, environment or model changed)", _if=changed,
                     commands=[f"systemctl stop {unit}; systemctl reset-failed {unit} 2>/dev/null; "
                               f"systemctl enable --quiet {unit} && systemctl start --no-block {unit}"])
        # Both of these for every instance, each guarded, never one or the other: pyinfra (CLI
        # order) identifies an operation by its code line, so two hosts taking different branches
        # here would order the same operations differently, a cycle in its ordering DAG.
        systemd_service(name=f"Ensure {unit} is enabled and running", unit=unit, running=True, enabled=True,
                        _if=lambda changed=changed, running=running: running and not changed())
        # Its LoRA adapters changed, nothing that restarts it: ExecReload loads and unloads them in
        # the running vLLM (its MainPID stays). A restart or a start loads them anyway (ExecStartPost).
        reloads = changes.reloads(unit)
        systemd_service(name=f"Reload {unit} (its adapters changed: loaded in the running vLLM)", unit=unit,
                        running=True, reloaded=True, enabled=True,
                        _if=lambda changed=changed, running=running, reloads=reloads: (
                            running and not changed() and reloads()))
        # New, stopped, or failed after its bounded restarts: the next deploy starts it.
        server.shell(name=f"Start {unit} (it was not running)",
                     _if=lambda changed=changed, running=running: not running and not changed(),
                     commands=[f"systemctl reset-failed {unit} 2>/dev/null; "
                               f"systemctl enable --quiet {unit} && systemctl start --no-block {unit}"])
    if changes.has(FRONT_UNIT):
        # After the instances: on the first deploy with a front, vLLM gives up the public port
        # only when it restarts onto its loopback port.
        run_handlers(FRONT_UNIT, changes.restarts(FRONT_UNIT), changes.reloads(FRONT_UNIT),
                     restarted_why="its unit changed", reloaded_why="its config changed; connections are kept")
    _monitoring_services(deployment)


def _monitoring_services(deployment: Deployment) -> None:
    """The exporters of a vllm_metrics host, then Alertmanager and Prometheus on the monitoring host,
    each restarted, reloaded or kept running as handlers.HANDLERS says of what changed."""
    changes = deployment.changes
    if not changes.has(EXPORTER_UNIT):
        return
    for unit in (NODE_EXPORTER_UNIT, EXPORTER_UNIT):
        run_handlers(unit, changes.restarts(unit), changes.reloads(unit), restarted_why="its unit or script changed")
    if not changes.has(PROMETHEUS_UNIT):
        return
    # Alertmanager first: the alerts Prometheus sends after its own restart find it listening.
    run_handlers(ALERTMANAGER_UNIT, changes.restarts(ALERTMANAGER_UNIT), changes.reloads(ALERTMANAGER_UNIT),
                 restarted_why="its unit or config changed")
    run_handlers(PROMETHEUS_UNIT, changes.restarts(PROMETHEUS_UNIT), changes.reloads(PROMETHEUS_UNIT),
                 restarted_why="its unit changed", reloaded_why="its config, rules or token changed")
