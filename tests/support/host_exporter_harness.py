"""The host exporter run as on a host, for its tests (tests/payloads/test_host_exporter*.py): its
bundled script and the file the deploy writes, started as a subprocess on a free loopback port and
scraped over HTTP, a strict parser of the text format (0.0.4), and a fake NVML module placed where
vLLM vendors pynvml. The exporter runs under this python, or under $VLLM_FLEET_EXPORTER_PYTHON."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

from support.payload_helpers import bundled_module
from vllm_fleet import payloads
from vllm_fleet.monitoring.files import exporter_source

host_exporter = bundled_module(payloads.EXPORTER, "host_exporter")
EXPORTER_PYTHON = os.environ.get("VLLM_FLEET_EXPORTER_PYTHON") or sys.executable


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


def write_exporter_file(directory: Path) -> Path:
    """The exporter's file as the deploy writes it (host-exporter.py: its payload bundled), in
    `directory` (each module's `exporter_file` fixture)."""
    path = directory / "host-exporter.py"
    path.write_text(exporter_source())
    return path


def exporter_runner(exporter_file: Path):
    """The body of each module's `run_exporter` fixture (`yield from exporter_runner(exporter_file)`):
    start(*args, env=...) -> a running exporter on a free loopback port; all stopped afterwards."""
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


def vllm_env(tmp_path: Path, module_text: str | None) -> Path:
    """A vLLM environment prefix whose vendored pynvml.py is `module_text` (none when None)."""
    prefix = tmp_path / "env"
    third_party = prefix / "lib" / "python3.11" / "site-packages" / "vllm" / "third_party"
    third_party.mkdir(parents=True)
    if module_text is not None:
        (third_party / "pynvml.py").write_text(module_text)
    return prefix
