"""Files and the service: the host's directories, the users each service runs as, where the front
listens and the units' limits."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_fleet import kinds
from vllm_fleet.config.knobs.common import BOOL, PATH, POSITIVE
from vllm_fleet.config.schema import knob, section

#: The most open files Linux lets one process have on a 64-bit host (fs.nr_open's ceiling, INT_MAX
#: rounded down to a multiple of 64: fs/file.c sysctl_nr_open_max); systemd raises fs.nr_open to it at
#: boot. A larger LimitNOFILE= fails the unit's start; one past 2**63 systemd cannot parse.
LINUX_NR_OPEN_MAX = 2 ** 31 - 64
#: The monitoring host's Prometheus files are in the directory beside vllm_config_dir named after it
#: with this suffix (monitoring/files.py), so the config directory's own name leaves room for it.
PROMETHEUS_DIR_SUFFIX = "-prometheus"


def _config_dir_problem(text: str) -> str | None:
    problem = kinds.config_dir_problem(text)
    if problem:
        return problem
    name = text.rsplit("/", 1)[-1].encode("utf-8", "surrogatepass")
    if len(name) + len(PROMETHEUS_DIR_SUFFIX) > kinds.NAME_MAX_BYTES:
        return (f"{text[:60]!r}... ends in a name of {len(name)} bytes: the directory beside it for the monitoring "
                f"host's Prometheus files (<name>{PROMETHEUS_DIR_SUFFIX}) would have more than the "
                f"{kinds.NAME_MAX_BYTES} bytes Linux takes for a name")
    return None


@section("Files and the service", notes="""
    Each directory is an absolute, normalised path that is no system directory (/, /etc, /usr,
    /var/lib, ...: kinds.SYSTEM_DIRECTORIES), contains none, and is inside no tree whose files root
    reads or runs (/etc, /usr, /boot, /lib*, /bin, /sbin, /root, /home, /run, /var/spool, /var/log,
    /var/lib/dpkg, /var/lib/apt, /var/lib/systemd, ...: kinds.ROOT_READ_TREES); vllm_config_dir, root's
    own, may also be a directory of its own directly below /etc. The service user owns its directories
    (state, HF_HOME, cache); root owns vllm_root and vllm_config_dir, and neither pair lies inside the
    other. At deploy time, a directory that exists already must be the service user's (or an empty one
    of root's), and every directory above it root's and writable by no one else: the deploy refuses the
    host otherwise, before any change.
    """)
@dataclass(frozen=True)
class FilesKnobs:
    vllm_config_dir: str = knob(
        "/etc/vllm-fleet", "<name>.yaml engine config, <name>.env secrets, manifest.json", check=_config_dir_problem)
    vllm_state_dir: str = knob("/var/lib/vllm-fleet", "the service user's home", **PATH)
    vllm_hf_home: str = knob("/var/lib/vllm-fleet/hf", "HF_HOME (TRANSFORMERS_CACHE is ignored by transformers)",
                             **PATH)
    vllm_cache_root: str = knob(
        "/var/lib/vllm-fleet/cache", "VLLM_CACHE_ROOT (compiled graphs and kernels)", **PATH)
    vllm_models_dir: str = knob(
        "/var/lib/vllm-fleet/models", "where model_source directories are synced to", **PATH)
    vllm_service_user: str = knob(
        "vllm", "vLLM and Ray", check=kinds.user_problem,
        notes="""
        The users the deploy creates, one per service, so that each process reads only its own secrets:
        code a model runs inside vLLM (trust_remote_code, custom ops) cannot read the clients' keys, the
        metrics token or the TLS key, which only the front's user reads. Never root, nor an account the OS,
        a package or a person already has: an existing user of that name that the deploy did not create is
        refused, before any change.
        """)
    vllm_front_user: str = knob(
        "vllm-front", "the front (nginx): the keys file and the TLS key", check=kinds.user_problem)
    vllm_gateway_user: str = knob("vllm-router", "the gateway's vllm-router", check=kinds.user_problem)
    vllm_exporter_user: str = knob("vllm-exporter", "the host exporter (vllm_metrics)", check=kinds.user_problem)
    vllm_gateway_check_user: str = knob(
        "vllm-gateway-check", "keepalived's readiness check of the gateway (vllm_gateway_address)",
        check=kinds.user_problem)
    vllm_bind_host: str = knob(
        "0.0.0.0", "the address the front listens on for every instance", check=kinds.listen_address_problem,
        fix="vllm_bind_host = '0.0.0.0' (every IPv4 interface), '::' (every interface) or one "
            "address of the host",
        notes="""
        Clients reach each instance at <vllm_bind_host>:<port> through the host's front (nginx from the OS
        packages, unit vllm-fleet-front.service), which passes only /v1/... (vLLM checks the API key there)
        and /health. vLLM itself listens on 127.0.0.1:<port + vllm_backend_port_offset>: its other routes
        (/invocations, /tokenize, /pause, ... answer WITHOUT the key) are reachable from the host only.
        """)
    vllm_backend_port_offset: int = knob(
        10000, "vLLM's own loopback port = the instance's port + this", **POSITIVE)
    vllm_limit_nofile: int = knob(
        65536, f"LimitNOFILE of the units (at most {LINUX_NR_OPEN_MAX}: Linux's most open files)",
        low=1, high=LINUX_NR_OPEN_MAX,
        must=f"a whole number from 1 to {LINUX_NR_OPEN_MAX} (the most open files Linux lets a process have)")
    vllm_shutdown_timeout_s: int = knob(
        30, "seconds the requests in flight may finish on a stop (--shutdown-timeout)",
        low=0, high=3600, must="a number of seconds from 0 to 3600",
        notes="""
        On a stop or restart (a deploy's), vLLM takes no new request and lets those in flight finish for up
        to this long before it aborts them (--shutdown-timeout; vLLM's own default, 0, aborts at once). The
        units' TimeoutStopSec is this plus 60 s. A restart waits that long only while requests run.
        """)
    vllm_install_host_packages: bool = knob(
        True, "install the OS packages the runtime needs (False: refuse a host that lacks one)", **BOOL,
        notes="""
        OS packages the runtime needs (vllm_fleet/rules/host_packages.py says why, with the sources): nginx for
        the front; CUDA: a C compiler and the Python headers (Triton builds a stub at the first kernel
        launch); CPU: libnuma, plus g++ and the Python headers unless every instance runs enforce-eager.
        True: missing ones are installed with apt or dnf from the host's own package sources. False: a
        host that lacks one is refused before anything changes, with the package names to install.
        """)
