"""Step 9: verify each instance over SSH (/health, /v1/models with the key, a 1-token completion,
its GPU processes); on a multi-node instance's nodes, first the Ray cluster."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pyinfra import logger
from pyinfra.api.exceptions import OperationError
from pyinfra.operations import python

from vllm_fleet.facts import ray_cluster
from vllm_fleet.connect import remote
from vllm_fleet.facts.verify import (InstanceCheck, format_failure, host_probe_command, parse_host_probe,
                                     parse_probe_output, probe_command, with_diagnosis)
from vllm_fleet.render_front import front_probe_address
from vllm_fleet.render import (front_paths, instance_gpu_bus_ids, instance_paths,
                               served_task, start_timeout_s)

from . import gateway, ray
from .state import Deployment, record_failure


def verify(deployment: Deployment) -> None:
    """9. Per instance: /health, /v1/models with the key, a 1-token completion (a pooling instance: the
    request its endpoint serves, an embedding for an embedding model), GPU processes."""
    config, plan = deployment.config, deployment.plan
    if not config.settings.vllm_verify:
        return
    if plan.ray is not None:  # first: a missing node is named, not only the instance's failure
        python.call(name=f"Verify the Ray {'cluster' if plan.ray.is_head else 'worker'} of {plan.ray.instance}",
                    function=ray.verify_ray_node,
                    spec=ray.cluster_spec(deployment, ray_cluster.VERIFY_TIMEOUT_S,
                                          only_this_node=not plan.ray.is_head))
    checks = []
    for inst in plan.instances:
        timeout = config.settings.vllm_verify_timeout_s or start_timeout_s(inst)
        checks.append(InstanceCheck(
            name=inst.name, unit=inst.unit_name, port=inst.backend_port, front_port=inst.port,
            front_address=front_probe_address(config.settings.vllm_bind_host),
            front_ca=front_paths(config)["tls_trust"] if config.settings.vllm_tls is True else None,
            served_model_name=inst.config.served_model_name, max_model_len=inst.max_model_len or None,
            env_file=instance_paths(config, inst.name)["env"], timeout_s=int(timeout),
            gpu_bus_ids=instance_gpu_bus_ids(config, plan, inst),
            task=served_task(inst), adapters=[a.name for a in inst.config.adapters]))
    if checks:
        python.call(name="Verify instances (health, models, completion)", function=verify_instances, checks=checks,
                    gpus_unchecked=bool(plan.gpus) and not config.settings.vllm_verify_gpu_processes,
                    **gateway.checked_with_the_instances(deployment))


def verify_instances(state, host, checks: list[InstanceCheck], gateway_spec: dict[str, Any] | None = None,
                     with_gateway: Callable[[], bool] = lambda: False,
                     gateway_outcome: dict[str, Any] | None = None,
                     gpus_unchecked: bool = False) -> None:  # runs at execution, per host
    """The instances' probe. On the gateway host, when `with_gateway()` (its router neither restarts
    nor reloads in this run), the same remote command checks the gateway too: its result waits in
    `gateway_outcome` for the gateway's own verification, which then sends nothing. `gpus_unchecked`:
    the host's GPUs are SIMULATED (vllm_verify_gpu_processes = False), which each line says."""
    if gateway_spec is not None and with_gateway():  # (checked_with_the_instances gives the outcome too)
        payload = {"instances": [c.as_spec() for c in checks], "gateway": dict(gateway_spec, timeout_s=0)}
        ok, stdout, stderr = remote.run(host, host_probe_command("verify-with-gateway", payload))
        both = parse_host_probe(stdout) or {}
        results = with_diagnosis(both.get("instances") or [])
        gateway_outcome["result"] = both.get("gateway")
    else:
        ok, stdout, stderr = remote.run(host, probe_command(checks))
        results = parse_probe_output(stdout)
    failures = [result for result in results if not result.get("ok")]
    for result in results:
        if result.get("ok"):
            served = next((c for c in ("completion", "embedding", "classification", "pooling")
                           if c in result.get("checks", {})), "completion")
            logger.info(f"{host.print_prefix}verified {result['name']}: health, models, "
                        f"{'a 1-token completion' if served == 'completion' else 'a real ' + served} "
                        f"({result.get('seconds_to_healthy')} s to healthy)"
                        + ("; its GPU processes NOT checked: SIMULATED GPUs (vllm_verify_gpu_processes = False)"
                           if gpus_unchecked else ""))
    if not results:
        raise OperationError(f"host {host.name}: the verification probe printed no result:\n"
                             f"{stderr[-2000:]}")
    if failures:
        text = "\n".join(format_failure(host.name, result) for result in failures)
        record_failure(host, text)
        raise OperationError(text)
