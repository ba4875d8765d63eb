"""Rollout's side of the gateway: drain a batch's backends before their hosts converge, put them
back once verified (or rolled back), so clients of the gateway see no failed request.

Drain = vllm-router stops sending new requests to the backend (`DELETE /workers/<url>`), then the
requests it already sent finish: the backend's vLLM is watched until nothing runs or waits on it
(its /metrics, read on its own host), within `vllm_gateway_drain_timeout_s`. A backend that is the
only healthy one of its model is not drained: no other instance could take its requests, so
draining would only fail them sooner (they fail, or wait, while it restarts either way).

Everything runs on the hosts through the host probe (vllm_fleet/payloads/probe: gateway-status,
gateway-workers, wait-idle) with the hosts' connection arguments; the admin API stays on loopback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable
from urllib.parse import urlsplit

from gevent.pool import Pool

from vllm_fleet import gateway
from vllm_fleet.connect import remote
from vllm_fleet.config import HostConfig
from vllm_fleet.render import manifest_path
from vllm_fleet.facts.verify import host_probe_command, parse_host_probe, printed_result


@dataclass
class Drained:
    """What a batch took out of the gateway, to be put back."""

    workers: list[dict[str, str]] = field(default_factory=list)  # {"url", "model_id"}
    kept: list[str] = field(default_factory=list)  # why a backend of the batch stayed in


def _probe(host, mode: str, payload: dict[str, Any], timeout: int = 60) -> Any:
    _ok, out, err = remote.run(host, host_probe_command(mode, payload), timeout=timeout)
    result = parse_host_probe(out)
    if result is None and not printed_result(out):
        raise RuntimeError(f"host {host.name}: the {mode} probe printed no result: {err.strip()[-300:]}")
    return result


class DrainError(Exception):
    """A router could not take the batch's backends out (it answers no admin request, or refused one
    of them): with several gateways the batch is not converged (commands/gateway_rollout.py)."""


def drain(gw_host, gw_config: HostConfig, batch: list[str], hosts: dict[str, Any],
          configs: dict[str, HostConfig], log: Callable[[str], None], done: Drained) -> Drained:
    """Take the batch's backends out of the gateway and wait for their requests in flight. `done`
    records each worker before it is taken out, so the caller puts it back even if this fails."""
    ports = take_out(gw_host, gw_config, batch, configs, log, done)
    wait_until_idle(hosts, ports, int(gw_config.settings.vllm_gateway_drain_timeout_s), log)
    return done


def take_out(gw_host, gw_config: HostConfig, batch: list[str], configs: dict[str, HostConfig],
             log: Callable[[str], None], done: Drained, strict: bool = False) -> dict[str, list[int]]:
    """Take the batch's backends out of one gateway's router (no new request goes to them): the vLLM
    ports to wait on, by host. `strict` (several gateways): a router that is up but answers no admin
    request, or refuses a removal, raises DrainError instead of being logged and passed over."""
    status = _probe(gw_host, "gateway-status", {"manifest": manifest_path(gw_config)})
    if not status:
        log(f"gateway on {gw_config.name}: not drained (not deployed yet: no router sends requests there)")
        return {}
    if status.get("error"):
        if strict and status.get("active"):
            raise DrainError(f"gateway on {gw_config.name}: its router runs ({status['state']}) but {status['error']}")
        log(f"gateway on {gw_config.name}: not drained ({status['error']}; its router is {status.get('state')}, "
            "so it sends no request now)")
        return {}
    backends = status["backends"]
    serving = {}  # model -> healthy backends outside the batch
    for b in backends:
        if b["host"] not in batch and b.get("healthy"):
            serving.setdefault(b["model"], []).append(b["url"])
    ports: dict[str, list[int]] = {}
    leaving = []
    kept = []
    for b in backends:
        if b["host"] not in batch or not b.get("registered"):
            continue
        if not serving.get(b["model"]):
            kept.append(f"{b['host']}/{b['instance']} (the only healthy backend of {b['model']})")
            continue
        leaving.append({"url": b["url"], "model_id": b["model"]})
        offset = configs[b["host"]].settings.vllm_backend_port_offset if b["host"] in configs else None
        if offset is not None:
            ports.setdefault(b["host"], []).append(urlsplit(b["url"]).port + offset)
    done.kept.extend(kept)
    if kept:
        log(f"gateway on {gw_config.name}: not drained: {', '.join(kept)}")
    if not leaving:
        return ports
    done.workers.extend(leaving)
    router_port = gateway.gateway_ports(gw_config.settings)["router"]
    result = _probe(gw_host, "gateway-workers", {"router_port": router_port,
                                                 "remove": [w["url"] for w in leaving]})
    # Put back only what left: re-adding a worker the router still has is an error of its own.
    removed = set(result["removed"])
    done.workers[:] = [w for w in done.workers if w not in leaving or w["url"] in removed]
    if result["errors"]:
        if strict:
            raise DrainError(f"gateway on {gw_config.name}: {'; '.join(result['errors'])}")
        log(f"gateway: {'; '.join(result['errors'])}")
    return ports


def wait_until_idle(hosts: dict[str, Any], ports: dict[str, list[int]], timeout_s: int,
                    log: Callable[[str], None]) -> None:
    """Wait until the vLLMs on `ports` (by host) have nothing running or waiting: the requests the
    routers sent them before they were taken out. One deadline for the whole batch, whose hosts are
    waited for side by side (greenlets: the waits are on the network), not one after the other."""
    deadline = time.monotonic() + timeout_s

    def wait_idle(name: str) -> None:
        left_s = max(1, int(deadline - time.monotonic()))
        try:
            idle = _probe(hosts[name], "wait-idle", {"ports": ports[name], "timeout_s": left_s},
                          timeout=left_s + 60)
        except Exception as exc:  # noqa: BLE001 - one host's wait: the others' go on, the batch is deployed
            log(f"{name}: could not wait for its requests in flight ({exc}); they may fail while it restarts")
            return
        busy = sum(idle["in_flight"].values())
        log(f"{name}: drained from the gateway in {idle['seconds']} s"
            + (f" ({busy} request(s) still in flight when the drain time ran out)" if busy else
               " (no request in flight)"))

    waiting = [name for name in ports if hosts.get(name) is not None]
    if waiting:
        Pool(len(waiting)).map(wait_idle, waiting)


def restore(gw_host, gw_config: HostConfig, drained: Drained, log: Callable[[str], None],
            named: bool = False) -> list[str]:
    """Put the drained backends back (the router health-checks them before it sends requests); the
    router's errors. `named`: the log line names the gateway (one of several)."""
    if not drained.workers or gw_host is None:
        return []
    result = _probe(gw_host, "gateway-workers", {"router_port": gateway.gateway_ports(gw_config.settings)["router"],
                                                 "add": drained.workers})
    log(f"gateway{'' if not named else ' on ' + gw_config.name}: {len(result['added'])} backend(s) back in"
        + (f"; errors: {'; '.join(result['errors'])}" if result["errors"] else ""))
    return result["errors"]
