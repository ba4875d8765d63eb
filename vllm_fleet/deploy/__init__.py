"""The pyinfra deploy of vLLM onto a host, packaged the way pyinfra packages reusable deploys.

`vllm_fleet_deploy` runs every step on the current host, its operations grouped under the deploy's
name (DEPLOY_NAME) in pyinfra's output. The root deploy.py calls it; so can a team's own deploy
file, beside its other operations, with pyinfra's global arguments:

    from vllm_fleet.deploy import RunOptions, vllm_fleet_deploy
    vllm_fleet_deploy(_sudo=True)

The steps, by module: prepare.py (validation, the lock through access.py, facts, plan, render,
with the run's Fleet for the hosts around this one), steps.py (service user, models, environment,
OS packages, hub downloads), files.py, services.py (with ray.py), verify.py, gateway.py. state.py
holds the run's state: what prepare decided, what each step's operations changed, and the run's
Fleet (vllm_fleet/fleet.py: every inventory host parsed once).
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy

from vllm_fleet.config import Settings
from vllm_fleet.host import ssh_lost

from . import access, files, gateway, operation_order, prepare, ray, services, steps, verify
from .options import RunOptions
from .state import Deployment, DeployError, failure_reason

__all__ = ["DEPLOY_NAME", "Deployment", "DeployError", "RunOptions", "failure_reason", "observing_calls",
           "vllm_fleet_deploy"]

ssh_lost.install()  # a connection that drops fails its host with a message, not the whole run
operation_order.install()  # pyinfra's order of operations, without reading source files per operation

DEPLOY_NAME = "vLLM fleet"


@deploy(DEPLOY_NAME, data_defaults=Settings.defaults())
def vllm_fleet_deploy(options: RunOptions | None = None) -> Deployment | None:
    """Converge the current host: every step, in order (the root deploy.py's docstring says what
    each does and what a run that changes nothing costs). `options`: how the run was asked to go
    (pyinfra's --dry and --serial; default: neither).

    Every knob's default is the deploy's data default (pyinfra's `data_defaults`), under inventory,
    group and `--data` values. Bad input raises DeployError (the run stops, no host changed); a
    refused host (its commands do not run as root, another deploy holds its lock) fails alone and
    this returns None."""
    deployment = prepare.prepare(options or RunOptions())
    if deployment is None:
        return None
    logger.info(f"{host.print_prefix}plan: {prepare.describe(deployment)}")
    steps.service_user(deployment)
    steps.models(deployment)
    steps.environment(deployment)
    steps.host_packages(deployment)
    steps.hub_models(deployment)
    files.service_files(deployment)
    services.services(deployment)
    verify.verify(deployment)
    gateway.gateway_service(deployment)
    access.release_lock(deployment)
    return deployment


def observing_calls(state, host_name: str) -> set:
    """The deploy's python.call functions that only look (the lock's release, the verifications, the
    wait for a Ray cluster): pyinfra counts them as run, yet they change nothing. A Ray worker's join
    check is one of them unless it (re)started the worker in the run of `state`."""
    calls = {access._release_lock, verify.verify_instances, gateway.verify_gateway, ray.wait_for_cluster,
             ray.verify_ray_node}
    if not ray.ray_worker_restarted(state, host_name):
        calls.add(ray._join_cluster)
    return calls
