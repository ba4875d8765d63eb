"""Model sync's workstation side (vllm_fleet/model_source.py): the manifest of the model directory
and its cache (a second call reads no content), the links it follows and those it refuses, the
progress logged while a file is read."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from support.model_sync_helpers import model_tree
from support.model_sync_helpers import model_sync_cache  # noqa: F401 (an autouse fixture: pytest finds it by name)

from vllm_fleet import model_source
from vllm_fleet.model_source import PARTIAL_SUFFIX, ModelSyncError
from vllm_fleet.operations import model_sync as ms

_REAL_SHA256 = model_source.sha256_file


def _count_hashes(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = _REAL_SHA256

    def counting(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(model_source, "sha256_file", counting)
    return calls


# --- The workstation manifest -----------------------------------------------------------------------

def test_manifest_lists_files_skips_hidden_and_second_call_reads_no_content(tmp_path, monkeypatch):
    src = model_tree(tmp_path)
    calls = _count_hashes(monkeypatch)
    first = model_source.local_manifest(src)
    assert sorted(first.files) == ["config.json", "model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors", "tokenizer/tokenizer.json"]
    assert first.dirs == ["empty", "tokenizer"]
    assert len(calls) == 4 and first.hashed_files == 4
    import hashlib
    shard = src / "model-00001-of-00002.safetensors"
    assert first.files[shard.name].sha256 == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert model_source.cache_file(src).is_file() and model_source.cache_file(src).parent == tmp_path / "cache" / "model-manifests"

    # Second pass: no file is opened at all (hashing would raise; plain open() is watched too).
    def no_reads(path):
        raise AssertionError(f"read {path}")

    monkeypatch.setattr(model_source, "sha256_file", no_reads)
    real_open = open
    opened: list[str] = []

    def watching_open(file, *a, **k):
        if str(file).startswith(str(src)):
            opened.append(str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", watching_open)
    second = model_source.local_manifest(src)
    monkeypatch.setattr("builtins.open", real_open)
    assert opened == [] and second.hashed_files == 0
    assert second.files == first.files

    # Same size, new content and mtime: only that file is read again.
    calls = _count_hashes(monkeypatch)
    shard.write_bytes(os.urandom(300_000))
    os.utime(shard, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    third = model_source.local_manifest(src)
    assert calls == [str(shard)]
    assert third.files[shard.name].sha256 != first.files[shard.name].sha256
    # Replaced by another file (new inode) with the same size and mtime: read again too.
    calls.clear()
    other = tmp_path / "other"
    shutil.copy2(shard, other)
    os.replace(other, shard)
    os.utime(shard, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    model_source.local_manifest(src)
    assert calls == [str(shard)]


def _hf_snapshot(root: Path) -> tuple[Path, Path]:
    """A Hugging Face cache repo as huggingface_hub lays it out: (snapshot dir, blobs dir)."""
    repo = root / "hub" / "models--org--tiny"
    blobs, src = repo / "blobs", repo / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    (src / "tokenizer").mkdir(parents=True)
    (blobs / "abc").write_bytes(b"weights")
    (blobs / "def").write_text('{"architectures": ["X"]}\n')
    (blobs / "123").write_text("{}\n")
    (src / "model.safetensors").symlink_to("../../blobs/abc")
    (src / "config.json").symlink_to("../../blobs/def")
    (src / "tokenizer" / "tokenizer.json").symlink_to("../../../blobs/123")
    return src, blobs


def test_symlinks_are_followed_and_bad_ones_refused_clearly(tmp_path):
    src, blobs = _hf_snapshot(tmp_path)
    manifest = model_source.local_manifest(src)
    entry = manifest.files["model.safetensors"]
    assert entry.size == 7 and entry.source == str(blobs / "abc")

    (src / "gone.bin").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ModelSyncError, match=r"gone.bin is a symlink to .*nowhere, which does not exist; fix"):
        model_source.local_manifest(src)
    (src / "gone.bin").unlink()
    (src / "sub").mkdir()
    (src / "sub" / "up").symlink_to(src)
    with pytest.raises(ModelSyncError, match=r"sub/up is a symlink to .*one of its own parent directories"):
        model_source.local_manifest(src)
    (src / "sub" / "up").unlink()
    os.mkfifo(src / "pipe")
    with pytest.raises(ModelSyncError, match="pipe is not a regular file or directory"):
        model_source.local_manifest(src)
    (src / "pipe").unlink()
    (src / f"x{PARTIAL_SUFFIX}").write_text("")
    with pytest.raises(ModelSyncError, match="marks an unfinished upload"):
        model_source.local_manifest(src)
    with pytest.raises(ModelSyncError, match="is not a directory on this workstation"):
        model_source.local_manifest(tmp_path / "missing")


def test_a_link_out_of_model_source_is_refused_naming_it_and_its_target(tmp_path):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    src = home / "models" / "m"
    src.mkdir(parents=True)
    (src / "config.json").write_text("{}\n")
    (src / "tokenizer.json").symlink_to("../../.ssh/id_ed25519")
    with pytest.raises(ModelSyncError) as refused:
        model_source.local_manifest(src)
    text = str(refused.value)
    assert text.startswith(f"model_source {src}: tokenizer.json is a symlink to ../../.ssh/id_ed25519 "
                           f"({home / '.ssh' / 'id_ed25519'}), outside model_source: ")
    assert "fix: put a copy of the file the model needs in place of the link, or remove the link" in text
    (src / "tokenizer.json").unlink()
    # A directory link leading out is refused the same way, before anything below it is read.
    (src / "extra").symlink_to(home / ".ssh")
    with pytest.raises(ModelSyncError, match=rf"extra is a symlink to {home / '.ssh'}, outside model_source: "):
        model_source.local_manifest(src)
    (src / "extra").unlink()
    # A link to a sibling of model_source ("../x") leads out as well.
    (home / "models" / "other.bin").write_bytes(b"x")
    (src / "weights.bin").symlink_to("../other.bin")
    with pytest.raises(ModelSyncError, match=r"weights.bin is a symlink to \.\./other.bin \(.*other.bin\), outside"):
        model_source.local_manifest(src)


def test_links_that_stay_inside_model_source_are_followed(tmp_path):
    src = tmp_path / "m"
    (src / "sub").mkdir(parents=True)
    (src / "config.json").write_text('{"a": 1}\n')
    (src / "alias.json").symlink_to("config.json")
    (src / "sub" / "config.json").symlink_to("../config.json")
    (src / "tok").symlink_to("sub")
    manifest = model_source.local_manifest(src)
    assert sorted(manifest.files) == ["alias.json", "config.json", "sub/config.json", "tok/config.json"]
    assert manifest.files["alias.json"].source == str((src / "config.json").resolve())
    assert manifest.files["tok/config.json"].sha256 == manifest.files["config.json"].sha256


def test_a_hugging_face_snapshot_may_link_into_its_own_blobs_only(tmp_path):
    src, blobs = _hf_snapshot(tmp_path)
    manifest = model_source.local_manifest(src)
    assert sorted(manifest.files) == ["config.json", "model.safetensors", "tokenizer/tokenizer.json"]
    assert manifest.files["tokenizer/tokenizer.json"].source == str((blobs / "123").resolve())
    # Another repository's blobs are outside: refused, saying what is allowed.
    other = tmp_path / "hub" / "models--org--other" / "blobs"
    other.mkdir(parents=True)
    (other / "zzz").write_text("x")
    (src / "extra.bin").symlink_to("../../../models--org--other/blobs/zzz")
    with pytest.raises(ModelSyncError, match=r"extra.bin is a symlink to \.\./\.\./\.\./models--org--other/blobs/zzz "
                                             r"\(.*\), outside model_source and its Hugging Face repository's blobs/"):
        model_source.local_manifest(src)
    (src / "extra.bin").unlink()
    # The same links from a directory that is not a snapshot (its parent is not `snapshots`): refused.
    plain = blobs.parent / "checkout"
    plain.mkdir()
    (plain / "config.json").symlink_to("../blobs/def")
    with pytest.raises(ModelSyncError, match=r"config.json is a symlink to \.\./blobs/def \(.*\), outside model_source: "):
        model_source.local_manifest(plain)


# --- Progress ------------------------------------------------------------------------------------------

def test_progress_is_logged_while_a_file_is_read_in_chunks(monkeypatch, tmp_path):
    big = tmp_path / "shard.bin"
    big.write_bytes(b"x" * 100_000)
    lines: list[str] = []
    monkeypatch.setattr(ms, "PROGRESS_EVERY_S", 0.0)
    transfer = ms.Transfer("[gpu9] ", "/srv/m", 1, 100_000)
    transfer.log = lines.append
    reader = ms.ProgressReader(str(big), "shard.bin", 100_000, transfer)
    reader.seek(0)
    got = b""
    while block := reader.read(32768):  # how paramiko's putfo reads
        got += block
    assert got == big.read_bytes() and reader.read(32768) == b""
    assert lines[0] == "[gpu9] model sync /srv/m: sending shard.bin (97.7 KiB), file 1 of 1"
    assert any("shard.bin: 32.0 KiB of 97.7 KiB (33%)" in line and "MB/s" in line for line in lines)
    assert "sent shard.bin (97.7 KiB)" in lines[-1] and "total 1/1 files, 97.7 KiB of 97.7 KiB" in lines[-1]
    reader.seek(0)  # a retry starts over (pyinfra's _put_file retries a failed upload)
    assert reader.read() == got
