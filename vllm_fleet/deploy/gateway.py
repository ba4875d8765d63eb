"""Step 10, on the fleet's gateway host: vllm-router restarted, reloaded or kept running as its files
changed, then verified (backends registered, the key required, the models served)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra import host, logger
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from vllm_fleet.gateway import KEEPALIVED_UNIT, gateway_ports
from vllm_fleet.host_layout import GATEWAY_UNIT
from vllm_fleet.facts import batch as facts
from vllm_fleet.connect import remote
from vllm_fleet.facts.state import UnitState
from vllm_fleet.facts.verify import host_probe_command, parse_host_probe
from vllm_fleet.render import front_paths, instance_paths
from vllm_fleet.render_front import front_probe_address

from .handlers import run_handlers
from .state import Deployment, record_failure


def gateway_service(deployment: Deployment) -> None:
    """10. On the fleet's gateway host, after this host's instances are verified (a restart or reload
    registers every backend, this host's included, so they must be serving by then): vllm-router
    restarted when its unit or environment changed (SIGTERM lets requests in flight finish); else
    reloaded when its workers changed (ExecReload posts the list again: no request is dropped);
    else kept running. Then it is verified."""
    changes = deployment.changes
    if not changes.has(GATEWAY_UNIT):
        return
    untouched = router_untouched(deployment)
    run_handlers(GATEWAY_UNIT, changes.restarts(GATEWAY_UNIT), changes.reloads(GATEWAY_UNIT),
                 restarted_why="its unit or environment changed",
                 reloaded_why="its backends changed; requests in flight are kept")
    if deployment.config.settings.vllm_verify:
        python.call(name="Verify the gateway (backends registered, key required, models)",
                    function=verify_gateway, spec=gateway_check(deployment),
                    registering=lambda: not untouched(), outcome=deployment.gateway_outcome)
    floating_service(deployment)


def floating_service(deployment: Deployment) -> None:
    """On a gateway behind a floating address, after its router is up (keepalived's readiness check
    asks it): keepalived reloaded when its config changed (SIGHUP: the holder keeps the address),
    else kept enabled and running. Never restarted: a restart would drop the address on the holder."""
    changes = deployment.changes
    if not changes.has(KEEPALIVED_UNIT):
        return
    run_handlers(KEEPALIVED_UNIT, changes.restarts(KEEPALIVED_UNIT), changes.reloads(KEEPALIVED_UNIT),
                 restarted_why="never: no change restarts it",
                 reloaded_why="its config changed; the address stays where it is")


def router_untouched(deployment: Deployment) -> Callable[[], bool]:
    """At execution: whether vllm-router kept running through this run, neither restarted nor
    reloaded. Only a router this run started or reloaded is still registering its backends, worth
    waiting for; one that kept running has every backend it will have (one missing now was drained
    by a rollout, which puts it back), and can be checked with the instances
    (checked_with_the_instances)."""
    changes = deployment.changes
    restart, reload = changes.restarts(GATEWAY_UNIT), changes.reloads(GATEWAY_UNIT)
    was_running = facts.get(host, UnitState, unit=GATEWAY_UNIT)["running"]
    return lambda: was_running and not (restart() or reload())


def checked_with_the_instances(deployment: Deployment) -> dict[str, Any]:
    """On the gateway host, what the instances' verification needs to check the gateway in its own
    remote command (deploy/verify.py verify_instances): when the router kept running and this run
    neither restarts nor reloads it, nothing happens to it between the two checks, and a converged
    gateway host costs one remote command fewer. Elsewhere, nothing."""
    if not deployment.changes.has(GATEWAY_UNIT) or not deployment.config.settings.vllm_verify:
        return {}
    return {"gateway_spec": gateway_check(deployment), "gateway_outcome": deployment.gateway_outcome,
            "with_gateway": router_untouched(deployment)}


def gateway_check(deployment: Deployment) -> dict[str, Any]:
    """What the host probe checks of the gateway (check_gateway in vllm_fleet/payloads/probe/gateway.py).
    The key is read on the host from an instance's root-only env file, never passed."""
    config, backends, instances = deployment.config, deployment.backends, deployment.plan.instances
    ports = gateway_ports(config.settings)
    return {"unit": GATEWAY_UNIT, "router_port": ports["router"], "port": ports["port"],
            "address": front_probe_address(config.settings.vllm_bind_host),
            "ca": front_paths(config)["tls_trust"] if config.settings.vllm_tls is True else None,
            "urls": sorted({backend.url for backend in backends}),
            "models": sorted({backend.served_model_name for backend in backends}),
            "env_file": instance_paths(config, instances[0].name)["env"] if instances else None,
            "timeout_s": 10}


def verify_gateway(state, host, spec: dict[str, Any], registering=lambda: True,
                   outcome: dict[str, Any] | None = None) -> None:
    """Runs at execution, on the gateway host; `registering()`: whether vllm-router may still be
    registering its backends (started or reloaded by this run): the probe waits for them then.
    `outcome`: where the instances' verification left the gateway's result when it checked it in
    its own command (checked_with_the_instances); then no command is sent."""
    if outcome and outcome.get("result") is not None:
        result = outcome["result"]
        stderr = ""
    else:
        spec = dict(spec, timeout_s=spec["timeout_s"] if registering() else 0)
        _ok, stdout, stderr = remote.run(host, host_probe_command("gateway", spec))
        result = parse_host_probe(stdout)
    if not result:
        raise OperationError(f"host {host.name}: the gateway probe printed no result:\n{stderr[-2000:]}")
    if not result["ok"]:
        text = f"host {host.name}, gateway: verification failed: {result['error']}"
        journal = [ln for ln in result.get("journal", "").splitlines() if ln.strip()][-15:]
        if journal:
            text += f"\n  last journal lines of {result['unit']}:\n" + "\n".join(f"    {ln}" for ln in journal)
        record_failure(host, text)
        raise OperationError(text)
    absent = result.get("not_registered") or []
    if absent:  # e.g. drained by a rollout while their hosts converge: it puts them back
        logger.warning(f"{host.print_prefix}gateway: not registered in vllm-router now: {', '.join(absent)}")
    logger.info(f"{host.print_prefix}verified the gateway: {len(spec['urls']) - len(absent)} of "
                f"{len(spec['urls'])} backend(s) registered, key required, models {', '.join(spec['models'])}")
