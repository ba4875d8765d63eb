"""The workstation's package settings, as pip and uv are already configured there.

vllm-fleet resolves and downloads wheels on the workstation (`vllm-fleet bundle`, the sandbox's
wheelhouse) with uv and pip. The user has configured them for this machine: pip through pip.conf and
`PIP_*` variables (its index, extra indexes, find-links, the CA bundle of a TLS-inspecting proxy), uv
through uv.toml and `UV_*`. uv reads none of pip's settings, and by default trusts only the roots
bundled into it, not the OS certificate store that pip (and curl, git, apt) use. So each uv call gets:

- trust: `SSL_CERT_FILE` where it is set (uv reads it itself), else pip's `cert` bundle where pip
  names one (given to uv as its `SSL_CERT_FILE`), else the OS certificate store (`UV_SYSTEM_CERTS`:
  uv's own probe of the OS's bundle and certificate folder);
- indexes: uv's own when uv has any (UV_* variables or a uv.toml); otherwise pip's `index-url`,
  `extra-index-url` (best version over all of them, as pip picks), `find-links`, `trusted-host` and
  `no-index`, as `pip download` reads them ([download], then [global]).

pip reads its own configuration; where it names no `cert`, it is given `SSL_CERT_FILE` or the OS's
bundle file, so both tools trust the same roots; where uv's indexes are set by variables, pip's
download is given them too. `describe()` is what `vllm-fleet bundle` prints: which indexes and which
trust it used, and where each came from.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from vllm_fleet.environment import OS_CA_BUNDLES, PYPI_SIMPLE
# uv's variables that set where packages come from: with any of them, uv's own settings rule.
UV_INDEX_VARIABLES = ("UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_INDEX", "UV_EXTRA_INDEX_URL",
                      "UV_FIND_LINKS", "UV_NO_INDEX")  # fmt: skip
# Keys of a uv.toml that set where packages come from.
UV_TOML_INDEX_KEYS = re.compile(
    r"^\s*(\[\[index\]\]|(index-url|extra-index-url|default-index|index|find-links|no-index)\s*=)", re.M)
# pip's settings vllm-fleet passes on to uv, and the sections they are read from, strongest first
# (pip's own order: variables, then the command's section, then [global]).
PIP_KEYS = ("index-url", "extra-index-url", "find-links", "cert", "trusted-host", "no-index")
PIP_SECTIONS = (":env:", "download", "global")


@dataclass(frozen=True)
class PackageSources:
    """Where the workstation's packages come from, and which certificates it trusts."""

    index_url: str | None = None  # None: PyPI
    extra_index_urls: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    no_index: bool = False
    ca_file: str | None = None  # the bundle both tools trust (SSL_CERT_FILE, pip's cert, the OS's)
    ca_from_pip: bool = False  # ca_file is pip's cert: uv is given it as SSL_CERT_FILE
    uv_configured: bool = False  # uv has index settings of its own: pip's are not passed to it
    uv_indexes: tuple[str, ...] = ()  # uv's own, where variables set them (the default first)
    uv_digest: str = ""  # what uv's own configuration says, for the input hash
    origins: dict[str, str] = field(default_factory=dict)  # setting -> where it was read

    def indexes(self) -> list[str]:
        """Every index a resolve may ask, the default first (for messages and the input hash)."""
        if self.uv_configured:
            return list(self.uv_indexes)
        if self.no_index:
            return []
        return [self.index_url or PYPI_SIMPLE, *self.extra_index_urls]

    def uv_args(self, find_links: bool = True) -> list[str]:
        """uv pip options for these sources (none where uv's own configuration rules)."""
        if self.uv_configured:
            return []
        args: list[str] = []
        if self.no_index:
            args.append("--no-index")
        if self.index_url:
            args += ["--index-url", self.index_url]
        for url in self.extra_index_urls:
            args += ["--extra-index-url", url]
        if self.extra_index_urls:
            # pip takes each package's best version over all its indexes; uv's default takes the
            # first index that has the package, which a partial mirror would then pin.
            args += ["--index-strategy", "unsafe-best-match"]
        for link in self.find_links if find_links else ():
            args += ["--find-links", link]
        for host in self.trusted_hosts:
            args += ["--allow-insecure-host", host]
        return args

    def uv_environment(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """The environment for a uv call: the OS trust store on, pip's bundle where it names one."""
        env = dict(os.environ if base is None else base)
        env.setdefault("UV_SYSTEM_CERTS", "1")  # uv >= 0.11
        env.setdefault("UV_NATIVE_TLS", "1")  # the same, for older uv
        if self.ca_from_pip and self.ca_file and not env.get("SSL_CERT_FILE"):
            env["SSL_CERT_FILE"] = self.ca_file
        return env

    def pip_args(self) -> list[str]:
        """pip reads its own configuration: it is given the trusted bundle when it names no cert, and
        uv's indexes when uv's own (set by variables) are the ones the resolve used."""
        args = ["--cert", self.ca_file] if self.ca_file and not self.ca_from_pip else []
        if self.uv_configured and self.uv_indexes:
            args += ["--index-url", self.uv_indexes[0]]
            for url in self.uv_indexes[1:]:
                args += ["--extra-index-url", url]
        return args

    def describe(self) -> list[str]:
        """What a bundle prints: the indexes and the trust, and where each setting came from."""
        def origin(key: str, default: str) -> str:
            return self.origins.get(key, default)

        lines = []
        if self.uv_configured:
            said = f": {', '.join(self.uv_indexes)}" if self.uv_indexes else ""
            lines.append(f"indexes: uv's own configuration ({origin('uv', 'uv.toml / UV_*')}){said}; "
                         "pip's index settings are not passed to uv")
        elif self.no_index:
            lines.append(f"indexes: none (no-index, from {origin('no-index', 'pip')}); find-links only")
        else:
            lines.append(f"index: {self.index_url or PYPI_SIMPLE} ({origin('index-url', 'the default')})")
            for url in self.extra_index_urls:
                lines.append(f"extra index: {url} ({origin('extra-index-url', 'pip')})")
        for link in self.find_links:
            lines.append(f"find-links: {link} ({origin('find-links', 'pip')})")
        if self.ca_file and origin("trust", "") != "the OS store":
            lines.append(f"trust: {self.ca_file} ({origin('trust', '')}; uv and pip both)")
        else:
            lines.append(f"trust: the OS certificate store (uv with UV_SYSTEM_CERTS, pip with "
                         f"{self.ca_file or 'its own roots'})")
        return lines


def pip_config(python: str = sys.executable, env: dict[str, str] | None = None) -> dict[str, list[str]]:
    """pip's effective settings among PIP_KEYS, as `pip config list` reports them (parse_pip_config)."""
    out = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         check=False, env=env).stdout  # fmt: skip
    return parse_pip_config(out)


def parse_pip_config(listing: str) -> dict[str, list[str]]:
    """`pip config list` output -> key -> values (whitespace-separated lists split), each key from
    its strongest section, and under '<key>@' where it was read ('pip PIP_CERT', 'pip global.cert')."""
    found: dict[tuple[str, str], list[str]] = {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if key in PIP_KEYS and section in PIP_SECTIONS:
            text = value.strip()
            if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
                text = text[1:-1]
            text = text.replace("\\n", "\n")
            try:
                values = [text] if key == "cert" else shlex.split(text)
            except ValueError:  # an unmatched quote in the value: pip itself splits on whitespace
                values = text.split()
            found[(section, key)] = values
    settings: dict[str, list[str]] = {}
    for key in PIP_KEYS:
        for section in PIP_SECTIONS:
            if (section, key) in found:
                settings[key] = found[(section, key)]
                where = "PIP_" + key.upper().replace("-", "_") if section == ":env:" else f"{section}.{key}"
                settings[key + "@"] = [f"pip {where}"]
                break
    return settings


def uv_configuration(env: dict[str, str], home: Path) -> tuple[str, tuple[str, ...], str] | None:
    """uv's own index settings, or None when it has none (no variable, no uv.toml that sets one):
    (where they are, the index URLs the variables name, a digest of what they say)."""
    named = [name for name in UV_INDEX_VARIABLES if env.get(name)]
    if named:
        urls = [env[n] for n in ("UV_DEFAULT_INDEX", "UV_INDEX_URL") if env.get(n)][:1] or [PYPI_SIMPLE]
        for name in ("UV_INDEX", "UV_EXTRA_INDEX_URL"):
            urls += env.get(name, "").split()
        said = "\n".join(f"{n}={env[n]}" for n in named)
        return ", ".join(named), tuple(urls), hashlib.sha256(said.encode()).hexdigest()[:12]
    if env.get("UV_NO_CONFIG"):
        return None
    files = [env.get("UV_CONFIG_FILE")]
    config_home = env.get("XDG_CONFIG_HOME") or str(home / ".config")
    files.append(f"{config_home}/uv/uv.toml")
    for folder in (env.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(":"):
        files.append(f"{folder}/uv/uv.toml")
    files.append("/etc/uv/uv.toml")
    for path in filter(None, files):
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        if UV_TOML_INDEX_KEYS.search(text):
            return path, (), hashlib.sha256(text.encode()).hexdigest()[:12]
    return None


def os_ca_file() -> str | None:
    """The OS's own CA bundle file (Debian/Ubuntu, RHEL/Fedora, SUSE, Alpine), not a Python's: a
    conda or Homebrew Python carries its own copy of Mozilla's roots, without a proxy's CA."""
    for candidate in OS_CA_BUNDLES:
        if Path(candidate).is_file():
            return candidate
    return None


def workstation_sources(python: str = sys.executable, env: dict[str, str] | None = None,
                        home: Path | None = None) -> PackageSources:
    """Read pip's and uv's settings and the trust store of this workstation."""
    env = dict(os.environ if env is None else env)
    home = home or Path(env.get("HOME") or Path.home())
    pip = pip_config(python, env)
    origins = {key: pip[key + "@"][0] for key in PIP_KEYS if key in pip}
    uv_own = uv_configuration(env, home)
    if uv_own:
        origins["uv"] = uv_own[0]
    ca_from_pip = False
    if env.get("SSL_CERT_FILE"):
        ca_file, origins["trust"] = env["SSL_CERT_FILE"], "SSL_CERT_FILE"
    elif pip.get("cert"):
        ca_file, origins["trust"], ca_from_pip = pip["cert"][0], origins["cert"], True
    else:
        ca_file, origins["trust"] = os_ca_file(), "the OS store"
    index_url = pip.get("index-url", [None])[0]
    return PackageSources(
        index_url=index_url if index_url and index_url.rstrip("/") != PYPI_SIMPLE else None,
        extra_index_urls=tuple(pip.get("extra-index-url", ())),
        find_links=tuple(pip.get("find-links", ())),
        trusted_hosts=tuple(pip.get("trusted-host", ())),
        no_index=pip.get("no-index", ["false"])[0].lower() in ("1", "true", "yes", "on"),
        ca_file=ca_file, ca_from_pip=ca_from_pip, uv_configured=bool(uv_own),
        uv_indexes=uv_own[1] if uv_own else (), uv_digest=uv_own[2] if uv_own else "", origins=origins,
    )


def failure_advice(output: str, sources: PackageSources, what: str) -> str:
    """One paragraph for a failed resolve or download: the indexes tried, why, and what to change."""
    tried = ", ".join(sources.indexes()) or (f"uv's own indexes ({sources.origins.get('uv', 'uv.toml')})"
                                             if sources.uv_configured else "no index")
    if sources.find_links:
        tried += f" (find-links: {', '.join(sources.find_links)})"
    text = output.lower()
    if re.search(r"certificate|unknownissuer|ssl|tls", text):
        why = "the index's TLS certificate is not trusted"
        fix = ("put the CA that signs it in the OS certificate store (update-ca-certificates), or name its "
               "bundle with SSL_CERT_FILE=PATH or pip's cert (pip config set global.cert PATH)")
    elif re.search(r"connect|dns|resolve host|timed out|timeout|network|unreachable|refused", text):
        why = "the index could not be reached"
        fix = ("name an index this machine reaches with pip's index-url (pip config set global.index-url "
               "URL) or UV_INDEX_URL=URL, or add a local folder of wheels with pip's find-links")
    elif re.search(r"not found|no solution|unsatisfiable|could not find|no matching", text):
        why = "a package or version is not on those indexes"
        fix = ("add the index that has it (pip config set global.extra-index-url URL, or UV_EXTRA_INDEX_URL), "
               "or choose a version they hold (--vllm-version)")
    else:
        why = "the package tool failed"
        fix = "see its message above; the indexes come from pip.conf / PIP_* and uv.toml / UV_*"
    return f"{what} failed: {why}; tried {tried}. Fix: {fix}."
