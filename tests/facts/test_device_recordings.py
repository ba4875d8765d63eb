"""The GPU facts and the host exporter against what a real GPU machine answered to the very commands
vllm-fleet sends (tests/fixtures/device/<gpu>-<driver>/, recorded with tests/device/record.py; its
README says where and how)."""

from __future__ import annotations

import json
from pathlib import Path

from vllm_fleet import gpu_support
from vllm_fleet.facts.gpus import GpuTopology, NvidiaGpus
from vllm_fleet.payloads.exporter.exposition import Exposition
from vllm_fleet.payloads.exporter.gpus import write_gpus

H200 = Path(__file__).resolve().parents[1] / "fixtures" / "device" / "h200-580.159.04"
MIB = 1024 * 1024


def lines(name: str) -> list[str]:
    return (H200 / name).read_text().splitlines()


def test_the_h200s_nvidia_smi_answer_is_a_supported_gpu():
    [gpu] = NvidiaGpus().process(lines("query.csv"))
    assert (gpu.index, gpu.name, gpu.memory_mib, gpu.compute_capability) == (0, "NVIDIA H200", 143771, 9.0)
    assert gpu.driver_version == "580.159.04" and not gpu.unreadable
    assert gpu_support.preflight("h200-01", [gpu], vllm_version="0.33.0") == []


def test_the_h200s_nvml_probe_answer_reads_as_the_topology():
    topology = GpuTopology().process(lines("topology.txt"))
    assert topology["available"] is True and topology["driver"] == "580.159.04"
    [gpu] = topology["gpus"]
    assert (gpu["name"], gpu["memory_total_mib"], gpu["processes"]) == ("NVIDIA H200", 143771, [])


def test_the_exporter_writes_the_h200s_nvml_read_as_its_gpu_series():
    read = json.loads((H200 / "exporter-nvml.json").read_text())
    out = Exposition()
    write_gpus(out, read, "nvml")
    text = out.text()
    assert 'vllm_fleet_gpu_memory_total_bytes{' in text and " 150754820096" in text
    assert 'name="NVIDIA H200"' in text and 'source="nvml"' in text


def test_cuda_gives_vllm_the_total_less_what_the_driver_reserves():
    """vLLM budgets from CUDA's total (torch.cuda.mem_get_info), not nvidia-smi's: on the H200 the
    difference is exactly what nvidia-smi reports as reserved (and NVML as used on an idle GPU)."""
    memory = json.loads((H200 / "cuda-memory.json").read_text())
    [cuda], [nvml] = memory["devices"], memory["nvml"]
    smi_total_mib, reserved_mib = (int(v) for v in memory["nvidia_smi_memory_total_mib"].split(","))
    assert nvml["total"] == smi_total_mib * MIB == NvidiaGpus().process(lines("query.csv"))[0].memory_mib * MIB
    assert cuda["mem_get_info_total"] == cuda["properties_total_memory"] < nvml["total"]
    withheld = nvml["total"] - cuda["mem_get_info_total"]
    # NVML's "used" with no CUDA context on the GPU (the exporter's read; cuda_memory.py's own read
    # comes after torch made its context, which adds to it).
    [idle] = json.loads((H200 / "exporter-nvml.json").read_text())
    assert withheld == idle["memory_used"] == 644939776 < nvml["used"]
    assert abs(withheld / MIB - reserved_mib) <= 1  # nvidia-smi's memory.reserved, in whole MiB
