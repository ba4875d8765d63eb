"""`vllm-fleet rollout` across two gateways behind a floating address, offline: every router drains a
batch (all or nothing), one gateway a batch, and the address moved off the holder before it converges,
each against stand-in hosts that keep what the real ones would (the routers' workers, which gateway
holds the address, keepalived's state) and record every step in order."""

from __future__ import annotations

import json
import subprocess
import time
from types import SimpleNamespace

import pytest

from support import nft_tool
from support.rollout_stubs import RolloutState, stub_pyinfra
from vllm_fleet.commands import gateway_drain, gateway_rollout, rollout
from vllm_fleet.commands.gateway_rollout import BatchRefused, Gateway
from vllm_fleet.config import parse_host

GROUP = {"vllm_target": "cpu", "vllm_gateway_address": "10.0.0.100/24", "vllm_gateway_interface": "eth0"}


def instance(name: str, port: int = 8000) -> dict:
    return {"name": name, "model": "/models/tiny", "served_model_name": "alpha", "port": port, "max_model_len": 2048}


FLEET = [
    ("gw1", {**GROUP, "ssh_hostname": "10.0.0.1", "vllm_gateway": True, "vllm_instances": [instance("a")]}),
    ("gw2", {**GROUP, "ssh_hostname": "10.0.0.2", "vllm_gateway": True, "vllm_instances": [instance("a")]}),
    ("h3", {**GROUP, "ssh_hostname": "10.0.0.3", "vllm_instances": [instance("a")]}),
]
CONFIGS = {name: parse_host(name, data) for name, data in FLEET}
URLS = {name: f"http://10.0.0.{i}:8000" for i, name in enumerate(CONFIGS, 1)}


class Hosts:
    """Stand-ins for the gateways and backends: each router's registered workers, which gateways hold
    the floating address, whose keepalived runs and whose readiness check passes; `steps` records
    every command as (host, what) in the order it ran."""

    def __init__(self, holder="gw1"):
        self.workers = {gw: set(URLS.values()) for gw in ("gw1", "gw2")}
        self.holding = {holder} if holder else set()
        self.keepalived = {"gw1": True, "gw2": True}
        self.ready = {"gw1": True, "gw2": True}
        self.router_active = {"gw1": True, "gw2": True}
        self.refuse_removal: set[str] = set()
        self.take_over = True
        self.steps: list[tuple[str, str]] = []

    def host(self, name):
        return SimpleNamespace(name=name)

    def probe(self, host, mode, payload, timeout=60):
        gw = host.name
        if mode == "gateway-status":
            self.steps.append((gw, "status"))
            if not self.router_active[gw]:
                return {"state": "failed/failed", "active": False, "error": "vllm-router answered 0", "backends": []}
            return {"state": "active/running", "active": True, "backends": [
                {"host": name, "instance": "a", "model": "alpha", "url": url, "registered": url in self.workers[gw],
                 "healthy": url in self.workers[gw]} for name, url in URLS.items()]}
        if mode == "gateway-workers":
            out = {"removed": [], "added": [], "errors": []}
            for url in payload.get("remove", []):
                self.steps.append((gw, f"remove {url}"))
                if gw in self.refuse_removal:
                    out["errors"].append(f"DELETE {url}: 500")
                else:
                    self.workers[gw].discard(url)
                    out["removed"].append(url)
            for worker in payload.get("add", []):
                self.steps.append((gw, f"add {worker['url']}"))
                self.workers[gw].add(worker["url"])
                out["added"].append(worker["url"])
            return out
        if mode == "wait-idle":
            self.steps.append((gw, "wait idle"))
            return {"seconds": 0.1, "in_flight": {str(p): 0 for p in payload["ports"]}}
        raise AssertionError(mode)

    def run(self, host, command, timeout=60):
        name = host.name
        if command.startswith("ip -o -4 addr"):
            held = name in self.holding
            return True, "2: eth0    inet 10.0.0.%s/24 ...\n" % name[-1] + (
                "2: eth0    inet 10.0.0.100/24 scope global secondary eth0\n" if held else ""), ""
        if "gateway-check.py" in command:
            self.steps.append((name, "ready?"))
            return self.keepalived[name] and self.ready[name], "", ""
        if "systemctl stop keepalived" in command:
            self.steps.append((name, "stop keepalived"))
            assert "ss -Htn state established state syn-recv src 10.0.0.100:9000" in command  # its clients first
            order = [command.index(step) for step in ("nft -f -", "systemctl reload --no-block vllm-fleet-front",
                                                     "ss -Htn", "ip addr del 10.0.0.100/24 dev eth0", "systemctl stop")]
            assert order == sorted(order), command
            self.keepalived[name] = False
            self.holding.discard(name)
            others = [g for g in self.keepalived if self.keepalived[g] and self.ready[g]]
            if others and self.take_over:
                self.holding.add(others[0])
            return True, "held=1 open=0 waited=0\n", ""
        if command.startswith("systemctl start keepalived"):
            self.steps.append((name, "start keepalived"))
            self.keepalived[name] = True
            if not self.holding:
                self.holding.add(name)
            return True, "", ""
        raise AssertionError(command)


@pytest.fixture
def hosts(monkeypatch):
    stand_in = Hosts()
    monkeypatch.setattr(gateway_drain, "_probe", stand_in.probe)
    monkeypatch.setattr(gateway_rollout, "_run", stand_in.run)
    monkeypatch.setattr(gateway_rollout, "POLL_S", 0)
    return stand_in


def gateways(stand_in, unreachable=()):
    return [Gateway(name, CONFIGS[name], None if name in unreachable else stand_in.host(name)) for name in ("gw1", "gw2")]


def backends(stand_in):
    return {name: stand_in.host(name) for name in CONFIGS}


# --- one gateway a batch -------------------------------------------------------------------------

def test_a_batch_takes_one_gateway_the_next_ones_go_alone_right_after_it_in_order():
    batches = [["gw1", "h3", "gw2", "h4"], ["h5", "gw3"], ["h6"]]
    assert gateway_rollout.one_gateway_per_batch(batches, ["gw1", "gw2", "gw3"]) == [
        ["gw1", "h3", "h4"], ["gw2"], ["h5", "gw3"], ["h6"]]
    assert gateway_rollout.one_gateway_per_batch([["gw1", "gw2"]], ["gw1", "gw2"]) == [["gw1"], ["gw2"]]
    assert gateway_rollout.one_gateway_per_batch([["h3", "h4"]], ["gw1", "gw2"]) == [["h3", "h4"]]


def test_the_address_is_found_on_the_interface_by_its_exact_address():
    text = ("2: eth0    inet 10.0.0.1/24 brd 10.0.0.255 scope global eth0\n"
            "2: eth0    inet 10.0.0.100/24 scope global secondary eth0\n")
    assert gateway_rollout.holds_address(text, "10.0.0.100")
    assert not gateway_rollout.holds_address(text, "10.0.0.10")  # a prefix of another address is not it
    assert not gateway_rollout.holds_address("2: eth0    inet 10.0.0.1000/24\n", "10.0.0.100")
    assert not gateway_rollout.holds_address("", "10.0.0.100")
    assert gateway_rollout.holds_command(CONFIGS["gw1"]) == "ip -o -4 addr show dev eth0"


# --- every router drains the batch ---------------------------------------------------------------

def test_every_router_drains_the_batch_before_its_requests_are_waited_for_and_takes_it_back_after(hosts):
    log: list[str] = []
    with gateway_rollout.stepped_aside(gateways(hosts), ["h3"], backends(hosts), CONFIGS, log.append):
        hosts.steps.append(("h3", "deploy"))
        assert all(URLS["h3"] not in hosts.workers[gw] for gw in ("gw1", "gw2"))
    assert hosts.steps == [("gw1", "status"), ("gw1", f"remove {URLS['h3']}"),
                           ("gw2", "status"), ("gw2", f"remove {URLS['h3']}"),
                           ("h3", "wait idle"),  # once, when no router sends it anything more
                           ("h3", "deploy"),
                           ("gw1", f"add {URLS['h3']}"), ("gw2", f"add {URLS['h3']}")]
    assert "gateway on gw1: 1 backend(s) back in" in log and "gateway on gw2: 1 backend(s) back in" in log


def test_a_router_that_refuses_the_drain_stops_the_batch_and_the_drained_ones_get_it_back(hosts):
    hosts.refuse_removal.add("gw2")
    log: list[str] = []
    with pytest.raises(BatchRefused, match=r"not drained from every gateway \(gateway on gw2: DELETE"):
        with gateway_rollout.stepped_aside(gateways(hosts), ["h3"], backends(hosts), CONFIGS, log.append):
            pytest.fail("the batch converged half drained")
    assert ("gw1", f"add {URLS['h3']}") in hosts.steps  # gw1 had taken it out: back in
    assert not any(step == ("gw2", f"add {URLS['h3']}") for step in hosts.steps)  # gw2 never took it out
    assert not any(what == "wait idle" for _h, what in hosts.steps)
    assert URLS["h3"] in hosts.workers["gw1"]


def test_an_unreachable_gateway_stops_the_batch_and_says_so(hosts):
    with pytest.raises(BatchRefused, match="gateway on gw2: unreachable over SSH, so its router cannot be drained"):
        with gateway_rollout.stepped_aside(gateways(hosts, unreachable=("gw2",)), ["h3"], backends(hosts),
                                           CONFIGS, print):
            pytest.fail("the batch converged")
    assert URLS["h3"] in hosts.workers["gw1"] and hosts.steps[-1] == ("gw1", f"add {URLS['h3']}")


def test_a_router_that_is_down_sends_nothing_and_is_reported_while_one_that_runs_but_fails_stops_it(hosts):
    hosts.router_active["gw2"] = False
    log: list[str] = []
    with gateway_rollout.stepped_aside(gateways(hosts), ["h3"], backends(hosts), CONFIGS, log.append):
        pass
    assert any(line.startswith("gateway on gw2: not drained (vllm-router answered 0; its router is failed/failed")
               for line in log), log
    running_but_failing = Hosts()
    running_but_failing.probe = lambda host, mode, payload, timeout=60: (
        {"state": "active/running", "active": True, "error": "vllm-router answered 500"}
        if host.name == "gw2" and mode == "gateway-status" else hosts.probe(host, mode, payload, timeout))
    gateway_drain._probe = running_but_failing.probe  # restored by the fixture's monkeypatch
    with pytest.raises(BatchRefused, match="gateway on gw2: its router runs .* but vllm-router answered 500"):
        with gateway_rollout.stepped_aside(gateways(hosts), ["h3"], backends(hosts), CONFIGS, print):
            pass


# --- the floating address leaves the holder first -------------------------------------------------

def test_the_address_moves_to_a_ready_gateway_before_the_holder_converges_and_keepalived_rejoins_after(hosts):
    log: list[str] = []
    with gateway_rollout.stepped_aside(gateways(hosts), ["gw1"], backends(hosts), CONFIGS, log.append):
        hosts.steps.append(("gw1", "deploy"))
        assert hosts.holding == {"gw2"} and not hosts.keepalived["gw1"]
    order = [step for step in hosts.steps if step[1] != "status"]
    assert order == [("gw1", f"remove {URLS['gw1']}"), ("gw2", f"remove {URLS['gw1']}"), ("gw1", "wait idle"),
                     ("gw2", "ready?"), ("gw1", "stop keepalived"), ("gw1", "deploy"), ("gw1", "start keepalived"),
                     ("gw1", f"add {URLS['gw1']}"), ("gw2", f"add {URLS['gw1']}")]
    assert hosts.holding == {"gw2"} and hosts.keepalived["gw1"]  # a backup again: nopreempt keeps it on gw2
    assert any(line.startswith("floating address 10.0.0.100: moved from gw1 to gw2 in ") for line in log), log
    assert "gateway on gw1: keepalived started again, a backup (the address stays on gw2)" in log


def test_a_gateway_that_does_not_hold_the_address_converges_without_moving_it(hosts):
    with gateway_rollout.stepped_aside(gateways(hosts), ["gw2"], backends(hosts), CONFIGS, print):
        hosts.steps.append(("gw2", "deploy"))
    assert not any("keepalived" in what or what == "ready?" for _h, what in hosts.steps)
    assert hosts.holding == {"gw1"}


def test_the_holder_is_not_converged_while_no_other_gateway_is_ready(hosts):
    hosts.ready["gw2"] = False
    with pytest.raises(BatchRefused, match="gw1 holds the floating address 10.0.0.100 and no other gateway is ready"):
        with gateway_rollout.stepped_aside(gateways(hosts), ["gw1"], backends(hosts), CONFIGS, print):
            pytest.fail("the holder converged with no gateway to take its clients")
    assert ("gw1", "stop keepalived") not in hosts.steps and hosts.holding == {"gw1"}
    assert hosts.steps[-2:] == [("gw1", f"add {URLS['gw1']}"), ("gw2", f"add {URLS['gw1']}")]  # drained: put back


def test_when_no_gateway_takes_the_address_the_holder_takes_it_back_and_is_not_converged(hosts, monkeypatch):
    hosts.take_over = False
    monkeypatch.setattr(gateway_rollout, "MOVE_TIMEOUT_S", 0.05)
    with pytest.raises(BatchRefused, match="did not move from gw1 to another gateway"):
        with gateway_rollout.stepped_aside(gateways(hosts), ["gw1"], backends(hosts), CONFIGS, print):
            pytest.fail("converged without a holder")
    assert hosts.holding == {"gw1"} and hosts.keepalived["gw1"]
    assert hosts.steps.index(("gw1", "stop keepalived")) < hosts.steps.index(("gw1", "start keepalived"))


def test_keepalived_rejoins_even_when_the_deploy_raises(hosts):
    with pytest.raises(RuntimeError, match="the deploy broke"):
        with gateway_rollout.stepped_aside(gateways(hosts), ["gw1"], backends(hosts), CONFIGS, print):
            raise RuntimeError("the deploy broke")
    assert hosts.keepalived["gw1"] and URLS["gw1"] in hosts.workers["gw1"] and URLS["gw1"] in hosts.workers["gw2"]


# --- the whole rollout ---------------------------------------------------------------------------

def _inventory(tmp_path) -> str:
    inv = tmp_path / "inv.py"
    inv.write_text(f"hosts = {FLEET!r}\n")
    return str(inv)


def test_rollout_takes_two_gateways_one_batch_each_draining_every_router(tmp_path, monkeypatch, capsys, hosts):
    deployed: list[tuple[str, ...]] = []
    stub_pyinfra(monkeypatch, RolloutState(),
                 load=lambda _state, _f, options: deployed.append(tuple(options.limit)))
    monkeypatch.setattr(gateway_drain, "_probe", hosts.probe)
    code = rollout.main([_inventory(tmp_path), "--json", "--batch", "3"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert deployed == [("gw1", "h3"), ("gw2",)]  # --batch 3 would have taken both gateways at once
    assert "batch 1: gw1, h3" in out.err and "batch 2: gw2" in out.err
    assert [h["state"] for h in json.loads(out.out)["hosts"]] == ["unchanged"] * 3
    # The address left gw1 before its batch, and gw2's (holding it then) moved it back.
    assert [line.split(": moved ")[1].split(" in ")[0] for line in out.err.splitlines()
            if line.startswith("floating address 10.0.0.100: moved")] == ["from gw1 to gw2", "from gw2 to gw1"]


def test_rollout_stops_at_a_batch_that_cannot_be_drained_from_every_router(tmp_path, monkeypatch, capsys, hosts):
    deployed: list[tuple[str, ...]] = []
    stub_pyinfra(monkeypatch, RolloutState(),
                 load=lambda _state, _f, options: deployed.append(tuple(options.limit)))
    monkeypatch.setattr(gateway_drain, "_probe", hosts.probe)
    hosts.refuse_removal.add("gw2")
    code = rollout.main([_inventory(tmp_path), "--json", "--batch", "1", "--order", "h3,gw1,gw2"])
    out = capsys.readouterr()
    assert code == 1 and deployed == []
    report = {h["name"]: h for h in json.loads(out.out)["hosts"]}
    assert {h["state"] for h in report.values()} == {"untouched"}
    assert "not drained from every gateway (gateway on gw2: DELETE" in report["h3"]["error"]
    assert "stopping: batch 1 not converged" in out.err and "3 host(s) left untouched" in out.err


# --- the move's command, run by a real shell ------------------------------------------------------

def _run_move(tmp_path, open_polls: int, fail: str = "", missing: str = "",
              quiet_s: int = 5, terminate_after_s: float | None = None) -> tuple[int, list[str], str, str]:
    """quiet_then_stop_command run by `sh` with recording stand-ins for nft, systemctl, ss and ip on
    PATH: ss lists one open connection `open_polls` times, then none; `fail` names a stand-in that
    exits 1, `missing` one that is not there; `terminate_after_s`: SIGTERM then (as when the rollout is
    stopped). (exit status, the calls in order, stdout, stderr)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    polls = tmp_path / "polls"
    polls.write_text(str(open_polls))
    scripts = {
        "nft": 'if [ "$1" = -f ]; then echo "nft -f $(tr "\\n" " ")" >> "$LOG"; else echo "nft $*" >> "$LOG"; fi',
        "systemctl": 'echo "systemctl $*" >> "$LOG"',
        "ss": 'echo ss >> "$LOG"; n=$(cat "$POLLS"); if [ "$n" -gt 0 ]; then echo $((n - 1)) > "$POLLS"; '
              'echo "ESTAB 0 0 10.0.0.100:9000 10.0.0.9:5000"; fi',
        "ip": 'echo "ip $*" >> "$LOG"',
    }
    for name, body in scripts.items():
        if name != missing:
            tail = "; exit 1" if name == fail else ""
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}{tail}\n")
            (bin_dir / name).chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "LOG": str(log), "POLLS": str(polls)}
    proc = subprocess.Popen(["sh", "-c", gateway_rollout.quiet_then_stop_command(CONFIGS["gw1"], quiet_s=quiet_s)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if terminate_after_s is not None:
        time.sleep(terminate_after_s)
        proc.terminate()
    stdout, stderr = proc.communicate(timeout=30)
    calls = [line for line in log.read_text().splitlines() if line != "ss"] if log.exists() else []
    return proc.returncode, calls, stdout, stderr


def test_the_move_holds_new_connections_lets_the_front_end_the_open_ones_then_moves_and_drops_the_hold(tmp_path):
    code, calls, out, _err = _run_move(tmp_path, open_polls=3)
    assert code == 0
    report = gateway_rollout.move_report(out)
    assert (report["held"], report["open"]) == (1, 0) and report["waited"] <= 1  # whole seconds: 0, or 1 at a tick
    assert gateway_rollout.describe_move("gw1", out, "") == (
        f"gw1: new connections held; every open connection ended within {report['waited']} s")
    assert calls == [
        "nft -f " + gateway_rollout.hold_rules("10.0.0.100", 9000).replace("\n", " ") + " ",
        "systemctl reload --no-block vllm-fleet-front.service",
        "ip addr del 10.0.0.100/24 dev eth0",
        "systemctl stop keepalived.service",
        "nft delete table inet vllm_fleet_address_move",
    ]
    assert (tmp_path / "polls").read_text().strip() == "0"  # it waited until ss listed nothing


def test_the_hold_drops_only_new_connections_to_the_address_and_port_as_nft_reads_it():
    rules = gateway_rollout.hold_rules("10.0.0.100", 9000)
    try:
        loaded = nft_tool.run(rules, "list ruleset", f"delete table inet {gateway_rollout.HOLD_TABLE}",
                              "list ruleset")
    except nft_tool.ToolUnavailable as exc:
        pytest.skip(str(exc))
    assert loaded.returncode == 0, loaded.stderr
    listed, _, after_delete = loaded.stdout.partition("}\n}\n")
    assert "type filter hook input priority filter - 10; policy accept;" in listed
    # nft's own reading: SYN set and ACK clear, to that address and port only; one rule, nothing else.
    assert [line.strip() for line in listed.splitlines() if "drop" in line] == [
        "ip daddr 10.0.0.100 tcp dport 9000 tcp flags syn / syn,ack drop"]
    assert after_delete.strip() == ""  # the exit trap's delete leaves nothing behind


def test_the_hold_is_dropped_even_when_the_move_fails(tmp_path):
    code, calls, _out, _err = _run_move(tmp_path, open_polls=0, fail="systemctl")
    assert code != 0
    assert calls[-1] == "nft delete table inet vllm_fleet_address_move"


def test_without_nft_the_move_warns_and_still_waits_for_a_quiet_moment(tmp_path):
    code, calls, out, err = _run_move(tmp_path, open_polls=2, missing="nft")
    assert code == 0
    assert "new connections to the floating address are not held" in err
    assert "new connections NOT held" in gateway_rollout.describe_move("gw1", out, err)
    assert calls == ["systemctl reload --no-block vllm-fleet-front.service", "ip addr del 10.0.0.100/24 dev eth0",
                     "systemctl stop keepalived.service"]


def test_connections_still_open_when_the_wait_ends_are_named_as_cut(tmp_path):
    code, calls, out, _err = _run_move(tmp_path, open_polls=10 ** 6, quiet_s=1)
    assert code == 0 and "ip addr del 10.0.0.100/24 dev eth0" in calls  # it moves all the same
    report = gateway_rollout.move_report(out)
    assert report["open"] == 1 and 1 <= report["waited"] <= 2
    said = gateway_rollout.describe_move("gw1", out, "")
    assert "1 connection(s) still open after" in said and "10.0.0.9:5000" in said
    assert gateway_rollout.describe_move("gw1", "", "ssh: broken pipe") == (
        "gw1: the move said nothing of its connections (ssh: broken pipe)")


def test_a_move_stopped_while_it_waits_drops_the_hold_and_leaves_the_address(tmp_path):
    code, calls, _out, _err = _run_move(tmp_path, open_polls=10 ** 6, quiet_s=20, terminate_after_s=1.0)
    assert code != 0
    assert calls[-1] == "nft delete table inet vllm_fleet_address_move"
    assert not any(call.startswith(("ip addr del", "systemctl stop")) for call in calls)
