"""The facts' shell code runs here, in dash and bash, against a small tree under tmp_path (and a
stand-in `systemctl` on PATH): what each command prints and what its `process` reads agree, alone
and inside one batch (facts.prefetch); a failed fact of a batch is asked alone, and a batch is split
only past its size limit."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess

import pytest

from vllm_fleet.facts import batch as facts
from vllm_fleet.facts import gpus as gpu_facts
from vllm_fleet.facts import host as host_facts
from vllm_fleet.operations import model_sync as ms
from vllm_fleet.facts.batch import parse_batch, query
from vllm_fleet.facts.state import DirectoryState, FileState, NewestMtime, ServiceAccount, UnitState


SHELLS = [path for path in map(shutil.which, ("dash", "bash")) if path]  # Debian's sh, and bash


def _run(command: str, shell: str = "/bin/sh", env: dict | None = None) -> list[str]:
    out = subprocess.run([shell, "-c", command], capture_output=True, text=True, timeout=60,
                         env=env or dict(os.environ))
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:-1]  # as pyinfra reads lines: no trailing newline, blanks kept


def _fact(cls, shell="/bin/sh", env=None, **kwargs):
    """The fact's own command, run here; its lines through its process (as pyinfra's get_fact)."""
    lines = _run(cls().command(**kwargs), shell, env)
    return cls().process(lines) if lines else cls().default()


# --- the facts' shell code, run for real ------------------------------------------------------------

@pytest.fixture
def tree(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "a b.yaml").write_text("engine: 1\n")
    (tmp_path / "etc" / "a b.yaml").chmod(0o640)
    (tmp_path / "etc" / "secret.env").write_text("KEY='it''s'\n")
    (tmp_path / "etc" / "secret.env").chmod(0o600)
    (tmp_path / "state").mkdir(mode=0o751)
    (tmp_path / "state").chmod(0o751)
    (tmp_path / "link").symlink_to(tmp_path / "etc" / "a b.yaml")
    os.utime(tmp_path / "etc" / "a b.yaml", (1_700_000_000, 1_700_000_000))
    os.utime(tmp_path / "etc" / "secret.env", (1_700_000_500, 1_700_000_500))
    return tmp_path


@pytest.mark.parametrize("shell", SHELLS)
def test_file_and_directory_state_read_mode_owner_and_sha256(tree, shell):
    me = subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    group = subprocess.run(["id", "-gn"], capture_output=True, text=True).stdout.strip()
    found = _fact(FileState, shell, path=str(tree / "etc" / "a b.yaml"))
    assert found == {"kind": "file", "mode": 0o640, "user": me, "group": group,
                     "sha256": hashlib.sha256(b"engine: 1\n").hexdigest()}
    assert _fact(FileState, shell, path=str(tree / "etc" / "secret.env"))["mode"] == 0o600
    assert _fact(FileState, shell, path=str(tree / "nope")) == {"kind": "absent"}
    assert _fact(FileState, shell, path=str(tree / "link")) == {"kind": "other"}  # never written through
    assert _fact(FileState, shell, path=str(tree / "state")) == {"kind": "other"}
    assert _fact(DirectoryState, shell, path=str(tree / "state")) == {"kind": "dir", "mode": 0o751, "user": me,
                                                                     "group": group}
    assert _fact(DirectoryState, shell, path=str(tree / "etc" / "a b.yaml")) == {"kind": "other"}
    assert _fact(DirectoryState, shell, path=str(tree / "nope")) == {"kind": "absent"}


@pytest.mark.parametrize("shell", SHELLS)
def test_service_account_and_newest_mtime(tree, shell):
    root = _fact(ServiceAccount, shell, user="root", group="root")
    assert root["user"]["uid"] == 0 and root["user"]["group"] == "root" and root["group"]["gid"] == 0
    assert root["user"]["home"] and root["user"]["shell"]
    assert _fact(ServiceAccount, shell, user="vf-no-such-user", group="vf-no-such-group") == {"user": None,
                                                                                            "group": None}
    paths = (str(tree / "etc" / "a b.yaml"), str(tree / "etc" / "secret.env"), str(tree / "gone"))
    assert _fact(NewestMtime, shell, paths=paths) == 1_700_000_500
    assert _fact(NewestMtime, shell, paths=(str(tree / "gone"),)) == 0


FAKE_SYSTEMCTL = """#!/bin/sh
# stands in for systemd's: `show -p A -p B UNIT` prints A=..., `--value` prints the value alone
case "$*" in
  *ExecMainStartTimestamp*--value*vllm-up.service*) echo "Tue 2023-11-14 22:13:20 UTC" ;;
  *ExecMainStartTimestamp*--value*) echo "" ;;
  *vllm-up.service*) printf 'MainPID=4242\\nLoadState=loaded\\nActiveState=active\\nSubState=running\\nUnitFileState=enabled\\nNeedDaemonReload=no\\n' ;;
  *vllm-stale.service*) printf 'MainPID=0\\nLoadState=loaded\\nActiveState=failed\\nSubState=failed\\nUnitFileState=disabled\\nNeedDaemonReload=yes\\n' ;;
  *) printf 'MainPID=0\\nLoadState=not-found\\nActiveState=inactive\\nSubState=dead\\nUnitFileState=\\nNeedDaemonReload=no\\n' ;;
esac
"""


@pytest.mark.parametrize("shell", SHELLS)
def test_unit_state_reads_systemctl_show(tmp_path, shell):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(FAKE_SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    up = _fact(UnitState, shell, env, unit="vllm-up.service")
    assert up["running"] and up["enabled"] and not up["need_daemon_reload"]
    assert up["main_pid"] == 4242 and up["started"] == 1_700_000_000  # date -d of the timestamp
    stale = _fact(UnitState, shell, env, unit="vllm-stale.service")
    assert not stale["running"] and not stale["enabled"] and stale["need_daemon_reload"]
    assert stale["started"] == 0 and stale["active_state"] == "failed"
    gone = _fact(UnitState, shell, env, unit="vllm-gone.service")
    assert gone["load_state"] == "not-found" and not gone["running"] and not gone["enabled"]
    # No systemctl at all: a unit nobody runs.
    empty = tmp_path / "empty"
    empty.mkdir()
    for tool in ("date", "stat", "sort", "tail"):
        (empty / tool).symlink_to(shutil.which(tool))
    assert _fact(UnitState, shell, dict(os.environ, PATH=str(empty)), unit="x.service") == UnitState().default()


@pytest.mark.parametrize("shell", SHELLS)
def test_one_batch_answers_each_fact_as_its_own_command_does(tree, shell):
    queries = [query(FileState, path=str(tree / "etc" / "a b.yaml")), query(FileState, path=str(tree / "x")),
               query(DirectoryState, path=str(tree / "state")),
               query(NewestMtime, paths=(str(tree / "etc" / "secret.env"),)),
               query(host_facts.PathsPresent, paths=(str(tree / "state"), str(tree / "nope"))),
               query(host_facts.LinkTarget, path=str(tree / "link")),
               query(gpu_facts.NvidiaGpus),  # no nvidia-smi here: pyinfra's "command missing" default
               query(host_facts.HostRuntime, python_version="3.11"),
               query(host_facts.ModelConfig, path=str(tree / "nope")),
               query(ms.ModelSyncState, dest=str(tree / "state"))]
    raw = parse_batch(_run(facts.batch_command(queries), shell))
    assert sorted(raw) == list(range(len(queries)))
    for i, q in enumerate(queries):
        rc, lines = raw[i]
        assert rc == 0, q
        alone = _run(q.fact().command(**q.kwargs), shell) if q.fact is not gpu_facts.NvidiaGpus else []
        if q.fact is gpu_facts.NvidiaGpus and subprocess.run(["sh", "-c", "command -v nvidia-smi"]).returncode:
            assert lines == [facts.MISSING_COMMAND] and facts._answer(q, lines) is None
            continue
        assert facts._answer(q, lines) == (q.fact().process(alone) if alone else q.fact().default()), q


def test_a_failed_fact_in_a_batch_is_asked_alone_and_the_rest_are_kept():
    # Markers around each command: a failing one keeps its status, a last line without newline its text.
    raw = parse_batch(_run("echo '##vllm-fleet-fact 0'\n( echo out; false )\necho \"##vllm-fleet-fact-end 0 $?\"\n"
                           "echo '##vllm-fleet-fact 1'\n( printf 'no newline' )\necho \"##vllm-fleet-fact-end 1 $?\""))
    assert raw == {0: (1, ["out"]), 1: (0, ["no newline"])}
    # prefetch keeps what succeeded; get asks the failed one alone (pyinfra reports its failure).
    fake = _Host({"LinkTarget": "asked alone"}, batch=lambda queries: {0: (1, ["out"]), 1: (0, ["target"])})
    failing, fine = query(host_facts.LinkTarget, path="/a"), query(host_facts.LinkTarget, path="/b")
    facts.prefetch(fake, [failing, fine])
    assert facts.get(fake, host_facts.LinkTarget, path="/b") == "target"
    assert facts.get(fake, host_facts.LinkTarget, path="/a") == "asked alone"
    assert fake.asked == ["FactBatch", "LinkTarget"]


class _Host:
    """pyinfra's host for facts.prefetch/get and the operations: facts from a dict, calls recorded."""

    name, print_prefix = "box", "[box] "
    data = {"ssh_user": "deploy"}

    def __init__(self, answers: dict | None = None, batch=None):
        self.answers, self.batch, self.asked, self.noops = answers or {}, batch, [], []
        self.current_op_global_arguments = {}

    def get_fact(self, cls, **kwargs):
        self.asked.append(cls.__name__)
        if cls is facts.FactBatch:
            return self.batch(kwargs["queries"]) if self.batch else None
        value = self.answers[cls.__name__]
        return value(**kwargs) if callable(value) else value

    def noop(self, text):
        self.noops.append(text)

    def get_temp_filename(self, key, temp_directory=None):
        return f"/tmp/pyinfra-{hashlib.sha1(key.encode()).hexdigest()}"


def test_prefetch_reads_once_and_get_answers_from_it(tree):
    def batch(queries):  # runs the real batch here
        return parse_batch(_run(facts.batch_command(queries)))

    fake = _Host({"FileState": {"kind": "absent"}}, batch)
    path = str(tree / "etc" / "a b.yaml")
    facts.prefetch(fake, [query(FileState, path=path), query(DirectoryState, path=str(tree / "state"))])
    facts.prefetch(fake, [query(FileState, path=path)])  # known already: no second command
    assert fake.asked == ["FactBatch"]
    assert facts.get(fake, FileState, path=path)["mode"] == 0o640
    assert facts.get(fake, DirectoryState, path=str(tree / "state"))["kind"] == "dir"
    assert fake.asked == ["FactBatch"]
    # Not prefetched: its own command, once.
    assert facts.get(fake, FileState, path="/elsewhere") == {"kind": "absent"}
    assert facts.get(fake, FileState, path="/elsewhere") == {"kind": "absent"}
    assert fake.asked == ["FactBatch", "FileState"]
    # A new pyinfra run (another State) reads afresh.
    fake.state = object()
    facts.get(fake, FileState, path="/elsewhere")
    assert fake.asked == ["FactBatch", "FileState", "FileState"]


def test_a_batch_is_split_only_past_its_size_limit(monkeypatch):
    fake = _Host(batch=lambda queries: {i: (0, ["absent"]) for i in range(len(queries))})
    facts.prefetch(fake, [query(FileState, path=f"/etc/vllm-fleet/instance-{i}.yaml") for i in range(300)])
    assert fake.asked == ["FactBatch"]  # 300 files (about 75 instances) in one command
    fake = _Host(batch=lambda queries: {i: (0, ["absent"]) for i in range(len(queries))})
    facts.prefetch(fake, [query(FileState, path="/x/" + "p" * 20_000 + str(i)) for i in range(5)])
    assert fake.asked == ["FactBatch"] * 3  # two of these paths fit a batch
    # Under _su_user pyinfra quotes the command twice: still one argument below Linux's 128 KiB.
    biggest = facts.batch_command([query(FileState, path="/x/" + "p" * 20_000 + str(i)) for i in range(2)])
    assert len(shlex.quote(shlex.quote(biggest))) < 131072
