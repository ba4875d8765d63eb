"""A model's config.json and the size of its weights, read from a directory on this workstation
(`model_info = '/srv/models/qwen3-8b'`, `vllm-fleet model-info MODEL_DIR`).

What is read is bounded and stays in the model's directory: config.json and the safetensors index
must be regular files of at most MAX_CONFIG_BYTES / MAX_INDEX_BYTES, opened without following a
link at the last step; a symbolic link is followed only to a file inside the model's directory or,
for a snapshot of the Hugging Face cache (models--org--name/snapshots/<revision>/), inside that
model's cache folder, where its blobs are. Nothing under /proc, /sys or /dev is read. The weights
are never read, only their sizes looked at: model.safetensors.index.json's metadata.total_size,
else the *.safetensors files beside config.json (consolidated*.safetensors alone where a
Mistral-format checkpoint sits beside the Hugging Face one, as vLLM loads it), else the same for
PyTorch's *.bin files.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_fleet import kinds

MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_INDEX_BYTES = 64 * 1024 * 1024
#: A checkpoint's total above this is no number a real index holds (1 PiB).
MAX_WEIGHTS_BYTES = 1 << 50
_NOT_READ = ("/proc", "/sys", "/dev")
#: PyTorch files of a repository that vLLM does not load (weight_utils.filter_files_not_needed_for_inference).
_NOT_WEIGHTS = {"training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt"}


class ModelFilesError(Exception):
    """A model directory or file that cannot be read as one: str() says what, `fix` what to do."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class ModelFiles:
    """What was read: the config (a dict), where from, and the weights' bytes (None: no weight
    files beside it) with where that number came from."""

    config: dict[str, Any]
    config_path: Path
    weights_bytes: int | None
    weights_source: str
    #: modules.json beside config.json: a sentence-transformers model, which vLLM runs as a pooling model.
    sentence_transformers: bool = False


def _shown(path: Any) -> str:
    return str(path) if kinds.printable(str(path)) else repr(str(path))


def _root_of(directory: Path) -> Path:
    """Where a link of this model directory may lead: the directory, or its Hugging Face cache folder."""
    if directory.parent.name == "snapshots" and directory.parent.parent.name.startswith("models--"):
        return directory.parent.parent
    return directory


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _target(path: Path, root: Path) -> Path:
    """The file `path` stands for: itself, or where its link leads when that stays under `root`."""
    resolved = Path(os.path.realpath(path))
    if path.is_symlink() and not _inside(resolved, root):
        raise ModelFilesError(f"{_shown(path)} is a link to {_shown(resolved)}, outside the model's directory "
                              f"{_shown(root)}", "point model_info at the model directory itself (a copy, or "
                              "the Hugging Face cache's snapshot folder)")
    if any(_inside(resolved, Path(p)) for p in _NOT_READ):
        raise ModelFilesError(f"{_shown(path)} is no model file", "point model_info at the model's directory")
    return resolved


def read_json(path: Path, root: Path, limit: int) -> Any:
    """A JSON file of the model: a regular file of at most `limit` bytes, read without following a link
    it may have become since it was looked at."""
    target = _target(path, root)
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelFilesError(f"cannot read {_shown(path)}: {exc.strerror}",
                              "point model_info at a model directory this user can read") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ModelFilesError(f"{_shown(path)} is not a regular file", "point model_info at the model's "
                                  "config.json or its directory")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise ModelFilesError(f"{_shown(path)} holds more than {limit} bytes, more than a model's {path.name} does",
                              "point model_info at the model's own config.json")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise ModelFilesError(f"{_shown(path)} is not valid JSON",
                              "give the model's config.json as published (or download it again)") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _sizes(directory: Path, root: Path, pattern: str) -> list[int]:
    sizes = []
    for path in sorted(directory.glob(pattern)):
        if path.name in _NOT_WEIGHTS:
            continue
        target = _target(path, root)
        info = os.stat(target)
        if stat.S_ISREG(info.st_mode):
            sizes.append(info.st_size)
    return sizes


def weights_size(directory: Path, root: Path) -> tuple[int | None, str]:
    """(bytes of the weights vLLM loads from this directory, where the number comes from); (None, "")
    without weight files."""
    for index, pattern in (("model.safetensors.index.json", "*.safetensors"),
                           ("pytorch_model.bin.index.json", "*.bin")):
        path = directory / index
        if path.is_file() or path.is_symlink():
            data = read_json(path, root, MAX_INDEX_BYTES)
            total = (data.get("metadata") or {}).get("total_size") if isinstance(data, dict) else None
            if isinstance(total, bool) or not isinstance(total, int) or not 0 < total <= MAX_WEIGHTS_BYTES:
                raise ModelFilesError(f"{_shown(path)} has no metadata.total_size (a positive number of bytes)",
                                      "download the model's index again, or paste its config.json with "
                                      "'weights_gib' added")
            return total, f"{index} (metadata.total_size)"
        if pattern == "*.safetensors" and list(directory.glob("consolidated*.safetensors")):
            pattern = "consolidated*.safetensors"
        sizes = _sizes(directory, root, pattern)
        if sizes:
            return sum(sizes), f"{len(sizes)} {pattern} file{'s' if len(sizes) > 1 else ''}"
    return None, ""


def read_model_files(given: str) -> ModelFiles:
    """The config.json of a model directory (or that file itself) and its weights' size, read as the
    module says; ModelFilesError names what is wrong with the fix."""
    if not isinstance(given, str) or not given.strip() or not kinds.printable(given):
        raise ModelFilesError(f"{given!r} is not a path", "model_info = '/srv/models/<model>' (its directory)")
    path = Path(given).expanduser()
    if not path.is_absolute():
        raise ModelFilesError(f"{_shown(given)} is not an absolute path (it would depend on the directory "
                              "vllm-fleet is run from)", f"model_info = '/.../{_shown(path)}'")
    if path.is_dir():
        directory, config_path = Path(os.path.realpath(path)), path / "config.json"
    else:
        directory, config_path = Path(os.path.realpath(path.parent)), path
    if not (config_path.is_file() or config_path.is_symlink()):
        raise ModelFilesError(f"{_shown(config_path)} does not exist on this workstation",
                              "point model_info at a model directory holding config.json (`hf download "
                              "<id> --include '*.json'` fetches it without the weights)")
    root = _root_of(directory)
    config = read_json(config_path, root, MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise ModelFilesError(f"{_shown(config_path)} is not a JSON object", "give the model's config.json")
    weights, source = weights_size(directory, root)
    modules = directory / "modules.json"
    return ModelFiles(config, config_path, weights, source,
                      sentence_transformers=modules.is_file() or modules.is_symlink())
