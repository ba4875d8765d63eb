"""Two gateways behind a floating address through the whole simulated deploy: keepalived installed where
it is missing, its config and readiness check written on each gateway, keepalived reloaded (never
restarted) when its config changes, and left alone when only the check changes."""

from __future__ import annotations

from support.simulated_host import SimulatedHost, run_deploy

KEEPALIVED_CONFIG = "/etc/keepalived/keepalived.conf"
CHECK = "/etc/vllm-fleet/gateway-check.py"
FLOATING = {"vllm_gateway": True, "vllm_gateway_address": "10.0.0.100/24", "vllm_gateway_interface": "eth0"}
HOST_DATA = {"gw": FLOATING, "box": FLOATING}


def _keepalived_commands(commands: list[str]) -> list[str]:
    return [c for c in commands if "keepalived" in c and not c.startswith("##") and "vllm-fleet-fact" not in c]


def test_each_gateway_gets_keepalived_its_config_and_check_naming_the_other(tmp_path, monkeypatch):
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    run_deploy(tmp_path, monkeypatch, worlds, host_data=HOST_DATA)
    for name, own, other in (("gw", "10.0.0.1", "10.0.0.2"), ("box", "10.0.0.2", "10.0.0.1")):
        conf = worlds[name].rendered[KEEPALIVED_CONFIG].content
        assert f"unicast_src_ip {own}\n" in conf and f"        {other}\n" in conf
        assert CHECK in worlds[name].rendered


def test_a_changed_config_reloads_keepalived_and_a_changed_check_leaves_it(tmp_path, monkeypatch):
    for changed, expected in ((KEEPALIVED_CONFIG, "systemctl reload keepalived.service"), (CHECK, None)):
        worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
        worlds["gw"].changed_files = {changed}
        commands, uploads, _state = run_deploy(tmp_path, monkeypatch, worlds, host_data=HOST_DATA)
        ran = _keepalived_commands(commands["gw"])
        assert not any(c.startswith(("systemctl restart keepalived", "systemctl stop keepalived")) for c in ran), ran
        assert any(c.startswith("systemctl reload keepalived.service") for c in ran) == (expected is not None), ran
        assert len(uploads["gw"]) == 1 and "box" not in uploads
        assert not _keepalived_commands(commands["box"]), commands["box"]


def test_a_host_without_keepalived_gets_debians_package_then_starts_it(tmp_path, monkeypatch):
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    worlds["gw"].missing_packages = {"keepalived"}
    commands, _uploads, _state = run_deploy(tmp_path, monkeypatch, worlds, host_data=HOST_DATA)
    ran = _keepalived_commands(commands["gw"])
    install = [i for i, c in enumerate(ran) if "apt-get" in c and "install" in c]
    start = [i for i, c in enumerate(ran) if c.startswith("systemctl start keepalived.service")]
    assert install and start and install[0] < start[0], ran
    assert not any("apt-get" in c for c in _keepalived_commands(commands["box"]))


def test_without_the_address_no_host_hears_of_keepalived(tmp_path, monkeypatch):
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    commands, _uploads, _state = run_deploy(tmp_path, monkeypatch, worlds)
    assert not _keepalived_commands(commands["gw"]) and not _keepalived_commands(commands["box"])
    assert KEEPALIVED_CONFIG not in worlds["gw"].rendered
