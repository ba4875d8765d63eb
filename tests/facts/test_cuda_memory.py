"""The memory vLLM budgets from: CUDA's total per GPU, read on the host by the CUDA memory probe
(vllm_fleet/payloads/cuda_memory, bundled; the CudaMemory fact) through libcuda.so.1, and the
sources the plan falls back to (nvidia-smi's memory.reserved, the recorded table, the rule).

The probe runs here as the host runs it (`python3 -c TEXT`) against stand-in libcuda.so.1 builds
compiled from C with the driver API's signatures: one with two GPUs, one whose cuInit answers
CUDA_ERROR_NO_DEVICE; and with no libcuda.so.1 at all, as on this machine and the sandbox."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from support.planning_fixtures import host_data, instance, prepare_on_fake_host
from vllm_fleet.catalog import DRIVER_RESERVES, GIB, MIB, cuda_total, driver_reserve
from vllm_fleet.config import parse_host
from vllm_fleet.facts.gpus import CUDA_MEMORY_SOURCE, CudaMemory, cuda_memory_command, parse_gpu_csv
from vllm_fleet.plan import plan_host
from vllm_fleet.rules import cuda_memory

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "device" / "h200-580.159.04"
A1, A2 = "00000000:41:00.0", "00000000:81:00.0"
#: nvidia-smi's rows (GPU_QUERY's fields) of a host with two A100-40GB; memory.reserved unreadable.
SMI = [f"0, {A1}, NVIDIA A100-SXM4-40GB, 40960, 3, GPU-a1, 8.0, 580.126.09, Disabled, [N/A]",
       f"1, {A2}, NVIDIA A100-SXM4-40GB, 40960, 3, GPU-a2, 8.0, 580.126.09, Disabled, [N/A]"]
A100_CUDA_TOTAL = (40960 - 621) * MIB  # a stand-in driver's share, not a recorded one

FAKE_LIBCUDA = r"""
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
static const char *ids[] = {"0000:41:00.0", "0000:81:00.0"};
int cuInit(unsigned int flags) { (void)flags; return INIT_RESULT; }
int cuDriverGetVersion(int *version) { *version = 13000; return 0; }
/* As the driver does: CUDA_VISIBLE_DEVICES narrows what it shows. */
int cuDeviceGetCount(int *count) { *count = getenv("CUDA_VISIBLE_DEVICES") ? 1 : 2; return 0; }
int cuDeviceGet(int *device, int ordinal) { if (ordinal < 0 || ordinal > 1) return 101; *device = ordinal; return 0; }
int cuDeviceGetPCIBusId(char *out, int size, int device) { strncpy(out, ids[device], size); return 0; }
int cuDeviceGetName(char *out, int size, int device) { (void)device; strncpy(out, "NVIDIA A100-SXM4-40GB", size); return 0; }
int cuDeviceTotalMem_v2(size_t *total, int device) { *total = TOTAL + device; return 0; }
"""


def stand_in_libcuda(directory: Path, init_result: int = 0) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build a stand-in libcuda.so.1")
    directory.mkdir(parents=True, exist_ok=True)
    source = directory / "libcuda.c"
    source.write_text(FAKE_LIBCUDA)
    subprocess.run([compiler, "-shared", "-fPIC", f"-DINIT_RESULT={init_result}", f"-DTOTAL={A100_CUDA_TOTAL}ULL",
                    "-o", str(directory / "libcuda.so.1"), str(source)], check=True, capture_output=True)
    return directory


def run_probe(library_dir: Path | None, path: str | None = None) -> subprocess.CompletedProcess:
    """The fact's own command under bash, as the host runs it (libcuda.so.1 found through
    LD_LIBRARY_PATH; none when `library_dir` is None)."""
    env = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    env["CUDA_VISIBLE_DEVICES"] = "1"  # the probe must see every GPU whatever the login sets
    if library_dir is not None:
        env["LD_LIBRARY_PATH"] = str(library_dir)
    if path is not None:
        env["PATH"] = path
    return subprocess.run(["bash", "-c", cuda_memory_command()], capture_output=True, text=True, env=env,
                          timeout=60)


def test_the_probe_reads_every_gpu_through_libcuda(tmp_path):
    done = run_probe(stand_in_libcuda(tmp_path / "lib"))
    assert done.returncode == 0, done.stderr
    result = CudaMemory().process(done.stdout.splitlines())
    assert result == {"available": True, "driver_api": 13000, "gpus": [
        {"ordinal": 0, "bus_id": A1, "name": "NVIDIA A100-SXM4-40GB", "total_bytes": A100_CUDA_TOTAL},
        {"ordinal": 1, "bus_id": A2, "name": "NVIDIA A100-SXM4-40GB", "total_bytes": A100_CUDA_TOTAL + 1}]}


def test_without_libcuda_the_probe_says_unavailable_and_exits_zero():
    done = run_probe(None)
    assert done.returncode == 0 and done.stderr == ""
    result = CudaMemory().process(done.stdout.splitlines())
    assert result["available"] is False and "no CUDA driver library (libcuda.so.1)" in result["reason"]


def test_a_cuda_that_cannot_start_is_unavailable_with_its_error(tmp_path):
    done = run_probe(stand_in_libcuda(tmp_path / "lib", init_result=100))
    result = CudaMemory().process(done.stdout.splitlines())
    assert result == {"available": False,
                      "reason": "CUDA could not read the GPUs: cuInit returned CUDA_ERROR_NO_DEVICE"}


def test_a_host_without_python3_answers_unavailable(tmp_path):
    bash_only = tmp_path / "bin"
    bash_only.mkdir()
    for tool in ("bash", "echo"):
        found = shutil.which(tool)
        if found:
            (bash_only / tool).symlink_to(found)
    done = run_probe(None, path=str(bash_only))
    assert done.returncode == 0
    assert CudaMemory().process(done.stdout.splitlines()) == {"available": False, "reason": "no python3 on the host"}


def test_the_bundled_probe_is_what_the_fact_sends():
    assert f"python3 -c {shlex.quote(CUDA_MEMORY_SOURCE)} ||" in cuda_memory_command()
    assert CudaMemory().default()["available"] is False


@pytest.mark.parametrize("output", [
    [], ["something else"], ["VLLM_FLEET_CUDA_MEMORY {not json"], ['VLLM_FLEET_CUDA_MEMORY ["a list"]'],
    ['VLLM_FLEET_CUDA_MEMORY {"available": "yes"}'],
    ['VLLM_FLEET_CUDA_MEMORY {"available": true, "gpus": [{"bus_id": "0000:41:00.0", "total_bytes": true}]}'],
    ['VLLM_FLEET_CUDA_MEMORY {"available": true, "gpus": [{"bus_id": "0000:41:00.0", "total_bytes": -5}]}'],
    ['VLLM_FLEET_CUDA_MEMORY {"available": true, "gpus": "all"}'],
])
def test_what_is_not_the_probes_result_reads_as_unavailable(output):
    assert cuda_memory.parse_output(output)["available"] is False


def test_totals_go_to_the_gpu_at_the_same_bus_id_and_only_below_nvidia_smis():
    live = parse_gpu_csv(SMI)
    result = {"available": True, "gpus": [{"bus_id": "0000:81:00.0", "total_bytes": A100_CUDA_TOTAL},
                                          {"bus_id": "0000:41:00.0", "total_bytes": 40961 * MIB}]}
    gpus, note = cuda_memory.with_cuda_totals(live, result)
    assert gpus[1].cuda_total_bytes == A100_CUDA_TOTAL and gpus[1].cuda_total.source == "host"
    assert gpus[0].cuda_total_bytes is None and gpus[0].cuda_total.source == "rule"  # more than the card
    assert note == f"CUDA reported no usable total for GPU 0 ({A1})"
    unchanged, why = cuda_memory.with_cuda_totals(live, {"available": False, "reason": "no libcuda.so.1"})
    assert unchanged == live and why == "CUDA's totals not read on the host: no libcuda.so.1"


def test_a_deploy_plans_from_the_totals_read_on_the_host(monkeypatch, tmp_path):
    probe = CudaMemory().process(run_probe(stand_in_libcuda(tmp_path / "lib")).stdout.splitlines())
    data = host_data(instances=[instance(model="Qwen/Qwen2.5-14B-Instruct", tokenizer=None, max_model_len=4096,
                                         gpus=[0], tensor_parallel_size=1)])
    del data["gpus"]  # planned from the live GPUs, as on a real host
    deployed, fake = prepare_on_fake_host(monkeypatch, data, {"NvidiaGpus": parse_gpu_csv(SMI), "CudaMemory": probe,
                                                              "GpuTopology": {"available": False, "reason": "-"},
                                                              "ManagedUnits": []})
    assert ("CudaMemory", {}) in fake.asked
    (inst,) = deployed.plan.instances
    assert inst.layout.per_gpu[0].budget_gib == pytest.approx(A100_CUDA_TOTAL / GIB * 0.9)
    assert any(f"CUDA total {A100_CUDA_TOTAL / GIB:.2f} GiB (read on the host" in r for r in inst.reasons)
    (gpu0, _) = deployed.plan.as_dict()["gpus"]
    assert (gpu0["cuda_total_bytes"], gpu0["budget_source"]) == (A100_CUDA_TOTAL, "host")


def test_without_the_probe_a_deploy_falls_back_and_says_so(monkeypatch):
    data = host_data(instances=[instance(model="Qwen/Qwen2.5-14B-Instruct", tokenizer=None, max_model_len=4096,
                                         gpus=[0], tensor_parallel_size=1)])
    del data["gpus"]
    deployed, _ = prepare_on_fake_host(monkeypatch, data, {"NvidiaGpus": parse_gpu_csv(SMI), "ManagedUnits": [],
                                                           "GpuTopology": {"available": False, "reason": "-"}})
    (inst,) = deployed.plan.instances
    assert any("less a conservative 640 MiB for the driver" in r for r in inst.reasons)


# --- the sources the plan falls back to ----------------------------------------------------------

def test_the_h200_row_is_the_recording():
    recorded = json.loads((RECORDING / "cuda-memory.json").read_text())
    (device,), (nvml,) = recorded["devices"], recorded["nvml"]
    row = driver_reserve("NVIDIA H200", 143771)
    assert row is not None and row.reserve_bytes == nvml["total"] - device["mem_get_info_total"]
    assert cuda_total("NVIDIA H200", 143771).total_bytes == device["mem_get_info_total"] == 150109880320
    assert cuda_total("NVIDIA H200", 143771).source == "table"


def test_nvidia_smis_reserved_field_gives_the_recorded_total_to_the_mib():
    recorded = json.loads((RECORDING / "cuda-memory.json").read_text())
    total_mib, reserved_mib = (int(v) for v in recorded["nvidia_smi_memory_total_mib"].split(","))
    (gpu,) = parse_gpu_csv([(RECORDING / "query.csv").read_text().strip() + f", {reserved_mib}"])
    assert (gpu.memory_mib, gpu.reserved_mib) == (total_mib, 616)
    assert gpu.cuda_total.source == "nvidia-smi reserved"
    # nvidia-smi rounds to whole MiB: within one MiB of what CUDA reports.
    assert abs(gpu.cuda_total.total_bytes - recorded["devices"][0]["mem_get_info_total"]) <= MIB
    # The recorded query (before memory.reserved was asked) still parses, and takes the table.
    (old,) = parse_gpu_csv((RECORDING / "query.csv").read_text().splitlines())
    assert old.reserved_mib is None and old.cuda_total.source == "table"


def test_the_rtx_4090_row_stays_at_or_below_every_public_log():
    row = driver_reserve("NVIDIA GeForce RTX 4090 D", 24564)
    assert row is not None and row.needle == "RTX 4090"
    total = cuda_total("NVIDIA GeForce RTX 4090", 24564).total_gib
    assert 23.545 <= total <= 23.555  # vLLM logged 23.55 and 23.58 GiB; 23.99 GiB by nvidia-smi
    assert driver_reserve("NVIDIA GeForce RTX 4090", 24000) is None  # another board size: not this row


def test_sources_in_order_host_then_reserved_then_table_then_rule():
    assert cuda_total("NVIDIA H200", 143771, 150000000000, 600).source == "host"
    assert cuda_total("NVIDIA H200", 143771, None, 600).source == "nvidia-smi reserved"
    assert cuda_total("NVIDIA H200", 143771, None, None).source == "table"
    rule = cuda_total("NVIDIA L40S", 46068)
    assert rule.source == "rule" and rule.total_bytes == (46068 - 640) * MIB
    big = cuda_total("NVIDIA B200", 183359)
    assert big.total_bytes == (183359 - 917) * MIB  # 0.5 % of the card, above 640 MiB
    # Above every reserve the table records: the rule never plans more than a recorded GPU would get.
    assert all(row.reserve_bytes <= 640 * MIB for row in DRIVER_RESERVES)
    # A reserved field nvidia-smi could not have meant (the whole card or more) is not used.
    assert cuda_total("NVIDIA H200", 143771, None, 143771).source == "table"


def test_a_declared_h200_plans_with_the_budget_vllm_will_see():
    (inst,) = plan_host(parse_host("box", host_data(gpus=[{"name": "NVIDIA H200", "memory_mib": 143771}],
                                                      instances=[instance(model="Qwen/Qwen2.5-14B-Instruct",
                                                                          tokenizer=None, max_model_len=4096)]))).instances
    assert inst.layout.per_gpu[0].budget_gib == pytest.approx(150109880320 / GIB * 0.9)
    assert any("CUDA total 139.80 GiB (H200 table: nvidia-smi's 140.40 GiB less the driver's 615 MiB)" in r
               for r in inst.reasons)


@pytest.mark.parametrize("reserved", ["[N/A]", "[Unknown Error]", "abc", "-5", "99999999", "1e400", ""])
def test_a_reserved_field_that_is_no_share_of_the_card_falls_back(reserved):
    row = f"0, {A1}, NVIDIA H200, 143771, 3, GPU-h, 9.0, 580.159.04, Disabled, {reserved}"
    (gpu,) = parse_gpu_csv([row])
    assert gpu.unreadable == ()  # no error: the plan takes the next source
    assert gpu.cuda_total.source == "table" and gpu.cuda_total.total_bytes == 150109880320


def test_an_infinite_memory_total_is_an_unreadable_field_not_a_crash():
    (gpu,) = parse_gpu_csv([f"0, {A1}, NVIDIA H200, 1e400, 3, GPU-h, 9.0, 580.159.04, Disabled, 616"])
    assert gpu.unreadable == (("memory.total", "1e400"),)
