"""Runs ON a host with the vLLM environment's python: the GPUs as NVIDIA's library (NVML) sees them.

vllm-fleet sends this payload's text over SSH (`<env>/bin/python -c TEXT`; the text is its modules
bundled, vllm_fleet.payloads.GPU_TOPOLOGY); nothing is installed.
NVML comes from the module vLLM itself imports: vLLM vendors NVIDIA's official bindings as
`vllm.third_party.pynvml` (vllm-project/vllm vllm/utils/import_utils.py, import_pynvml():
"we decide to copy the official `pynvml` module to our codebase, and use it directly"), so the
probe loads that file first (by path: importing the `vllm` package itself would pull in torch),
then falls back to a `pynvml` module (nvidia-ml-py) if the environment has one. The result says
which one was used (`nvml_module`). NVML reads the driver's view without creating a CUDA context.

Prints one line `VLLM_FLEET_TOPOLOGY <json>` and always exits 0:

    {"available": true, "driver": "580.126.09", "nvml_module": "vllm.third_party.pynvml",
     "gpus": [{"index": 0, "nvml_index": 0, "bus_id": "00000000:01:00.0", "name": ..., "uuid": ...,
               "memory_total_mib": ..., "memory_used_mib": ..., "nvlink_active": 0,
               "processes": [{"pid": 1234, "used_mib": 812, "name": "python3",
                              "unit": "vllm-gemma.service"}]}, ...],
     "p2p": {"read": [[...]], "nvlink": [[...]]}}

`index` is the position in PCI bus order (what CUDA_DEVICE_ORDER=PCI_BUS_ID numbers, and the
nvidia-smi fact's order). `p2p[kind][i][j]` is "ok", "self" on the diagonal, or why not
("chipset not supported", ..., "error: <NVML's message>"), from nvmlDeviceGetP2PStatus with
NVML_P2P_CAPS_INDEX_READ ("read") or NVML_P2P_CAPS_INDEX_NVLINK ("nvlink"). A process's `unit` is
the systemd service whose cgroup holds it (None if none). Without pynvml, or when NVML cannot start
(no driver, no libnvidia-ml.so.1, as on the sandbox's simulated GPUs):

    {"available": false, "reason": "..."}

vllm_fleet.rules.gpu_topology reads that result on the workstation. The modules: `probe` here, and
vllm_fleet/payloads/nvidia.py (bus ids, a process's unit, NVML's constants), which the exporter shares.
"""
