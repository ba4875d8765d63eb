"""What vLLM's memory budget starts from on this GPU: CUDA's total (torch.cuda.mem_get_info, which
vLLM's MemorySnapshot reads) beside NVML's and nvidia-smi's totals. Raw JSON."""
import json
import subprocess
import sys
out = {"python": sys.version}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_runtime"] = torch.version.cuda
    out["devices"] = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        props = torch.cuda.get_device_properties(i)
        out["devices"].append({"index": i, "name": props.name, "capability": [props.major, props.minor],
                               "mem_get_info_free": free, "mem_get_info_total": total,
                               "properties_total_memory": props.total_memory,
                               "multi_processor_count": props.multi_processor_count})
except Exception as exc:
    out["torch_error"] = repr(exc)
try:
    import pynvml
    pynvml.nvmlInit()
    out["nvml_driver"] = pynvml.nvmlSystemGetDriverVersion()
    out["nvml"] = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        out["nvml"].append({"index": i, "name": pynvml.nvmlDeviceGetName(h), "total": m.total, "used": m.used,
                            "free": m.free})
except Exception as exc:
    out["nvml_error"] = repr(exc)
out["nvidia_smi_memory_total_mib"] = subprocess.run(
    ["nvidia-smi", "--query-gpu=memory.total,memory.reserved", "--format=csv,noheader,nounits"],
    capture_output=True, text=True).stdout.strip()
print(json.dumps(out, indent=1, default=str))
