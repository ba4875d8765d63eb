"""The host exporter (vllm_fleet/payloads/exporter) as it runs on a host: its bundled script, the file
the deploy writes, as a subprocess on a free loopback port, scraped over HTTP, its answers read by a
strict parser of the text format; its functions from that same script, executed here as one module.

GPUs come from a fake NVML module (the file vLLM vendors, placed in a --vllm-env tree made here),
from the sandbox's SIMULATED nvidia-smi, or from nothing; the front from a stub_status server
started here, a tmp_path filesystem and a certificate made with `cryptography`. The exporter runs
under this python, or under $VLLM_FLEET_EXPORTER_PYTHON (e.g. a Python 3.9, the oldest it supports)."""

from __future__ import annotations

import datetime
import http.server
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from support.payload_helpers import bundled_module
from vllm_fleet import payloads
from vllm_fleet.monitoring.files import exporter_source
from vllm_fleet.sandbox import nvidia_smi

host_exporter = bundled_module(payloads.EXPORTER, "host_exporter")
EXPORTER_PYTHON = os.environ.get("VLLM_FLEET_EXPORTER_PYTHON") or sys.executable
HOSTILE_COMM = 'q"b\\s\nn'  # a quote, a backslash and a newline: /proc/PID/comm keeps all three

# --- a strict reader of the text format (0.0.4) ------------------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL_VALUE = r'"((?:[^"\\\n]|\\[\\"n])*)"'
SAMPLE = re.compile(rf"({NAME})(?:\{{((?:[a-zA-Z_][a-zA-Z0-9_]*={LABEL_VALUE}(?:,(?!\}})|(?=\}})))*)\}})? "
                    r"(-?[0-9.eE+-]+|NaN|\+Inf|-Inf)")
LABEL = re.compile(rf"([a-zA-Z_][a-zA-Z0-9_]*)={LABEL_VALUE}")
HELP_LINE = re.compile(rf"# HELP ({NAME}) ((?:[^\\\n]|\\[\\n])*)")
TYPE_LINE = re.compile(rf"# TYPE ({NAME}) (counter|gauge|histogram|summary|untyped)")


def unescape(value: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), value)


class Scrape:
    """A parsed answer: samples as (name, labels, value), and each family's type and help."""

    def __init__(self, text: str):
        assert text.endswith("\n"), "the exposition ends with a line feed"
        self.text, self.samples, self.types, self.helps = text, [], {}, {}
        for line in text[:-1].split("\n"):
            if m := HELP_LINE.fullmatch(line):
                assert m.group(1) not in self.helps, f"second HELP for {m.group(1)}"
                self.helps[m.group(1)] = unescape(m.group(2))
            elif m := TYPE_LINE.fullmatch(line):
                assert m.group(1) not in self.types, f"second TYPE for {m.group(1)}"
                assert not any(s[0] == m.group(1) for s in self.samples), "TYPE after samples"
                self.types[m.group(1)] = m.group(2)
            elif m := SAMPLE.fullmatch(line):
                name = m.group(1)
                assert name in self.types and name in self.helps, f"{name}: no TYPE/HELP before it"
                labels = {k: unescape(v) for k, v in LABEL.findall(m.group(2) or "")}
                assert len(labels) == len(LABEL.findall(m.group(2) or "")), f"a label twice: {line}"
                self.samples.append((name, labels, float(m.group(4))))
            else:
                raise AssertionError(f"not a line of the text format: {line!r}")
        names = [s[0] for s in self.samples]
        for name in set(names):  # a family's samples are together
            first, last = names.index(name), len(names) - 1 - names[::-1].index(name)
            assert set(names[first:last + 1]) == {name}, f"{name}'s samples are split"

    def get(self, name: str, **labels) -> list[tuple[dict, float]]:
        return [(got, v) for n, got, v in self.samples
                if n == name and all(got.get(k) == v for k, v in labels.items())]

    def value(self, name: str, **labels) -> float:
        (found,) = self.get(name, **labels)
        return found[1]


# --- running it ---------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fetch(url: str, method: str = "GET", timeout: float = 20) -> tuple[int, str, dict]:
    request = urllib.request.Request(url, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), dict(exc.headers)


class Exporter:
    def __init__(self, proc: subprocess.Popen, base: str):
        self.proc, self.base = proc, base

    def scrape(self, route: str) -> Scrape:
        status, body, headers = fetch(self.base + route)
        assert status == 200, body
        assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        return Scrape(body)

    def stderr(self) -> str:
        stop(self.proc)
        return self.proc.stderr.read()


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def exporter_file(tmp_path_factory) -> Path:
    """The exporter's file as the deploy writes it (host-exporter.py: its payload bundled)."""
    path = tmp_path_factory.mktemp("exporter") / "host-exporter.py"
    path.write_text(exporter_source())
    return path


@pytest.fixture
def run_exporter(exporter_file):
    """start(*args, env=...) -> a running exporter on a free loopback port; all stopped afterwards."""
    started: list[subprocess.Popen] = []

    def start(*args: str, env: dict | None = None) -> Exporter:
        port = free_port()
        proc = subprocess.Popen([EXPORTER_PYTHON, "-I", str(exporter_file), "--listen", f"127.0.0.1:{port}", *args],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        started.append(proc)
        base = f"http://127.0.0.1:{port}"
        until = time.monotonic() + 20
        while True:
            assert proc.poll() is None, f"the exporter exited: {proc.stderr.read()}"
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return Exporter(proc, base)
            except OSError:
                assert time.monotonic() < until, "the exporter never listened"
                time.sleep(0.05)

    yield start
    for proc in started:
        stop(proc)


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


# --- a fake NVML, where vLLM vendors pynvml -------------------------------------------------------

FAKE_NVML = textwrap.dedent('''
    """A FAKE pynvml for the host exporter's tests: two GPUs, NVML order not PCI order."""
    import os
    import sys
    import time
    from types import SimpleNamespace as S

    # nvidia-ml-py's pynvml does this while it loads (_extractNVMLErrorsAsClasses).
    _this_module = sys.modules[__name__]

    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_TIMEOUT = 10
    NVML_TEMPERATURE_GPU = 0
    NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    nvmlEventTypeXidCriticalError = 0x8

    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__(f"NVML error {value}")
            self.value = value

    class NVMLError_NotSupported(NVMLError):
        def __init__(self):
            super().__init__(NVML_ERROR_NOT_SUPPORTED)

    MIB = 1024 * 1024
    A100, RTX = 0, 1  # NVML's own order: the A100 first, though its bus id is the higher one
    GPUS = {
        A100: dict(bus=b"00000000:41:00.0", name=b"NVIDIA A100-SXM4-40GB",
                   uuid=b"GPU-3f1c2a9e-0b6d-4c1e-9a57-2d8e6f0b1c3a", util=37, used=1024 * MIB,
                   total=40960 * MIB, temp=41, slowdown=90, power=61234, limit=400000, sm=1410, mem=1215,
                   ecc={0: 2, 1: 0}, retired={0: [0x1000], 1: []}, xid=True),
        RTX: dict(bus=b"00000000:01:00.0", name=b"NVIDIA GeForce RTX 4090 D",
                  uuid=b"GPU-a7d0e5b4-51c2-4e8f-8b3d-6c9f1e2a4d70", util=0, used=512 * MIB,
                  total=24564 * MIB, temp=33, slowdown=87, power=21500, limit=425000, sm=2280,
                  mem=10501, ecc=None, retired=None, xid=False),
    }
    HOSTILE_PID = int(os.environ["FAKE_NVML_PID"])
    _events = [S(device=A100, eventType=nvmlEventTypeXidCriticalError, eventData=79)]

    def nvmlInit(): pass
    def nvmlShutdown(): pass
    def nvmlSystemGetDriverVersion(): return "580.126.09"
    def nvmlDeviceGetCount(): return len(GPUS)
    def nvmlDeviceGetHandleByIndex(i): return i
    def nvmlDeviceGetPciInfo(h): return S(busId=GPUS[h]["bus"])
    def nvmlDeviceGetName(h): return GPUS[h]["name"]
    def nvmlDeviceGetUUID(h): return GPUS[h]["uuid"]
    def nvmlDeviceGetUtilizationRates(h): return S(gpu=GPUS[h]["util"], memory=0)
    def nvmlDeviceGetMemoryInfo(h): return S(used=GPUS[h]["used"], total=GPUS[h]["total"], free=0)
    def nvmlDeviceGetTemperature(h, sensor):
        assert sensor == NVML_TEMPERATURE_GPU
        return GPUS[h]["temp"]
    def nvmlDeviceGetTemperatureThreshold(h, kind):
        assert kind == NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return GPUS[h]["slowdown"]
    def nvmlDeviceGetPowerUsage(h): return GPUS[h]["power"]
    def nvmlDeviceGetEnforcedPowerLimit(h): return GPUS[h]["limit"]
    def nvmlDeviceGetClockInfo(h, clock): return GPUS[h]["sm" if clock == NVML_CLOCK_SM else "mem"]
    def nvmlDeviceGetTotalEccErrors(h, error_type, counter):
        assert counter == NVML_VOLATILE_ECC
        if GPUS[h]["ecc"] is None:
            raise NVMLError_NotSupported()
        return GPUS[h]["ecc"][error_type]
    def nvmlDeviceGetRetiredPages(h, cause):
        if GPUS[h]["retired"] is None:
            raise NVMLError_NotSupported()
        return GPUS[h]["retired"][cause]
    def nvmlDeviceGetComputeRunningProcesses(h):
        return [S(pid=HOSTILE_PID, usedGpuMemory=812 * MIB)] if h == A100 else []
    def nvmlDeviceGetGraphicsRunningProcesses(h):  # the same process, seen again: counted once
        return [S(pid=HOSTILE_PID, usedGpuMemory=812 * MIB)] if h == A100 else []
    def nvmlEventSetCreate(): return "event-set"
    def nvmlDeviceRegisterEvents(h, types, event_set):
        if not GPUS[h]["xid"]:
            raise NVMLError_NotSupported()
    def nvmlEventSetWait(event_set, timeout_ms):
        if _events:
            return _events.pop()
        time.sleep(min(timeout_ms, 200) / 1000)
        raise NVMLError(NVML_ERROR_TIMEOUT)
    def nvmlEventSetFree(event_set): pass
''')

NO_LIBRARY_NVML = textwrap.dedent('''
    """vLLM's pynvml where there is no libnvidia-ml.so.1 (as on the sandbox's simulated hosts)."""
    class NVMLError(Exception):
        def __init__(self, value):
            super().__init__("NVML Shared Library Not Found")
            self.value = value
    def nvmlInit():
        raise NVMLError(12)
''')


def vllm_env(tmp_path: Path, module_text: str | None) -> Path:
    """A vLLM environment prefix whose vendored pynvml.py is `module_text` (none when None)."""
    prefix = tmp_path / "env"
    third_party = prefix / "lib" / "python3.11" / "site-packages" / "vllm" / "third_party"
    third_party.mkdir(parents=True)
    if module_text is not None:
        (third_party / "pynvml.py").write_text(module_text)
    return prefix


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


# --- /front -----------------------------------------------------------------------------------------

STUB_TEXT = "Active connections: 3 \nserver accepts handled requests\n 17 16 29 \nReading: 0 Writing: 1 Waiting: 2 \n"


@pytest.fixture
def stub_status():
    """nginx's stub_status page, served on a free loopback port."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = STUB_TEXT.encode()
            self.send_response(200 if self.path == "/stub_status" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/stub_status"
    finally:
        server.shutdown()
        server.server_close()


def make_certificate(path: Path, not_after: datetime.datetime) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpu-01.test")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_after - datetime.timedelta(days=90)).not_valid_after(not_after)
            .sign(key, hashes.SHA256()))
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def test_front_counters_storage_and_certificate(tmp_path, run_exporter, stub_status):
    not_after = datetime.datetime(2031, 5, 17, 12, 30, 0, tzinfo=datetime.timezone.utc)
    cert = tmp_path / "front.crt"
    make_certificate(cert, not_after)
    odd_dir = tmp_path / 'models "x"'
    odd_dir.mkdir()
    exporter = run_exporter("--front-status", stub_status, "--storage", str(odd_dir),
                            "--storage", str(tmp_path / "missing"), "--tls-cert", str(cert))
    scrape = exporter.scrape("/front")
    assert scrape.value("vllm_fleet_front_up") == 1
    assert {labels["state"]: v for labels, v in scrape.get("vllm_fleet_front_connections")} == {
        "active": 3, "reading": 0, "writing": 1, "waiting": 2}
    assert scrape.value("vllm_fleet_front_connections_accepted_total") == 17
    assert scrape.value("vllm_fleet_front_connections_handled_total") == 16
    assert scrape.value("vllm_fleet_front_http_requests_total") == 29
    assert scrape.types["vllm_fleet_front_http_requests_total"] == "counter"
    fs = os.statvfs(odd_dir)
    assert scrape.value("vllm_fleet_storage_size_bytes", path=str(odd_dir)) == fs.f_blocks * fs.f_frsize
    avail = scrape.value("vllm_fleet_storage_avail_bytes", path=str(odd_dir))
    assert 0 < avail <= fs.f_blocks * fs.f_frsize
    sizes = scrape.get("vllm_fleet_storage_size_bytes")
    assert [labels["path"] for labels, _ in sizes] == [str(odd_dir)]  # missing: skipped
    assert scrape.value("vllm_fleet_tls_cert_not_after_timestamp_seconds", path=str(cert)) == not_after.timestamp()

    status, _, _ = fetch(exporter.base + "/front", method="HEAD")
    assert status == 200
    for route in ("/", "/metrics", "/gpu/x"):
        assert fetch(exporter.base + route)[0] == 404
    assert fetch(exporter.base + "/front", method="POST")[0] >= 400


def test_front_down_is_front_up_0_and_fast_and_an_unreadable_certificate_is_absent(tmp_path, run_exporter):
    bad_cert = tmp_path / "front.crt"
    bad_cert.write_text("-----BEGIN CERTIFICATE-----\nnot a certificate\n-----END CERTIFICATE-----\n")
    exporter = run_exporter("--front-status", f"http://127.0.0.1:{free_port()}/stub_status",
                            "--tls-cert", str(bad_cert))
    started = time.monotonic()
    scrape = exporter.scrape("/front")
    assert time.monotonic() - started < 2
    assert scrape.samples == [("vllm_fleet_front_up", {}, 0.0)]


def test_a_front_that_never_answers_is_front_up_0_within_the_deadline(run_exporter):
    with socket.socket() as silent:  # accepts connections (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        exporter = run_exporter("--front-status", f"http://127.0.0.1:{silent.getsockname()[1]}/stub_status")
        started = time.monotonic()
        scrape = exporter.scrape("/front")
        assert time.monotonic() - started < host_exporter.SCRAPE_TIMEOUT_S + 3
    assert scrape.value("vllm_fleet_front_up") == 0


# --- pure parts ------------------------------------------------------------------------------------

def test_slowdown_temperature_from_both_shapes_of_nvidia_smi_q():
    older = ("GPU 00000000:07:00.0\n    Temperature\n        GPU Current Temp            : 47 C\n"
             "        GPU Shutdown Temp           : 99 C\n        GPU Slowdown Temp           : 96 C\n")
    r535 = ("GPU 00000000:01:00.0\n    Temperature\n        GPU Current Temp                  : 33 C\n"
            "        GPU T.Limit Temp                  : 54 C\n"
            "        GPU Shutdown T.Limit Temp         : -8 C\n"
            "        GPU Slowdown T.Limit Temp         : -2 C\n"
            "        GPU Max Operating T.Limit Temp    : 0 C\n"
            "        GPU Target Temperature            : N/A\n"
            "GPU 00000000:02:00.0\n    Temperature\n        GPU Current Temp                  : 30 C\n"
            "        GPU T.Limit Temp                  : N/A\n"
            "        GPU Slowdown T.Limit Temp         : N/A\n")
    assert host_exporter.slowdown_temperatures(older) == {"00000000:07:00.0": 96}
    assert host_exporter.slowdown_temperatures(r535) == {"00000000:01:00.0": 89}  # N/A: absent


def test_stub_status_and_label_escaping():
    assert host_exporter.parse_stub_status(
        "Active connections: 1 \nserver accepts handled requests\n 7 7 9 \nReading: 0 Writing: 1 Waiting: 0 ") == {
        "active": 1, "accepted": 7, "handled": 7, "requests": 9, "reading": 0, "writing": 1, "waiting": 0}
    with pytest.raises(ValueError):
        host_exporter.parse_stub_status("<html>502 Bad Gateway</html>")
    out = host_exporter.Exposition()
    out.add("vllm_fleet_storage_size_bytes", 10, {"path": 'a\\b"c\nd'})
    assert 'path="a\\\\b\\"c\\nd"' in out.text()
    assert Scrape(out.text()).get("vllm_fleet_storage_size_bytes")[0][0] == {"path": 'a\\b"c\nd'}
    assert host_exporter.unit_from_cgroup("0::/system.slice/vllm-gemma.service\n") == "vllm-gemma.service"
    assert host_exporter.unit_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None


def _gated_exporter(tmp_path, run_exporter):
    """An exporter whose NVML answers a GPU's utilization only once `gate` exists, each call counted
    as a line in `calls`: (exporter, gate, calls)."""
    gate, calls = tmp_path / "nvml-may-answer", tmp_path / "nvml-calls"
    stuck = FAKE_NVML.replace(
        "def nvmlDeviceGetUtilizationRates(h): return",
        "def nvmlDeviceGetUtilizationRates(h):\n"
        f"        open({str(calls)!r}, 'a').write('call\\n')\n"
        f"        while not os.path.exists({str(gate)!r}): time.sleep(0.05)\n"
        "        return")
    exporter = run_exporter("--vllm-env", str(vllm_env(tmp_path, stuck)), env={"FAKE_NVML_PID": str(os.getpid())})
    return exporter, gate, calls


def _in_background(url: str) -> tuple[threading.Thread, dict]:
    answer: dict = {}
    thread = threading.Thread(target=lambda: answer.update(answer=fetch(url, timeout=30)))
    thread.start()
    return thread, answer


def test_scrapes_at_the_same_time_share_one_scrape(tmp_path, run_exporter):
    """Two scrapers of one route at once (two Prometheus servers, or one and a person with curl):
    the second gets the running scrape's answer, not a 503, and NVML is read once for both."""
    exporter, gate, calls = _gated_exporter(tmp_path, run_exporter)
    first_thread, first = _in_background(exporter.base + "/gpu")
    time.sleep(1.0)  # the first scrape is in the fake NVML now
    second_thread, second = _in_background(exporter.base + "/gpu")
    time.sleep(1.0)  # the second request waits for it
    gate.write_text("")
    first_thread.join(timeout=30)
    second_thread.join(timeout=30)
    assert first["answer"][0] == 200 and second["answer"][0] == 200
    assert first["answer"][1] == second["answer"][1]
    gpus = len(Scrape(first["answer"][1]).get("vllm_fleet_gpu_info"))
    assert calls.read_text().count("call") == gpus  # one scrape's calls, one per GPU


def test_a_scrape_stuck_in_nvml_makes_the_next_one_answer_503_after_the_scrape_deadline(tmp_path, run_exporter):
    """NVML calls have no timeout: while one scrape of /gpu is stuck in the driver, the next one
    waits for it no longer than a scrape may take (SCRAPE_TIMEOUT_S), then is refused without
    starting another; /front still answers."""
    exporter, gate, _calls = _gated_exporter(tmp_path, run_exporter)
    first_thread, first = _in_background(exporter.base + "/gpu")
    time.sleep(1.0)  # the first scrape is in the fake NVML now
    started = time.monotonic()
    status, body, _headers = fetch(exporter.base + "/gpu", timeout=30)
    waited = time.monotonic() - started
    assert status == 503 and "still running" in body
    assert host_exporter.SCRAPE_TIMEOUT_S <= waited < host_exporter.SCRAPE_TIMEOUT_S + 3, waited
    assert fetch(exporter.base + "/front")[0] == 200
    gate.write_text("")
    first_thread.join(timeout=30)
    assert first["answer"][0] == 200
    assert fetch(exporter.base + "/gpu")[0] == 200  # the route is free again


def test_a_filesystem_that_does_not_answer_is_left_out_and_not_asked_again_meanwhile(monkeypatch):
    release = threading.Event()
    calls = []

    def hanging_statvfs(path):
        calls.append(path)
        release.wait(10)
        raise OSError("gone")

    monkeypatch.setattr(host_exporter.os, "statvfs", hanging_statvfs)
    started = time.monotonic()
    assert host_exporter.statvfs_within("/srv/nfs", 0.2) is None
    assert host_exporter.statvfs_within("/srv/nfs", 0.2) is None  # still hanging: not asked again
    assert time.monotonic() - started < 2 and calls == ["/srv/nfs"]
    release.set()
    deadline = time.monotonic() + 5
    while "/srv/nfs" in host_exporter._statvfs_pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "/srv/nfs" not in host_exporter._statvfs_pending


def test_a_process_name_with_a_comma_keeps_every_gpus_processes():
    rows = host_exporter._csv_rows("00000000:01:00.0, 4242, python3, -m vllm, 812\n00000000:02:00.0, 7, x, 3\n",
                                   host_exporter.NVIDIA_SMI_APP_FIELDS, "process_name")
    assert [(r["pid"], r["process_name"], r["used_memory"]) for r in rows] == [
        ("4242", "python3, -m vllm", "812"), ("7", "x", "3")]
