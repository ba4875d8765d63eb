"""The CUDA memory probe's result, on the workstation: read from the probe's output and put on
nvidia-smi's GPUs (by PCI bus id), so the planner budgets from the total vLLM will see.

The probe itself runs on the host: vllm_fleet/payloads/cuda_memory (its docstring says what it
prints); vllm_fleet.facts.gpus sends it.
"""

import json
from dataclasses import replace

from vllm_fleet.payloads.cuda_memory.probe import CUDA_MEMORY_PREFIX

__all__ = ["CUDA_MEMORY_PREFIX", "parse_output", "unavailable", "with_cuda_totals"]
from vllm_fleet.payloads.nvidia import normalize_bus_id


def unavailable(reason):
    return {"available": False, "reason": reason}


def parse_output(lines):
    """The probe's result from its output lines (an 'unavailable' result if it printed none or
    something else than its result)."""
    for line in reversed(list(lines)):
        if not line.startswith(CUDA_MEMORY_PREFIX):
            continue
        try:
            result = json.loads(line[len(CUDA_MEMORY_PREFIX):])
        except ValueError as exc:
            return unavailable(f"the CUDA memory probe printed unreadable JSON: {exc}")
        if not isinstance(result, dict) or not isinstance(result.get("available"), bool):
            return unavailable("the CUDA memory probe printed an unexpected result")
        if result["available"] and not _well_formed(result.get("gpus")):
            return unavailable("the CUDA memory probe printed GPUs without a bus id and a total")
        return result
    return unavailable("the CUDA memory probe printed no result")


def _well_formed(gpus):
    return isinstance(gpus, list) and all(
        isinstance(g, dict) and isinstance(g.get("bus_id"), str)
        and isinstance(g.get("total_bytes"), int) and not isinstance(g.get("total_bytes"), bool)
        and g["total_bytes"] > 0 for g in gpus)


def with_cuda_totals(gpus, result):
    """(nvidia-smi's `gpus` with the totals CUDA reported, why not when it could not be used).

    A total is taken only for a GPU nvidia-smi lists at the same bus id, and only when it is below
    nvidia-smi's own total for it (CUDA never shows more than the card has: anything else is a
    misread, and the plan falls back to the next source)."""
    if not result.get("available"):
        return list(gpus), f"CUDA's totals not read on the host: {result.get('reason') or 'unavailable'}"
    by_bus = {normalize_bus_id(g["bus_id"]): g["total_bytes"] for g in result["gpus"]}
    out, missing = [], []
    for gpu in gpus:
        total = by_bus.get(normalize_bus_id(gpu.pci_bus_id or ""))
        if total is None or not 0 < total <= gpu.memory_mib * 1024 * 1024:
            missing.append(f"GPU {gpu.index} ({gpu.pci_bus_id or 'no bus id'})")
            out.append(gpu)
        else:
            out.append(replace(gpu, cuda_total_bytes=total))
    note = (f"CUDA reported no usable total for {', '.join(missing)}" if missing else None)
    return out, note
