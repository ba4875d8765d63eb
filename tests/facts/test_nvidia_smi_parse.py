"""The nvidia-smi parsers against outputs real drivers printed (tests/fixtures/nvidia-smi/, each file
naming the public page it was copied from), and the simulated nvidia-smi against the same parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_fleet import gpu_support
from vllm_fleet.config import ConfigError
from vllm_fleet.facts.gpus import GPU_QUERY, NvidiaGpus, parse_gpu_csv
from vllm_fleet.sandbox import nvidia_smi

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def recorded(name: str, folder: str = "nvidia-smi") -> list[str]:
    """A fixture's lines without our '#' header (which names its source)."""
    text = (FIXTURES / folder / name).read_text()
    assert text.startswith("# Recorded"), f"{name} must say where it was copied from"
    assert "Source: https://" in text
    return [line for line in text.splitlines() if not line.startswith("#")]


def test_every_fixture_names_its_public_source():
    files = sorted((FIXTURES / "nvidia-smi").iterdir()) + sorted((FIXTURES / "nvml").iterdir())
    assert len(files) >= 10
    for path in files:
        head = [line for line in path.read_text().splitlines() if line.startswith("#")]
        assert any("Source: https://github.com/" in line for line in head), path.name


# --- CSV (--query-gpu) -------------------------------------------------------------------------

def test_unified_memory_board_na_memory_is_a_named_error_not_a_traceback():
    gpus = parse_gpu_csv(recorded("gb10-unified-memory-query.csv"))  # must not raise
    (gb10,) = gpus
    assert gb10.name == "NVIDIA GB10" and gb10.memory_mib == 0
    assert ("memory.total", "[N/A]") in gb10.unreadable
    errors = gpu_support.preflight("spark-01", gpus)
    assert len(errors) == 1 and isinstance(errors[0], ConfigError)
    text = errors[0].located()
    assert text.startswith("host spark-01, key gpus[0].memory.total: nvidia-smi could not read "
                           "memory.total of GPU 0 (NVIDIA GB10): it printed '[N/A]'")
    assert "unified-memory board" in text and "fix:" in text


def test_pre_turing_gpu_and_old_driver_from_a_real_570_query():
    gpus = parse_gpu_csv(recorded("titanv-rtx5880-570.86.15-query.csv"))
    assert [(g.index, g.name, g.compute_capability, g.driver_version) for g in gpus] == [
        (0, "NVIDIA TITAN V", 7.0, "570.86.15"), (1, "NVIDIA RTX 5880 Ada Generation", 8.9, "570.86.15")]
    errors = gpu_support.preflight("ws-01", gpus, vllm_version="0.33.0")
    keys = [e.key for e in errors]
    assert keys == ["driver_version", "gpus[0]"]
    driver, titan = (e.located() for e in errors)
    assert "NVIDIA driver 570.86.15 is too old for vLLM 0.33.0" in driver
    assert "needs driver >= 580.65.06" in driver and "CUDA 13.0" in driver and "torch 2.14.0" in driver
    assert "upgrade the NVIDIA driver to the 580 branch" in driver
    assert "GPU 0 (NVIDIA TITAN V, compute capability 7.0) is not supported by vLLM 0.33.0" in titan
    assert ">= 7.5" in titan and "gpu_support.py" in titan


def test_unknown_error_in_a_field_we_do_not_use_is_ignored():
    rows = gpu_support.parse_csv_rows(recorded("rtx2080ti-442.19-unknown-error.csv"), [])
    assert rows == [{"name": "GeForce RTX 2080 Ti", "utilization.gpu": "100", "utilization.memory": "37",
                     "temperature.gpu": "56", "power.draw": "228.82", "power.limit": "210.00",
                     "fan.speed": "56", "clocks.current.graphics": "1560",
                     "clocks.current.memory": "6800", "power.default_limit": "[Unknown Error]"}]
    (gpu,) = gpu_support.gpus_from_rows(rows)
    assert gpu.unreadable == ()  # power.default_limit is not something the plan needs
    assert gpu_support.unreadable("[Unknown Error]") and gpu_support.unreadable(" [Not Supported] ")


@pytest.mark.parametrize("field, value", [("memory.total", "[Unknown Error]"),
                                          ("compute_cap", "[N/A]"),
                                          ("driver_version", "[Not Supported]"),
                                          ("name", "[Unknown Error]")])
def test_any_needed_field_unreadable_names_host_gpu_and_field(field, value):
    # The fact's own query shape (noheader), with the bracketed value nvidia-smi prints where it
    # cannot read a field (as in the recorded outputs above) put into one needed column.
    row = {"index": "1", "pci.bus_id": "00000000:41:00.0", "name": "NVIDIA A100-SXM4-40GB",
           "memory.total": "40960", "memory.used": "3", "uuid": "GPU-x", "compute_cap": "8.0",
           "driver_version": "580.126.09", "mig.mode.current": "Disabled", "memory.reserved": "456"}
    row[field] = value
    line = ", ".join(row[f] for f in GPU_QUERY.split(","))
    gpus = parse_gpu_csv([line])
    errors = gpu_support.preflight("box", gpus)
    located = [e.located() for e in errors]
    assert any(f"key gpus[0].{field}: nvidia-smi could not read {field} of GPU 0" in t
               and repr(value) in t for t in located), located


def test_old_seven_field_rows_still_parse_without_driver_or_mig():
    gpus = parse_gpu_csv(["0, 00000000:01:00.0, NVIDIA GeForce RTX 4090 D, 24564, 1, GPU-a, 8.9"])
    assert (gpus[0].driver_version, gpus[0].mig_mode, gpus[0].unreadable) == (None, None, ())
    assert gpu_support.preflight("box", gpus) == []


def test_fact_falls_back_to_a_query_every_driver_answers():
    command = NvidiaGpus().command()
    assert f"--query-gpu={GPU_QUERY} --format=csv,noheader,nounits" in command
    assert "|| nvidia-smi --query-gpu=index,pci.bus_id,name,memory.total,memory.used,uuid,driver_version " \
           "--format=csv,nounits" in command
    # The fallback prints a header; columns are mapped by it, compute_cap then comes from the catalog.
    gpus = parse_gpu_csv(["index, pci.bus_id, name, memory.total [MiB], memory.used [MiB], uuid, driver_version",
                          "0, 00000000:3B:00.0, Tesla V100-SXM2-16GB, 16160, 0, GPU-v, 470.182.03"])
    (v100,) = gpus
    assert (v100.memory_mib, v100.compute_capability, v100.capability, v100.driver_version) == (
        16160, None, 7.0, "470.182.03")
    assert [e.key for e in gpu_support.preflight("old", gpus)] == ["driver_version", "gpus[0]"]


# --- bare `nvidia-smi` tables --------------------------------------------------------------------

@pytest.mark.parametrize("name, driver, cuda, gpus", [
    ("gb10-580.126.09-table.txt", "580.126.09", "13.0",
     [(0, "NVIDIA GB10", "0000000F:01:00.0", None, None)]),
    ("a800-580.119.02-mig-disabled-table.txt", "580.119.02", "13.0",
     [(0, "NVIDIA A800 80GB PCIe", "00000000:01:00.0", 81920, "Disabled"),
      (1, "NVIDIA A800 80GB PCIe", "00000000:81:00.0", 81920, "Disabled")]),
    ("a800-535.86.10-mig-enabled-table.txt", "535.86.10", "12.2",
     [(0, "NVIDIA A800-SXM4-80GB", "00000000:18:00.0", 81920, "Enabled")]),
    ("a100-510.47.03-mig-mixed-table.txt", "510.47.03", "11.6",
     [(0, "NVIDIA A100-SXM...", "00000000:01:00.0", 81920, "Disabled"),
      (1, "NVIDIA A100-SXM...", "00000000:41:00.0", 81920, "Enabled")]),
    ("a100-495.29.05-mig-enabled-table.txt", "495.29.05", "11.5",
     [(0, "NVIDIA A100-SXM...", "00000000:01:00.0", 81251, "Enabled"),
      (1, "NVIDIA A100-SXM...", "00000000:41:00.0", 81251, "Enabled")]),
])
def test_tables_of_several_driver_generations(name, driver, cuda, gpus):
    table = gpu_support.parse_smi_table("\n".join(recorded(name)))
    assert (table["driver_version"], table["cuda_version"]) == (driver, cuda)
    assert [(g["index"], g["name"], g["pci_bus_id"], g["memory_total_mib"], g["mig_mode"])
            for g in table["gpus"]] == gpus


def _specs_from_table(name: str):
    """GpuSpecs from a recorded table (driver and MIG mode as that driver printed them)."""
    table = gpu_support.parse_smi_table("\n".join(recorded(name)))
    from vllm_fleet.config import GpuSpec
    return [GpuSpec(g["index"], g["name"], g["memory_total_mib"] or 0, None, g["pci_bus_id"],
                    driver_version=table["driver_version"], mig_mode=g["mig_mode"])
            for g in table["gpus"]]


def test_mig_enabled_gpu_is_refused_with_the_fix():
    errors = gpu_support.preflight("a100-box", _specs_from_table("a100-510.47.03-mig-mixed-table.txt"))
    mig = [e for e in errors if "MIG" in e.message]
    assert len(mig) == 1 and mig[0].key == "gpus[1]"  # GPU 0 has MIG disabled
    text = mig[0].located()
    assert "GPU 1 (NVIDIA A100-SXM...) has MIG mode enabled" in text
    assert "fix: disable MIG on it: `nvidia-smi -i 1 -mig 0`" in text
    # 510.47.03 is older than CUDA 13's driver too: one driver error for the host.
    assert [e.key for e in errors].count("driver_version") == 1


def test_a_current_driver_without_mig_passes():
    specs = _specs_from_table("a800-580.119.02-mig-disabled-table.txt")
    assert gpu_support.preflight("hami", specs) == []


def test_mig_only_on_gpus_no_instance_uses_is_not_an_error():
    class Inst:
        gpus = (0,)
    specs = _specs_from_table("a100-510.47.03-mig-mixed-table.txt")
    errors = gpu_support.preflight("a100-box", specs, [Inst()], vllm_version="0.33.0")
    assert not [e for e in errors if "MIG" in e.message]


# --- -q and -L -----------------------------------------------------------------------------------

def test_query_output_driver_and_mig_mode():
    q = gpu_support.parse_smi_query("\n".join(recorded("a100-450.203.03-q.txt")))
    assert q["driver_version"] == "450.203.03" and q["cuda_version"] == "11.0"
    assert q["gpus"] == [{"pci_bus_id": "00000000:07:00.0", "name": "A100-SXM4-40GB",
                          "mig_current": "Disabled", "mig_pending": "Disabled"}]
    old = gpu_support.parse_smi_query("\n".join(recorded("geforce-410.72-q.txt")))
    assert old["driver_version"] == "410.72"
    assert old["gpus"] == [{"pci_bus_id": "00000000:01:00.0", "name": "GeForce GTX 960M",
                            "mig_current": None, "mig_pending": None}]


def test_list_output():
    listed = gpu_support.parse_smi_list("\n".join(recorded("titanv-rtx5880-L.txt")))
    assert [(g["index"], g["name"], g["uuid"]) for g in listed] == [
        (0, "NVIDIA TITAN V", "GPU-b5169cef-2205-c30e-f2b3-220cfa14bafd"),
        (1, "NVIDIA RTX 5880 Ada Generation", "GPU-7518f6b0-991f-ce2b-3d37-c779130d3137")]


def test_nvml_memory_not_supported_fixture_is_what_the_probe_tolerates():
    lines = recorded("gb10-memory-info-not-supported.txt", "nvml")
    records = [json.loads(line) for line in lines if line.strip()]
    assert all(r["error"] == "Not Supported" for r in records)
    assert records[-1]["product_name"] == "NVIDIA-GB10"


# --- the simulated nvidia-smi answers the same query -----------------------------------------------

def _sim(tmp_path, layout, *args, env=None):
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(layout))
    environ = {k: v for k, v in os.environ.items() if k != "VLLM_FLEET_SIM_DRIVER"}
    environ.update(VLLM_FLEET_SIM_GPUS=str(path), **(env or {}))
    return subprocess.run([sys.executable, nvidia_smi.__file__, *args], capture_output=True, text=True,
                          env=environ, timeout=30)


def test_simulated_nvidia_smi_answers_driver_and_mig_and_stays_labelled(tmp_path):
    layout = [{"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9},
              {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": "8.0"}]
    out = _sim(tmp_path, layout, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits")
    assert out.returncode == 0, out.stderr
    assert "SIMULATED" in out.stderr
    gpus = parse_gpu_csv(out.stdout.splitlines())
    assert [(g.name, g.driver_version, g.mig_mode) for g in gpus] == [
        ("NVIDIA GeForce RTX 4090 D", nvidia_smi.DEFAULT_DRIVER_VERSION, "Disabled"),
        ("NVIDIA A100-SXM4-40GB", nvidia_smi.DEFAULT_DRIVER_VERSION, "Disabled")]
    assert gpu_support.preflight("sim", gpus) == []
    assert "(simulated)" in _sim(tmp_path, layout, "-L").stdout


def test_simulated_old_driver_is_refused_by_preflight(tmp_path):
    layout = [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0,
               "driver_version": "550.54.15"}]
    out = _sim(tmp_path, layout, f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits")
    gpus = parse_gpu_csv(out.stdout.splitlines())
    assert gpus[0].driver_version == "550.54.15"
    (error,) = gpu_support.preflight("sim-old", gpus)
    assert "NVIDIA driver 550.54.15 is too old" in error.message
    table = _sim(tmp_path, {"driver_version": "535.86.10", "gpus": layout}).stdout
    assert "Driver Version: 535.86.10" in table and "SIMULATED" in table  # top-level wins
