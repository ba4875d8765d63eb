"""Model sync's decisions (rules/model_sync.py, facts/model_sync.py, operations/model_sync.py): what
the operation takes from its facts (the commands it yields for each state of the host are the cases
in model_sync.model_sync/), and a real pyinfra run against @local that counts the remote commands of
a no-op run. The workstation manifest is tested in test_model_sync_manifest.py, the commands run
for real in test_model_sync_commands.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.model_sync_helpers import model_tree, run_model_sync, run_sh, tree_bytes, uploaded_paths
from support.model_sync_helpers import model_sync_cache  # noqa: F401 (an autouse fixture: pytest finds it by name)

from vllm_fleet import model_source
from vllm_fleet.model_source import PARTIAL_SUFFIX, ModelSyncError
from vllm_fleet.operations import model_sync as ms
from vllm_fleet.rules import model_sync as model_sync_rules
from vllm_fleet.rules.model_sync import MANIFEST_NAME


# --- Decisions from fact dicts ----------------------------------------------------------------------

def _synced_state(local: model_source.LocalManifest) -> dict:
    """The fact as it reads after a complete sync of `local`."""
    files = {rel: {"size": f.size, "mtime": f"{f.host_mtime}0", "mode": 0o644}
             for rel, f in local.files.items()}
    manifest = {rel: {"size": f.size, "sha256": f.sha256, "mtime": f.host_mtime}
                for rel, f in local.files.items()}
    return {"exists": True, "dir_mode": 0o755, "manifest": manifest, "files": files,
            "dirs": {d: {"mode": 0o755} for d in local.dirs}, "other": [], "listing_ok": True}


def test_each_difference_gets_exactly_its_fix(monkeypatch, tmp_path):
    src = model_tree(tmp_path)
    local = model_source.local_manifest(src)
    shard1, shard2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"

    # One file changed on the workstation, same size (new sha and mtime): only it is sent.
    state = _synced_state(local)
    (src / shard1).write_bytes(os.urandom(300_000))
    cmds, _ = run_model_sync(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert uploaded_paths(cmds) == [f"/srv/m/{shard1}{PARTIAL_SUFFIX}", f"/srv/m/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    assert not any(isinstance(c, str) and c.startswith("rm -rf") for c in cmds)
    local = model_source.local_manifest(src)

    # Truncated on the host: re-sent, without asking the host for a hash.
    state = _synced_state(local)
    state["files"][shard2] = {**state["files"][shard2], "size": 1000, "mtime": "1800000000.5"}
    plan = model_sync_rules.plan_sync(local, state, "/srv/m")
    assert plan.send == {shard2: "truncated on the host (1000 of 200000 bytes)"} and not plan.to_hash
    cmds, fake = run_model_sync(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert uploaded_paths(cmds)[0] == f"/srv/m/{shard2}{PARTIAL_SUFFIX}" and len(uploaded_paths(cmds)) == 2
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
    cmds, _ = run_model_sync(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
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
    src = model_tree(tmp_path)
    local = model_source.local_manifest(src)
    shard1 = "model-00001-of-00002.safetensors"
    good = {rel: f.sha256 for rel, f in local.files.items()}

    # A first sync cut short after some renames: the claim's manifest vouches for no file. Adopt
    # what matches, send what does not.
    state = _synced_state(local)
    state["manifest"] = {}
    hashes = dict(good, **{shard1: "0" * 64})
    cmds, fake = run_model_sync(monkeypatch, {"ModelSyncState": state, "ModelSyncHashes": lambda dest, paths: {
        p: hashes[p] for p in paths}}, src=str(src), dest="/srv/m")
    assert fake.fact_calls == ["ModelSyncState", "ModelSyncHashes"]
    assert uploaded_paths(cmds) == [f"/srv/m/{shard1}{PARTIAL_SUFFIX}", f"/srv/m/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    written = json.loads(cmds[-2].src.getvalue())["files"]
    assert written["config.json"]["mtime"] == state["files"]["config.json"]["mtime"]  # as found on the host

    # Touched on the host (same size, another mtime): hashed there; same content -> adopted, only
    # the manifest is rewritten; other content -> sent again.
    for host_sha, sent in ((good[shard1], []), ("f" * 64, [f"/srv/m/{shard1}{PARTIAL_SUFFIX}"])):
        ms._HOST_HASHES.clear()
        state = _synced_state(local)
        state["files"][shard1]["mtime"] = "1800000000.123"
        cmds, fake = run_model_sync(monkeypatch, {"ModelSyncState": state, "ModelSyncHashes": {shard1: host_sha}},
                         src=str(src), dest="/srv/m")
        assert uploaded_paths(cmds) == sent + [f"/srv/m/{MANIFEST_NAME}{PARTIAL_SUFFIX}"]
    # The hashes are kept by (size, mtime): the execution pass does not read the file again.
    cmds, fake = run_model_sync(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/srv/m")
    assert fake.fact_calls == ["ModelSyncState"] and len(uploaded_paths(cmds)) == 2


def _foreign_state(files=(), dirs=(), other=(), hidden=(), listing_ok=True) -> dict:
    """The fact for an existing directory without vllm-fleet's manifest (its top-level entries)."""
    return {"exists": True, "dir_mode": 0o755, "manifest": None, "manifest_found": False,
            "files": {rel: {"size": 10, "mtime": "1.0", "mode": 0o644} for rel in files},
            "dirs": {rel: {"mode": 0o755} for rel in dirs}, "other": list(other), "hidden": list(hidden),
            "listing_ok": listing_ok}


_ETC_FILES = [f"file{i:03d}.conf" for i in range(90)] + ["passwd", "shadow", "hosts", "group", "fstab"]
_ETC_DIRS = ["apt", "cron.d", "ssh", "systemd", "sudoers.d", "default"]


def test_an_etc_like_directory_is_refused_before_anything_is_sent_or_removed(monkeypatch, tmp_path):
    src = model_tree(tmp_path)
    local = model_source.local_manifest(src)
    state = _foreign_state(files=_ETC_FILES, dirs=_ETC_DIRS, other=["localtime"], hidden=[".pwd.lock"])
    problem = model_sync_rules.ownership_problem(state, "/etc/")
    assert problem == ("/etc holds 103 entries vllm-fleet did not put there (it has no .vllm-fleet-manifest.json), "
                       "e.g. .pwd.lock, apt, cron.d, default, file000.conf, ...")
    with pytest.raises(ModelSyncError) as refused:
        model_sync_rules.plan_sync(local, state, "/etc")
    assert str(refused.value) == problem
    # The operation: one failing command that names the host and the directory; no upload, no rm.
    cmds, fake = run_model_sync(monkeypatch, {"ModelSyncState": state}, src=str(src), dest="/etc")
    assert len(cmds) == 1 and isinstance(cmds[0], str) and cmds[0].endswith(" >&2; exit 1")
    said = run_sh(cmds[0]).stderr
    assert said.startswith(f"host gpu9: model sync {src} -> /etc: /etc holds 103 entries vllm-fleet did not put "
                           "there (it has no .vllm-fleet-manifest.json), e.g. ")
    assert ("nothing was sent or removed; fix: set 'model' to an empty or new directory, e.g. a directory of its "
            "own under vllm_models_dir; or, if /etc is meant for this model alone, remove its contents yourself") in said
    assert fake.fact_calls == ["ModelSyncState"]  # not even a hash is asked for


def test_a_directory_of_other_models_is_refused_naming_them(tmp_path):
    local = model_source.local_manifest(model_tree(tmp_path))
    # As a fact lists it (full listing, e.g. from a fabricated or older state): named by top-level entry.
    state = _foreign_state(files=["gemma-3-12b/config.json", "llama-3-8b/config.json", "README"],
                           dirs=["gemma-3-12b", "llama-3-8b"])
    with pytest.raises(ModelSyncError, match=r"^/data/models holds 3 entries vllm-fleet did not put there \(it has "
                                             r"no \.vllm-fleet-manifest\.json\), e\.g\. README, gemma-3-12b, "
                                             r"llama-3-8b$"):
        model_sync_rules.plan_sync(local, state, "/data/models")


def test_a_directory_with_only_dotfiles_or_an_unreadable_listing_is_refused(tmp_path):
    local = model_source.local_manifest(model_tree(tmp_path))
    with pytest.raises(ModelSyncError, match=r"^/home/u holds 2 entries .* e\.g\. \.bashrc, \.ssh$"):
        model_sync_rules.plan_sync(local, _foreign_state(hidden=[".bashrc", ".ssh"]), "/home/u")
    with pytest.raises(ModelSyncError, match=r"^/srv/m has no \.vllm-fleet-manifest\.json and could not be listed"):
        model_sync_rules.plan_sync(local, _foreign_state(listing_ok=False), "/srv/m")
    # One entry: singular.
    assert model_sync_rules.ownership_problem(_foreign_state(dirs=["lost+found"]), "/mnt/new").startswith(
        "/mnt/new holds 1 entry vllm-fleet did not put there")


def test_a_new_or_empty_directory_or_one_with_our_manifest_is_synced(tmp_path):
    local = model_source.local_manifest(model_tree(tmp_path))
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
        state = model_sync_rules.parse_state(run_sh(model_sync_rules.state_command(str(dest))).stdout.splitlines())
        assert state["exists"] and state["listing_ok"] and not state["manifest_found"]
        assert sorted(state["files"]) == ["passwd", "shadow"] and list(state["dirs"]) == ["apt"]  # not below
        assert state["other"] == ["localtime"] and state["hidden"] == [".pwd.lock"]
        assert model_sync_rules.ownership_problem(state, str(dest)) == (
            f"{dest} holds 5 entries vllm-fleet did not put there (it has no {MANIFEST_NAME}), e.g. .pwd.lock, "
            "apt, localtime, passwd, shadow" if dest == foreign else
            f"{dest} is reached through a symlink (it resolves to {foreign}); the sync, which writes as root, "
            "follows none")
    # A link on the way to a dest that does not exist yet carries the first sync elsewhere too.
    state = model_sync_rules.parse_state(run_sh(model_sync_rules.state_command(str(link / "new"))).stdout.splitlines())
    assert not state["exists"] and f"resolves to {foreign}/new" in model_sync_rules.ownership_problem(state, str(link / "new"))
    # An empty directory: nothing listed, ours to claim.
    (tmp_path / "empty").mkdir()
    state = model_sync_rules.parse_state(run_sh(model_sync_rules.state_command(str(tmp_path / "empty"))).stdout.splitlines())
    assert state["exists"] and state["listing_ok"] and model_sync_rules.ownership_problem(state, str(tmp_path / "empty")) is None
    # An unreadable manifest is still ours (found), and then the whole tree is listed.
    (foreign / MANIFEST_NAME).write_text("not json")
    state = model_sync_rules.parse_state(run_sh(model_sync_rules.state_command(str(foreign))).stdout.splitlines())
    assert state["manifest_found"] and state["manifest"] is None and "apt/sources.list.d/x.list" in state["files"]
    assert model_sync_rules.ownership_problem(state, str(foreign)) is None


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
    src = model_tree(tmp_path)
    dest = tmp_path / "host" / "m"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))

    def run():
        done = subprocess.run([sys.executable, str(script), str(src), str(dest)], capture_output=True, text=True,
                              env=env, timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    first = run()
    assert first["ok"] and first["uploads"] == 5  # 4 files and the manifest
    assert tree_bytes(dest) == tree_bytes(src)
    again = run()
    assert again == {"commands": 1, "uploads": 0, "ok": True}
    (src / "config.json").write_text('{"architectures": ["Y"]}\n')
    changed = run()
    assert changed["ok"] and changed["uploads"] == 2 and tree_bytes(dest) == tree_bytes(src)


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
