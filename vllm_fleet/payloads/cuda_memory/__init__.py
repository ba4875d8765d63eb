"""Runs ON a host with its own python3: the total memory CUDA reports for each GPU, the number vLLM
multiplies by gpu_memory_utilization (torch.cuda.mem_get_info's total), read without torch.

vllm-fleet sends this payload's text over SSH (`python3 -c TEXT`; the text is its modules bundled,
vllm_fleet.payloads.CUDA_MEMORY); nothing is installed, and no vLLM environment is needed: it loads
the driver's own libcuda.so.1 with ctypes and calls cuInit, cuDeviceGetCount, then per device
cuDeviceGet, cuDeviceGetPCIBusId, cuDeviceGetName and cuDeviceTotalMem_v2. cuDeviceTotalMem needs
no context, so it takes no memory on a GPU an instance is using: it is the total the runtime puts
in cudaDeviceProp.totalGlobalMem, the same number as cudaMemGetInfo's total (recorded on an H200:
torch's total_memory and mem_get_info's total are both 150109880320 bytes,
tests/fixtures/device/h200-580.159.04/cuda-memory.json). CUDA_VISIBLE_DEVICES is dropped first so
that every GPU is seen; devices are matched to nvidia-smi's by PCI bus id, not by ordinal.

Prints one line `VLLM_FLEET_CUDA_MEMORY <json>` and always exits 0:

    {"available": true, "driver_api": 13000,
     "gpus": [{"ordinal": 0, "bus_id": "00000000:00:06.0", "name": "NVIDIA H200",
               "total_bytes": 150109880320}, ...]}

Without the driver's libcuda.so.1 (no NVIDIA driver, as on the sandbox's simulated GPUs) or when
CUDA cannot start (CUDA_ERROR_NO_DEVICE, a driver/library mismatch):

    {"available": false, "reason": "..."}

vllm_fleet.rules.cuda_memory reads that result on the workstation; the planner then budgets from it
(GpuSpec.cuda_total says which source a plan used).
"""
