"""The fleet's Prometheus alert rules (templates/prometheus-rules.yml.j2), rendered. Pure.

Example:

    text = alert_rules(down_for_s=120, tls=True)   # the rules.yml the monitoring host gets
"""

from __future__ import annotations

from vllm_fleet.templating import jinja_environment

TEMPLATE = "prometheus-rules.yml.j2"

#: Every alert the template can hold, in its order. VllmFleetCertificateExpiring only with TLS.
RULE_NAMES = (
    "VllmFleetInstanceDown",
    "VllmFleetHostDown",
    "VllmFleetTargetDown",
    "VllmFleetUnitFailed",
    "VllmFleetUnitRestartLoop",
    "VllmFleetKvCacheFull",
    "VllmFleetRequestsWaiting",
    "VllmFleetGatewayBackendOut",
    "VllmFleetMonitoringPeerDown",
    "VllmFleetMonitorsDisagree",
    "VllmFleetGpuUnreadable",
    "VllmFleetGpuEccErrors",
    "VllmFleetGpuXidErrors",
    "VllmFleetGpuHot",
    "VllmFleetModelStorageLow",
    "VllmFleetCertificateExpiring",
)
TLS_ONLY = frozenset({"VllmFleetCertificateExpiring"})

_UNITS = (("h", 3600), ("m", 60), ("s", 1))


def prometheus_duration(seconds: int) -> str:
    """`seconds` as a Prometheus duration: 120 -> "2m", 20 -> "20s", 5400 -> "1h30m", 0 -> "0s".

    Whole units only, largest first (the form Prometheus itself prints), so the rules read as
    written by hand and a value that did not change renders the same text."""
    if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
        raise ValueError(f"a duration is a whole number of seconds >= 0, not {seconds!r}")
    if seconds == 0:
        return "0s"
    parts = []
    for unit, size in _UNITS:
        count, seconds = divmod(seconds, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def alert_rules(down_for_s: int, tls: bool) -> str:
    """rules.yml: the group `vllm-fleet`. `down_for_s`: how long a target (an instance, an
    exporter, a gateway backend) is down before its alert fires; `tls`: the fronts serve HTTPS, so
    their certificate's end is watched too."""
    template = jinja_environment().get_template(TEMPLATE)
    return template.render(down_for=prometheus_duration(down_for_s), tls=bool(tls))


def rule_names(tls: bool) -> tuple[str, ...]:
    """The alerts alert_rules(..., tls) holds."""
    return tuple(name for name in RULE_NAMES if tls or name not in TLS_ONLY)
