"""`vllm-fleet status` behind a floating address: each gateway's probe reads its own interface with
`ip addr` (here a stand-in `ip` and `systemctl` on PATH, answering as iproute2 and systemd 252 do),
and status says which gateway holds the address, "none", or "two holders!"."""

from __future__ import annotations

import stat

import pytest

from support.payload_helpers import bundled_module
from vllm_fleet import payloads
from vllm_fleet.commands import status

host_probe = bundled_module(payloads.PROBE, "host_probe")

FLOATING = {"address": "10.213.9.100", "interface": "eth0", "unit": "keepalived.service"}
OWN = "2: eth0    inet 10.213.9.12/24 brd 10.213.9.255 scope global eth0\\       valid_lft forever preferred_lft forever\n"
HELD = "2: eth0    inet 10.213.9.100/24 scope global secondary eth0\\       valid_lft forever preferred_lft forever\n"
# An address that starts like the floating one is not it.
LOOKALIKE = "2: eth0    inet 10.213.9.10/24 scope global secondary eth0\\       valid_lft forever preferred_lft forever\n"


@pytest.fixture
def tools(tmp_path, monkeypatch):
    """Stand-in `ip` (prints $IP_OUT, exits $IP_RC) and `systemctl show` first on PATH; returns a
    function setting what `ip` answers."""
    for name, body in (("ip", 'printf "%s" "$IP_OUT"; printf "%s" "$IP_ERR" >&2; exit "${IP_RC:-0}"'),
                       ("systemctl", 'printf "ActiveState=active\\nSubState=running\\n"')):
        tool = tmp_path / name
        tool.write_text(f"#!/bin/sh\n{body}\n")
        tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")

    def answer(out: str = "", rc: int = 0, err: str = "") -> None:
        monkeypatch.setenv("IP_OUT", out)
        monkeypatch.setenv("IP_RC", str(rc))
        monkeypatch.setenv("IP_ERR", err)

    return answer


def test_the_probe_says_whether_its_interface_holds_the_address(tools):
    tools(OWN + HELD)
    held = host_probe.floating_status(FLOATING)
    assert held["holds"] is True and held["state"] == "active/running" and "error" not in held
    for out in (OWN, OWN + LOOKALIKE, ""):
        tools(out)
        assert host_probe.floating_status(FLOATING)["holds"] is False, out


def test_an_interface_ip_cannot_show_is_unknown_with_the_reason(tools):
    tools(rc=1, err='Device "eth9" does not exist.')
    answer = host_probe.floating_status(dict(FLOATING, interface="eth9"))
    assert answer["holds"] is None and 'Device "eth9" does not exist.' in answer["error"]


def _gateway(host: str, holds: bool | None) -> dict:
    return {"host": host, "url": "http://10.213.9.100:9000/v1",
            "floating": {"address": "10.213.9.100", "interface": "eth0", "holds": holds,
                         "unit": "keepalived.service", "state": "active/running"}}


@pytest.mark.parametrize("holds, verdict, holders", [
    ((True, False), "gw1", ["gw1"]),
    ((False, True), "gw2", ["gw2"]),
    ((False, False), "none", []),
    ((True, True), "two holders! (gw1, gw2)", ["gw1", "gw2"]),
    ((None, False), "unknown", []),
    ((True, None), "gw1", ["gw1"]),
])
def test_status_names_the_holder_or_says_none_or_two(holds, verdict, holders, capsys):
    gateways = [_gateway("gw1", holds[0]), _gateway("gw2", holds[1])]
    summary = status.floating_summary(gateways)
    assert summary["verdict"] == verdict and summary["holders"] == holders
    assert summary["unknown"] == [g["host"] for g in gateways if g["floating"]["holds"] is None]
    status.print_floating(summary, gateways)
    out = capsys.readouterr().out
    assert out.startswith(f"floating address 10.213.9.100: held by {verdict}")
    assert ("gw1: holds it; keepalived.service active/running" in out) == (holds[0] is True)


def test_without_a_floating_address_status_says_nothing_of_one(capsys):
    gateways = [{"host": "gw", "url": "http://10.0.0.5:9000/v1", "backends": []}]
    assert status.floating_summary(gateways) is None
    status.print_floating(None, gateways)
    assert capsys.readouterr().out == ""
