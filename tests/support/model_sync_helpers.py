"""What the model sync's tests share (tests/operations/test_model_sync*.py): the workstation's
cache per test, a model directory to sync, the operation run against fact dicts, and the shell that
runs its commands for real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand

from vllm_fleet.operations import model_sync as ms


@pytest.fixture(autouse=True)
def model_sync_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path / "cache"))
    ms._HOST_HASHES.clear()


def model_tree(root: Path) -> Path:
    src = root / "model"
    (src / "tokenizer").mkdir(parents=True)
    (src / "config.json").write_text('{"architectures": ["X"]}\n')
    (src / "model-00001-of-00002.safetensors").write_bytes(os.urandom(300_000))
    (src / "model-00002-of-00002.safetensors").write_bytes(os.urandom(200_000))
    (src / "tokenizer" / "tokenizer.json").write_text('{"v": 1}\n')
    (src / ".gitattributes").write_text("hidden\n")
    (src / ".cache" / "huggingface").mkdir(parents=True)
    (src / ".cache" / "huggingface" / "x.lock").write_text("")
    (src / "empty").mkdir()
    return src


class FactsHost:
    name, print_prefix = "gpu9", "[gpu9] "

    def __init__(self, facts):
        self.facts = facts
        self.data: dict = {}
        self.noops: list[str] = []
        self.fact_calls: list[str] = []

    def get_fact(self, fact, **kwargs):
        self.fact_calls.append(fact.__name__)
        value = self.facts[fact.__name__]
        return value(**kwargs) if callable(value) else value

    def noop(self, description):
        self.noops.append(description)


def run_model_sync(monkeypatch, facts, **kwargs):
    fake = FactsHost(facts)
    monkeypatch.setattr(ms, "host", fake)
    return list(ms.model_sync._inner(**kwargs)), fake


def uploaded_paths(cmds):
    return [c.dest for c in cmds if isinstance(c, FileUploadCommand)]


def run_sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}
