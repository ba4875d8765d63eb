"""pyinfra facts that read what a host has: paths, a network interface's addresses, the OS
packages the runtime needs, a model directory's config, the environment and Hugging Face
downloads in place, the units vllm-fleet wrote (one command each, parsed in `process`)."""

from __future__ import annotations

import json
import shlex

from pyinfra.api import FactBase

from vllm_fleet.rules import host_packages

MANAGED_MARKER = "# Managed by vllm-fleet"  # the first line of every file the deploy writes
# Unit files vllm-fleet wrote (a unit without the marker is the user's own and is left alone).
MANAGED_UNIT_FILES = f"grep -l '^{MANAGED_MARKER}' /etc/systemd/system/vllm-*.service 2>/dev/null"


class PathsPresent(FactBase):
    """Which of the given paths exist on the host: {path: bool}."""

    def command(self, paths: tuple[str, ...]) -> str:
        checks = " ".join(shlex.quote(p) for p in paths)
        return f"for p in {checks}; do if [ -e \"$p\" ]; then echo \"1 $p\"; else echo \"0 $p\"; fi; done"

    def default(self):
        return {}

    def process(self, output):
        out = {}
        for line in output:
            flag, _, path = line.partition(" ")
            out[path] = flag == "1"
        return out


class InterfaceAddresses(FactBase):
    """The addresses (IPv4 and IPv6, without prefix length) of one network interface; None when the
    host has no interface of that name. A multi-node instance's node checks its own address on the
    nodes' network (vllm_private_interface) against the one the group uses for it."""

    def command(self, interface: str) -> str:
        quoted = shlex.quote(interface)
        return f"if ip -o addr show dev {quoted} >/dev/null 2>&1; then ip -o addr show dev {quoted}; else echo none; fi"

    def default(self):
        return None

    def process(self, output):
        lines = [line for line in output if line.strip()]
        if lines == ["none"]:
            return None
        found = []
        for line in lines:  # "2: eth0    inet 10.0.0.5/24 brd ... scope global eth0"
            words = line.split()
            for family in ("inet", "inet6"):
                if family in words and words.index(family) + 1 < len(words):
                    found.append(words[words.index(family) + 1].split("/")[0])
        return found


class ModelConfig(FactBase):
    """A local model directory's config.json (None if absent) and the size of its weights."""

    def command(self, path: str) -> str:
        quoted = shlex.quote(path)
        return (f"if [ -f {quoted}/config.json ]; then cat {quoted}/config.json | tr -d '\\n'; echo; "
                f"du -cb {quoted}/*.safetensors {quoted}/*.bin {quoted}/*.gguf 2>/dev/null | tail -n1; "
                f"else echo none; fi")

    def process(self, output):
        lines = list(output)
        if not lines or lines[0] == "none":
            return None
        try:
            config = json.loads(lines[0])
        except ValueError:
            return None
        size = int(lines[1].split()[0]) if len(lines) > 1 and lines[1].split() else 0
        return {"config": config, "weights_bytes": size}


class ManagedUnits(FactBase):
    """Names of vllm-*.service units that vllm-fleet wrote (they carry its marker line)."""

    def command(self) -> str:
        return f"{MANAGED_UNIT_FILES} | xargs -r -n1 basename || true"

    def default(self):
        return []

    def process(self, output):
        return sorted(line.strip() for line in output if line.strip())


class LinkTarget(FactBase):
    """Where a symlink points (None if it is not a link)."""

    def command(self, path: str) -> str:
        return f"readlink {shlex.quote(path)} || true"

    def process(self, output):
        lines = [line.strip() for line in output if line.strip()]
        return lines[0] if lines else None


class InstalledEnvironment(FactBase):
    """The environment `current` points to and its spec (vLLM version), from its marker file."""

    def command(self, current: str, marker: str) -> str:
        link, mark = shlex.quote(current), shlex.quote(marker)
        return f"if [ -f {link}/{mark} ]; then readlink {link}; cat {link}/{mark}; fi"

    def process(self, output):
        lines = list(output)
        if len(lines) < 2:
            return None
        try:
            return {"name": lines[0].strip(), **json.loads(lines[1])}
        except ValueError:
            return None


class HubModelCached(FactBase):
    """Whether the deploy finished downloading a Hugging Face repo into HF_HOME (hub.complete_marker)."""

    def command(self, hf_home: str, model: str) -> str:
        from vllm_fleet.rules.hub import complete_marker

        return f"test -f {shlex.quote(complete_marker(hf_home, model))} && echo complete || true"

    def process(self, output):
        return any(line.strip() == "complete" for line in output)

    def default(self):
        return False


class HostRuntime(FactBase):
    """What the runtime needs from the OS and which package manager the host has, in one command:
    ({need key: present}, "debian" | "rhel" | None). See host_packages.probe_command."""

    def command(self, python_version: str) -> str:
        return host_packages.probe_command(python_version)

    def default(self):
        return {}, None

    def process(self, output):
        return host_packages.parse_probe(list(output))
