"""What a run of the deploy did on a host, for callers that drive it through pyinfra's Python API
(`vllm-fleet rollout`): why a host failed (failure_reason; pyinfra records only that it failed) and
which of the deploy's operations only look (observing_calls), so that they are not counted as changes."""

from __future__ import annotations

from . import access, gateway, ray, verify
from .state import failure_reason

__all__ = ["failure_reason", "observing_calls"]


def observing_calls(state, host_name: str) -> set:
    """The deploy's python.call functions that only look (the lock's release, the verifications, the
    wait for a Ray cluster): pyinfra counts them as run, yet they change nothing. A Ray worker's join
    check is one of them unless it (re)started the worker in the run of `state`."""
    calls = {access._release_lock, verify.verify_instances, gateway.verify_gateway, ray.wait_for_cluster,
             ray.verify_ray_node}
    if not ray.ray_worker_restarted(state, host_name):
        calls.add(ray._join_cluster)
    return calls
