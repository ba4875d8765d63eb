"""What the deploy's memo of a host relies on, against fake hosts: one writer per path (an instance
or directory that would share another's path is refused while planning), the deploy lock held
before the first fact is read (and a lock not taken diagnosed), one sync per model directory."""

from __future__ import annotations


import pytest

from support.planning_fixtures import TINY_MODEL_INFO
from vllm_fleet.deploy.prepare import prepare
from vllm_fleet.facts.state import UnitState


# --- what the memo relies on: one writer per path, and the lock before the first read -------------

def _prepare(monkeypatch, **data_overrides):
    from support.planning_fixtures import FakeHost, host_data, instance, use_fake_host

    from vllm_fleet.deploy import access

    monkeypatch.setenv("VLLM_FLEET_API_KEY", "sk-test-5b1e0c2f9a")
    name = data_overrides.pop("instance_name", "a")
    data = dict(host_data(gpus=None, instances=[
        instance(name=name, model="someone/tiny", tokenizer=None, max_model_len=1024, model_info=TINY_MODEL_INFO)]),
        vllm_target="cpu", **data_overrides)
    fake = FakeHost(data, {"ManagedUnits": [], "HubModelCached": False})
    use_fake_host(monkeypatch, fake)
    return access, fake


def test_an_instance_named_hub_would_share_the_token_files_path_and_is_refused(monkeypatch):
    # Its env file (the API key) and the downloads' HF token file would both be
    # /etc/vllm-fleet/hub.env: each step deciding from the same earlier read, one would go unseen.
    from vllm_fleet.deploy import DeployError

    access, fake = _prepare(monkeypatch, instance_name="hub")
    with pytest.raises(DeployError) as info:
        prepare()
    text = str(info.value)
    assert ("host box, instance hub, key name: instance hub's env file would be /etc/vllm-fleet/hub.env, the file "
            "of the Hugging Face token the downloads use") in text
    assert "rename the instance" in text and "nothing was changed on any host" in text
    assert fake.batches == []  # refused from the inventory alone, before the host is read


def test_a_config_dir_the_state_dir_also_makes_is_refused(monkeypatch):
    from vllm_fleet.deploy import DeployError

    access, _fake = _prepare(monkeypatch, vllm_config_dir="/var/lib/vllm-fleet/config")
    with pytest.raises(DeployError) as info:
        prepare()
    text = str(info.value)
    assert ("host box, key vllm_config_dir: vllm_config_dir /var/lib/vllm-fleet/config (root's) is "
            "<vllm_state_dir>/config (VLLM_CONFIG_ROOT)") in text
    assert "give vllm_config_dir a directory of its own" in text and "nothing was changed on any host" in text


def test_the_deploy_lock_is_held_before_the_first_fact_is_read(monkeypatch):
    access, fake = _prepare(monkeypatch)
    order = []
    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", lambda host, owner: order.append("lock") or "deploy lock taken")
    monkeypatch.setattr(access, "access_problem", lambda: order.append("access check"))
    real_get_fact = fake.get_fact
    monkeypatch.setattr(fake, "get_fact", lambda cls, **kw: order.append(cls.__name__) or real_get_fact(cls, **kw))
    prepare()
    # The lock's own command is the root check: no separate `id -u` round trip when it succeeds.
    assert order[0] == "lock" and order.count("lock") == 1 and "access check" not in order, order


def test_a_host_whose_lock_is_held_is_refused_before_any_fact(monkeypatch):
    access, fake = _prepare(monkeypatch)
    refused = []

    def busy(host, owner):
        raise access.host_lock.LockBusy("host box is being deployed by someone@else; this deploy changed nothing on it")

    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", busy)
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert refused == ["host box is being deployed by someone@else; this deploy changed nothing on it"]
    assert fake.batches == [] and fake.asked == []


@pytest.mark.parametrize("diagnosis", ["host box: deploy cannot run commands as root through sudo (...)", None])
def test_a_lock_that_could_not_be_taken_is_diagnosed_by_the_access_check(monkeypatch, diagnosis):
    """sudo refused the lock's command (or it ran as another user): the host is asked why, once, and
    refused with that answer (or the lock's own words when the access check finds nothing wrong)."""
    access, fake = _prepare(monkeypatch)
    refused, checks = [], []

    def failed(host, owner):
        raise access.host_lock.LockFailed("host box: could not take the deploy lock /run/vllm-fleet/deploy.lock: "
                                          "sudo: a password is required")

    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", failed)
    monkeypatch.setattr(access.ssh_lost, "transport_gone", lambda connector: False)
    monkeypatch.setattr(access, "access_problem", lambda: checks.append(1) or diagnosis)
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert checks == [1] and fake.batches == [] and fake.asked == []
    assert refused == [diagnosis or "host box: could not take the deploy lock /run/vllm-fleet/deploy.lock: "
                                    "sudo: a password is required; nothing was changed on this host"]


def test_a_lock_lost_with_its_connection_is_reported_as_such_without_asking_the_host(monkeypatch):
    access, fake = _prepare(monkeypatch)
    refused, checks = [], []

    def failed(host, owner):
        raise access.host_lock.LockFailed("host box: could not open the deploy lock's SSH channel: EOF")

    monkeypatch.setattr(access.host_lock, "lockable", lambda host: True)
    monkeypatch.setattr(access.host_lock, "acquire", failed)
    monkeypatch.setattr(access.ssh_lost, "transport_gone", lambda connector: True)
    monkeypatch.setattr(access, "access_problem", lambda: checks.append(1))
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert checks == [] and fake.batches == []
    assert "the SSH connection to box was lost: run the deploy again" in refused[0]
    assert "nothing was changed on this host" in refused[0]


def test_without_an_ssh_session_the_access_check_runs_alone(monkeypatch):
    access, fake = _prepare(monkeypatch)
    refused = []
    monkeypatch.setattr(access, "access_problem", lambda: "host box: commands run as uid 1000 (deploy), not root")
    monkeypatch.setattr(access, "refuse_host", refused.append)
    assert prepare() is None
    assert refused == ["host box: commands run as uid 1000 (deploy), not root"] and fake.batches == []


def test_a_process_start_that_cannot_be_read_is_unknown_not_stale():
    parsed = UnitState().process(["MainPID=4242", "ActiveState=active", "SubState=running", "StartEpoch="])
    assert parsed["main_pid"] == 4242 and parsed["started"] is None
    assert UnitState().process(["MainPID=0", "SubState=dead"])["started"] == 0


def test_one_sync_per_model_directory_and_two_sources_for_one_directory_are_refused(monkeypatch, tmp_path):
    """Two instances serving one synced directory: one model_sync (a second would decide from the
    same earlier read and send every file again). Two sources into one directory: refused, naming
    both instances, before any change."""
    from types import SimpleNamespace

    from support.planning_fixtures import host_data, instance
    from vllm_fleet.config import ConfigErrors, parse_host
    from vllm_fleet.deploy import steps
    from vllm_fleet.deploy.state import Deployment
    from vllm_fleet.prepared import Discovered, prepare_host

    src, other = tmp_path / "m", tmp_path / "other"

    def config(second_source):
        insts = [instance(name=n, model="/srv/models/m", model_source=str(s), tokenizer=None, port=p,
                          max_model_len=1024, model_info=TINY_MODEL_INFO)
                 for n, s, p in (("a", src, 8000), ("b", second_source, 8100))]
        return parse_host("box", host_data(gpus=None, instances=insts, vllm_target="cpu"))

    calls = []
    monkeypatch.setattr(steps, "model_sync", lambda **kw: calls.append(kw) or f"op{len(calls)}")
    deployment = Deployment(config(src), SimpleNamespace(instances=[]), {}, None)
    steps.models(deployment)
    assert [c["dest"] for c in calls] == ["/srv/models/m"] and calls[0]["name"].startswith("Sync model a, b:")
    assert deployment.changes.model_syncs == {"a": "op1", "b": "op1"}
    with pytest.raises(ConfigErrors, match=r"instances a and b sync different model_source directories .* into "
                                           r"the same host path /srv/models/m"):
        prepare_host(Discovered(config(other), None, None, None))  # the deploy's plan and render
