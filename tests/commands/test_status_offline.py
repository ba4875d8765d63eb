"""`vllm-fleet status` without hosts: host_status driven through a stub connection whose remote.run
runs the deploy's discovery batch in a real local shell (the simulated nvidia-smi first on PATH: no
vLLM environment there, so NVML's topology is unavailable) and the status probe (its status mode, bundled as the host runs it)
in-process against recorded-shape systemctl/journal answers. Covers: a host that declares no `gpus` is planned
with its live GPUs (not "not in the plan"); a failed unit shows systemd's
Result, its restarts, the journal's reason and a diagnosis, in the table and the JSON; the front unit."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.payload_helpers import bundled_module
from support.planning_fixtures import A100_40G, RTX_4090D, host_data, instance
from vllm_fleet.connect import remote
from vllm_fleet.commands import status
from vllm_fleet.config import parse_host
from vllm_fleet.facts.gpus import GPU_QUERY, parse_gpu_csv
from vllm_fleet import payloads
from vllm_fleet.payloads.probe.host import RESULT_PREFIX
from vllm_fleet.plan import plan_host
from vllm_fleet.render import render_host
from vllm_fleet.host_layout import FRONT_UNIT
from vllm_fleet.sandbox import nvidia_smi

host_probe = bundled_module(payloads.PROBE, "host_probe")  # as the host runs it: one namespace

# What journalctl -u UNIT -o cat shows for an instance with a bad engine argument after its start
# limit: vLLM's argparse error (the format test_rollout_sandbox's bad flag produces), then systemd
# 252's own lines for a failed start and the refused restart.
JOURNAL = """\
usage: vllm serve [model_tag] [options]
vllm serve: error: unrecognized arguments: --no-such-flag 1
vllm-gemma.service: Main process exited, code=exited, status=2/INVALIDARGUMENT
vllm-gemma.service: Failed with result 'exit-code'.
vllm-gemma.service: Scheduled restart job, restart counter is at 2.
vllm-gemma.service: Start request repeated too quickly.
vllm-gemma.service: Failed with result 'start-limit-hit'.
Failed to start vllm-gemma.service - vLLM gemma3-12b-q4 (vllm-fleet instance gemma)."""


def simulated_csv(tmp_path, layout) -> str:
    """The sandbox's simulated nvidia-smi answering the deploy's GPU query (labelled simulated)."""
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps(layout))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_FLEET_SIM_DRIVER"}
    out = subprocess.run([sys.executable, nvidia_smi.__file__, f"--query-gpu={GPU_QUERY}",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         env={**env, "VLLM_FLEET_SIM_GPUS": str(path)}, timeout=30, check=True)
    return out.stdout


def simulated_smi_on_path(tmp_path, layout) -> "Path":
    """A bin/ directory whose nvidia-smi is the sandbox's simulated one answering `layout`."""
    (tmp_path / "gpus.json").write_text(json.dumps(layout))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nVLLM_FLEET_SIM_GPUS={shlex.quote(str(tmp_path / 'gpus.json'))} "
                   f"exec {shlex.quote(sys.executable)} {shlex.quote(nvidia_smi.__file__)} \"$@\"\n")
    smi.chmod(0o755)
    return bin_dir


def local_shell(command: str, bin_dir=None) -> tuple[bool, str, str]:
    """remote.run's answer for `command` run by this machine's /bin/sh (bin_dir first on PATH)."""
    env = {k: v for k, v in os.environ.items() if k != "VLLM_FLEET_SIM_DRIVER"}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}:{env.get('PATH', '/usr/bin:/bin')}"
    out = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, env=env, timeout=60)
    return out.returncode == 0, out.stdout, out.stderr


class StubHost:
    name = "box"


@pytest.fixture
def undeclared(tmp_path, monkeypatch):
    """A CUDA host without declared `gpus`; its probe sees gemma failed after its start limit."""
    gguf = tmp_path / "models" / "gemma-3-12b-it-q4_0.gguf"  # the GGUF file is on the "host" (here)
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    data = host_data(instances=[instance(model=str(gguf))], placement="single-instance",
                     vllm_config_dir=str(tmp_path / "etc"))
    del data["gpus"]
    config = parse_host("box", data)
    layout = [dict(g, compute_capability=c) for g, c in ((RTX_4090D, 8.9), (A100_40G, 8.0), (A100_40G, 8.0))]
    csv = simulated_csv(tmp_path, layout)
    # What the last deploy wrote: the plan with the live GPUs (as the deploy plans).
    rendered = {f.path: f.content for f in render_host(config, plan_host(config, tuple(parse_gpu_csv(
        csv.splitlines()))))}
    (tmp_path / "etc").mkdir()
    manifest = json.loads(rendered[f"{tmp_path}/etc/manifest.json"])
    (tmp_path / "etc" / "manifest.json").write_text(json.dumps(manifest))
    units = {"vllm-gemma.service": {"ActiveState": "failed", "SubState": "failed", "Result": "start-limit-hit",
                                    "NRestarts": "2", "MainPID": "0", "ActiveEnterTimestampMonotonic": "0"},
             FRONT_UNIT: {"ActiveState": "active", "SubState": "running", "Result": "success",
                          "NRestarts": "0"}}
    monkeypatch.setattr(host_probe, "show", lambda unit, *props: {p: units[unit].get(p, "") for p in props})
    monkeypatch.setattr(host_probe, "journal", lambda unit, lines=40: JOURNAL if unit == "vllm-gemma.service" else "")
    monkeypatch.setattr(host_probe, "call", lambda port, path, *a, **k: (0, "Connection refused"))
    monkeypatch.setattr(host_probe, "nvidia_smi", lambda *args: "")
    monkeypatch.setattr(host_probe, "sha256_of", lambda path: hashlib.sha256(rendered[path].encode()).hexdigest()
                        if path in rendered else None)
    commands = []
    bin_dir = simulated_smi_on_path(tmp_path, layout)

    def run(host, command, timeout=None):
        commands.append(command)
        if command.startswith("python3 -c "):
            words = shlex.split(command)
            if words[3] == "status":  # the status probe, run here
                return True, RESULT_PREFIX + json.dumps(host_probe.status(json.loads(words[4]))) + "\n", ""
        return local_shell(command, bin_dir)

    monkeypatch.setattr(remote, "run", run)
    return config, commands


def test_undeclared_gpus_are_read_live_and_planned_like_the_deploy(undeclared):
    config, commands = undeclared
    assert config.gpus is None
    from vllm_fleet.prepared import Discovered

    _planned, _front, error, _ray = status.planned_files(Discovered(config, None, None, None))  # declared alone
    assert error and "no GPUs known" in error
    report = status.host_status("box", StubHost(), config)
    # Two commands: the deploy's discovery batch (nvidia-smi's query among its facts), the probe.
    assert len(commands) == 2 and f"nvidia-smi --query-gpu={GPU_QUERY}" in commands[0]
    assert report["plan_error"] is None and report["gpus_planned_from"] == "live (nvidia-smi)"
    assert report["gpu_topology"].startswith("unavailable ("), report["gpu_topology"]  # no vLLM env: no NVML
    inst = report["instances"]["gemma"]
    assert inst["drift"] == []  # not "not in the plan (would be removed by the next deploy)"


def test_a_host_the_deploy_would_refuse_is_still_planned_with_its_live_gpus(undeclared, tmp_path):
    """The GGUF file gone from the host: the deploy would refuse it, but status plans what it read
    (the live GPUs: no `gpus` declared) and shows the instance that runs, with the reason; it does
    not call it "not in the plan (would be removed)"."""
    config, commands = undeclared
    (tmp_path / "models" / "gemma-3-12b-it-q4_0.gguf").unlink()
    report = status.host_status("box", StubHost(), config)
    assert report["gpus_planned_from"] == "live (nvidia-smi)"
    assert "model path" in report["plan_error"] and "does not exist on the host" in report["plan_error"]
    assert "(the deploy would refuse this host as it is)" in report["plan_error"]
    assert report["instances"]["gemma"]["drift"] == []


def test_failed_unit_shows_result_restarts_and_the_journals_reason(undeclared, capsys):
    config, _commands = undeclared
    report = status.host_status("box", StubHost(), config)
    failure = report["instances"]["gemma"]["failure"]
    assert failure["result"] == "start-limit-hit" and failure["restarts"] == "2"
    assert "crash loop" in failure["reason"]
    assert "unrecognized argument" in failure["diagnosis"]
    assert "vllm serve: error: unrecognized arguments: --no-such-flag 1" in failure["journal"]
    assert len(failure["journal"]) <= status.JOURNAL_TAIL
    assert report["front"] == {"unit": FRONT_UNIT, "state": "active/running", "active": True,
                               "bind": config.settings.vllm_bind_host, "tls": False, "requests_last_hour": {}}
    json.loads(json.dumps({"hosts": [report]}))  # what --json prints
    status.print_table([report])
    out = capsys.readouterr().out
    assert "planned with live (nvidia-smi) GPUs" in out
    assert "failed/failed (start-limit-hit, 2 restarts)" in out
    assert "(front)" in out and "active/running" in out
    assert "box instance gemma (vllm-gemma.service): crash loop" in out
    assert "diagnosis: unrecognized argument" in out
    assert "vllm serve: error: unrecognized arguments: --no-such-flag 1" in out


def test_status_exit_code_and_json_through_main(undeclared, monkeypatch, capsys):
    config, _commands = undeclared
    monkeypatch.setattr(status, "collect",
                        lambda inventory, limit, since: ([status.host_status("box", StubHost(), config)], [], [], None))
    assert status.main(["inventory.py", "--json"]) == 1  # a failed instance is unhealthy
    data = json.loads(capsys.readouterr().out)
    (host,) = data["hosts"]
    assert host["gpus_planned_from"] == "live (nvidia-smi)"
    assert host["instances"]["gemma"]["failure"]["result"] == "start-limit-hit"
    assert host["front"]["active"] is True


def test_without_nvidia_smi_status_plans_the_declared_gpus_and_says_the_deploy_would_refuse(monkeypatch, tmp_path):
    config = parse_host("box", host_data(placement="single-instance", vllm_config_dir=str(tmp_path / "etc")))
    empty = tmp_path / "empty-bin"  # no nvidia-smi: PATH holds only the shell's own tools
    empty.mkdir()
    for tool in ("sh", "grep", "cat", "test", "python3"):
        found = shutil.which(tool)
        if found:
            os.symlink(found, empty / tool)
    monkeypatch.setattr(remote, "run", lambda host, command, timeout=None: (
        (True, RESULT_PREFIX + json.dumps({"instances": {}, "front": None}) + "\n", "")
        if command.startswith("python3 -c ") else local_shell(command.replace("command -v", "PATH=" + str(empty) + " command -v"))))
    found, source, refusal, _topology = status.discover_host(StubHost(), config)
    assert found.live is None and found.config.gpus == config.gpus  # planned from the declared GPUs
    assert source == "declared (nvidia-smi listed none: see the plan error)"
    assert "nvidia-smi is missing: no NVIDIA driver on this host" in refusal
    assert "(the deploy would refuse this host as it is)" in refusal
    report = status.host_status("box", StubHost(), config)
    assert "nvidia-smi is missing" in report["plan_error"]
    assert report["instances"]  # the declared plan's instances, reported as not deployed
    assert all(e["drift"] == ["planned, not deployed"] for e in report["instances"].values())


def test_host_probe_reports_a_unit_waiting_to_restart(monkeypatch):
    props = {"ActiveState": "activating", "SubState": "auto-restart", "Result": "timeout", "NRestarts": "1"}
    monkeypatch.setattr(host_probe, "journal", lambda unit, lines=40: "vllm-fleet: http://127.0.0.1:18000/health "
                        "did not answer 200 within 285 s of starting\n")
    failure = host_probe.unit_failure("vllm-x.service", props)
    assert failure["result"] == "timeout" and failure["restarts"] == "1"
    explained = status.explain_failure(failure)
    assert "TimeoutStartSec" in explained["reason"] and "did not answer 200" in explained["journal"][-1]
    assert host_probe.unit_failure("vllm-x.service", dict(props, ActiveState="active", SubState="running")) is None


# --- verification waits for systemd's own verdict ------------------------------------------------

def _fake_unit(monkeypatch, states):
    """host_probe against a unit whose ActiveState goes through `states` (the last one repeats)."""
    seen = iter(states)
    last = {"state": states[0]}

    def show(unit, *props):
        last["state"] = next(seen, last["state"])
        return {p: (last["state"] if p == "ActiveState" else "0") for p in props}

    def serving(spec, res):
        res["checks"]["completion"] = True
        res["ok"] = True

    monkeypatch.setattr(host_probe, "show", show)
    monkeypatch.setattr(host_probe, "wait_healthy", lambda spec, res, restarts0: True)
    monkeypatch.setattr(host_probe, "check_serving", serving)
    monkeypatch.setattr(host_probe.time, "sleep", lambda s: None)
    return host_probe


SPEC = {"name": "tiny", "unit": "vllm-tiny.service", "port": 18000, "timeout_s": 30}


def test_an_instance_that_answers_is_verified_only_once_its_unit_is_active(monkeypatch):
    # vLLM answers /health before ExecStartPost (polling every 2 s) ends the start job: a deploy
    # that called it verified at that moment left the unit "activating" (a race a test met).
    probe = _fake_unit(monkeypatch, ["0", "activating", "activating", "activating", "active"])
    res = probe.verify_one(SPEC)
    assert res["ok"] and res["checks"]["unit_active"], res


def test_a_unit_that_fails_after_vllm_answered_is_not_verified(monkeypatch):
    probe = _fake_unit(monkeypatch, ["0", "activating", "failed"])
    res = probe.verify_one(SPEC)
    assert not res["ok"] and "went failed" in res["error"], res


def test_a_unit_stuck_activating_is_not_verified(monkeypatch):
    probe = _fake_unit(monkeypatch, ["0", "activating"])
    clock = iter(range(0, 10_000, 5))
    monkeypatch.setattr(probe.time, "time", lambda: next(clock))
    res = probe.verify_one(SPEC)
    assert not res["ok"] and "has not finished starting" in res["error"], res


def test_remote_facts_read_the_deploys_batch_and_name_a_fact_that_failed(monkeypatch, tmp_path):
    """facts.RemoteFacts (status's reader): one command for a prefetched batch, answers as the deploy's
    facts give them; a fact whose command fails alone is an error naming the host and the fact."""
    from vllm_fleet.facts import batch as facts
    from vllm_fleet.facts import host as host_facts

    (tmp_path / "there").mkdir()
    sent = []
    monkeypatch.setattr(remote, "run", lambda host, command, timeout=None: sent.append(command) or local_shell(command))
    on = facts.RemoteFacts(StubHost())
    paths = (str(tmp_path / "there"), str(tmp_path / "absent"))
    facts.prefetch(on, [facts.query(host_facts.PathsPresent, paths=paths), facts.query(host_facts.ManagedUnits)])
    assert len(sent) == 1
    assert facts.get(on, host_facts.PathsPresent, paths=paths) == {paths[0]: True, paths[1]: False}
    assert len(sent) == 1  # answered from the batch
    monkeypatch.setattr(remote, "run", lambda host, command, timeout=None: (False, "", "sudo: a password is required"))
    with pytest.raises(facts.FactUnreadable, match="host box: could not read LinkTarget: "):
        facts.get(facts.RemoteFacts(StubHost()), host_facts.LinkTarget, path="/nowhere")
