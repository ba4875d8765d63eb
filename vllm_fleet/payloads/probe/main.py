"""The probe's modes, by name from its command line; prints the one result line."""

import json
import sys

from vllm_fleet.payloads.probe.alerts import firing_alerts
from vllm_fleet.payloads.probe.gateway import check_gateway, gateway_status, gateway_workers, wait_idle
from vllm_fleet.payloads.probe.host import RESULT_PREFIX
from vllm_fleet.payloads.probe.instances import verify
from vllm_fleet.payloads.probe.prometheus import instant_queries
from vllm_fleet.payloads.probe.status import status
from vllm_fleet.payloads.probe.usage import prometheus_usage


def verify_with_gateway(spec):
    """The instances' verification, then the gateway's (no wait: its router kept running), in one
    remote command: what the gateway host's deploy runs when nothing restarts or reloads the router."""
    instances = verify(spec["instances"])
    try:
        gateway = check_gateway(spec["gateway"])
    except Exception as exc:  # the gateway's own failure, reported as its verification's, not the instances'
        gateway = {"ok": False, "unit": spec["gateway"].get("unit"), "error": f"the gateway check failed: {exc!r}"}
    return {"instances": instances, "gateway": gateway}


def main(argv):
    mode, payload = argv[1], json.loads(argv[2])
    modes = {"verify": verify, "status": status, "gateway": check_gateway, "gateway-status": gateway_status,
             "gateway-workers": gateway_workers, "wait-idle": wait_idle,
             "verify-with-gateway": verify_with_gateway, "usage": prometheus_usage,
             "prometheus-query": instant_queries, "alerts": firing_alerts}
    if mode not in modes:
        sys.exit(f"host_probe: unknown mode {mode!r} (known: {', '.join(modes)})")
    result = modes[mode](payload)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv)
