"""The converge bench's flow (bench/converge/), offline: with ansible-core installed, the playbook
itself runs against this machine (local connection, files in a temp dir, no systemd units); the
bench's whole flow with every tool and host faked; drift and service removal on every host."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from support.converge_records import render_record

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

import benchlib  # noqa: E402
from converge import cli, inventories, machine, report, settings, steps, tool_output  # noqa: E402


# --- the playbook itself (needs ansible-core) -------------------------------------------------------

ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"
needs_ansible = pytest.mark.skipif(not ANSIBLE_PLAYBOOK.exists(), reason="ansible-core is not installed here "
                                   f"(the bench installs it: {sys.executable} -m pip install 'ansible-core>=2.17')")


class _Models(BaseHTTPRequestHandler):
    key = ""

    def do_GET(self):  # noqa: N802
        if self.path != "/v1/models" or self.headers.get("Authorization") != f"Bearer {self.key}":
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps({"object": "list", "data": [{"id": "tiny-llama"}]}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _ansible(tmp_path: Path, inventory: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ANSIBLE_CONFIG=str(settings.ANSIBLE_DIR / "ansible.cfg"), ANSIBLE_HOME=str(tmp_path / "ah"),
               ANSIBLE_LOCAL_TEMP=str(tmp_path / "ah" / "tmp"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([sys.executable, str(ANSIBLE_PLAYBOOK), "-i", str(inventory), *extra, str(settings.PLAYBOOK)],
                          capture_output=True, text=True, env=env, timeout=300)


@needs_ansible
def test_playbook_no_op_then_one_file_changed_and_the_key_check(tmp_path):
    """On this machine (local connection, no become, no units): a no-op changes nothing, an edited file
    is rewritten, and /v1/models is asked with the key read from the env file, which no output shows."""
    key = "skbenchtest" + os.urandom(6).hex()
    _Models.key = key
    server = HTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        user, group = os.getuid(), os.getgid()
        import grp
        import pwd
        owner, group_name = pwd.getpwuid(user).pw_name, grp.getgrgid(group).gr_name
        files_dir, dest = tmp_path / "files", tmp_path / "dest"
        record = {"host": "h", "files": [
            {"path": str(dest / "tiny.env"), "content": f"# secrets\nVLLM_API_KEY='{key}'\n", "owner": owner,
             "group": group_name, "mode": "0600", "secret": True, "role": "other", "unit_name": None},
            {"path": str(dest / "manifest.json"), "content": "{}\n", "owner": None, "group": None,
             "mode": "0644", "secret": False, "role": "manifest", "unit_name": None}],
            "instances": [{"name": "tiny", "unit": "vllm-tiny.service", "port": server.server_address[1],
                           "served_model_name": "tiny-llama", "env_file": str(dest / "tiny.env")}]}
        dest.mkdir()
        for f in record["files"]:
            for target in (inventories.rendered_src(files_dir, "h", f["path"]), Path(f["path"])):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(f["content"])
                target.chmod(int(f["mode"], 8))
        host = {"ansible_connection": "local", "ansible_become": False, "ansible_python_interpreter": sys.executable,
                **inventories.ansible_host_vars(record, files_dir)}
        host["vf_units"] = []  # no systemd here
        inventory = tmp_path / "inv.yml"
        inventory.write_text(json.dumps(inventories.ansible_inventory({"h": host})))

        proc = _ansible(tmp_path, inventory, "-vvv")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert tool_output.play_recap(proc.stdout)["h"]["changed"] == 0
        assert key not in proc.stdout + proc.stderr

        (dest / "manifest.json").write_text("{edited}\n")
        (dest / "tiny.env").write_text(f"VLLM_API_KEY='{key}'\n# edited\n")
        proc = _ansible(tmp_path, inventory)
        assert proc.returncode == 0, proc.stdout[-3000:]
        assert tool_output.play_recap(proc.stdout)["h"]["changed"] == 2
        assert (dest / "manifest.json").read_text() == "{}\n"
        assert (dest / "tiny.env").read_text() == f"# secrets\nVLLM_API_KEY='{key}'\n"
        assert key not in proc.stdout + proc.stderr
    finally:
        server.shutdown()
        server.server_close()
        shutil.rmtree(tmp_path / "ah", ignore_errors=True)


# --- the bench's flow, with every tool and host faked --------------------------------------------------

@pytest.mark.parametrize("argv", [[], ["--hosts", "10"]], ids=["vllm-3-hosts", "standin-10-hosts"])
def test_run_bench_flow_with_fake_tools(monkeypatch, tmp_path, capsys, argv):
    """run_bench end to end without a host: fake deploys, playbook runs, relays and host state. Checks
    the phases, the A B A B order, what the report and the JSON hold, and that cleanup stops relays.
    With the stand-in engine (10 hosts of its own) the services' first converge is compared too."""
    import hashlib
    from types import SimpleNamespace

    import standin_engine
    from vllm_fleet.sandbox import assets

    args = cli.parse_args(["--runs", "2", "--latency-ms", "0,50", *argv])
    bench = machine.Bench(args, sys.stdout)
    names = bench.host_names
    records = {h: render_record(h, gateway=h == names[0]) for h in names}
    calls: list[str] = []
    relays: list = []

    class FakeRelay:
        def __init__(self, rtt_ms, targets, workdir):
            self.rtt_ms, self.stopped, self.count = rtt_ms, False, 0
            self.ports = {n: 40000 + i for i, n in enumerate(sorted(targets))}
            relays.append(self)

        def connections(self):
            return {n: self.count for n in self.ports}

        def stop(self):
            self.stopped = True

    def fake_pyinfra(self, inventory, label, debug=False, deploy=None, extra=(), env=None):
        calls.append(f"{'bare' if deploy == settings.BARE_DEPLOY else 'ours'}:{label}")
        if deploy == settings.BARE_DEPLOY:  # its input: the first instance's rendered unit and env file
            assert json.loads(Path(env["VLLM_FLEET_BENCH_BARE"]).read_text())[names[0]]["unit_name"] == "vllm-tiny.service"
        if relays and not relays[-1].stopped:
            relays[-1].count += 1
        text = ""
        if debug:
            text = "".join(f"    [pyinfra.connectors.ssh] Connecting to: 127.0.0.1 ({{'port': {p}}})\n"
                           f"    [pyinfra.connectors.ssh] Running command on {n}: (pty=False) true\n"
                           for n, p in relays[-1].ports.items())
        return (1.0 + 0.05 * ("relay-50" in str(inventory)), text)

    def fake_ansible(self, inventory, label, verbose=False, ssh_verbosity=None):
        calls.append(f"ansible:{label}")
        if relays and not relays[-1].stopped:
            relays[-1].count += 1
        text = "PLAY RECAP ***\n" + "".join(f"{h} : ok=5 changed=0 unreachable=0 failed=0\n" for h in names)
        return (2.0 + 0.5 * ("relay-50" in str(inventory)), text, 3)

    def fake_state(self):
        return {n: {"files": {f["path"]: hashlib.sha256(f["content"].encode()).hexdigest() for f in r["files"]},
                    "pids": {u: "100" for u in inventories.ansible_host_vars(r, self.tmp)["vf_units"]}}
                for n, r in self.records.items()}

    def fake_fleet_command(self, argv, label):
        calls.append(f"fleet:{' '.join(argv[:1] + argv[2:])}")
        self.last_usage = {"cpu_s": 0.8, "peak_rss_mib": 150.0}
        if argv[0] == "rollout":  # each host 2 s after the previous one, in inventory order
            now = time.time()
            hosts = [{"name": n, "state": "updated", "started": now + 2 * i, "finished": now + 2 * i + 1.5}
                     for i, n in enumerate(names)]
            return 2.0 * len(names), json.dumps({"hosts": hosts})
        return 0.5, json.dumps({"hosts": [{"name": n} for n in names]})

    downs = []
    monkeypatch.setattr(machine.Bench, "run_fleet_command", fake_fleet_command)
    monkeypatch.setattr(steps, "start_up_seconds", lambda b: {n: 1.0 for n in names})
    monkeypatch.setattr(machine.Bench, "report_leftovers", lambda self: calls.append("leftovers checked"))
    monkeypatch.setattr(machine, "Relay", FakeRelay)
    monkeypatch.setattr(machine.Bench, "run_pyinfra", fake_pyinfra)
    monkeypatch.setattr(machine.Bench, "run_ansible", fake_ansible)
    monkeypatch.setattr(machine.Bench, "host_state", fake_state)
    monkeypatch.setattr(machine.Bench, "render", lambda self, inv, tag: json.loads(json.dumps(records)))
    monkeypatch.setattr(machine.Bench, "ensure_ansible", lambda self: "2.19.14")
    monkeypatch.setattr(machine.Bench, "relay_known_hosts", lambda self, ports, tag: tmp_path / f"kh-{tag}")
    monkeypatch.setattr(machine.Bench, "inject_drift", lambda self: calls.append("drift"))
    monkeypatch.setattr(machine.Bench, "remove_services", lambda self: calls.append("remove"))
    monkeypatch.setattr(machine.Bench, "cprofile_pyinfra", lambda self, inv, label: calls.append("cprofile") or [
        {"function": "arguments.py:395(pop_global_arguments)", "where": "pyinfra/api/arguments.py", "calls": 1408,
         "own_s": 0.24, "cumulative_s": 3.0}])
    monkeypatch.setattr(machine.Bench, "profile_pyinfra", lambda self, inv, label: calls.append("profile") or {
        "seconds": 1.0, "cpu_s": 0.5, "phases": [("SSH connections", 0.25), ("operations before verification", 0.75)]})
    monkeypatch.setattr(assets, "prepare", lambda log: (tmp_path / "tiny", tmp_path / "wheelhouse"))
    monkeypatch.setattr(standin_engine, "build_standin_wheelhouse",
                        lambda dest, real_wheelhouse: calls.append(f"standin:{real_wheelhouse}") or tmp_path / "si")
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path))  # the stand-in wheelhouse's place
    bench.harness = SimpleNamespace(up=lambda sandbox, log: calls.append("up"),
                                    down=lambda sandbox: downs.append(sandbox),
                                    host_pss_kib=lambda sandbox, host: 60 * 1024)
    try:
        result = steps.run_bench(bench)
    finally:
        bench.cleanup()
    assert downs and not bench.tmp.exists() and all(r.stopped for r in relays)
    assert calls[-1] == "leftovers checked"  # after the hosts' teardown
    standin = argv != []
    first = ["up", "ours:first converge (ours)", "ansible:Ansible first run", "ours:warm-up (ours)"]
    if standin:  # built from the real wheelhouse (its vllm-router), before the hosts start
        assert calls.pop(0) == f"standin:{tmp_path / 'wheelhouse'}"
    assert calls[:4] == first
    assert bench.env["VLLM_FLEET_WHEELHOUSE"] == str(tmp_path / ("si" if standin else "wheelhouse"))
    noop = [c for c in calls if c.startswith(("ours:no-op", "ansible:no-op", "bare:"))]
    assert noop == (["ours:no-op (ours)", "ansible:no-op (Ansible)"] * 2  # A B A B
                    + ["bare:bare pyinfra first run"] + ["ours:no-op (ours)", "bare:no-op (bare pyinfra)"] * 2)
    assert result["bare_pyinfra"]["ratio"] == 1.0
    assert calls.count("drift") == 4  # before each run of the file-change scenario
    assert calls.count("profile") == 2 and result["noop_profile"]["phases"][0] == ("SSH connections", 0.25)
    assert calls.count("cprofile") == 1 and result["noop_profile"]["top"][0]["calls"] == 1408
    scenarios = {"noop", "noop_relay_0ms", "noop_relay_50ms", "one_file_changed"}
    if standin:  # services removed before each run, A B A B
        firsts = [c for c in calls if c == "remove" or c.startswith(("ours:first converge", "ansible:first"))]
        assert firsts[1:] == ["remove", "ours:first converge (ours)", "remove", "ansible:first converge (Ansible)"] * 2
        scenarios.add("first_services")
        assert result["engine"] == "standin" and settings.STANDIN_NOTE in result["notes"]
        assert result["host_names"] == [f"sbx-b{i:02d}" for i in range(1, 11)]
    else:
        assert result["engine"] == "vllm" and result["host_names"] == benchlib.CPU_HOSTS
    assert set(result["scenarios"]) == scenarios
    assert result["scenarios"]["noop"]["ratio"] == 0.5
    growth = result["latency"]["growth"]["50"]
    assert growth["ours"]["added_s"] == pytest.approx(0.05) and growth["ansible"]["added_s"] == pytest.approx(0.5)
    assert growth["ansible"]["round_trips"] == pytest.approx(10)
    assert result["counts"]["ours"][names[1]]["commands"] == 1
    assert result["counts"]["ours_relay"][names[0]]["connections"] == 1
    assert result["latency"]["connections"]["50"]["ansible"] == [{h: 1 for h in names}] * 2
    assert result["noop_violations"] == [] and result["api_key_in_output"] == []
    assert result["managed_files"] == {h: 7 if h == names[0] else 6 for h in names}
    assert result["host_cost"]["pss_mib"] == 60 and result["host_cost"]["hosts"] == len(names)
    assert result["status"]["median"] == 0.5 and result["status"]["peak_rss_mib"] == 150.0
    assert [c for c in calls if c.startswith("fleet:status")] == ["fleet:status --json"] * 2
    rollouts = [c for c in calls if c.startswith("fleet:rollout")]
    if standin:  # to the change and back, each --runs times; 10 hosts in batches of 2 (25 %, rounded down)
        assert rollouts == ["fleet:rollout --batch 25% --json"] * 4
        rollout = result["rollout"]
        assert [b["hosts"] for b in rollout["rollouts"][0]["batches"]] == [2] * 5
        # each batch spans 2 hosts x 2 s (the last: to the run's end), the slowest start-up is 1 s
        assert rollout["span_per_batch_s"] == pytest.approx(4.0)
        assert rollout["overhead_per_batch_s"] == pytest.approx(3.0)
    else:
        assert rollouts == [] and "rollout" not in result
    report.print_report(result, print)
    out = capsys.readouterr().out
    assert f"`vllm-fleet status` of {len(names)} hosts: 0.50 s (target ≤ 3 s): met" in out
    assert "the workstation's peak RSS over our runs: 0.15 GiB (target ≤ 1 GiB): met" in out
    assert "| no-op through a relay, +50 ms RTT | 1.05 s (1.05–1.05) | 2.50 s (2.50–2.50) | 0.42 |" in out
    assert "API key in any captured output: no" in out
    assert f"{settings.BARE_LABEL}: ours 1.00 s (1.00–1.00), bare pyinfra 1.00 s (1.00–1.00): **1.00×**" in out
    assert ("SIMULATED engine" in out) == standin
    json.dumps(result)  # --json can print it


def test_drift_and_service_removal_commands_run_on_every_host_and_a_failure_names_it():
    from functools import partial
    from types import SimpleNamespace

    sent = {}

    class Sandbox:
        def run(self, name, command, timeout=60):
            sent[name] = command
            return SimpleNamespace(returncode=0 if name != "sbx-cpu3" or "printf" in command else 1,
                                   stderr="Failed to disable unit")

    bench = SimpleNamespace(sandbox=Sandbox(), records={h: render_record(h) for h in ("sbx-cpu1", "sbx-cpu2")})
    bench.on_every_host = partial(machine.Bench.on_every_host, bench)
    machine.Bench.inject_drift(bench)
    drift_path = next(f["path"] for f in render_record()["files"] if f["role"] == settings.DRIFT_ROLE)
    assert set(sent) == {"sbx-cpu1", "sbx-cpu2"} and all(c.endswith(f">> {drift_path}") for c in sent.values())
    machine.Bench.remove_services(bench)
    assert sent["sbx-cpu1"].startswith("systemctl disable --now --quiet vllm-fleet-front.service vllm-tiny.service;")
    assert "/etc/vllm-fleet/tiny.env" in sent["sbx-cpu1"] and "manifest.json" not in sent["sbx-cpu1"]
    bench.records["sbx-cpu3"] = render_record("sbx-cpu3")
    with pytest.raises(SystemExit, match="sbx-cpu3: could not remove the services: Failed to disable unit"):
        machine.Bench.remove_services(bench)
