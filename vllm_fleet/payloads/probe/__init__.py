"""Runs ON a host (python3, stdlib only): checks of vLLM instances for `verify` and `status`.

vllm-fleet sends this payload's text over SSH (`python3 -c TEXT MODE JSON`; the text is its modules
bundled, vllm_fleet.payloads.PROBE); nothing is installed. The API key is read here from the
root-only env file, so it never travels on a command line. Prints one line
`VLLM_FLEET_PROBE <json>` as its result.

    verify [checks]   wait for /health, then /v1/models with the key, a 1-token completion, and the
                      unit's processes on its GPUs; the journal of any failing instance
    status [units]    read-only: unit state and uptime, /health, /version, served models, /metrics,
                      sha256 of the managed files, and the GPUs; each instance's tokens by client
    usage             on the monitoring host: tokens by client over a window, from its Prometheus
    alerts            on the monitoring host: the alerts its Alertmanager holds (firing, or held back)
    gateway, gateway-status, gateway-workers, wait-idle, verify-with-gateway
                      the fleet gateway's checks, its state, its backends taken out and put back,
                      and the wait for a drained backend's last requests

The modules: `host` (requests to the instances, systemd's properties, the env file's key),
`journal` (how a unit ended and why it fails), `instances` (verify), `gateway`, `status`, `usage`,
`alerts`, `main`.
"""
