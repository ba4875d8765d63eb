"""Model sync (vllm_fleet/host/model_sync.py): the workstation manifest and its cache, the decisions the
operation takes from its facts, and the generated commands RUN for real in a tmp dir (an upload is
simulated by copying the bytes the operation would send to the path it names), down to a real
pyinfra run against @local that counts the remote commands of a no-op run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand

from vllm_fleet.host import model_sync as ms
from vllm_fleet.host.model_sync import MANIFEST_NAME, PARTIAL_SUFFIX, ModelSyncError


_REAL_SHA256 = ms.sha256_file


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_FLEET_CACHE", str(tmp_path / "cache"))
    ms._HOST_HASHES.clear()


def _model(root: Path) -> Path:
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


def _count_hashes(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = _REAL_SHA256

    def counting(path):
        calls.append(path)
        return real(path)

    monkeypatch.setattr(ms, "sha256_file", counting)
    return calls


# --- The workstation manifest -----------------------------------------------------------------------

def test_manifest_lists_files_skips_hidden_and_second_call_reads_no_content(tmp_path, monkeypatch):
    src = _model(tmp_path)
    calls = _count_hashes(monkeypatch)
    first = ms.local_manifest(src)
    assert sorted(first.files) == ["config.json", "model-00001-of-00002.safetensors",
                                   "model-00002-of-00002.safetensors", "tokenizer/tokenizer.json"]
    assert first.dirs == ["empty", "tokenizer"]
    assert len(calls) == 4 and first.hashed_files == 4
    import hashlib
    shard = src / "model-00001-of-00002.safetensors"
    assert first.files[shard.name].sha256 == hashlib.sha256(shard.read_bytes()).hexdigest()
    assert ms.cache_file(src).is_file() and ms.cache_file(src).parent == tmp_path / "cache" / "model-manifests"

    # Second pass: no file is opened at all (hashing would raise; plain open() is watched too).
    def no_reads(path):
        raise AssertionError(f"read {path}")

    monkeypatch.setattr(ms, "sha256_file", no_reads)
    real_open = open
    opened: list[str] = []

    def watching_open(file, *a, **k):
        if str(file).startswith(str(src)):
            opened.append(str(file))
        return real_open(file, *a, **k)

    monkeypatch.setattr("builtins.open", watching_open)
    second = ms.local_manifest(src)
    monkeypatch.setattr("builtins.open", real_open)
    assert opened == [] and second.hashed_files == 0
    assert second.files == first.files

    # Same size, new content and mtime: only that file is read again.
    calls = _count_hashes(monkeypatch)
    shard.write_bytes(os.urandom(300_000))
    os.utime(shard, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    third = ms.local_manifest(src)
    assert calls == [str(shard)]
    assert third.files[shard.name].sha256 != first.files[shard.name].sha256
    # Replaced by another file (new inode) with the same size and mtime: read again too.
    calls.clear()
    other = tmp_path / "other"
    shutil.copy2(shard, other)
    os.replace(other, shard)
    os.utime(shard, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    ms.local_manifest(src)
    assert calls == [str(shard)]


def test_symlinks_are_followed_and_bad_ones_refused_clearly(tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    (blobs / "abc").write_bytes(b"weights")
    src = tmp_path / "snapshot"
    src.mkdir()
    (src / "model.safetensors").symlink_to(blobs / "abc")  # how a Hugging Face snapshot looks
    manifest = ms.local_manifest(src)
    entry = manifest.files["model.safetensors"]
    assert entry.size == 7 and entry.source == str(blobs / "abc")

    (src / "gone.bin").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ModelSyncError, match=r"gone.bin is a symlink to .*nowhere, which does not exist; fix"):
        ms.local_manifest(src)
    (src / "gone.bin").unlink()
    (src / "sub").mkdir()
    (src / "sub" / "up").symlink_to(src)
    with pytest.raises(ModelSyncError, match=r"sub/up is a symlink to .*one of its own parent directories"):
        ms.local_manifest(src)
    (src / "sub" / "up").unlink()
    os.mkfifo(src / "pipe")
    with pytest.raises(ModelSyncError, match="pipe is not a regular file or directory"):
        ms.local_manifest(src)
    (src / "pipe").unlink()
    (src / f"x{PARTIAL_SUFFIX}").write_text("")
    with pytest.raises(ModelSyncError, match="marks an unfinished upload"):
        ms.local_manifest(src)
    with pytest.raises(ModelSyncError, match="is not a directory on this workstation"):
        ms.local_manifest(tmp_path / "missing")


# --- Decisions from fact dicts ----------------------------------------------------------------------

class _Host:
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


def _synced_state(local: ms.LocalManifest) -> dict:
    """The fact as it reads after a complete sync of `local`."""
    files = {rel: {"size": f.size, "mtime": f"{f.host_mtime}0", "mode": 0o644}
             for rel, f in local.files.items()}
    manifest = {rel: {"size": f.size, "sha256": f.sha256, "mtime": f.host_mtime}
                for rel, f in local.files.items()}
    return {"exists": True, "dir_mode": 0o755, "manifest": manifest, "files": files,
            "dirs": {d: {"mode": 0o755} for d in local.dirs}, "other": [], "listing_ok": True}


def _op(monkeypatch, facts, **kwargs):
    fake = _Host(facts)
    monkeypatch.setattr(ms, "host", fake)
    return list(ms.model_sync._inner(**kwargs)), fake


def _uploads(cmds):
    return [c.dest for c in cmds if isinstance(c, FileUploadCommand)]


def test_unchanged_model_yields_nothing_and_one_fact(monkeypatch, tmp_path):
    src = _model(tmp_path)
    state = _synced_state(ms.local_manifest(src))
    cmds, fake = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert cmds == [] and fake.fact_calls == ["ModelSyncState"]
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file() and ".cache" not in p.parts
               and not p.name.startswith("."))
    assert fake.noops == [f"model /srv/m is up to date (4 files, {size / 1024:.1f} KiB; manifest and "
                          "sizes/mtimes match)"]


def test_each_difference_gets_exactly_its_fix(monkeypatch, tmp_path):
    src = _model(tmp_path)
    local = ms.local_manifest(src)
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"

    # One file changed on the workstation, same size (new sha and mtime): only it is sent.
    state = _synced_state(local)
    (src / shard1).write_bytes(os.urandom(300_000))
    cmds, _ = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert _uploads(cmds) == [f"/srv/m/{shard1}{PARTIAL_SUFFIX}", f"/srv/m/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    assert not any(isinstance(c, str) and c.startswith("rm -rf") for c in cmds)
    local = ms.local_manifest(src)

    # Truncated on the host: re-sent, without asking the host for a hash.
    state = _synced_state(local)
    state["files"][shard2] = {**state["files"][shard2], "size": 1000, "mtime": "1800000000.5"}
    plan = ms.plan_sync(local, state, "/srv/m")
    assert plan.send == {shard2: "truncated on the host (1000 of 200000 bytes)"} and not plan.to_hash
    cmds, fake = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert _uploads(cmds)[0] == f"/srv/m/{shard2}{PARTIAL_SUFFIX}" and len(_uploads(cmds)) == 2
    assert fake.fact_calls == ["ModelSyncState"]

    # Missing on the host; an extra host file and directory; a leftover partial upload.
    state = _synced_state(local)
    del state["files"]["config.json"]
    state["files"]["old-shard.bin"] = {"size": 5, "mtime": "1.0", "mode": 0o644}
    state["files"]["stale/x.bin"] = {"size": 5, "mtime": "1.0", "mode": 0o644}
    state["dirs"]["stale"] = {"mode": 0o755}
    state["files"][f"{shard1}{PARTIAL_SUFFIX}"] = {"size": 300_000, "mtime": "1.0", "mode": 0o600}
    plan = ms.plan_sync(local, state, "/srv/m")
    assert plan.send == {"config.json": "missing on the host"}
    assert plan.delete == ["model-00001-of-00002.safetensors.vllm-fleet-partial", "old-shard.bin", "stale"]
    cmds, _ = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert cmds[0] == ("rm -rf -- /srv/m/model-00001-of-00002.safetensors.vllm-fleet-partial "
                       "/srv/m/old-shard.bin /srv/m/stale")
    # delete=False keeps extras, but our leftover partial goes anyway.
    assert ms.plan_sync(local, state, "/srv/m", delete=False).delete == [f"{shard1}{PARTIAL_SUFFIX}"]

    # A new file on the workstation: sent, and the manifest grows by it.
    (src / "generation_config.json").write_text("{}\n")
    local2 = ms.local_manifest(src)
    plan = ms.plan_sync(local2, _synced_state(local), "/srv/m")
    assert plan.send == {"generation_config.json": "new"} and plan.write_manifest
    assert sorted(plan.manifest) == sorted(local2.files)

    # A wrong mode is fixed in place, not by sending the file again.
    state = _synced_state(local)
    state["files"]["config.json"]["mode"] = 0o600
    state["dirs"]["tokenizer"]["mode"] = 0o700
    plan = ms.plan_sync(local, state, "/srv/m")
    assert not plan.send and plan.chmod_files == ["/srv/m/config.json"]
    assert plan.chmod_dirs == ["/srv/m/tokenizer"] and not plan.write_manifest


def test_right_size_but_not_vouched_for_is_hashed_on_the_host_once(monkeypatch, tmp_path):
    src = _model(tmp_path)
    local = ms.local_manifest(src)
    shard1 = "model-00001-of-00002.safetensors"
    good = {rel: f.sha256 for rel, f in local.files.items()}

    # No host manifest (the first run after files.sync): adopt what matches, send what does not.
    state = _synced_state(local)
    state["manifest"] = None
    hashes = dict(good, **{shard1: "0" * 64})
    cmds, fake = _op(monkeypatch, {"ModelSyncState": state, "ModelSyncHashes": lambda dest, paths: {
        p: hashes[p] for p in paths}}, src=str(src), dest="/srv/m")
    assert fake.fact_calls == ["ModelSyncState", "ModelSyncHashes"]
    assert _uploads(cmds) == [f"/srv/m/{shard1}{PARTIAL_SUFFIX}", f"/srv/m/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    written = json.loads(cmds[-2].src.getvalue())["files"]
    assert written["config.json"]["mtime"] == state["files"]["config.json"]["mtime"]  # as found on the host

    # Touched on the host (same size, another mtime): hashed there; same content -> adopted, only
    # the manifest is rewritten; other content -> sent again.
    for host_sha, sent in ((good[shard1], []), ("f" * 64, [f"/srv/m/{shard1}{PARTIAL_SUFFIX}"])):
        ms._HOST_HASHES.clear()
        state = _synced_state(local)
        state["files"][shard1]["mtime"] = "1800000000.123"
        cmds, fake = _op(monkeypatch, {"ModelSyncState": state, "ModelSyncHashes": {shard1: host_sha}},
                         src=str(src), dest="/srv/m")
        assert _uploads(cmds) == sent + [f"/srv/m/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    # The hashes are kept by (size, mtime): the execution pass does not read the file again.
    cmds, fake = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert fake.fact_calls == ["ModelSyncState"] and len(_uploads(cmds)) == 2


def test_no_host_state_fails_the_host_not_the_run(monkeypatch, tmp_path):
    src = _model(tmp_path)
    cmds, _ = _op(monkeypatch, {"ModelSyncState": None}, src=str(src), dest="/srv/m")
    assert len(cmds) == 1 and "host gpu9: could not read the state of /srv/m" in cmds[0] and "exit 1" in cmds[0]


# --- The commands, run for real ---------------------------------------------------------------------

def _sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def _real_facts(dest: Path):
    def state(dest):
        done = _sh(ms.state_command(dest))
        assert done.returncode == 0, done.stderr
        return ms.parse_state(done.stdout.splitlines())

    def hashes(dest, paths):
        done = _sh(ms.hashes_command(dest, list(paths)))
        assert done.returncode == 0, done.stderr
        return ms.ModelSyncHashes().process(done.stdout.splitlines())

    return {"ModelSyncState": state, "ModelSyncHashes": hashes}


def _upload(cmd: FileUploadCommand, limit: int | None = None) -> None:
    """What pyinfra's connector does with a FileUploadCommand: seek(0), read, write to cmd.dest
    (which must already exist: the prepare command made it). `limit`: stop early, as a dropped
    connection would."""
    assert os.path.exists(cmd.dest), "the partial file is prepared before the upload"
    cmd.src.seek(0)
    with open(cmd.dest, "wb") as out:
        sent = 0
        while block := cmd.src.read(65536 if limit is None else min(65536, limit - sent)):
            out.write(block)
            sent += len(block)
            if limit is not None and sent >= limit:
                break


def _apply(cmds, interrupt_after_upload: str | None = None, short: str | None = None) -> list[str]:
    """Run the commands in order; returns the stderr of a failing command (and stops there)."""
    for cmd in cmds:
        if isinstance(cmd, FileUploadCommand):
            if short and cmd.dest.endswith(short + PARTIAL_SUFFIX):
                _upload(cmd, limit=1000)
            else:
                _upload(cmd)
            if interrupt_after_upload and cmd.dest.endswith(interrupt_after_upload + PARTIAL_SUFFIX):
                return ["interrupted"]
            continue
        done = _sh(cmd)
        if done.returncode != 0:
            return [done.stderr]
    return []


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)}


def test_commands_really_sync_verify_rename_and_write_the_manifest(monkeypatch, tmp_path):
    src = _model(tmp_path)
    dest = tmp_path / "host" / "models" / "m"
    facts = _real_facts(dest)
    logged: list[str] = []
    monkeypatch.setattr(ms, "logger", type("L", (), {"info": logged.append, "debug": logged.append,
                                                     "warning": logged.append})())
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds) == []
    assert _tree(dest) == _tree(src) and (dest / "empty").is_dir()
    assert not (dest / ".gitattributes").exists() and not list(dest.rglob(f"*{PARTIAL_SUFFIX}"))
    assert oct((dest / "config.json").stat().st_mode & 0o777) == "0o644"
    assert oct((dest / "tokenizer").stat().st_mode & 0o777) == "0o755"
    manifest = json.loads((dest / MANIFEST_NAME).read_text())
    assert oct((dest / MANIFEST_NAME).stat().st_mode & 0o777) == "0o644"
    local = ms.local_manifest(src)
    for rel, f in local.files.items():
        assert manifest["files"][rel] == {"size": f.size, "sha256": f.sha256, "mtime": f.host_mtime}
        assert (dest / rel).stat().st_mtime_ns == f.mtime_ns
    # Progress: per file and totals, with rates.
    sent = [line for line in logged if "sent model-" in line]
    assert len(sent) == 2 and all("MB/s" in line and "total " in line for line in sent)
    total = f"{local.total_bytes / 1024:.1f} KiB"
    assert any(f"total 4/4 files, {total} of {total}" in line for line in logged), logged

    # Again: nothing to do.
    cmds, fake = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds == [] and fake.noops and fake.fact_calls == ["ModelSyncState"]

    # Host damage: one file truncated, one touched (same content), one rewritten (same size), an
    # extra file, a stray partial. Only the truncated and rewritten ones travel.
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    with open(dest / shard2, "r+b") as f:
        f.truncate(1234)
    os.utime(dest / "config.json", (1_800_000_000, 1_800_000_000))
    (dest / "tokenizer" / "tokenizer.json").write_text('{"v": 2}\n')
    (dest / "extra.bin").write_text("x")
    (dest / f"config.json{PARTIAL_SUFFIX}").write_text("half")
    cmds, fake = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert sorted(_uploads(cmds)) == sorted(f"{dest}/{r}{PARTIAL_SUFFIX}" for r in
                                            (shard2, "tokenizer/tokenizer.json", MANIFEST_NAME))
    assert _apply(cmds) == []
    assert _tree(dest) == _tree(src)
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds == []

    # One file changed on the workstation, same size: only it is sent (and the manifest).
    (src / shard1).write_bytes(os.urandom(300_000))
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _uploads(cmds) == [f"{dest}/{shard1}{PARTIAL_SUFFIX}", f"{dest}/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    assert _apply(cmds) == [] and _tree(dest) == _tree(src)


def test_an_interrupted_or_short_transfer_never_becomes_the_real_file(monkeypatch, tmp_path):
    src = _model(tmp_path)
    dest = tmp_path / "host" / "m"
    facts = _real_facts(dest)
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds) == []
    before = _tree(dest)
    shard1 = "model-00001-of-00002.safetensors"
    (src / shard1).write_bytes(os.urandom(300_000))

    # Short: the connection dropped after 1000 bytes, yet the verify step ran.
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    errors = _apply(cmds, short=shard1)
    assert len(errors) == 1 and f"{dest}/{shard1}: the upload is incomplete (1000 of 300000 bytes arrived)" \
        in errors[0]
    assert _tree(dest) == before and not list(dest.rglob(f"*{PARTIAL_SUFFIX}"))

    # Interrupted right after the upload (the deploy was killed): a complete-looking partial is left.
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds, interrupt_after_upload=shard1) == ["interrupted"]
    assert (dest / f"{shard1}{PARTIAL_SUFFIX}").read_bytes() == (src / shard1).read_bytes()
    assert _tree(dest)[shard1] == before[shard1]  # the real file is still the old one
    # The next run does not take the partial as the file: it deletes it and sends the file.
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds[0] == f"rm -rf -- {dest}/{shard1}{PARTIAL_SUFFIX}"
    assert _uploads(cmds)[0] == f"{dest}/{shard1}{PARTIAL_SUFFIX}"
    assert _apply(cmds) == [] and _tree(dest) == _tree(src)

    # Content that changed during the upload (or was corrupted): the sha256 check refuses it.
    (src / shard1).write_bytes(os.urandom(300_000))
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    (src / shard1).write_bytes(os.urandom(300_000))  # changed again while "uploading"
    errors = _apply(cmds)
    assert len(errors) == 1 and "sha256 is" in errors[0] and "the partial file was removed" in errors[0]
    assert not list(dest.rglob(f"*{PARTIAL_SUFFIX}"))


def test_interrupted_after_renames_but_before_the_manifest_resends_nothing(monkeypatch, tmp_path):
    src = _model(tmp_path)
    dest = tmp_path / "host" / "m"
    facts = _real_facts(dest)
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds) == []
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (src / name).write_bytes(os.urandom(len((src / name).read_bytes())))
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds, interrupt_after_upload=MANIFEST_NAME) == ["interrupted"]  # both renamed, old manifest
    cmds, fake = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert fake.fact_calls == ["ModelSyncState", "ModelSyncHashes"]
    assert _uploads(cmds) == [f"{dest}/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]  # hashed on the host, adopted
    assert _apply(cmds) == []
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds == []


def test_fact_output_parses_odd_names_and_hidden_entries(tmp_path):
    dest = tmp_path / "m"
    (dest / "sub dir").mkdir(parents=True)
    (dest / "sub dir" / "a b.bin").write_bytes(b"12345")
    (dest / ".hidden").mkdir()
    (dest / ".hidden" / "x").write_text("x")
    (dest / "link").symlink_to("sub dir")
    (dest / MANIFEST_NAME).write_text(ms.manifest_text({"sub dir/a b.bin": {"size": 5, "sha256": "a" * 64,
                                                                            "mtime": "17"}}))
    done = _sh(ms.state_command(str(dest)))
    state = ms.parse_state(done.stdout.splitlines())
    assert state["exists"] and state["listing_ok"] and state["dir_mode"] == (dest.stat().st_mode & 0o777)
    assert state["files"]["sub dir/a b.bin"]["size"] == 5 and "." in state["files"]["sub dir/a b.bin"]["mtime"]
    assert list(state["dirs"]) == ["sub dir"] and state["other"] == ["link"]
    assert state["manifest"] == {"sub dir/a b.bin": {"size": 5, "sha256": "a" * 64, "mtime": "17"}}
    absent = ms.parse_state(_sh(ms.state_command(str(tmp_path / "none"))).stdout.splitlines())
    assert absent["exists"] is False and absent["files"] == {}


# --- A real pyinfra run (@local): a no-op run is one remote command --------------------------------

def test_pyinfra_run_against_local_noop_is_one_remote_command(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(f"""
import json, sys
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.connectors.local import LocalConnector
from vllm_fleet.host.model_sync import model_sync

counts = {{"commands": 0, "uploads": 0}}
real_run, real_put = LocalConnector.run_shell_command, LocalConnector.put_file
def run(self, *a, **k):
    counts["commands"] += 1
    return real_run(self, *a, **k)
def put(self, *a, **k):
    counts["uploads"] += 1
    return real_put(self, *a, **k)
LocalConnector.run_shell_command, LocalConnector.put_file = run, put

state = State(Inventory((["@local"], {{}})), Config())
connect_all(state)
add_op(state, model_sync, src=sys.argv[1], dest=sys.argv[2])
run_ops(state)
ok = not state.failed_hosts
print(json.dumps(dict(counts, ok=ok)))
""")
    src = _model(tmp_path)
    dest = tmp_path / "host" / "m"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))

    def run():
        done = subprocess.run([sys.executable, str(script), str(src), str(dest)], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert first["ok"] and first["uploads"] == 5  # 4 files and the manifest
    assert _tree(dest) == _tree(src)
    again = run()
    assert again == {"commands": 1, "uploads": 0, "ok": True}
    (src / "config.json").write_text('{"architectures": ["Y"]}\n')
    changed = run()
    assert changed["ok"] and changed["uploads"] == 2 and _tree(dest) == _tree(src)


# --- Progress and the sudo path's ownership handover ------------------------------------------------

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


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root and runuser")
def test_the_login_user_writes_the_partial_file_in_a_root_directory_and_root_owns_the_result(tmp_path):
    """The sudo path: root's commands prepare the partial file for the login user (here: nobody),
    who writes it (as SFTP would) in a directory it cannot write; the verify step makes it root's."""
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="vf-model-sync-"))  # pytest's tmp dirs are root's 0700
    try:
        _handover(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _handover(base: Path) -> None:
    dest = base / "m"
    dest.mkdir()
    os.chmod(base, 0o755)
    os.chmod(dest, 0o755)
    data = b"weights" * 1000
    import hashlib
    partial, final = f"{dest}/w.bin{PARTIAL_SUFFIX}", f"{dest}/w.bin"
    assert _sh(ms.prepare_partial_command(partial, "nobody")).returncode == 0
    write = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", f"cat > {partial}"], input=data)
    assert write.returncode == 0
    assert subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", f"touch {dest}/other"]).returncode != 0
    done = _sh(ms.finalize_command(partial, final, len(data), hashlib.sha256(data).hexdigest(), "0644",
                                   "1700000000.000000001", "host gpu9: w.bin"))
    assert done.returncode == 0, done.stderr
    st = os.stat(final)
    assert (st.st_uid, st.st_mode & 0o777, st.st_mtime_ns) == (0, 0o644, 1_700_000_000_000_000_001)
    assert Path(final).read_bytes() == data and not os.path.exists(partial)
