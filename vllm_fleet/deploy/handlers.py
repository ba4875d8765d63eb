"""What each service the deploy runs does when something of its changes: one table, HANDLERS, read
the way a role's `notify:` and handlers/main.yml are.

Step 7 (files.py) notifies a service of each file it writes for it, by kind; steps 3 and 4 record
the model syncs and the environment, which notify every service whose row names "model" or
"environment". Step 8 (services.py, ray.py) and step 10 (gateway.py) ask the run's Changes
(state.py) whether a service restarts or reloads, and Changes answers from this table alone: a
restart when any change of a RESTART kind changed the host, else a reload when any of a RELOAD kind
did (a restart rereads everything a reload would), else the service is only kept running. NOTHING:
the service reads that file itself as it goes, and a change needs no signal. Every unit file
written or removed also makes systemd reload its units first (daemon-reload, services.py).
"""

from __future__ import annotations

from collections.abc import Callable

from vllm_fleet.operations.managed import systemd_service

RESTART, RELOAD, NOTHING = "restart", "reload", "nothing"

HANDLERS: dict[str, dict[str, str]] = {
    # An instance's vLLM reads its unit, engine YAML, env file, model and environment only as it
    # starts. On a multi-node head, a restarted Ray restarts it too (services.py).
    "instance": {"unit": RESTART, "config": RESTART, "env": RESTART, "model": RESTART, "environment": RESTART,
                 # The module vLLM imports as it starts (--middleware) restarts it; its LoRA adapters
                 # (their list, the script that loads them, a synced adapter's files) reload it:
                 # ExecReload loads and unloads them in the running vLLM.
                 "model_access": RESTART, "adapters": RELOAD, "adapter_loader": RELOAD, "adapter": RELOAD},
    # A multi-node instance's Ray node (head or worker): its unit and the environment it starts from.
    "ray": {"unit": RESTART, "environment": RESTART},
    # nginx rereads its config and every file it includes on SIGHUP, keeping its connections; its
    # unit (the address it binds among it: a reload cannot move a listening socket) needs a restart.
    "front": {"unit": RESTART, "config": RELOAD, "keys": RELOAD, "tls_cert": RELOAD, "tls_key": RELOAD,
              "tls_trust": RELOAD, "prefix_key": RELOAD},
    # vllm-router: its unit and the environment it runs from restart it (SIGTERM lets requests in
    # flight finish); its backends (the workers list, the script that registers them) reload it:
    # ExecReload posts the list again and no request is dropped. The models lists are the front's,
    # which nginx reads per request.
    "gateway": {"unit": RESTART, "environment": RESTART, "workers": RELOAD, "register": RELOAD,
                "models": NOTHING, "client_models": NOTHING},
    # keepalived (Debian's unit, on a gateway behind a floating address) rereads its config on SIGHUP,
    # keeping the address where it is; it runs its readiness check afresh each time, so a changed
    # check needs no signal.
    "keepalived": {"config": RELOAD, "check": NOTHING},
    # The host exporter reads its script as it starts; the node exporter has only its unit.
    "exporter": {"unit": RESTART, "script": RESTART},
    "node_exporter": {"unit": RESTART},
    # Prometheus rereads prometheus.yml, its CAs, the rules and the token on SIGHUP (no sample is
    # lost), and each job's target list on its own (file_sd).
    "prometheus": {"unit": RESTART, "config": RELOAD, "trust": RELOAD, "rules": RELOAD, "token": RELOAD,
                   "targets": NOTHING},
    # Alertmanager reads its config from the copy systemd makes as the unit starts (LoadCredential):
    # a SIGHUP would reread the old copy, so a changed config restarts it (Prometheus resends every
    # alert still firing; silences and the notification log stay in its state directory).
    "alertmanager": {"unit": RESTART, "config": RESTART},
}


def action(service: str, kind: str) -> str:
    """What a change of `kind` does to `service` (one of RESTART, RELOAD, NOTHING). A kind its row
    does not name is a change the table has no decision for: a ValueError, never a silent no-op."""
    try:
        return HANDLERS[service][kind]
    except KeyError:
        raise ValueError(f"handlers.HANDLERS has no row {service!r} with a change {kind!r}: "
                         "declare what it does to the service there") from None


def run_handlers(unit: str, restart: Callable[[], bool], reload: Callable[[], bool], *,
                 restarted_why: str, reloaded_why: str | None = None) -> None:
    """The operations of a service whose handlers are plain systemd actions (the front, the gateway,
    the exporters, Prometheus): restarted when `restart()`, else reloaded when `reload()` (only where
    it has a RELOAD kind: `reloaded_why`), else kept enabled and running. All of them for every such
    service, each guarded: pyinfra's CLI order identifies an operation by its code line, so every
    host must add the same ones whatever changed."""
    systemd_service(name=f"Restart {unit} ({restarted_why})", unit=unit, running=True, restarted=True,
                    enabled=True, _if=restart)
    if reloaded_why is not None:
        systemd_service(name=f"Reload {unit} ({reloaded_why})", unit=unit, running=True, reloaded=True,
                        enabled=True, _if=reload)
    systemd_service(name=f"Ensure {unit} is enabled and running", unit=unit, running=True, enabled=True,
                    _if=lambda: not (restart() or reload()))
