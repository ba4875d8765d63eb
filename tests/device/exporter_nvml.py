"""The host exporter's NVML read (vllm_fleet/payloads/exporter: stdlib and NVML only) and the
the GPUs as the exporter reads them (what it writes /metrics/gpu from), on this machine. Raw."""
import json
import sys

from vllm_fleet.payloads.exporter.nvml import Nvml, read_nvml
state = Nvml(None)
if state.start() is None:
    print(json.dumps({"error": state.error}))
    sys.exit(0)
print(json.dumps(read_nvml(state), indent=1, default=str))
