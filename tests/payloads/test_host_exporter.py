"""The host exporter (vllm_fleet/payloads/exporter) as it runs on a host: its bundled script, the file
the deploy writes, as a subprocess on a free loopback port, scraped over HTTP, its answers read by a
strict parser of the text format (tests/support/host_exporter_harness.py).

Here its /gpu: GPUs from a fake NVML module (the file vLLM vendors, placed in a --vllm-env tree made
here), from the sandbox's SIMULATED nvidia-smi, or from nothing. Its /front and its pure parts are
tested in test_host_exporter_front.py. The exporter runs under this python, or under
$VLLM_FLEET_EXPORTER_PYTHON (e.g. a Python 3.9, the oldest it supports)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from support.host_exporter_harness import FAKE_NVML, exporter_runner, host_exporter, stop, vllm_env, write_exporter_file

from vllm_fleet.sandbox import nvidia_smi


@pytest.fixture(scope="module")
def exporter_file(tmp_path_factory) -> Path:
    return write_exporter_file(tmp_path_factory.mktemp("exporter"))


@pytest.fixture
def run_exporter(exporter_file):
    yield from exporter_runner(exporter_file)


HOSTILE_COMM = 'q"b\\s\nn'  # a quote, a backslash and a newline: /proc/PID/comm keeps all three


@pytest.fixture
def hostile_process():
    """A process whose name (/proc/PID/comm) holds a quote, a backslash and a newline."""
    code = f"open('/proc/self/comm', 'w').write({HOSTILE_COMM!r}); import time; time.sleep(120)"
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        until = time.monotonic() + 10
        while Path(f"/proc/{proc.pid}/comm").read_text() != HOSTILE_COMM + "\n":
            assert time.monotonic() < until, "the child never renamed itself"
            time.sleep(0.02)
        yield proc.pid
    finally:
        stop(proc)

NO_LIBRARY_NVML = textwrap.dedent('''
    """vLLM's pynvml where there is no libnvidia-ml.so.1 (as on the sandbox's simulated hosts)."""
    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__("NVML Shared Library Not Found")
            self.value = value
    def nvmlInit():
        raise NVMLError(12)
''')


def simulated_smi(tmp_path: Path, layout: list[dict]) -> Path:
    """The sandbox's SIMULATED nvidia-smi answering `layout`, as one executable."""
    (tmp_path / "gpus.json").write_text(json.dumps(layout))
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nVLLM_FLEET_SIM_GPUS={shlex.quote(str(tmp_path / 'gpus.json'))} "
                   f"exec {shlex.quote(sys.executable)} {shlex.quote(nvidia_smi.__file__)} \"$@\"\n")
    smi.chmod(0o755)
    return smi


GPU_SERIES = ["vllm_fleet_gpu_info", "vllm_fleet_gpu_utilization_ratio", "vllm_fleet_gpu_memory_used_bytes",
              "vllm_fleet_gpu_memory_total_bytes", "vllm_fleet_gpu_temperature_celsius",
              "vllm_fleet_gpu_slowdown_temperature_celsius", "vllm_fleet_gpu_power_watts",
              "vllm_fleet_gpu_power_limit_watts", "vllm_fleet_gpu_sm_clock_hertz",
              "vllm_fleet_gpu_memory_clock_hertz"]


# --- /gpu through NVML ----------------------------------------------------------------------------

def test_nvml_gpus_in_pci_order_with_units_and_unsupported_metrics_absent(tmp_path, run_exporter,
                                                                           hostile_process):
    env = vllm_env(tmp_path, FAKE_NVML)
    exporter = run_exporter("--vllm-env", str(env), "--nvidia-smi", str(tmp_path / "no-nvidia-smi"),
                            env={"FAKE_NVML_PID": str(hostile_process)})
    scrape = exporter.scrape("/gpu")
    assert scrape.value("vllm_fleet_gpu_up") == 1
    info = sorted(scrape.get("vllm_fleet_gpu_info"), key=lambda s: s[0]["gpu"])
    # NVML lists the A100 first; PCI order (bus 01 before bus 41) puts the 4090 D first.
    assert [(labels["gpu"], labels["gpu_name"], labels["pci_bus_id"], labels["source"], labels["simulated"],
             labels["driver"]) for labels, _ in info] == [
        ("0", "NVIDIA GeForce RTX 4090 D", "00000000:01:00.0", "nvml", "false", "580.126.09"),
        ("1", "NVIDIA A100-SXM4-40GB", "00000000:41:00.0", "nvml", "false", "580.126.09")]
    assert info[1][0]["uuid"] == "GPU-3f1c2a9e-0b6d-4c1e-9a57-2d8e6f0b1c3a"
    a100 = {"gpu": "1"}
    assert scrape.value("vllm_fleet_gpu_utilization_ratio", **a100) == pytest.approx(0.37)
    assert scrape.value("vllm_fleet_gpu_memory_used_bytes", **a100) == 1024 * 1024 * 1024
    assert scrape.value("vllm_fleet_gpu_memory_total_bytes", **a100) == 40960 * 1024 * 1024
    assert scrape.value("vllm_fleet_gpu_temperature_celsius", **a100) == 41
    assert scrape.value("vllm_fleet_gpu_slowdown_temperature_celsius", **a100) == 90
    assert scrape.value("vllm_fleet_gpu_power_watts", **a100) == pytest.approx(61.234)  # from mW
    assert scrape.value("vllm_fleet_gpu_power_limit_watts", **a100) == 400
    assert scrape.value("vllm_fleet_gpu_sm_clock_hertz", **a100) == 1410e6  # from MHz
    assert scrape.value("vllm_fleet_gpu_memory_clock_hertz", **a100) == 1215e6
    assert scrape.value("vllm_fleet_gpu_power_limit_watts", gpu="0") == 425
    assert scrape.value("vllm_fleet_gpu_ecc_errors_total", gpu="1", type="corrected") == 2
    assert scrape.value("vllm_fleet_gpu_ecc_errors_total", gpu="1", type="uncorrected") == 0
    assert scrape.value("vllm_fleet_gpu_retired_pages_total", gpu="1", cause="single_bit") == 1
    assert scrape.value("vllm_fleet_gpu_retired_pages_total", gpu="1", cause="double_bit") == 0
    # NOT_SUPPORTED: absent, not 0.
    assert scrape.get("vllm_fleet_gpu_ecc_errors_total", gpu="0") == []
    assert scrape.get("vllm_fleet_gpu_retired_pages_total", gpu="0") == []
    assert scrape.types["vllm_fleet_gpu_ecc_errors_total"] == "counter"
    assert "volatile" in scrape.helps["vllm_fleet_gpu_ecc_errors_total"]
    for name in GPU_SERIES:
        assert {labels["gpu"] for labels, _ in scrape.get(name)} == {"0", "1"}, name
        assert all(labels["simulated"] == "false" and labels["gpu_name"] for labels, _ in scrape.get(name)), name

    # The process, counted once though NVML lists it as compute and graphics; its name escaped.
    (proc,) = scrape.get("vllm_fleet_gpu_process_memory_used_bytes")
    assert proc[0]["gpu"] == "1" and proc[0]["pid"] == str(hostile_process) and proc[1] == 812 * 1024 * 1024
    assert proc[0]["process"] == HOSTILE_COMM
    assert 'process="q\\"b\\\\s\\nn"' in scrape.text
    assert "unit" in proc[0]

    # One Xid event arrives on the A100; the 4090 D could not register for events: absent.
    until = time.monotonic() + 10
    xid = {"gpu": "1", "gpu_name": "NVIDIA A100-SXM4-40GB", "simulated": "false"}
    while scrape.get("vllm_fleet_gpu_xid_errors_total", gpu="1") != [(xid, 1.0)]:
        assert time.monotonic() < until, scrape.get("vllm_fleet_gpu_xid_errors_total")
        time.sleep(0.1)
        scrape = exporter.scrape("/gpu")
    assert scrape.get("vllm_fleet_gpu_xid_errors_total", gpu="0") == []
    assert scrape.types["vllm_fleet_gpu_xid_errors_total"] == "counter"


# --- /gpu through the SIMULATED nvidia-smi -----------------------------------------------------

def test_simulated_nvidia_smi_gpus_are_labelled_simulated_and_the_4090_d_has_no_ecc(tmp_path, run_exporter):
    layout = [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0,
               "pci_bus_id": "00000000:41:00.0"},
              {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9,
               "pci_bus_id": "00000000:01:00.0"},
              {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0,
               "pci_bus_id": "00000000:81:00.0"}]
    exporter = run_exporter("--vllm-env", str(vllm_env(tmp_path, NO_LIBRARY_NVML)),
                            "--nvidia-smi", str(simulated_smi(tmp_path, layout)))
    scrape = exporter.scrape("/gpu")
    assert scrape.value("vllm_fleet_gpu_up") == 1
    info = sorted(scrape.get("vllm_fleet_gpu_info"), key=lambda s: s[0]["gpu"])
    assert [(labels["gpu"], labels["gpu_name"], labels["source"]) for labels, _ in info] == [
        ("0", "NVIDIA GeForce RTX 4090 D", "nvidia-smi"), ("1", "NVIDIA A100-SXM4-40GB", "nvidia-smi"),
        ("2", "NVIDIA A100-SXM4-40GB", "nvidia-smi")]
    assert all(labels["uuid"].startswith("GPU-sim-") for labels, _ in info)
    gpu_samples = [s for s in scrape.samples if s[0] != "vllm_fleet_gpu_up"]
    assert gpu_samples and all(labels["simulated"] == "true" for _, labels, _ in gpu_samples)
    for name in GPU_SERIES:
        assert {labels["gpu"] for labels, _ in scrape.get(name)} == {"0", "1", "2"}, name
    assert scrape.value("vllm_fleet_gpu_memory_total_bytes", gpu="0") == 24564 * 1024 * 1024  # MiB
    assert scrape.value("vllm_fleet_gpu_power_limit_watts", gpu="0") == 425
    assert scrape.value("vllm_fleet_gpu_power_limit_watts", gpu="1") == 400
    assert scrape.value("vllm_fleet_gpu_power_watts", gpu="1") == 60
    assert scrape.value("vllm_fleet_gpu_sm_clock_hertz", gpu="1") == 1410e6  # MHz
    assert scrape.value("vllm_fleet_gpu_temperature_celsius", gpu="1") == 35
    # From `-q -d TEMPERATURE`'s T.Limit rows: current + margin - slowdown offset.
    assert scrape.value("vllm_fleet_gpu_slowdown_temperature_celsius", gpu="2") == 87
    assert scrape.value("vllm_fleet_gpu_ecc_errors_total", gpu="1", type="uncorrected") == 0
    assert scrape.value("vllm_fleet_gpu_retired_pages_total", gpu="2", cause="double_bit") == 0
    # The GeForce board has no ECC ([N/A]): no ECC and no retired-page series for it.
    assert scrape.get("vllm_fleet_gpu_ecc_errors_total", gpu="0") == []
    assert scrape.get("vllm_fleet_gpu_retired_pages_total", gpu="0") == []
    assert scrape.get("vllm_fleet_gpu_xid_errors_total") == []  # no NVML, no event set
    assert scrape.get("vllm_fleet_gpu_process_memory_used_bytes") == []


def test_no_nvml_and_no_nvidia_smi_is_gpu_up_0_and_says_why(tmp_path, run_exporter):
    exporter = run_exporter("--vllm-env", str(vllm_env(tmp_path, NO_LIBRARY_NVML)),
                            "--nvidia-smi", str(tmp_path / "no-nvidia-smi"))
    scrape = exporter.scrape("/gpu")
    assert scrape.samples == [("vllm_fleet_gpu_up", {}, 0.0)]
    assert "no NVIDIA GPU" in scrape.helps["vllm_fleet_gpu_up"]
    assert "Library Not Found" in scrape.helps["vllm_fleet_gpu_up"]
    exporter.scrape("/gpu")
    errors = exporter.stderr()
    assert errors.count("no NVIDIA GPU") == 1, errors  # once, however many scrapes


def test_without_any_nvml_bindings_the_gpus_are_down_too(tmp_path, run_exporter):
    if __import__("importlib").util.find_spec("pynvml") is not None:
        pytest.skip("this python has a pynvml module")
    exporter = run_exporter("--vllm-env", str(vllm_env(tmp_path, None)),
                            "--nvidia-smi", str(tmp_path / "no-nvidia-smi"))
    scrape = exporter.scrape("/gpu")
    assert scrape.samples == [("vllm_fleet_gpu_up", {}, 0.0)]
    assert "no vllm/third_party/pynvml.py" in scrape.helps["vllm_fleet_gpu_up"]


def test_a_hanging_or_failing_nvidia_smi_gives_gpu_up_0_within_the_deadline(tmp_path, run_exporter):
    hanging = tmp_path / "hanging-nvidia-smi"
    hanging.write_text("#!/bin/sh\nsleep 60\necho never\n")  # a child of the script holds the pipe
    hanging.chmod(0o755)
    exporter = run_exporter("--vllm-env", str(vllm_env(tmp_path, NO_LIBRARY_NVML)), "--nvidia-smi", str(hanging))
    started = time.monotonic()
    scrape = exporter.scrape("/gpu")
    assert time.monotonic() - started < host_exporter.SCRAPE_TIMEOUT_S + 3
    assert scrape.samples == [("vllm_fleet_gpu_up", {}, 0.0)]

    failing = tmp_path / "failing-nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n")
    failing.chmod(0o755)
    exporter = run_exporter("--vllm-env", str(vllm_env(tmp_path / "2", NO_LIBRARY_NVML)),
                            "--nvidia-smi", str(failing))
    assert exporter.scrape("/gpu").samples == [("vllm_fleet_gpu_up", {}, 0.0)]
    assert "could not communicate" in exporter.stderr()
