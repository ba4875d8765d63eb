"""What restarts and what reloads each service the deploy runs (vllm_fleet/deploy/handlers.py): for
every (service, kind of change), the action, decided by the run's Changes from the one table, and
through the whole simulated deploy for every file a gateway host with monitoring renders."""

from __future__ import annotations

import pytest

from support.simulated_host import SimulatedHost, run_deploy
from vllm_fleet.deploy import handlers
from vllm_fleet.deploy.state import Changes

RESTART, RELOAD = "restart", "reload"

# (service, kind of change) -> what it does to the service (None: nothing). Written out here, not
# read from the table: the decisions the deploy has always made, and the ones a change must face.
EXPECTED = {
    ("instance", "unit"): RESTART, ("instance", "config"): RESTART, ("instance", "env"): RESTART,
    ("instance", "model"): RESTART, ("instance", "environment"): RESTART,
    # LoRA adapters: the module vLLM imports restarts it; the adapters (list, loader, files) reload it.
    ("instance", "model_access"): RESTART, ("instance", "adapters"): RELOAD, ("instance", "adapter_loader"): RELOAD,
    ("instance", "adapter"): RELOAD,
    ("ray", "unit"): RESTART, ("ray", "environment"): RESTART,
    ("front", "unit"): RESTART, ("front", "config"): RELOAD, ("front", "keys"): RELOAD,
    ("front", "tls_cert"): RELOAD, ("front", "tls_key"): RELOAD, ("front", "tls_trust"): RELOAD,
    ("front", "prefix_key"): RELOAD,  # nginx compiles the keyer as it loads its config
    ("gateway", "unit"): RESTART, ("gateway", "environment"): RESTART, ("gateway", "workers"): RELOAD,
    ("gateway", "register"): RELOAD, ("gateway", "models"): None, ("gateway", "client_models"): None,
    ("exporter", "unit"): RESTART, ("exporter", "script"): RESTART,
    ("node_exporter", "unit"): RESTART,
    ("prometheus", "unit"): RESTART, ("prometheus", "config"): RELOAD, ("prometheus", "trust"): RELOAD,
    ("prometheus", "rules"): RELOAD, ("prometheus", "token"): RELOAD, ("prometheus", "targets"): None,
    # Alertmanager reads its config from systemd's copy made at its start: a new one restarts it.
    ("alertmanager", "unit"): RESTART, ("alertmanager", "config"): RESTART,
    # keepalived: a new config reloads it (the holder keeps the address); its check is run afresh each time.
    ("keepalived", "config"): RELOAD, ("keepalived", "check"): None,
}


class Op:
    """Stands in for pyinfra's OperationMeta: whether it changed the host, known at execution."""

    def __init__(self):
        self.changed = False

    def did_change(self) -> bool:
        return self.changed


def _changes_of(service: str) -> tuple[Changes, dict[str, Op]]:
    """The Changes of a host running `service` (unit "svc"), one operation for each kind its row has."""
    changes, ops = Changes(), {}
    for (row, kind) in EXPECTED:
        if row != service:
            continue
        ops[kind] = Op()
        if kind == "environment":
            changes.environment = ops[kind]
        elif kind == "model":
            changes.model_syncs["a"] = ops[kind]
        else:
            changes.notify("svc", service, kind, ops[kind], instance="a")
    return changes, ops


def _action(changes: Changes) -> str | None:
    restart, reload = changes.restarts("svc")(), changes.reloads("svc")()
    assert not (restart and reload)  # one or the other, never both
    return RESTART if restart else RELOAD if reload else None


def test_the_table_declares_exactly_the_expected_changes():
    declared = {(service, kind) for service, row in handlers.HANDLERS.items() for kind in row}
    assert declared == set(EXPECTED)


@pytest.mark.parametrize("service, kind", sorted(EXPECTED))
def test_a_change_of_each_kind_restarts_reloads_or_leaves_its_service(service, kind):
    changes, ops = _changes_of(service)
    assert _action(changes) is None  # nothing changed: the service is only kept running
    ops[kind].changed = True
    assert _action(changes) == EXPECTED[(service, kind)]


@pytest.mark.parametrize("service", ["front", "gateway", "prometheus"])
def test_a_restart_wins_over_a_reload_and_a_kind_without_a_decision_is_refused(service):
    changes, ops = _changes_of(service)
    for op in ops.values():
        op.changed = True
    assert _action(changes) == RESTART
    with pytest.raises(ValueError, match=f"has no row '{service}' with a change 'pid_file'"):
        changes.notify("svc", service, "pid_file", Op())


def test_the_environment_and_a_model_notify_only_the_services_that_name_them():
    changes = Changes(environment=Op(), model_syncs={"a": Op(), "b": Op()})
    for unit, service, instance in (("vllm-a.service", "instance", "a"), ("vllm-b.service", "instance", "b"),
                                    ("front", "front", None), ("router", "gateway", None)):
        changes.notify(unit, service, "unit", Op(), instance=instance)
    changes.model_syncs["a"].changed = True
    assert [unit for unit in changes.services if changes.restarts(unit)()] == ["vllm-a.service"]
    changes.environment.changed = True
    assert [unit for unit in changes.services if changes.restarts(unit)()] == ["vllm-a.service", "vllm-b.service",
                                                                                "router"]


def test_daemon_reload_follows_every_unit_file_and_nothing_else():
    changes = Changes(environment=Op())
    for unit, service in (("vllm-a.service", "instance"), ("front", "front")):
        for kind in ("unit", "config"):
            changes.notify(unit, service, kind, Op(), instance="a")
    removed = Op()
    changes.removed_files.append(removed)
    units_changed = changes.any_unit_file_changed()
    for service in changes.services.values():
        service.by_kind["config"][0].changed = True
    changes.environment.changed = True
    assert not units_changed()
    removed.changed = True
    assert units_changed()


# --- through the whole deploy: each rendered file of a gateway host with monitoring -----------------

CLIENTS = {"alice": {"key_env": "ALICE_KEY", "models": ["gw"]}, "bob": {"key_env": "VLLM_FLEET_API_KEY"}}
HOST_DATA = {"gw": {"vllm_metrics": True, "vllm_monitoring": True, "vllm_api_clients": CLIENTS},
             "box": {"vllm_metrics": True, "vllm_api_clients": CLIENTS}}
UNITS = {"instance": "vllm-gw.service", "front": "vllm-fleet-front.service", "gateway": "vllm-fleet-gateway.service",
         "exporter": "vllm-fleet-exporter.service", "node_exporter": "vllm-fleet-node-exporter.service",
         "prometheus": "vllm-fleet-prometheus.service", "alertmanager": "vllm-fleet-alertmanager.service"}
# Each file of the gateway host by (service, kind) (the last test: every file it renders but the manifest
# and the other jobs' targets).
FILES = {
    "instance": {"unit": "/etc/systemd/system/vllm-gw.service", "config": "/etc/vllm-fleet/gw.yaml",
                 "env": "/etc/vllm-fleet/gw.env", "model_access": "/etc/vllm-fleet/python/vllm_fleet_model_access.py"},
    "front": {"unit": "/etc/systemd/system/vllm-fleet-front.service", "config": "/etc/vllm-fleet/front.conf",
              "keys": "/etc/vllm-fleet/front-secrets/keys.conf", "prefix_key": "/etc/vllm-fleet/front-prefix-key.js"},
    "gateway": {"unit": "/etc/systemd/system/vllm-fleet-gateway.service",
                "workers": "/etc/vllm-fleet/gateway-workers.json", "register": "/etc/vllm-fleet/gateway-register.py",
                "models": "/etc/vllm-fleet/gateway-models.json",
                "client_models": "/etc/vllm-fleet/gateway-models-alice.json"},
    "exporter": {"unit": "/etc/systemd/system/vllm-fleet-exporter.service",
                 "script": "/etc/vllm-fleet/host-exporter.py"},
    "node_exporter": {"unit": "/etc/systemd/system/vllm-fleet-node-exporter.service"},
    "prometheus": {"unit": "/etc/systemd/system/vllm-fleet-prometheus.service",
                   "config": "/etc/vllm-fleet-prometheus/prometheus.yml",
                   "rules": "/etc/vllm-fleet-prometheus/rules.yml", "token": "/etc/vllm-fleet-prometheus/metrics-token",
                   "targets": "/etc/vllm-fleet-prometheus/targets/vllm.json"},
    "alertmanager": {"unit": "/etc/systemd/system/vllm-fleet-alertmanager.service",
                     "config": "/etc/vllm-fleet-prometheus/alertmanager.yml"},
}
# Services are independent of each other's files: each run changes one file of every service.
ROUNDS = [{service: kinds[i] for service, kinds in ((s, list(f)) for s, f in FILES.items()) if i < len(kinds)}
          for i in range(max(len(f) for f in FILES.values()))]


def _actions(commands: list[str]) -> dict[str, str | None]:
    """What the run's commands did to each service of the host."""
    found: dict[str, str | None] = {}
    for service, unit in UNITS.items():
        if any(c.startswith((f"systemctl restart {unit}", f"systemctl stop {unit};")) for c in commands):
            found[service] = RESTART
        elif any(c.startswith(f"systemctl reload {unit}") for c in commands):
            found[service] = RELOAD
        else:
            found[service] = None
    return found


@pytest.mark.parametrize("changed", ROUNDS, ids=lambda r: ",".join(f"{s}:{k}" for s, k in r.items()))
def test_each_changed_file_restarts_reloads_or_leaves_its_service_through_the_deploy(tmp_path, monkeypatch,
                                                                                     changed):
    monkeypatch.setenv("ALICE_KEY", "sk-alice-8d2f0c9e71b4")
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    paths = {FILES[service][kind] for service, kind in changed.items()}
    worlds["gw"].changed_files = paths
    commands, uploads, _state = run_deploy(tmp_path, monkeypatch, worlds, host_data=HOST_DATA)
    assert len(uploads["gw"]) == len(paths)  # each changed file sent (a secret through the upload dir), no other
    assert _actions(commands["gw"]) == {service: EXPECTED[(service, changed[service])] if service in changed else None
                                        for service in UNITS}
    unit_changed = any(kind == "unit" for kind in changed.values())
    assert any("daemon-reload" in c for c in commands["gw"]) == unit_changed
    assert "box" not in uploads


def test_every_file_of_the_gateway_host_is_some_services_or_the_manifest(tmp_path, monkeypatch):
    """The rounds above cover each file the deploy renders on that host (but each job's targets, alike)."""
    monkeypatch.setenv("ALICE_KEY", "sk-alice-8d2f0c9e71b4")
    worlds = {"gw": SimulatedHost(), "box": SimulatedHost()}
    run_deploy(tmp_path, monkeypatch, worlds, host_data=HOST_DATA)
    covered = {path for kinds in FILES.values() for path in kinds.values()}
    rest = set(worlds["gw"].rendered) - covered
    assert rest == {"/etc/vllm-fleet/manifest.json",
                    *{f"/etc/vllm-fleet-prometheus/targets/{job}.json"
                      for job in ("front", "gpu", "node", "vllm-router")}}
