"""`vllm-fleet rollout --canary HOST[,HOST] --observe 10m`: the canary batch, judged by the fleet's
Prometheus before the rest of the fleet converges.

The canary's hosts (--canary, else those with vllm_rollout_canary = True) are the rollout's first
batch. Once they converged and were verified, the rollout waits out the observation window while
clients use the fleet, then asks the fleet's Prometheus, on its own host's loopback over SSH (as
`status --usage` does), for each of the canary's models on the canary and on the rest of the fleet
(monitoring/canary_queries.py), and judges the figures (rules/canary.py):

    proceed      the rest of the fleet follows, batch by batch
    roll back    the canary's hosts are restored from their snapshots (drained from the gateway
                 first), restarted and verified, as a failed host is; the rest stays untouched
    stop         too little traffic in the window (or no figures): nothing was judged, the rest
                 stays untouched, the canary keeps the release it verified with

Everything that can be refused is refused before the first batch (`plan`): no monitoring host, a
canary host that is not in the inventory or not in --limit, serves no model or is not scraped,
a model of the canary that no other scraped host serves (nothing to compare with), thresholds the
canary's hosts disagree on, a window shorter than 3 scrapes.
"""

from __future__ import annotations

import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from vllm_fleet.config import ConfigError, ConfigErrors
from vllm_fleet.config.knobs.rollout import OBSERVE_MAX_S, OBSERVE_MIN_S
from vllm_fleet.config.ports import monitoring_ports
from vllm_fleet.monitoring.canary_queries import canary_queries, empty_figures, side_figures
from vllm_fleet.monitoring.targets import PROMETHEUS_PREFIX
from vllm_fleet.rules import canary as judgement

#: The knobs the canary's hosts must agree on (each host's own value would judge the same figures).
AGREED = ("vllm_canary_observe_s", "vllm_canary_min_requests", "vllm_canary_max_ttft_ratio",
          "vllm_canary_max_itl_ratio", "vllm_canary_max_error_rate", "vllm_canary_max_preemption_increase")
#: Scrapes of every target a window must hold at least (increase() needs two samples in it).
MIN_SCRAPES = 3
_OBSERVE = re.compile(r"([0-9]{1,6})([smh])\Z")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


@dataclass
class CanaryRequest:
    """What the command line asks: --canary's hosts (None: the hosts with vllm_rollout_canary) and
    --observe's text (None: vllm_canary_observe_s). `report` is filled by the rollout: the figures
    and the decision (None: no canary batch ran to its judgement)."""

    hosts: list[str] | None = None
    observe: str | None = None
    report: dict[str, Any] | None = None


@dataclass(frozen=True)
class CanaryPlan:
    hosts: list[str]
    models: list[str]
    monitor: str
    observe_s: int
    thresholds: judgement.Thresholds
    rest: dict[str, list[str]] = field(default_factory=dict)  # model -> the scraped hosts it is compared with


def parse_observe(text: str) -> int:
    """'10m' -> 600, '30s' -> 30, '1h' -> 3600: digits and one unit, from OBSERVE_MIN_S to
    OBSERVE_MAX_S. ValueError for anything else (0, a sign, a fraction, no unit, a huge number)."""
    match = _OBSERVE.match(text or "") if isinstance(text, str) else None
    if not match:
        raise ValueError(f"--observe {text!r}: a window is digits and one unit, s, m or h (30s, 10m, 1h)")
    seconds = int(match[1]) * _UNIT_S[match[2]]
    if not OBSERVE_MIN_S <= seconds <= OBSERVE_MAX_S:
        raise ValueError(f"--observe {text}: from {OBSERVE_MIN_S} s to {OBSERVE_MAX_S // 3600} h, not {seconds} s")
    return seconds


def plan(request: CanaryRequest | None, everyone: list, selected: list[str]) -> CanaryPlan | None:
    """The canary of this rollout, checked against the fleet (`everyone`: every host's config;
    `selected`: the hosts the rollout converges), or None when there is none. ConfigErrors: every
    reason it is refused, each naming host, key and fix."""
    request = request or CanaryRequest()
    configs = {c.name: c for c in everyone}
    hosts = list(dict.fromkeys(request.hosts)) if request.hosts else [
        n for n in selected if configs[n].settings.vllm_rollout_canary is True]
    if not hosts:
        if request.observe is not None:
            raise ConfigError("--observe needs a canary", key="--observe",
                              fix="name the canary: --canary HOST[,HOST] (or vllm_rollout_canary = True on its hosts)")
        return None
    errors: list[ConfigError] = []
    for name in hosts:
        if name not in configs:
            errors.append(ConfigError(f"--canary names {name!r}, not a host of the inventory", key="--canary",
                                      fix="name hosts of the inventory: --canary HOST[,HOST]"))
        elif name not in selected:
            errors.append(ConfigError("a canary host must be one this rollout converges (outside --limit)",
                                      host=name, key="--canary", fix="add it to --limit, or name another canary"))
    if errors:
        raise ConfigErrors(errors)
    monitors = [c for c in everyone if c.settings.vllm_monitoring is True and c.settings.vllm_metrics is True]
    if not monitors:
        errors.append(ConfigError(
            "a canary is judged by the fleet's Prometheus, and the fleet has none", key="vllm_monitoring",
            fix="vllm_monitoring = True (and vllm_metrics = True) on one host, and vllm_metrics = True on the "
                "hosts to compare, then deploy (docs/monitoring.md); or roll out without --canary"))
    models: list[str] = []
    for name in hosts:
        config = configs[name]
        if config.member_of or any(inst.nodes for inst in config.instances):
            errors.append(ConfigError("a node of a multi-node instance cannot be a canary (its group would "
                                      "have to be judged and rolled back as one)", host=name, key="--canary",
                                      fix="name hosts of single-host instances as the canary"))
            continue
        if not config.instances:
            errors.append(ConfigError("a canary host serves no model: there is nothing of it to judge",
                                      host=name, key="--canary", fix="name hosts that serve a model as the canary"))
        if config.settings.vllm_metrics is not True:
            errors.append(ConfigError("the fleet's Prometheus does not scrape this canary host", host=name,
                                      key="vllm_metrics", fix="vllm_metrics = True on it, and deploy"))
        models += [inst.served_model_name for inst in config.instances if inst.served_model_name not in models]
    rest: dict[str, list[str]] = {}
    for model in models:
        serving = [c for c in everyone if c.name not in hosts
                   and any(inst.served_model_name == model for inst in c.instances)]
        scraped = [c.name for c in serving if c.settings.vllm_metrics is True]
        if not serving:
            errors.append(ConfigError(
                f"the canary ({', '.join(hosts)}) is every host that serves {model}: nothing to compare it with",
                key="--canary", fix=f"leave a host that serves {model} out of the canary"))
        elif not scraped:
            errors.append(ConfigError(
                f"no other host that serves {model} is scraped by the fleet's Prometheus: nothing to compare "
                "the canary with", host=serving[0].name, key="vllm_metrics",
                fix="vllm_metrics = True on the hosts that serve it, and deploy"))
        rest[model] = scraped
    for key in AGREED:
        values = {configs[n].settings[key] for n in hosts}
        if len(values) > 1:
            errors.append(ConfigError(
                f"the canary's hosts disagree: {', '.join(f'{n} {configs[n].settings[key]!r}' for n in hosts)}",
                host=hosts[1], key=key, fix=f"one value of {key} for every canary host"))
    if errors:
        raise ConfigErrors(errors)
    first = configs[hosts[0]].settings
    observe_s = parse_observe(request.observe) if request.observe is not None else first.vllm_canary_observe_s
    monitor = monitors[0]
    scrape_s = monitor.settings.vllm_monitoring_scrape_interval_s
    if observe_s < MIN_SCRAPES * scrape_s:
        raise ConfigError(f"an observation window of {observe_s} s holds fewer than {MIN_SCRAPES} scrapes "
                          f"(every {scrape_s} s on {monitor.name})", key="--observe",
                          fix=f"--observe {MIN_SCRAPES * scrape_s}s or longer (or a shorter "
                              "vllm_monitoring_scrape_interval_s)")
    return CanaryPlan(hosts=hosts, models=models, monitor=monitor.name, observe_s=observe_s,
                      thresholds=judgement.Thresholds.of(first), rest=rest)


def decide(plan: CanaryPlan, answer: dict[str, Any] | None, error: str | None = None) -> dict[str, Any]:
    """The report of the judgement (pure): the probe's answer ({"results", "errors"}) -> every model's
    figures, checks and verdict, and the decision. No answer, or a query that failed: stop."""
    report: dict[str, Any] = {"hosts": list(plan.hosts), "monitor": plan.monitor, "observe_s": plan.observe_s,
                              "thresholds": asdict(plan.thresholds), "models": []}
    failed = error or ("; ".join(f"{k}: {v}" for k, v in sorted((answer or {}).get("errors", {}).items()))
                       if answer is not None else "no answer")
    if failed:
        report.update(decision=judgement.STOP, reasons=[f"the fleet's Prometheus on {plan.monitor} gave no figures: "
                                                        f"{failed}"])
        return report
    results = answer["results"]
    canary, rest = side_figures(results, "canary"), side_figures(results, "rest")
    verdicts = [judgement.judge(model, judgement.Side.of(canary.get(model, empty_figures())),
                                judgement.Side.of(rest.get(model, empty_figures())), plan.thresholds)
                for model in plan.models]
    report["models"] = [dict(v.row(), compared_with=plan.rest.get(v.model, [])) for v in verdicts]
    report["decision"] = judgement.overall(verdicts)
    report["reasons"] = [f"{v.model}: {reason}" for v in verdicts for reason in v.reasons]
    return report


def read_figures(plan: CanaryPlan, host, config) -> tuple[dict[str, Any] | None, str | None]:
    """The probe's answer to every query, asked on the monitoring host, or (None, why not)."""
    from vllm_fleet.connect import remote
    from vllm_fleet.facts.verify import host_probe_command, parse_host_probe

    if host is None:
        return None, "unreachable over SSH"
    payload = {"port": monitoring_ports(config.settings)["prometheus"], "prefix": PROMETHEUS_PREFIX,
               "queries": canary_queries(plan.hosts, plan.observe_s)}
    _ok, out, err = remote.run(host, host_probe_command("prometheus-query", payload), timeout=180)
    answer = parse_host_probe(out)
    return (answer, None) if answer is not None else (None, f"the query probe failed: {err.strip()[-300:]}")


def after_canary_batch(plan: CanaryPlan, request: CanaryRequest, inventory, configs: dict, everyone: list,
                       results: dict, gateway_config, log: Callable[[str], None],
                       sleep: Callable[[float], None] | None = None) -> bool:
    """Once the canary batch converged: observe, judge, roll the canary back where its figures say
    so. True: the rollout proceeds. The report goes to request.report."""
    from vllm_fleet.commands.connection import connected

    states = {n: results[n].state for n in plan.hosts}
    failed = [n for n, s in states.items() if s not in ("updated", "unchanged")]
    if failed:  # whatever --max-fail allows elsewhere: a canary that failed is the release's verdict
        request.report = {"hosts": list(plan.hosts), "decision": judgement.ROLL_BACK, "models": [],
                          "reasons": [f"the canary failed its deploy or verification on {', '.join(failed)} "
                                      f"({', '.join(states[n] for n in failed)})"]}
        log(f"canary decision: roll back: {request.report['reasons'][0]}")
        if any(s == "updated" for s in states.values()):  # the canary is one release: all of it goes back
            roll_back_canary(plan, inventory, configs, results, gateway_config, request.report, log)
        return False
    if all(s == "unchanged" for s in states.values()):
        request.report = {"hosts": list(plan.hosts), "decision": judgement.PROCEED, "models": [],
                          "reasons": ["the release changed nothing on the canary: nothing to observe"]}
        log("canary: the release changed nothing on it; nothing to observe")
        return True
    log(f"canary {', '.join(plan.hosts)}: observing for {plan.observe_s} s (clients keep using the fleet), "
        f"then comparing {', '.join(plan.models)} with the rest of the fleet")
    (sleep or time.sleep)(plan.observe_s)
    monitor_config = next(c for c in everyone if c.name == plan.monitor)
    with connected(inventory, [plan.monitor]) as (_state, active):
        answer, error = read_figures(plan, active[plan.monitor], monitor_config)
    report = decide(plan, answer, error)
    request.report = report
    for line in report_lines(report):
        log(line)
    if report["decision"] == judgement.ROLL_BACK:
        roll_back_canary(plan, inventory, configs, results, gateway_config, report, log)
    return report["decision"] == judgement.PROCEED


def roll_back_canary(plan: CanaryPlan, inventory, configs: dict, results: dict, gateway_config, report: dict,
                     log: Callable[[str], None]) -> None:
    """The canary's updated hosts restored from their snapshots, as a failed host is: drained from
    the gateway first, restarted, verified, put back."""
    from vllm_fleet.commands import gateway_drain, rollback
    from vllm_fleet.commands.connection import connected

    why = "the canary's figures: " + "; ".join(report["reasons"])
    hosts = [n for n in plan.hosts if results[n].state == "updated"]
    gw_name = gateway_config.name if gateway_config is not None else None
    reach = hosts + ([gw_name] if gw_name and gw_name not in hosts else [])
    with connected(inventory, reach) as (state, active):
        gw_host = active.get(gw_name) if gw_name else None
        drained = gateway_drain.Drained()
        if gw_host is not None:
            try:
                gateway_drain.drain(gw_host, gateway_config, hosts, active, configs, log, drained)
            except Exception as exc:  # noqa: BLE001 - best effort, as the rollout's own drain
                log(f"gateway on {gw_name}: could not drain the canary ({exc})")

        def back(name: str) -> None:
            res = results[name]
            log(f"{name}: rolling the canary back")
            if active[name] is None:
                ok, message = False, "unreachable over SSH"
            else:
                ok, message = rollback.roll_back(active[name], configs[name], res.before)
            res.state = "rolled back" if ok else "failed"
            res.error = f"{why}; rollback: {message}"
            res.after, res.finished = res.before, time.time()

        try:
            state.pool.map(back, hosts)
        finally:
            try:
                gateway_drain.restore(gw_host, gateway_config, drained, log)
            except Exception as exc:  # noqa: BLE001
                log(f"gateway on {gw_name}: could not put the canary back ({exc}): run the deploy on {gw_name}")
    for name in plan.hosts:
        if results[name].state == "unchanged":
            results[name].error = f"{why} (unchanged by the release: nothing to roll back)"


def _figure(value: float | None, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "share":
        return f"{value:.2%}"
    if kind == "seconds":
        return "> largest bucket" if value == float("inf") else f"{value * 1000:.1f} ms"
    if kind == "ratio":
        return "inf" if value == float("inf") else f"{value:.2f} x"
    return f"{value:.3f}" if kind == "per request" else f"{value:.0f}"


ROWS = (("requests", "total", "count"), ("failed (5xx, aborted)", "failed", "count"),
        ("failed share", "error_rate", "share"), ("TTFT p95", "ttft_p95", "seconds"),
        ("inter-token latency p95", "itl_p95", "seconds"), ("preemptions", "preemptions", "count"),
        ("preemptions per request", "preemptions_per_request", "per request"))
CHECK_OF = {"error_rate": "error_rate", "ttft_p95": "ttft_p95", "itl_p95": "itl_p95",
            "preemptions_per_request": "preemptions_per_request"}


def report_lines(report: dict[str, Any]) -> list[str]:
    """The figures as plain lines (the rollout's log): per model, canary against rest, then the decision."""
    lines = []
    for model in report.get("models", []):
        checks = {c["figure"]: c for c in model["checks"]}
        lines.append(f"canary {', '.join(report['hosts'])} against {', '.join(model.get('compared_with') or ['-'])}"
                     f" for {model['model']} over {report.get('observe_s')} s:")
        for label, key, kind in ROWS:
            check = checks.get(CHECK_OF.get(key, ""))
            verdict = "" if check is None else (" ok" if check["passed"] else " BEYOND THE LIMIT"
                                                if check["passed"] is False else " not judged")
            lines.append(f"  {label:<26} canary {_figure(model['canary'].get(key), kind):>16}   "
                         f"rest {_figure(model['rest'].get(key), kind):>16}{verdict}")
    lines.append(f"canary decision: {report['decision']}"
                 + (": " + "; ".join(report["reasons"]) if report.get("reasons") else ""))
    return lines


def print_report(report: dict[str, Any]) -> None:
    """The canary's table, per model: each figure on the canary and on the rest, the limit, the verdict."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=170)
    for model in report.get("models", []):
        checks = {c["figure"]: c for c in model["checks"]}
        table = Table(title=f"canary {', '.join(report['hosts'])}: {model['model']} over {report['observe_s']} s "
                            f"(rest: {', '.join(model.get('compared_with') or ['-'])})")
        for column in ("figure", "canary", "rest", "compared", "limit", "verdict"):
            table.add_column(column)
        for label, key, kind in ROWS:
            check = checks.get(CHECK_OF.get(key, ""))
            if check is None:
                compared = limit = verdict = ""
            else:
                compared_kind = "ratio" if key in ("ttft_p95", "itl_p95") else (
                    "share" if key == "error_rate" else "per request")
                compared = _figure(check["compared"], compared_kind)
                limit = _figure(check["limit"], compared_kind)
                verdict = {True: "[green]ok[/green]", False: "[red]beyond[/red]", None: "[dim]not judged[/dim]"}[
                    check["passed"]]
            table.add_row(label, _figure(model["canary"].get(key), kind), _figure(model["rest"].get(key), kind),
                          compared, limit, verdict)
        console.print(table)
    colour = {"proceed": "green", "roll back": "red", "stop": "yellow"}[report["decision"]]
    console.print(f"canary decision: [{colour}]{report['decision']}[/{colour}]", highlight=False)
    for reason in report.get("reasons", []):
        console.print(f"  {reason}", highlight=False, markup=False)


def main_report(report: dict[str, Any] | None, as_json: bool) -> None:
    """After the hosts' table: the canary's (not in --json, where it is the document's "canary")."""
    if report is not None and not as_json:
        print_report(report)
        sys.stdout.flush()
