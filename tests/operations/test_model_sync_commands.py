"""Model sync's commands RUN for real in a tmp dir (operations/model_sync.py, rules/model_sync.py):
an upload is simulated by copying the bytes the operation would send to the path it names; a sync
interrupted or cut short anywhere is taken up by the next run; the sudo path's ownership handover."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand
from support.model_sync_helpers import model_tree, run_model_sync, run_sh, tree_bytes, uploaded_paths
from support.model_sync_helpers import model_sync_cache  # noqa: F401 (an autouse fixture: pytest finds it by name)

from vllm_fleet import model_source
from vllm_fleet.model_source import PARTIAL_SUFFIX, ModelSyncError
from vllm_fleet.operations import model_sync as ms
from vllm_fleet.rules import model_sync as model_sync_rules
from vllm_fleet.rules.model_sync import MANIFEST_NAME


def _real_facts(dest: Path):
    def state(dest):
        done = run_sh(model_sync_rules.state_command(dest))
        assert done.returncode == 0, done.stderr
        return model_sync_rules.parse_state(done.stdout.splitlines())

    def hashes(dest, paths):
        done = run_sh(model_sync_rules.hashes_command(dest, list(paths)))
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
        done = run_sh(cmd)
        if done.returncode != 0:
            return [done.stderr]
    return []


def test_commands_really_sync_verify_rename_and_write_the_manifest(monkeypatch, tmp_path):
    src = model_tree(tmp_path)
    dest = tmp_path / "host" / "models" / "m"
    facts = _real_facts(dest)
    logged: list[str] = []
    monkeypatch.setattr(ms, "logger", type("L", (), {"info": logged.append, "debug": logged.append,
                                                     "warning": logged.append})())
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds) == []
    assert tree_bytes(dest) == tree_bytes(src) and (dest / "empty").is_dir()
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
    cmds, fake = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
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
    cmds, fake = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert sorted(uploaded_paths(cmds)) == sorted(f"{dest}/{r}{PARTIAL_SUFFIX}" for r in
                                            (shard2, "tokenizer/tokenizer.json", MANIFEST_NAME))
    assert _apply(cmds) == []
    assert tree_bytes(dest) == tree_bytes(src)
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds == []

    # One file changed on the workstation, same size: only it is sent (and the manifest).
    (src / shard1).write_bytes(os.urandom(300_000))
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert uploaded_paths(cmds) == [f"{dest}/{shard1}{PARTIAL_SUFFIX}", f"{dest}/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    assert _apply(cmds) == [] and tree_bytes(dest) == tree_bytes(src)


def test_an_interrupted_or_short_transfer_never_becomes_the_real_file(monkeypatch, tmp_path):
    src = model_tree(tmp_path)
    dest = tmp_path / "host" / "m"
    facts = _real_facts(dest)
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds) == []
    before = tree_bytes(dest)
    shard1 = "model-00001-of-00002.safetensors"
    (src / shard1).write_bytes(os.urandom(300_000))

    # Short: the connection dropped after 1000 bytes, yet the verify step ran.
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    errors = _apply(cmds, short=shard1)
    assert len(errors) == 1 and f"{dest}/{shard1}: the upload is incomplete (1000 of 300000 bytes arrived)" \
        in errors[0]
    assert tree_bytes(dest) == before and not list(dest.rglob(f"*{PARTIAL_SUFFIX}"))

    # Interrupted right after the upload (the deploy was killed): a complete-looking partial is left.
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds, interrupt_after_upload=shard1) == ["interrupted"]
    assert (dest / f"{shard1}{PARTIAL_SUFFIX}").read_bytes() == (src / shard1).read_bytes()
    assert tree_bytes(dest)[shard1] == before[shard1]  # the real file is still the old one
    # The next run does not take the partial as the file: it deletes it and sends the file.
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds[0] == f"rm -rf -- {dest}/{shard1}{PARTIAL_SUFFIX}"
    assert uploaded_paths(cmds)[0] == f"{dest}/{shard1}{PARTIAL_SUFFIX}"
    assert _apply(cmds) == [] and tree_bytes(dest) == tree_bytes(src)

    # Content that changed during the upload (or was corrupted): the sha256 check refuses it.
    (src / shard1).write_bytes(os.urandom(300_000))
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    (src / shard1).write_bytes(os.urandom(300_000))  # changed again while "uploading"
    errors = _apply(cmds)
    assert len(errors) == 1 and "sha256 is" in errors[0] and "the partial file was removed" in errors[0]
    assert not list(dest.rglob(f"*{PARTIAL_SUFFIX}"))


def test_interrupted_after_renames_but_before_the_manifest_resends_nothing(monkeypatch, tmp_path):
    src = model_tree(tmp_path)
    dest = tmp_path / "host" / "m"
    facts = _real_facts(dest)
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds) == []
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (src / name).write_bytes(os.urandom(len((src / name).read_bytes())))
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert _apply(cmds, interrupt_after_upload=MANIFEST_NAME) == ["interrupted"]  # both renamed, old manifest
    cmds, fake = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert fake.fact_calls == ["ModelSyncState", "ModelSyncHashes"]
    assert uploaded_paths(cmds) == [f"{dest}/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]  # hashed on the host, adopted
    assert _apply(cmds) == []
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
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
        assert run_sh(cmd).returncode == 0
        if " && mv -fT -- " in cmd:
            renamed += 1
    raise AssertionError("the sync ended before the interruption point")


@pytest.mark.parametrize("renamed", [1, 2, 3])
def test_a_first_sync_cut_short_is_taken_up_by_the_next_run(monkeypatch, tmp_path, renamed):
    """The claim (counted as the first rename) marks dest before any file: after it, with some
    files in place and no full manifest, the next run recognises the directory, adopts what
    arrived (hashed on the host) and sends the rest."""
    src = model_tree(tmp_path)
    dest = tmp_path / "host" / "m"
    facts = _real_facts(dest)
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    _apply_until(cmds, renamed)
    assert json.loads((dest / MANIFEST_NAME).read_text())["files"] == {}  # the claim only
    placed = sorted(rel for rel in tree_bytes(dest))
    assert len(placed) == renamed - 1
    ms._HOST_HASHES.clear()
    cmds, fake = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    sent = sorted(u.removeprefix(f"{dest}/").removesuffix(PARTIAL_SUFFIX) for u in uploaded_paths(cmds))
    assert sent == sorted((set(model_source.local_manifest(src).files) - set(placed)) | {MANIFEST_NAME})
    assert fake.fact_calls == (["ModelSyncState", "ModelSyncHashes"] if placed else ["ModelSyncState"])
    assert _apply(cmds) == [] and tree_bytes(dest) == tree_bytes(src)
    cmds, _ = run_model_sync(monkeypatch, facts, src=str(src), dest=str(dest))
    assert cmds == []
    # Without the claim the same directory would be refused: the claim is what makes the rerun work.
    (dest / MANIFEST_NAME).unlink()
    with pytest.raises(ModelSyncError, match=rf"^{dest} holds \d+ entries vllm-fleet did not put there"):
        model_sync_rules.plan_sync(model_source.local_manifest(src), facts["ModelSyncState"](str(dest)), str(dest))


def test_a_directory_holding_files_of_others_is_left_exactly_as_it_was(monkeypatch, tmp_path):
    src = model_tree(tmp_path)
    dest = tmp_path / "host" / "etc"
    (dest / "ssh").mkdir(parents=True)
    for rel in ("passwd", "shadow", "ssh/sshd_config"):
        (dest / rel).write_text(rel)
    before = {str(p.relative_to(dest)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
              for p in dest.rglob("*")}
    cmds, _ = run_model_sync(monkeypatch, _real_facts(dest), src=str(src), dest=str(dest))
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
    done = run_sh(model_sync_rules.state_command(str(dest)))
    state = model_sync_rules.parse_state(done.stdout.splitlines())
    assert state["exists"] and state["listing_ok"] and state["dir_mode"] == (dest.stat().st_mode & 0o777)
    assert state["files"]["sub dir/a b.bin"]["size"] == 5 and "." in state["files"]["sub dir/a b.bin"]["mtime"]
    assert list(state["dirs"]) == ["sub dir"] and state["other"] == ["link"]
    assert state["manifest"] == {"sub dir/a b.bin": {"size": 5, "sha256": "a" * 64, "mtime": "17"}}
    absent = model_sync_rules.parse_state(run_sh(model_sync_rules.state_command(str(tmp_path / "none"))).stdout.splitlines())
    assert absent["exists"] is False and absent["files"] == {}


# --- The sudo path's ownership handover ------------------------------------------------------------

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
    assert run_sh(ms.prepare_partial_command(partial, "nobody")).returncode == 0
    write = subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", f"cat > {partial}"], input=data)
    assert write.returncode == 0
    assert subprocess.run(["runuser", "-u", "nobody", "--", "sh", "-c", f"touch {dest}/other"]).returncode != 0
    done = run_sh(ms.finalize_command(partial, final, len(data), hashlib.sha256(data).hexdigest(), "0644",
                                   "1700000000.000000001", "host gpu9: w.bin"))
    assert done.returncode == 0, done.stderr
    st = os.stat(final)
    assert (st.st_uid, st.st_mode & 0o777, st.st_mtime_ns) == (0, 0o644, 1_700_000_000_000_000_001)
    assert Path(final).read_bytes() == data and not os.path.exists(partial)
