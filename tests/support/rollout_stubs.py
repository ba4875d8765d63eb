"""`vllm-fleet rollout` with pyinfra stubbed out, for the tests that drive a rollout offline: its
State (RolloutState), its hosts (RolloutHost), the connection, the host commands, the deploy's load
and run_ops replaced (stub_pyinfra), and an inventory file of CPU hosts (rollout_inventory)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

#: The fleet key of these rollouts: the rollout reads it (with every other secret) before its first batch.
ROLLOUT_KEY = "sk-rollout-5c0e19a7d2"


class RolloutState:
    """What _converge_batch reads of pyinfra's State after run_ops."""

    def __init__(self, ops_by_host=None):
        from gevent.pool import Pool

        self.pool = Pool(4)  # pyinfra's greenlet pool, which the batch's snapshots run in
        self.ops, self.op_meta, self.order = {}, {}, []
        self.failed_hosts: set = set()
        self.active_hosts: set = set(ops_by_host or {})
        for host, ops in (ops_by_host or {}).items():
            self.ops[host] = {}
            for name, commands in ops:
                from pyinfra.api.operation import OperationMeta

                op_hash = f"{host.name}:{name}"
                meta = OperationMeta(op_hash, None)
                meta.set_complete(True, commands, None)
                self.ops[host][op_hash] = SimpleNamespace(operation_meta=meta)
                self.op_meta[op_hash] = SimpleNamespace(names={name})
                self.order.append(op_hash)

    def get_op_order(self):
        return self.order

    def set_stage(self, _stage):
        pass


class RolloutHost:
    def __init__(self, name):
        self.name, self.data = name, {}


def rollout_inventory(tmp_path, hosts=("box1",)):
    inv = tmp_path / "inv.py"
    inv.write_text(f"box = [{', '.join(repr((h, {'vllm_target': 'cpu'})) for h in hosts)}]\n")
    return str(inv)


def stub_pyinfra(monkeypatch, state, load=None, run_ops=None):
    monkeypatch.setenv("VLLM_FLEET_API_KEY", ROLLOUT_KEY)
    hosts = {}

    @contextmanager
    def connected(_inventory, names, **_kw):
        for n in names:
            hosts.setdefault(n, RolloutHost(n))
        yield state, {n: hosts[n] for n in names}

    import vllm_fleet.commands.connection

    vllm_fleet.commands.connection.install()  # first: gevent patched before pyinfra_cli is imported

    import pyinfra.api.operations
    import pyinfra_cli.util

    monkeypatch.setattr(vllm_fleet.commands.connection, "connected", connected)
    import vllm_fleet.connect.remote

    monkeypatch.setattr(vllm_fleet.connect.remote, "run", lambda *a, **k: (True, "{}", ""))
    monkeypatch.setattr(pyinfra_cli.util, "load_func", load or (lambda *_a, **_kw: None))
    monkeypatch.setattr(pyinfra.api.operations, "run_ops", run_ops or (lambda _state: None))
    return hosts
