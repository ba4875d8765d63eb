"""The probe: CUDA's total memory per GPU through the driver API, one result line."""

import ctypes
import json
import os

from vllm_fleet.payloads.nvidia import normalize_bus_id


CUDA_MEMORY_PREFIX = "VLLM_FLEET_CUDA_MEMORY "

#: What a CUresult means, for the ones a host without a usable GPU gives.
CUDA_ERRORS = {100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
               3: "CUDA_ERROR_NOT_INITIALIZED", 34: "CUDA_ERROR_STUB_LIBRARY",
               35: "CUDA_ERROR_INSUFFICIENT_DRIVER", 999: "CUDA_ERROR_UNKNOWN"}


class CudaCallError(Exception):
    pass


def _call(cuda, name, *args):
    code = getattr(cuda, name)(*args)
    if code != 0:
        raise CudaCallError(f"{name} returned {CUDA_ERRORS.get(code, code)}")


def read_cuda_memory(library="libcuda.so.1"):
    """The result described in the payload's docstring."""
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)  # read before cuInit: every GPU, as nvidia-smi lists them
    try:
        cuda = ctypes.CDLL(library)
    except OSError as exc:
        return {"available": False, "reason": f"no CUDA driver library ({library}): {exc}"}
    try:
        _call(cuda, "cuInit", ctypes.c_uint(0))
        version = ctypes.c_int(0)
        _call(cuda, "cuDriverGetVersion", ctypes.byref(version))
        count = ctypes.c_int(0)
        _call(cuda, "cuDeviceGetCount", ctypes.byref(count))
        gpus = []
        for ordinal in range(count.value):
            device = ctypes.c_int(0)
            _call(cuda, "cuDeviceGet", ctypes.byref(device), ctypes.c_int(ordinal))
            bus_id = ctypes.create_string_buffer(64)
            _call(cuda, "cuDeviceGetPCIBusId", bus_id, ctypes.c_int(64), device)
            name = ctypes.create_string_buffer(256)
            _call(cuda, "cuDeviceGetName", name, ctypes.c_int(256), device)
            total = ctypes.c_size_t(0)
            _call(cuda, "cuDeviceTotalMem_v2", ctypes.byref(total), device)
            gpus.append({"ordinal": ordinal, "bus_id": normalize_bus_id(bus_id.value.decode(errors="replace")),
                         "name": name.value.decode(errors="replace"), "total_bytes": int(total.value)})
    except (CudaCallError, AttributeError) as exc:  # AttributeError: a libcuda without the function
        return {"available": False, "reason": f"CUDA could not read the GPUs: {exc}"}
    return {"available": True, "driver_api": version.value, "gpus": gpus}


if __name__ == "__main__":
    try:
        result = read_cuda_memory()
    except Exception as exc:  # the probe must answer, whatever the host
        result = {"available": False, "reason": f"the CUDA memory probe failed: {type(exc).__name__}: {exc}"}
    print(CUDA_MEMORY_PREFIX + json.dumps(result))
