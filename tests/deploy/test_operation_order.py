"""deploy/operation_order.py gives pyinfra's own operation order in CLI mode: checked against
pyinfra's get_operation_order_from_stack at every operation of a whole simulated deploy."""

from __future__ import annotations

import sys

import pyinfra
from pyinfra.api.util import get_operation_order_from_stack as pyinfras_own

from support.simulated_host import SimulatedHost, run_deploy
from vllm_fleet.deploy import operation_order
from vllm_fleet.deploy.operation_order import pyinfra_operation


def test_the_order_is_pyinfras_own_at_every_operation_of_a_deploy(tmp_path, monkeypatch):
    compared = []

    def both(state):
        caller = sys._getframe(1)
        ours = operation_order.operation_order_from_frame(state, caller)
        theirs = pyinfras_own(state)  # from one frame deeper: this function's own line comes last
        assert theirs[:-1] == ours, (theirs, ours)
        compared.append(state.current_deploy_filename)
        return ours

    monkeypatch.setattr(pyinfra, "is_cli", True)  # as under pyinfra's CLI: the order comes from the stack
    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack", both)
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost(), "other": SimulatedHost()}
    worlds["box"].changed_files = {"/etc/vllm-fleet/box.yaml"}  # a restart too: the branches differ by host
    run_deploy(tmp_path, monkeypatch, worlds)
    assert len(compared) > 60 and all(name and name.endswith("deploy.py") for name in compared)


def test_the_deploy_puts_it_in_pyinfras_place_and_leaves_another_replacement_there(monkeypatch):
    from vllm_fleet import deploy

    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack", pyinfras_own)
    deploy.install()
    assert pyinfra_operation.get_operation_order_from_stack is operation_order._operation_order
    deploy.install()
    assert operation_order.installed()

    def another(state):
        return pyinfras_own(state)

    monkeypatch.setattr(pyinfra_operation, "get_operation_order_from_stack", another)
    deploy.install()  # a test's (or another tool's) own replacement stays
    assert pyinfra_operation.get_operation_order_from_stack is another
