"""The pyinfra deploy of vLLM onto a host, packaged the way pyinfra packages reusable deploys.

`vllm_fleet_deploy` runs every step on the current host, its operations grouped under the deploy's
name (DEPLOY_NAME) in pyinfra's output. The root deploy.py calls it; so can a team's own deploy
file, beside its other operations, with pyinfra's global arguments. It needs the run's options
(RunOptions: whether pyinfra was given --dry or --serial, the limit), which pyinfra keeps in its CLI:

    import sys
    from pyinfra import state
    from vllm_fleet.deploy import RunOptions, vllm_fleet_deploy

    vllm_fleet_deploy(options=RunOptions.from_pyinfra_cli(sys.argv[1:], state), _sudo=True)

Called without them, it cannot tell a dry run from one that changes the hosts: it refuses the run
(DeployError) before any lock, fact or command. The public API is __all__. Importing the package
changes nothing in pyinfra; install() does (what it changes is said there), and the deploy calls it
as it runs.

The steps, by module: prepare.py (validation, the lock through access.py, facts, plan, render,
with the run's Fleet for the hosts around this one), steps.py (service user, models, environment,
OS packages, hub downloads), files.py, services.py (with ray.py), verify.py, gateway.py; what
restarts and what reloads each service: handlers.py. state.py holds the run's state: what prepare
decided, what each step's operations changed, and the run's Fleet (vllm_fleet/fleet.py: every
inventory host parsed once). outcome.py: what a run did on a host, for `vllm-fleet rollout`.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import deploy

from vllm_fleet.config import Settings
from vllm_fleet.connect import ssh_lost

from . import access, files, gateway, operation_order, prepare, services, steps, verify
from .options import RunOptions
from .state import Deployment, DeployError

__all__ = ["DEPLOY_NAME", "DeployError", "RunOptions", "install", "vllm_fleet_deploy"]

DEPLOY_NAME = "vLLM fleet"

WITHOUT_OPTIONS = (
    "vllm_fleet_deploy() was called without options=RunOptions(...): it cannot tell a dry run (pyinfra "
    "--dry) from one that changes the hosts, so it takes no lock and changes nothing. In a deploy file "
    "that pyinfra's CLI runs, pass options=RunOptions.from_pyinfra_cli(sys.argv[1:], state) (`import sys`, "
    "`from pyinfra import state`), as the root deploy.py does; through pyinfra's Python API, "
    "RunOptions(dry=..., serial=..., limit=...); nothing was changed on any host")


def install() -> None:
    """What the deploy changes in pyinfra, for the whole process; idempotent. A connection that drops
    fails its host with a message instead of the whole run (vllm_fleet/connect/ssh_lost.py), and
    operations take pyinfra's own order without reading source files per operation
    (operation_order.py). The root deploy.py and `vllm-fleet rollout` call it before the deploy;
    vllm_fleet_deploy calls it as it runs, so a deploy file of one's own needs no call of its own:
    until then, importing vllm_fleet.deploy changes nothing."""
    ssh_lost.install()
    operation_order.install()


@deploy(DEPLOY_NAME, data_defaults=Settings.defaults())
def vllm_fleet_deploy(options: RunOptions | None = None) -> Deployment | None:
    """Converge the current host: every step, in order (the root deploy.py's docstring says what
    each does and what a run that changes nothing costs). `options`: how the run was asked to go
    (RunOptions); without them the run is refused before anything else (DeployError), taking no
    lock and changing nothing.

    Every knob's default is the deploy's data default (pyinfra's `data_defaults`), under inventory,
    group and `--data` values. Bad input raises DeployError (the run stops, no host changed); a
    refused host (its commands do not run as root, another deploy holds its lock) fails alone and
    this returns None."""
    if options is None:
        raise DeployError(WITHOUT_OPTIONS)
    install()
    deployment = prepare.prepare(options)
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
