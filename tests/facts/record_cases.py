"""Record the fact cases' outputs: each case's command run on this machine against a scratch tree.

    .venv/bin/python tests/facts/record_cases.py     # on a Debian 12 host, as root

The tree (/tmp/vf-facts, removed and made again) holds what the cases read: a key file, directories,
a link, a model directory, an environment, a hub download's marker, a synced model directory. Each
case's command and output are (re)written; its expected `fact` is kept, and a new case gets "TODO":
write what the fact must be by hand, from the output and the fact's docstring, not from `process`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from vllm_fleet.facts import host, model_sync, state  # noqa: E402 (after the path)

S = Path("/tmp/vf-facts")


def _file(path: Path, content: str | bytes, mode: int = 0o644, mtime: int | None = None) -> None:
    if isinstance(content, str):
        content = content.encode()
    path.write_bytes(content)
    os.chmod(path, mode)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def _dir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir(parents=True)
    os.chmod(path, mode)
    return path


def make_tree() -> None:
    """What the cases read, made again from nothing."""
    subprocess.run(["rm", "-rf", "--one-file-system", str(S)], check=True)
    _dir(S)
    _file(S / "key.env", "VLLM_API_KEY=example\n", 0o640, 1_700_000_200)
    _dir(S / "state", 0o750)
    _dir(S / "empty")
    os.symlink("key.env", S / "link")
    model = _dir(S / "model")
    _file(model / "config.json", json.dumps({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 896}, indent=2)
          + "\n", mtime=1_700_000_000)
    _file(model / "model.safetensors", b"\0" * 4096, mtime=1_700_000_100)
    environment = _dir(S / "envs" / "vllm-0.33.0-3f2a")
    _file(environment / "vllm-fleet-env.json", json.dumps({"vllm_version": "0.33.0", "target": "cuda"}) + "\n")
    os.symlink("vllm-0.33.0-3f2a", S / "envs" / "current")
    _file(_dir(S / "hf" / ".vllm-fleet-complete") / "Qwen--Qwen2.5-0.5B-Instruct", "")
    synced = _dir(S / "synced")  # a synced model directory without its manifest
    _file(synced / "config.json", "{}\n", mtime=1_700_000_300)
    _file(synced / "tokenizer.json", "{}\n", mtime=1_700_000_400)


CASES = {
    "FileState": {"file": {"path": f"{S}/key.env"}, "absent": {"path": f"{S}/absent"},
                  "symlink": {"path": f"{S}/link"}, "directory": {"path": f"{S}/state"}},
    "DirectoryState": {"directory": {"path": f"{S}/state"}, "absent": {"path": f"{S}/absent"},
                       "file": {"path": f"{S}/key.env"}},
    "ServiceAccount": {"root": {"user": "root", "group": "root"},
                       "absent": {"user": "vllm-fleet-nobody", "group": "vllm-fleet-nobody"},
                       "group_only": {"user": "vllm-fleet-nobody", "group": "daemon"}},
    "NewestMtime": {"files": {"paths": [f"{S}/model/config.json", f"{S}/model/model.safetensors", f"{S}/absent"]},
                    "none": {"paths": [f"{S}/absent"]}},
    "PathOwners": {"tree": {"paths": [f"{S}/empty", f"{S}/state/missing"]}},
    "PathsPresent": {"mixed": {"paths": [f"{S}/key.env", f"{S}/absent", f"{S}/with space"]}},
    "InterfaceAddresses": {"loopback": {"interface": "lo"}, "absent": {"interface": "vfnone0"}},
    "ModelConfig": {"model": {"path": f"{S}/model"}, "absent": {"path": f"{S}/absent"}},
    "LinkTarget": {"link": {"path": f"{S}/envs/current"}, "not_a_link": {"path": f"{S}/key.env"}},
    "InstalledEnvironment": {"installed": {"current": f"{S}/envs/current", "marker": "vllm-fleet-env.json"},
                             "none": {"current": f"{S}/absent", "marker": "vllm-fleet-env.json"}},
    "HubModelCached": {"complete": {"hf_home": f"{S}/hf", "model": "Qwen/Qwen2.5-0.5B-Instruct"},
                       "not_yet": {"hf_home": f"{S}/hf", "model": "Qwen/Qwen2.5-7B-Instruct"}},
    "ModelSyncState": {"without_manifest": {"dest": f"{S}/synced"}, "absent": {"dest": f"{S}/absent"}},
    "ModelSyncHashes": {"two_files": {"dest": f"{S}/synced", "paths": ["config.json", "tokenizer.json"]}},
    "HostRuntime": {"python311": {"python_version": "3.11"}},
    "ManagedUnits": {"none": {}},  # a host vllm-fleet never deployed to (this one writes no unit)
}
MODULES = {**{n: state for n in ("FileState", "DirectoryState", "ServiceAccount", "NewestMtime", "PathOwners")},
           **{n: host for n in ("PathsPresent", "ManagedUnits", "InterfaceAddresses", "ModelConfig", "LinkTarget",
                                "InstalledEnvironment", "HubModelCached", "HostRuntime")},
           **{n: model_sync for n in ("ModelSyncState", "ModelSyncHashes")}}


def main() -> None:
    make_tree()
    out_root = Path(__file__).resolve().parent
    for name, cases in CASES.items():
        cls = getattr(MODULES[name], name)
        for case, arg in cases.items():
            kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in arg.items()}
            command = cls().command(**kwargs)
            proc = subprocess.run(["sh", "-c", command], capture_output=True, text=True)
            lines = proc.stdout.splitlines()
            d = out_root / f"{MODULES[name].__name__.split('.')[-1]}.{name}"
            d.mkdir(exist_ok=True)
            path = d / f"{case}.json"
            fact = json.loads(path.read_text())["fact"] if path.exists() else "TODO"
            path.write_text(json.dumps({"arg": arg, "command": command, "output": lines, "fact": fact}, indent=2) + "\n")
            print(f"== {name}/{case} rc={proc.returncode}\n" + "\n".join(lines[:12]))
    subprocess.run(["rm", "-rf", "--one-file-system", str(S)], check=True)


if __name__ == "__main__":
    main()
