"""The richer GPU probe (vllm_fleet/payloads/gpu_topology, bundled; the GpuTopology fact) and what the
deploy does with it.

NVIDIA's library cannot exist on this machine (no GPU, no driver, no libnvidia-ml.so.1), so the
on-host script runs for real, in a subprocess, against a TEST DOUBLE: a fake `pynvml` module written
to a temporary directory placed first on PYTHONPATH. It implements only the calls and constants the
script uses, with nvidia-ml-py's names and shapes (including its `NVML_P2P_CAPS_INDEX_READ = 0,`
tuple, which a ctypes call rejects), and reads the GPUs it pretends to have from a JSON scenario.
What these tests prove is the script's logic and the deploy's use of it — not that a real driver
answers the same way.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support.planning_fixtures import A100_40G, RTX_3090, host_data, instance, prepare_on_fake_host
from vllm_fleet.deploy import DeployError
from vllm_fleet.rules import gpu_topology
from vllm_fleet.config import GpuSpec, parse_host
from vllm_fleet.facts.gpus import GpuTopology, parse_gpu_csv, topology_command
from vllm_fleet.payloads.nvidia import normalize_bus_id, unit_from_cgroup
from vllm_fleet.plan import Interconnect, plan_host

FAKE_PYNVML = textwrap.dedent('''
    """TEST DOUBLE of NVIDIA's pynvml (nvidia-ml-py): only what the probe calls, same names.
    The scenario comes from $FAKE_NVML_SCENARIO (JSON); calls are appended to $FAKE_NVML_LOG."""
    import ctypes, json, os
    from types import SimpleNamespace

    _S = json.load(open(os.environ["FAKE_NVML_SCENARIO"]))
    if _S.get("import_error"):
        raise ImportError(_S["import_error"])

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 36
    NVML_P2P_CAPS_INDEX_READ = 0,   # sic: a tuple, as in nvidia-ml-py 12.x/13.x
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_ERROR_UNINITIALIZED, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_SUPPORTED = 1, 2, 3
    NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND = 9, 12
    _MESSAGES = {1: "Uninitialized", 2: "Invalid Argument", 3: "Not Supported",
                 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found"}

    class NVMLError(Exception):
        def __new__(cls, value):
            cls = {9: NVMLError_DriverNotLoaded, 12: NVMLError_LibraryNotFound}.get(value, cls)
            obj = Exception.__new__(cls)
            obj.value = value
            return obj
        def __str__(self):
            return _MESSAGES.get(self.value, "Unknown Error")

    class NVMLError_DriverNotLoaded(NVMLError): pass
    class NVMLError_LibraryNotFound(NVMLError): pass

    _initialized = [False]

    def _log(name):
        with open(os.environ["FAKE_NVML_LOG"], "a") as f:
            f.write(name + "\\n")

    def _gpu(handle):
        if not _initialized[0]:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return _S["gpus"][handle.index]

    def nvmlInit():
        _log("nvmlInit")
        if _S.get("init_error"):
            raise NVMLError(_S["init_error"])
        _initialized[0] = True

    def nvmlShutdown():
        _log("nvmlShutdown")
        _initialized[0] = False

    def nvmlSystemGetDriverVersion():
        return "550.54.15"

    def nvmlDeviceGetCount():
        if not _initialized[0]:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(_S["gpus"])

    def nvmlDeviceGetHandleByIndex(index):
        if not 0 <= index < nvmlDeviceGetCount():
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(handle):
        return _gpu(handle)["name"].encode()  # older pynvml releases return bytes

    def nvmlDeviceGetUUID(handle):
        return _gpu(handle)["uuid"]

    def nvmlDeviceGetPciInfo(handle):
        return SimpleNamespace(busId=_gpu(handle)["bus_id"])

    def nvmlDeviceGetMemoryInfo(handle):
        g = _gpu(handle)
        return SimpleNamespace(total=g["total_mib"] << 20, used=g["used_mib"] << 20,
                               free=(g["total_mib"] - g["used_mib"]) << 20)

    def nvmlDeviceGetNvLinkState(handle, link):
        g = _gpu(handle)
        if not g["nvlinks"]:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= 12:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return NVML_FEATURE_ENABLED if link < g["nvlinks"] else 0

    def nvmlDeviceGetP2PStatus(device1, device2, p2pIndex):
        if not isinstance(p2pIndex, int):  # what ctypes does with a tuple argument
            raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter 3")
        a, b = sorted((_gpu(device1)["bus_id"], _gpu(device2)["bus_id"]))
        status = _S["p2p"][str(p2pIndex)][a + " " + b]
        if isinstance(status, str):  # "error:<code>": the call itself fails
            raise NVMLError(int(status.split(":")[1]))
        return status

    def nvmlDeviceGetComputeRunningProcesses(handle):
        return [SimpleNamespace(pid=pid, usedGpuMemory=mib << 20, gpuInstanceId=0xFFFFFFFF,
                                computeInstanceId=0xFFFFFFFF) for pid, mib in _gpu(handle)["procs"]]
''')

NO_SUCH_PID = 4_000_000_000  # above any pid_max: no /proc entry, so no unit and no name
RTX = "00000000:01:00.0"
A1, A2 = "00000000:41:00.0", "00000000:81:00.0"


def seed_box_scenario(procs_on_a1=((NO_SUCH_PID, 1024),)) -> dict:
    """The seeds' box as NVML reports it, in NVML's own order (not PCI order, to test the sort):
    the 4090 D has no P2P to the A100s (the driver disables it on GeForce cards), the A100s are
    NVLinked (12 links each)."""
    return {
        "gpus": [
            {"bus_id": A1, "name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a1", "total_mib": 40960,
             "used_mib": 1500, "nvlinks": 12, "procs": [list(p) for p in procs_on_a1]},
            {"bus_id": RTX, "name": "NVIDIA GeForce RTX 4090 D", "uuid": "GPU-rtx", "total_mib": 24564,
             "used_mib": 3, "nvlinks": 0, "procs": []},
            {"bus_id": A2, "name": "NVIDIA A100-SXM4-40GB", "uuid": "GPU-a2", "total_mib": 40960,
             "used_mib": 3, "nvlinks": 12, "procs": []},
        ],
        "p2p": {
            "0": {f"{RTX} {A1}": 2, f"{RTX} {A2}": 2, f"{A1} {A2}": 0},  # READ
            "2": {f"{RTX} {A1}": 5, f"{RTX} {A2}": "error:3", f"{A1} {A2}": 0},  # NVLINK
        },
    }


@pytest.fixture
def fake_nvml(tmp_path):
    """Run a command with the fake pynvml first on PYTHONPATH: (scenario dict) -> (stdout, log)."""
    (tmp_path / "pynvml.py").write_text(FAKE_PYNVML)

    def run(scenario: dict, command: list[str] | None = None) -> tuple[subprocess.CompletedProcess, str]:
        (tmp_path / "scenario.json").write_text(json.dumps(scenario))
        log = tmp_path / "calls.log"
        log.write_text("")
        env = dict(os.environ, PYTHONPATH=str(tmp_path), FAKE_NVML_SCENARIO=str(tmp_path / "scenario.json"),
                   FAKE_NVML_LOG=str(log))
        command = command or ["bash", "-c", topology_command(sys.executable)]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
        return result, log.read_text()

    return run


def fact(stdout: str) -> dict:
    return GpuTopology().process(stdout.splitlines())


# --- the on-host script, for real, against the fake library --------------------------------------

def test_seed_box_in_pci_order_with_p2p_nvlink_and_processes(fake_nvml):
    result, calls = fake_nvml(seed_box_scenario())
    assert result.returncode == 0, result.stderr
    topo = fact(result.stdout)
    assert topo["available"] is True, topo
    assert [(g["index"], g["bus_id"], g["name"], g["nvml_index"]) for g in topo["gpus"]] == [
        (0, RTX, "NVIDIA GeForce RTX 4090 D", 1), (1, A1, "NVIDIA A100-SXM4-40GB", 0),
        (2, A2, "NVIDIA A100-SXM4-40GB", 2)]
    assert [g["uuid"] for g in topo["gpus"]] == ["GPU-rtx", "GPU-a1", "GPU-a2"]
    assert [(g["memory_total_mib"], g["memory_used_mib"]) for g in topo["gpus"]] == [
        (24564, 3), (40960, 1500), (40960, 3)]
    assert [g["nvlink_active"] for g in topo["gpus"]] == [0, 12, 12]
    read, nvlink = topo["p2p"]["read"], topo["p2p"]["nvlink"]
    assert read == [["self", "GPU not supported", "GPU not supported"],
                    ["GPU not supported", "self", "ok"],
                    ["GPU not supported", "ok", "self"]]
    assert nvlink[1][2] == nvlink[2][1] == "ok"
    assert nvlink[0][1] == "not supported" and nvlink[0][2] == "error: Not Supported"
    assert topo["gpus"][1]["processes"] == [{"pid": NO_SUCH_PID, "used_mib": 1024, "name": None,
                                             "unit": None}]
    assert topo["gpus"][0]["processes"] == [] and topo["driver"] == "550.54.15"
    assert calls.splitlines() == ["nvmlInit", "nvmlShutdown"]
    assert topo["nvml_module"] == "pynvml"  # no vllm package on this PYTHONPATH: the fallback
    assert gpu_topology.summary(topo) == ("3 GPU(s); NVLink 1-2; via pynvml; "
                                          "no P2P 0-1 (GPU not supported), 0-2 (GPU not supported)")


def test_vllms_vendored_pynvml_is_used_first_without_importing_vllm(fake_nvml, tmp_path):
    """vLLM imports NVML as vllm.third_party.pynvml (vllm/utils/import_utils.py): the probe loads
    that file first, by path; vllm/__init__.py (torch and all) is never run."""
    vendored = tmp_path / "vllm" / "third_party"
    vendored.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('vllm/__init__ must not run')\n")
    (vendored / "__init__.py").write_text("")
    (vendored / "pynvml.py").write_text(FAKE_PYNVML)
    (tmp_path / "pynvml.py").write_text("raise ImportError('the fallback must not be needed')\n")
    result, calls = fake_nvml(seed_box_scenario())
    topo = fact(result.stdout)
    assert topo["available"] is True, topo
    assert topo["nvml_module"] == "vllm.third_party.pynvml"
    assert calls.splitlines() == ["nvmlInit", "nvmlShutdown"]
    assert "via vllm.third_party.pynvml" in gpu_topology.summary(topo)


def test_a_process_is_named_by_its_systemd_unit(fake_nvml):
    # This test's own process: whatever /proc says its unit is, the probe must say the same.
    me = os.getpid()
    result, _ = fake_nvml(seed_box_scenario(procs_on_a1=[(me, 700)]))
    (proc,) = fact(result.stdout)["gpus"][1]["processes"]
    expected = unit_from_cgroup(Path(f"/proc/{me}/cgroup").read_text())
    assert proc == {"pid": me, "used_mib": 700, "name": Path(f"/proc/{me}/comm").read_text().strip(),
                    "unit": expected}


def test_unit_from_cgroup_v1_and_v2():
    assert unit_from_cgroup("0::/system.slice/vllm-gemma.service\n") == "vllm-gemma.service"
    v1 = "12:cpu,cpuacct:/system.slice/other.service\n1:name=systemd:/system.slice/vllm-a.service\n"
    assert unit_from_cgroup(v1) == "other.service"
    assert unit_from_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert unit_from_cgroup("") is None


def test_pynvml_missing_is_unavailable_not_an_error(fake_nvml):
    result, calls = fake_nvml({"import_error": "No module named 'pynvml'"})
    assert result.returncode == 0
    topo = fact(result.stdout)
    assert topo["available"] is False
    assert "no NVML bindings can be imported" in topo["reason"] and sys.executable in topo["reason"]
    assert "vllm.third_party.pynvml: no vllm package" in topo["reason"]
    assert calls == ""


@pytest.mark.parametrize("code, words", [(9, "NVMLError_DriverNotLoaded: Driver Not Loaded"),
                                         (12, "NVMLError_LibraryNotFound: NVML Shared Library Not Found")])
def test_nvml_init_failure_is_unavailable_with_the_reason(fake_nvml, code, words):
    result, calls = fake_nvml({"init_error": code})
    assert result.returncode == 0
    topo = fact(result.stdout)
    assert topo == {"available": False, "reason": topo["reason"], "nvml_module": "pynvml"}
    assert "NVML did not start" in topo["reason"] and words in topo["reason"]
    assert calls.splitlines() == ["nvmlInit"]


def test_without_an_environment_the_fact_says_so(tmp_path):
    missing = str(tmp_path / "envs" / "current" / "bin" / "python")
    out = subprocess.run(["bash", "-c", topology_command(missing)], capture_output=True, text=True).stdout
    topo = fact(out)
    assert topo["available"] is False and "no vLLM environment yet" in topo["reason"] and missing in topo["reason"]


def test_fact_parse_takes_the_result_line_and_survives_garbage():
    line = gpu_topology.RESULT_PREFIX + json.dumps({"available": False, "reason": "x"})
    assert fact("a deprecation warning\n" + line + "\n") == {"available": False, "reason": "x"}
    assert fact("nothing here")["reason"] == "the GPU topology probe printed no result"
    assert "unreadable JSON" in fact(gpu_topology.RESULT_PREFIX + "{broken")["reason"]
    assert GpuTopology().default()["available"] is False


def test_bus_ids_from_nvml_and_nvidia_smi_compare_equal():
    assert normalize_bus_id("0000:41:00.0") == A1
    assert normalize_bus_id(b"00000000:41:00.0") == A1
    assert normalize_bus_id("00000000:C1:00.0") == "00000000:c1:00.0"


# --- the planner: P2P facts as data ---------------------------------------------------------------

def two_gpu_plan(gpus, interconnect=None):
    data = host_data(gpus=gpus, instances=[instance(model="Qwen/Qwen2.5-14B-Instruct", tokenizer=None,
                                                    max_model_len=4096, tensor_parallel_size=2)])
    (inst,) = plan_host(parse_host("box", data), None, interconnect).instances
    assert inst.tensor_parallel_size == 2 and inst.gpu_indices == (0, 1)
    return inst


def test_tp_group_without_p2p_gets_nccl_p2p_disable_with_a_reason():
    today = two_gpu_plan([A100_40G] * 2)
    assert "NCCL_P2P_DISABLE" not in today.env  # A100s: P2P left on by default
    no_p2p = Interconnect(read={(0, 1): "IOH topology not supported"}, nvlink={(0, 1): "not supported"})
    inst = two_gpu_plan([A100_40G] * 2, no_p2p)
    assert inst.env["NCCL_P2P_DISABLE"] == "1"
    assert inst.engine_args["disable-custom-all-reduce"] is True
    (reason,) = [r for r in inst.reasons if "no P2P" in r]
    assert "GPU 0 A100-SXM4-40GB <-> GPU 1 A100-SXM4-40GB (IOH topology not supported)" in reason


def test_tp_group_with_p2p_is_planned_as_today_and_the_facts_are_recorded():
    for gpus, link in (([A100_40G] * 2, "ok"), ([RTX_3090] * 2, "not supported")):
        today = two_gpu_plan(gpus)
        inst = two_gpu_plan(gpus, Interconnect(read={(0, 1): "ok"}, nvlink={(0, 1): link}))
        assert inst.env == today.env and inst.engine_args == today.engine_args
        assert inst.reasons[:len(today.reasons)] == today.reasons
        (extra,) = inst.reasons[len(today.reasons):]
        assert "reports P2P between every GPU pair" in extra
        assert ("NVLink 0-1" in extra) == (link == "ok")
    # Consumer cards keep today's NCCL_P2P_DISABLE=1 even with P2P reported, and say why.
    assert today.env["NCCL_P2P_DISABLE"] == "1" and "does not trust the driver's P2P report" in extra


def test_interconnect_from_the_probe_result(fake_nvml):
    result, _ = fake_nvml(seed_box_scenario())
    ic = Interconnect.from_topology(fact(result.stdout))
    assert ic.p2p(0, 1) is False and ic.p2p(2, 0) is False and ic.p2p(1, 2) is True
    assert ic.has_nvlink(2, 1) and not ic.has_nvlink(0, 1)
    assert ic.p2p(0, 7) is None


# --- deploy prepare(): cross-check, planner, warnings ---------------------------------------------

SMI_SEED_BOX = [f"0, {RTX}, NVIDIA GeForce RTX 4090 D, 24564, 3, GPU-rtx, 8.9",
                f"1, {A1}, NVIDIA A100-SXM4-40GB, 40960, 1500, GPU-a1, 8.0",
                f"2, {A2}, NVIDIA A100-SXM4-40GB, 40960, 3, GPU-a2, 8.0"]


@pytest.fixture
def prepare_on(monkeypatch):
    def run(topology: dict, smi=SMI_SEED_BOX, managed=()):
        data = host_data(instances=[instance(model="Qwen/Qwen2.5-14B-Instruct", tokenizer=None,
                                             max_model_len=4096, gpus=[1, 2], tensor_parallel_size=2)])
        del data["gpus"]  # planned from the live GPUs, as on a real host
        return prepare_on_fake_host(monkeypatch, data, {"NvidiaGpus": parse_gpu_csv(smi), "GpuTopology": topology,
                                                        "ManagedUnits": list(managed)})

    return run


def test_prepare_asks_the_env_python_and_plans_with_p2p_facts(fake_nvml, prepare_on):
    result, _ = fake_nvml(seed_box_scenario(procs_on_a1=[]))
    d, fake = prepare_on(fact(result.stdout))
    assert ("GpuTopology", {"python": "/opt/vllm-fleet/envs/current/bin/python"}) in fake.asked
    (inst,) = d.plan.instances
    assert inst.gpu_indices == (1, 2) and inst.tensor_parallel_size == 2
    assert "NCCL_P2P_DISABLE" not in inst.env  # NVLinked A100s: P2P stays on
    assert any("reports P2P between every GPU pair of each TP group (NVLink 1-2)" in r for r in inst.reasons)


def test_prepare_without_p2p_between_the_tp_gpus_disables_nccl_p2p(fake_nvml, prepare_on):
    scenario = seed_box_scenario(procs_on_a1=[])
    scenario["p2p"]["0"][f"{A1} {A2}"] = 4  # disabled by regkey
    scenario["p2p"]["2"][f"{A1} {A2}"] = 5
    result, _ = fake_nvml(scenario)
    d, _ = prepare_on(fact(result.stdout))
    (inst,) = d.plan.instances
    assert inst.env["NCCL_P2P_DISABLE"] == "1"
    assert any("(disabled by regkey)" in r for r in inst.reasons)
    rendered = "\n".join(f.content for f in d.files.values() if f.path.endswith(".service"))
    assert "NCCL_P2P_DISABLE=1" in rendered


def test_prepare_unavailable_probe_keeps_todays_plan(prepare_on):
    d, _ = prepare_on(gpu_topology.unavailable("no vLLM environment yet"))
    (inst,) = d.plan.instances
    assert "NCCL_P2P_DISABLE" not in inst.env and not any("P2P" in r for r in inst.reasons)


def test_prepare_gpu_mismatch_is_a_located_error(fake_nvml, prepare_on):
    scenario = seed_box_scenario(procs_on_a1=[])
    del scenario["gpus"][2]  # NVML lost the A100 at 81:00.0; nvidia-smi still lists it
    result, _ = fake_nvml(scenario)
    with pytest.raises(DeployError) as info:
        prepare_on(fact(result.stdout))
    text = str(info.value)
    assert "host box, key gpus: nvidia-smi and NVML (pynvml in the vLLM environment) list different GPUs " \
           "(3 vs 2)" in text
    assert f"nvidia-smi: 0: {RTX} NVIDIA GeForce RTX 4090 D, 1: {A1}" in text and f"2: {A2}" in text
    assert f"NVML:       0: {RTX} NVIDIA GeForce RTX 4090 D, 1: {A1} NVIDIA A100-SXM4-40GB" in text
    assert "fix:" in text and "nothing was changed on any host" in text


def test_prepare_warns_about_foreign_processes_only(fake_nvml, prepare_on, caplog):
    topo = fact(fake_nvml(seed_box_scenario(procs_on_a1=[]))[0].stdout)
    topo["gpus"][1]["processes"] = [
        {"pid": 4242, "used_mib": 3000, "name": "python3", "unit": "jupyter.service"},
        {"pid": 4343, "used_mib": 9000, "name": "vllm", "unit": "vllm-gemma.service"},  # managed
        {"pid": 4444, "used_mib": 20, "name": "Xorg", "unit": "display-manager.service"},  # small
    ]
    topo["gpus"][0]["processes"] = [{"pid": 4545, "used_mib": 2048, "name": "blender", "unit": None}]
    with caplog.at_level(logging.WARNING, logger="pyinfra"):
        d, fake = prepare_on(topo, managed=["vllm-gemma.service"])
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 2 and warned == d.plan.warnings[-2:]
    assert ("host box: GPU 0 (NVIDIA GeForce RTX 4090 D) has 2048 MiB held by pid 4545 (blender, unit none), "
            "not a vllm-fleet unit") == warned[0]
    assert warned[1].startswith("host box: GPU 1 (NVIDIA A100-SXM4-40GB) has 3000 MiB held by pid 4242 "
                                "(python3, unit jupyter.service)")
    assert "instance gemma needs gpu_memory_utilization x total free" in warned[1]
    assert not any("4343" in w or "4444" in w for w in warned)
    assert ("ManagedUnits", {}) in fake.asked


def test_mismatch_helper_accepts_the_same_gpus():
    live = parse_gpu_csv(SMI_SEED_BOX)
    topo = {"gpus": [{"index": i, "bus_id": b, "name": g.name}
                     for i, (b, g) in enumerate(zip((RTX, A1, A2), live, strict=True))]}
    assert gpu_topology.mismatch(topo, live) is None
    topo["gpus"][1], topo["gpus"][2] = topo["gpus"][2], topo["gpus"][1]
    assert "list different GPUs (3 vs 3)" in gpu_topology.mismatch(topo, live)
    assert gpu_topology.mismatch(topo, [GpuSpec(0, "x", 1, pci_bus_id=RTX)]) is not None


def test_the_vendored_pynvml_may_look_itself_up_while_it_loads(fake_nvml, tmp_path):
    """nvidia-ml-py (vLLM's vendored copy too) makes its NVMLError_* classes with
    sys.modules[__name__] as it loads: the probe's by-path load must register the module first."""
    vendored = tmp_path / "vllm" / "third_party"
    vendored.mkdir(parents=True)
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('vllm/__init__ must not run')\n")
    (vendored / "__init__.py").write_text("")
    (vendored / "pynvml.py").write_text("import sys\n_SELF = sys.modules[__name__]\n" + FAKE_PYNVML)
    (tmp_path / "pynvml.py").write_text("raise ImportError('the fallback must not be needed')\n")
    result, _calls = fake_nvml(seed_box_scenario())
    topo = fact(result.stdout)
    assert topo["available"] is True and topo["nvml_module"] == "vllm.third_party.pynvml", topo
