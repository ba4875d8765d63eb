"""Model sync (vllm_fleet/model_source.py, rules/model_sync.py, facts/model_sync.py,
operations/model_sync.py): the workstation manifest and its cache, the decisions the operation takes
from its facts (the commands it yields for each state of the host are the cases in
model_sync.model_sync/), and the generated commands RUN for real in a tmp dir (an upload is simulated
by copying the bytes the operation would send to the path it names), down to a real pyinfra run
against @local that counts the remote commands of a no-op run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand

from vllm_fleet import model_source
from vllm_fleet.rules import model_sync as model_sync_rules
from vllm_fleet.operations import model_sync as ms
from vllm_fleet.model_source import PARTIAL_SUFFIX, ModelSyncError
from vllm_fleet.rules.model_sync import MANIFEST_NAME


_REAL_SHA256 = model_source.sha256_file


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

    monkeypatch.setattr(model_source, "sha256_file", counting)
    return calls


# --- The workstation manifest -----------------------------------------------------------------------

def test_manifest_lists_files_skips_hidden_and_second_call_reads_no_content(tmp_path, monkeypatch):
    src = _model(tmp_path)
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


def _synced_state(local: model_source.LocalManifest) -> dict:
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


def test_each_difference_gets_exactly_its_fix(monkeypatch, tmp_path):
    src = _model(tmp_path)
    local = model_source.local_manifest(src)
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"

    # One file changed on the workstation, same size (new sha and mtime): only it is sent.
    state = _synced_state(local)
    (src / shard1).write_bytes(os.urandom(300_000))
    cmds, _ = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert _uploads(cmds) == [f"/srv/m/{shard1}{PARTIAL_SUFFIX}", f"/srv/m/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    assert not any(isinstance(c, str) and c.startswith("rm -rf") for c in cmds)
    local = model_source.local_manifest(src)

    # Truncated on the host: re-sent, without asking the host for a hash.
    state = _synced_state(local)
    state["files"][shard2] = {**state["files"][shard2], "size": 1000, "mtime": "1800000000.5"}
    plan = model_sync_rules.plan_sync(local, state, "/srv/m")
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
    plan = model_sync_rules.plan_sync(local, state, "/srv/m")
    assert plan.send == {"config.json": "missing on the host"}
    assert plan.delete == ["model-00001-of-00002.safetensors.vllm-fleet-partial", "old-shard.bin", "stale"]
    cmds, _ = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert cmds[0] == ("rm -rf -- /srv/m/model-00001-of-00002.safetensors.vllm-fleet-partial "
                       "/srv/m/old-shard.bin /srv/m/stale")
    # delete=False keeps extras, but our leftover partial goes anyway.
    assert model_sync_rules.plan_sync(local, state, "/srv/m", delete=False).delete == [f"{shard1}{PARTIAL_SUFFIX}"]

    # A new file on the workstation: sent, and the manifest grows by it.
    (src / "generation_config.json").write_text("{}\n")
    local2 = model_source.local_manifest(src)
    plan = model_sync_rules.plan_sync(local2, _synced_state(local), "/srv/m")
    assert plan.send == {"generation_config.json": "new"} and plan.write_manifest
    assert sorted(plan.manifest) == sorted(local2.files)

    # A wrong mode is fixed in place, not by sending the file again.
    state = _synced_state(local)
    state["files"]["config.json"]["mode"] = 0o600
    state["dirs"]["tokenizer"]["mode"] = 0o700
    plan = model_sync_rules.plan_sync(local, state, "/srv/m")
    assert not plan.send and plan.chmod_files == ["/srv/m/config.json"]
    assert plan.chmod_dirs == ["/srv/m/tokenizer"] and not plan.write_manifest


def test_right_size_but_not_vouched_for_is_hashed_on_the_host_once(monkeypatch, tmp_path):
    src = _model(tmp_path)
    local = model_source.local_manifest(src)
    shard1 = "model-00001-of-00002.safetensors"
    good = {rel: f.sha256 for rel, f in local.files.items()}

    # A first sync cut short after some renames: the claim's manifest vouches for no file. Adopt
    # what matches, send what does not.
    state = _synced_state(local)
    state["manifest"] = {}
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


def _foreign_state(files=(), dirs=(), other=(), hidden=(), listing_ok=True) -> dict:
    """The fact for an existing directory without vllm-fleet's manifest (its top-level entries)."""
    return {"exists": True, "dir_mode": 0o755, "manifest": None, "manifest_found": False,
            "files": {rel: {"size": 10, "mtime": "1.0", "mode": 0o644} for rel in files},
            "dirs": {rel: {"mode": 0o755} for rel in dirs}, "other": list(other), "hidden": list(hidden),
            "listing_ok": listing_ok}


_ETC_FILES = [f"file{i:03d}.conf" for i in range(90)] + ["passwd", "shadow", "hosts", "group", "fstab"]
_ETC_DIRS = ["apt", "cron.d", "ssh", "systemd", "sudoers.d", "default"]


def test_an_etc_like_directory_is_refused_before_anything_is_sent_or_removed(monkeypatch, tmp_path):
    src = _model(tmp_path)
    local = model_source.local_manifest(src)
    state = _foreign_state(files=_ETC_FILES, dirs=_ETC_DIRS, other=["localtime"], hidden=[".pwd.lock"])
    problem = model_sync_rules.ownership_problem(state, "/etc/")
    assert problem == ("/etc holds 103 entries vllm-fleet did not put there (it has no .vllm-fleet-manifest.json), "
                       "e.g. .pwd.lock, apt, cron.d, default, file000.conf, ...")
    with pytest.raises(ModelSyncError) as refused:
        model_sync_rules.plan_sync(local, state, "/etc")
    assert str(refused.value) == problem
    # The operation: one failing command that names the host and the directory; no upload, no rm.
    cmds, fake = _op(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/etc")
    assert len(cmds) == 1 and isinstance(cmds[0], str) and cmds[0].endswith(" >&2; exit 1")
    said = _sh(cmds[0]).stderr
    assert said.startswith(f"host gpu9: model sync {src} -> /etc: /etc holds 103 entries vllm-fleet did not put "
                           "there (it has no .vllm-fleet-manifest.json), e.g. ")
    assert ("nothing was sent or removed; fix: set 'model' to an empty or new directory, e.g. a directory of its "
            "own under vllm_models_dir; or, if /etc is meant for this model alone, remove its contents yourself") in said
    assert fake.fact_calls == ["ModelSyncState"]  # not even a hash is asked for


def test_a_directory_of_other_models_is_refused_naming_them(tmp_path):
    local = model_source.local_manifest(_model(tmp_path))
    # As a fact lists it (full listing, e.g. from a fabricated or older state): named by top-level entry.
    state = _foreign_state(files=["gemma-3-12b/config.json", "llama-3-8b/config.json", "README"],
                           dirs=["gemma-3-12b", "llama-3-8b"])
    with pytest.raises(ModelSyncError, match=r"^/data/models holds 3 entries vllm-fleet did not put there \(it has "
                                             r"no \.vllm-fleet-manifest\.json\), e\.g\. README, gemma-3-12b, "
                                             r"llama-3-8b$"):
        model_sync_rules.plan_sync(local, state, "/data/models")


def test_a_directory_with_only_dotfiles_or_an_unreadable_listing_is_refused(tmp_path):
    local = model_source.local_manifest(_model(tmp_path))
    with pytest.raises(ModelSyncError, match=r"^/home/u holds 2 entries .* e\.g\. \.bashrc, \.ssh$"):
        model_sync_rules.plan_sync(local, _foreign_state(hidden=[".bashrc", ".ssh"]), "/home/u")
    with pytest.raises(ModelSyncError, match=r"^/srv/m has no \.vllm-fleet-manifest\.json and could not be listed"):
        model_sync_rules.plan_sync(local, _foreign_state(listing_ok=False), "/srv/m")
    # One entry: singular.
    assert model_sync_rules.ownership_problem(_foreign_state(dirs=["lost+found"]), "/mnt/new").startswith(
        "/mnt/new holds 1 entry vllm-fleet did not put there")


def test_a_new_or_empty_directory_or_one_with_our_manifest_is_synced(tmp_path):
    local = model_source.local_manifest(_model(tmp_path))
    absent = {"exists": False, "dir_mode": None, "manifest": None, "manifest_found": False, "files": {}, "dirs": {},
              "other": [], "hidden": [], "listing_ok": False}
    for state in (absent, _foreign_state()):
        assert model_sync_rules.ownership_problem(state, "/srv/m") is None
        plan = model_sync_rules.plan_sync(local, state, "/srv/m")
        assert plan.claim and sorted(plan.send) == sorted(local.files) and plan.delete == []
        cmds = list(ms.sync_commands(local, plan, "/srv/m", "0644", "0755", None, "gpu9"))
        assert cmds[0] == ms.claim_command("/srv/m", "0755")  # marked ours before anything else
    # Ours: a manifest, even one that vouches for no file (a claim) or that cannot be parsed.
    synced = _synced_state(local)
    ours = [synced, dict(synced, manifest={}), dict(synced, manifest=None, manifest_found=True)]
    for state in ours:
        assert model_sync_rules.ownership_problem(state, "/srv/m") is None
        assert not model_sync_rules.plan_sync(local, state, "/srv/m", host_hashes={}).claim
    # Nothing but partial uploads (only vllm-fleet names files so): ours, and they are removed.
    partials = _foreign_state(files=[f"config.json{PARTIAL_SUFFIX}"], hidden=[f"{MANIFEST_NAME}{PARTIAL_SUFFIX}"])
    plan = model_sync_rules.plan_sync(local, partials, "/srv/m")
    assert plan.claim and plan.delete == [f"config.json{PARTIAL_SUFFIX}"]


def test_the_fact_without_a_manifest_lists_top_level_entries_dotfiles_too_and_follows_a_linked_dest(tmp_path):
    foreign = tmp_path / "etc"
    (foreign / "apt" / "sources.list.d").mkdir(parents=True)
    (foreign / "apt" / "sources.list.d" / "x.list").write_text("deb x\n")
    for name in ("passwd", "shadow", ".pwd.lock"):
        (foreign / name).write_text(name)
    (foreign / "localtime").symlink_to("/usr/share/zoneinfo/UTC")
    link = tmp_path / "models" / "m"
    link.parent.mkdir()
    link.symlink_to(foreign)  # `model` naming a link to a directory of others: what the sync would write into
    for dest in (foreign, link):
        state = model_sync_rules.parse_state(_sh(model_sync_rules.state_command(str(dest))).stdout.splitlines())
        assert state["exists"] and state["listing_ok"] and not state["manifest_found"]
        assert sorted(state["files"]) == ["passwd", "shadow"] and list(state["dirs"]) == ["apt"]  # not below
        assert state["other"] == ["localtime"] and state["hidden"] == [".pwd.lock"]
        assert model_sync_rules.ownership_problem(state, str(dest)) == (
            f"{dest} holds 5 entries vllm-fleet did not put there (it has no {MANIFEST_NAME}), e.g. .pwd.lock, "
            "apt, localtime, passwd, shadow" if dest == foreign else
            f"{dest} is reached through a symlink (it resolves to {foreign}); the sync, which writes as root, "
            "follows none")
    # A link on the way to a dest that does not exist yet carries the first sync elsewhere too.
    state = model_sync_rules.parse_state(_sh(model_sync_rules.state_command(str(link / "new"))).stdout.splitlines())
    assert not state["exists"] and f"resolves to {foreign}/new" in model_sync_rules.ownership_problem(state, str(link / "new"))
    # An empty directory: nothing listed, ours to claim.
    (tmp_path / "empty").mkdir()
    state = model_sync_rules.parse_state(_sh(model_sync_rules.state_command(str(tmp_path / "empty"))).stdout.splitlines())
    assert state["exists"] and state["listing_ok"] and model_sync_rules.ownership_problem(state, str(tmp_path / "empty")) is None
    # An unreadable manifest is still ours (found), and then the whole tree is listed.
    (foreign / MANIFEST_NAME).write_text("not json")
    state = model_sync_rules.parse_state(_sh(model_sync_rules.state_command(str(foreign))).stdout.splitlines())
    assert state["manifest_found"] and state["manifest"] is None and "apt/sources.list.d/x.list" in state["files"]
    assert model_sync_rules.ownership_problem(state, str(foreign)) is None


# --- The commands, run for real ---------------------------------------------------------------------

def _sh(command: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True)


def _real_facts(dest: Path):
    def state(dest):
        done = _sh(model_sync_rules.state_command(dest))
        assert done.returncode == 0, done.stderr
        return model_sync_rules.parse_state(done.stdout.splitlines())

    def hashes(dest, paths):
        done = _sh(model_sync_rules.hashes_command(dest, list(paths)))
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
    local = model_source.local_manifest(src)
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


def _apply_until(cmds, stop_after: int) -> None:
    """Run the commands of a first sync as the host would, and stop (the deploy was killed) once
    `stop_after` files were renamed into place (0: right after the claim)."""
    renamed = 0
    for cmd in cmds:
        if renamed == stop_after:
            return
        if isinstance(cmd, FileUploadCommand):
            _upload(cmd)
            continue
        assert _sh(cmd).returncode == 0
        if " && mv -fT -- " in cmd:
            renamed += 1
    raise AssertionError("the sync ended before the interruption point")


@pytest.mark.parametrize("renamed", [1, 2, 3])
def test_a_first_sync_cut_short_is_taken_up_by_the_next_run(monkeypatch, tmp_path, renamed):
    """The claim (counted as the first rename) marks dest before any file: after it, with some
    files in place and no full manifest, the next run recognises the directory, adopts what
    arrived (hashed on the host) and sends the rest."""
    src = _model(tmp_path)
    dest = tmp_path / "host" / "m"
    facts = _real_facts(dest)
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    _apply_until(cmds, renamed)
    assert json.loads((dest / MANIFEST_NAME).read_text())["files"] == {}  # the claim only
    placed = sorted(rel for rel in _tree(dest))
    assert len(placed) == renamed - 1
    ms._HOST_HASHES.clear()
    cmds, fake = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    sent = sorted(u.removeprefix(f"{dest}/").removesuffix(PARTIAL_SUFFIX) for u in _uploads(cmds))
    assert sent == sorted((set(model_source.local_manifest(src).files) - set(placed)) | {MANIFEST_NAME})
    assert fake.fact_calls == (["ModelSyncState", "ModelSyncHashes"] if placed else ["ModelSyncState"])
    assert _apply(cmds) == [] and _tree(dest) == _tree(src)
    cmds, _ = _op(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds == []
    # Without the claim the same directory would be refused: the claim is what makes the rerun work.
    (dest / MANIFEST_NAME).unlink()
    with pytest.raises(ModelSyncError, match=rf"^{dest} holds \d+ entries vllm-fleet did not put there"):
        model_sync_rules.plan_sync(model_source.local_manifest(src), facts["ModelSyncState"](str(dest)), str(dest))


def test_a_directory_holding_files_of_others_is_left_exactly_as_it_was(monkeypatch, tmp_path):
    src = _model(tmp_path)
    dest = tmp_path / "host" / "etc"
    (dest / "ssh").mkdir(parents=True)
    for rel in ("passwd", "shadow", "ssh/sshd_config"):
        (dest / rel).write_text(rel)
    before = {str(p.relative_to(dest)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
              for p in dest.rglob("*")}
    cmds, _ = _op(monkeypatch, _real_facts(dest), src=str(src), dest=str(dest))
    errors = _apply(cmds)
    assert len(errors) == 1 and f"model sync {src} -> {dest}: {dest} holds 3 entries" in errors[0]
    after = {str(p.relative_to(dest)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
             for p in dest.rglob("*")}
    assert after == before and not (dest / MANIFEST_NAME).exists()


def test_fact_output_parses_odd_names_and_hidden_entries(tmp_path):
    dest = tmp_path / "m"
    (dest / "sub dir").mkdir(parents=True)
    (dest / "sub dir" / "a b.bin").write_bytes(b"12345")
    (dest / ".hidden").mkdir()
    (dest / ".hidden" / "x").write_text("x")
    (dest / "link").symlink_to("sub dir")
    (dest / MANIFEST_NAME).write_text(model_sync_rules.manifest_text({"sub dir/a b.bin": {"size": 5, "sha256": "a" * 64,
                                                                            "mtime": "17"}}))
    done = _sh(model_sync_rules.state_command(str(dest)))
    state = model_sync_rules.parse_state(done.stdout.splitlines())
    assert state["exists"] and state["listing_ok"] and state["dir_mode"] == (dest.stat().st_mode & 0o777)
    assert state["files"]["sub dir/a b.bin"]["size"] == 5 and "." in state["files"]["sub dir/a b.bin"]["mtime"]
    assert list(state["dirs"]) == ["sub dir"] and state["other"] == ["link"]
    assert state["manifest"] == {"sub dir/a b.bin": {"size": 5, "sha256": "a" * 64, "mtime": "17"}}
    absent = model_sync_rules.parse_state(_sh(model_sync_rules.state_command(str(tmp_path / "none"))).stdout.splitlines())
    assert absent["exists"] is False and absent["files"] == {}


# --- A real pyinfra run (@local): a no-op run is one remote command --------------------------------

def test_pyinfra_run_against_local_noop_is_one_remote_command(tmp_path):
    script = tmp_path / "run.py"
    script.write_text("""
import json, sys
from pyinfra.api import Config, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.connectors.local import LocalConnector
from vllm_fleet.operations.model_sync import model_sync

counts = {"commands": 0, "uploads": 0}
real_run, real_put = LocalConnector.run_shell_command, LocalConnector.put_file
def run(self, *a, **k):
    counts["commands"] += 1
    return real_run(self, *a, **k)
def put(self, *a, **k):
    counts["uploads"] += 1
    return real_put(self, *a, **k)
LocalConnector.run_shell_command, LocalConnector.put_file = run, put

state = State(Inventory((["@local"], {})), Config())
connect_all(state)
add_op(state, model_sync, src=sys.argv[1], dest=sys.argv[2])
run_ops(state)
ok = not state.failed_hosts
print(json.dumps(dict(counts, ok=ok)))
""")
    src = _model(tmp_path)
    dest = tmp_path / "host" / "m"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))

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


@pytest.mark.skipif(os.geteuid() != 0, reason="deploy.py's first step needs `id -u` = 0 on the @local host")
def test_the_deploy_refuses_a_foreign_model_dir_and_an_outside_link_cleanly_before_any_change(tmp_path):
    """`pyinfra --dry INVENTORY deploy.py` on @local (no SSH; a dry run executes nothing even if
    the refusal regressed): each refusal is a located error, host, instance, key, with its fix and
    no traceback, and the directory of others keeps every file."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 1024,
        "max_position_embeddings": 2048}))
    (src / "model.safetensors").write_bytes(os.urandom(3000))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    for name in ("passwd", "shadow", "hosts"):
        (foreign / name).write_text(name + "\n")
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in foreign.iterdir()}
    inventory = tmp_path / "inv.py"
    inventory.write_text(f"""
box = [("@local", {{"vllm_target": "cpu", "vllm_root": "{tmp_path}/root", "vllm_config_dir": "{tmp_path}/etc",
                    "vllm_instances": [{{"name": "tiny", "model": "{foreign}", "model_source": "{src}",
                                        "served_model_name": "t", "port": 8000, "max_model_len": 1024}}]}})]
""")
    repo = Path(__file__).resolve().parents[2]
    env = dict(os.environ, VLLM_FLEET_API_KEY="sk-test-4e1f9c0b27", VLLM_FLEET_CACHE=str(tmp_path / "cache"))

    def deploy() -> str:
        done = subprocess.run([sys.executable, "-m", "pyinfra", "--dry", "-y", str(inventory), "deploy.py"],
                              cwd=repo, env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        text = done.stdout + done.stderr
        assert done.returncode != 0, text
        assert "Traceback" not in text and "An exception occurred" not in text, text
        assert "nothing was changed on any host" in text, text
        return text

    text = deploy()
    assert (f"error: host @local, instance tiny, key model: model path {foreign} holds 3 entries vllm-fleet did not "
            f"put there (it has no {MANIFEST_NAME}), e.g. hosts, passwd, shadow; syncing model_source {src} there "
            "would replace or delete them") in text, text
    assert "fix: set 'model' to an empty or new directory, e.g. under vllm_models_dir: " in text
    assert {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in foreign.iterdir()} == before

    (src / "tokenizer.json").symlink_to("../foreign/shadow")
    text = deploy()
    assert (f"error: host @local, instance tiny, key model_source: model_source {src}: tokenizer.json is a symlink "
            f"to ../foreign/shadow ({foreign / 'shadow'}), outside model_source: ") in text, text
    assert "fix: put a copy of the file the model needs in place of the link, or remove the link" in text
    assert "fix: point model_source at a model directory" not in text  # one fix, the precise one


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
