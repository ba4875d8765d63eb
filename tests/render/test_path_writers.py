"""One writer per host path (vllm_fleet.path_writers): the paths the settings give a host are the
files `render` writes, and the one rule refuses two writers of a path from the inventory alone, in
`check` and `plan` as in the deploy's check of the run, and again on what a host's plan rendered
(prepare_host: the deploy and status)."""

from __future__ import annotations

from dataclasses import replace
from support.fleet_helpers import CPU_HOSTS, REPO, variant_inventory
from support.planning_fixtures import SEED_BOX, TINY_MODEL_INFO, host_data, instance
from vllm_fleet import fleet_check, path_writers
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.fleet import Fleet
from vllm_fleet.path_writers import Writer
from vllm_fleet.prepared import Discovered, prepare_host
from vllm_fleet.render import render_host

import pytest

CLIENTS = {"alice": {"key_env": "ALICE_KEY"}, "limited": {"key_env": "LIMITED_KEY", "models": ["tiny-llama"]}}
SECRETS = {"ALICE_KEY": "sk-alice-2b7d0e9f41c3", "LIMITED_KEY": "sk-limited-8c1f5a7e3d20",
           "VLLM_FLEET_METRICS_TOKEN": "mt-writers-6e2a9c4b17", "VLLM_FLEET_API_KEY": "sk-writers-0f3e8d2a5b61"}


@pytest.mark.parametrize("inventory", ["team", "team-prefix", *sorted(p.name for p in (REPO / "inventory").glob("*.py"))])
def test_the_declared_files_are_the_files_render_writes(inventory, tmp_path):
    if inventory.startswith("team"):
        # Every kind of file: TLS, two clients (one limited), metrics, and the gateway and the fleet's
        # Prometheus on sbx-cpu1; sbx-cpu2 without its instance (metrics alone still give it a front).
        # team-prefix: the gateway's policy "prefix" (the front's keyer) on every host.
        team = {"vllm_tls": True, "vllm_api_clients": CLIENTS, "vllm_metrics": True,
                **({"vllm_gateway_policy": "prefix"} if inventory == "team-prefix" else {})}
        fleet = Fleet.load(variant_inventory(tmp_path, cpu2=None, host_data={
            name: dict(team, vllm_monitoring=name == "sbx-cpu1", vllm_gateway=name == "sbx-cpu1")
            for name in CPU_HOSTS}))
    else:  # multinode.py: the nodes' Ray units
        fleet = Fleet.load(REPO / "inventory" / inventory, cwd=REPO)
    hosts, plan = fleet.hosts(), fleet.plan()
    backends = fleet.gateway_backends()
    for config, host_plan in zip(hosts, plan.hosts, strict=True):
        rendered = {f.path for f in render_host(config, host_plan, backends=backends,
                                                targets=fleet.monitoring_targets(),
                                                gateway_access=fleet.gateway_access())}
        declared = {writer.path for writer in path_writers.declared_files(
            config, fleet.held_instances(config), [inst.name for inst in host_plan.instances])}
        assert declared == rendered, config.name


def _host(name="x", model="/srv/m", model_source="/tmp", **settings):
    return parse_host("box", host_data(gpus=None, vllm_target="cpu", **settings, instances=[instance(
        name=name, model=model, model_source=model_source, tokenizer="someone/tok", max_model_len=1024)]))


@pytest.mark.parametrize("config, located, words", [
    (lambda: _host(name="hub", model="someone/tiny", model_source=None), "host box, instance hub, key name",
     "instance hub's env file would be /etc/vllm-fleet/hub.env, the file of the Hugging Face token the downloads use"),
    (lambda: _host(model="/srv/vf-prometheus", vllm_config_dir="/srv/vf", vllm_monitoring=True, vllm_metrics=True),
     "host box, instance x, key model", "would be written by Prometheus' directory and by the model sync"),
    (lambda: _host(vllm_config_dir="/opt/vllm-fleet/rollback"), "host box, key vllm_config_dir",
     "/opt/vllm-fleet/rollback would be written by the config directory and by the rollback directory"),
])
def test_two_writers_of_one_path_are_refused_before_any_host_is_reached(config, located, words):
    config = config()
    fleet = Fleet.of([config])
    with pytest.raises(ConfigErrors) as info:
        fleet.hosts()  # what plan and render ask
    [error] = info.value.errors
    assert error.located().startswith(located) and words in error.message and error.fix
    assert [e.located() for e in fleet_check.problems(fleet, environ=SECRETS)] == [error.located()]  # check


@pytest.mark.parametrize("model, settings, words", [
    ("/srv/vf/x.env", {"vllm_config_dir": "/srv/vf"}, "it is inside vllm_config_dir /srv/vf, which root writes"),
    ("/srv/vf/front-secrets", {"vllm_config_dir": "/srv/vf"}, "it is inside vllm_config_dir /srv/vf"),
    ("/srv/vf/models/m", {"vllm_config_dir": "/srv/vf"}, "it is inside vllm_config_dir /srv/vf"),
    ("/opt/vllm-fleet/.upload", {}, "it is inside vllm_root /opt/vllm-fleet, which root writes"),
])
def test_a_model_synced_into_a_directory_root_writes_is_refused_with_the_host(model, settings, words):
    # Before any file is laid out: the whole directory has a writer (root), not only its rendered files.
    with pytest.raises(ConfigErrors) as info:
        _host(model=model, **settings)
    [error] = info.value.errors
    assert (error.host, error.instance, error.key) == ("box", "x", "model") and words in error.message
    assert error.fix == "model = '/var/lib/vllm-fleet/models/x' (a directory of its own)"


def test_one_path_of_one_writer_is_no_clash():
    # Two instances that sync one source into one path are one sync.
    config = parse_host("box", host_data(gpus=None, vllm_target="cpu", instances=[
        instance(name=n, model="/srv/models/m", model_source="/tmp", tokenizer="someone/tok", port=p,
                 max_model_len=1024) for n, p in (("a", 8000), ("b", 8100))], vllm_config_dir="/srv/vf"))
    writers = path_writers.declared_writers(config, config.instances)
    assert [w.who for w in writers if w.path == "/srv/models/m"] == ["the model sync of /tmp"] * 2
    assert path_writers.path_clashes(config, writers, synced=config.instances) == []


def test_one_source_spelled_two_ways_is_one_sync():
    config = parse_host("box", host_data(gpus=None, vllm_target="cpu", instances=[
        instance(name=n, model="/srv/models/m", model_source=s, tokenizer="someone/tok", port=p, max_model_len=1024)
        for n, s, p in (("a", "/tmp/", 8000), ("b", "/tmp", 8100))]))
    assert Fleet.of([config]).path_problems([config]) == []


def _two_sources(model_b="/srv/models/m", **settings):
    return parse_host("box", host_data(gpus=None, vllm_target="cpu", **settings, instances=[
        instance(name=n, served_model_name=n, model=m, model_source=s, tokenizer=None, port=p, max_model_len=1024,
                 model_info=TINY_MODEL_INFO)
        for n, m, s, p in (("a", "/srv/models/m", "/src/one", 8000), ("b", model_b, "/src/two", 8100))]))


def test_two_instances_syncing_two_sources_into_one_path_are_refused_naming_both():
    # Each sync makes the path equal to its source: each would undo what the other sent.
    fleet = Fleet.of([_two_sources()])
    with pytest.raises(ConfigErrors) as info:
        fleet.hosts()  # plan and render
    [error] = info.value.errors
    assert (error.host, error.instance, error.key) == ("box", "b", "model")
    assert error.message == ("instances a and b sync different model_source directories (/src/one, /src/two) "
                             "into the same host path /srv/models/m")
    assert error.fix == "give each model_source a model path of its own"
    assert [e.message for e in fleet_check.problems(fleet, environ=SECRETS)] == [error.message]  # check


def test_a_case_variant_is_another_path():
    # The hosts' filesystems are case sensitive (Linux's are): /srv/models/M is a directory of its own.
    config = _two_sources(model_b="/srv/models/M")
    assert Fleet.of([config]).path_problems([config]) == []


@pytest.mark.parametrize("spelling", ["/srv/models/m/", "/srv//models/m", "/srv/./models/m", "//srv/models/./m//"])
def test_a_path_spelled_another_way_is_the_same_path(spelling):
    # The input refuses such spellings (kinds.host_path_problem, below); the rule compares paths as
    # the host resolves them all the same, so a writer that derives one cannot slip past it.
    config = _two_sources()
    writers = [w._replace(path=spelling) if w.instance == "b" and w.source else w
               for w in path_writers.declared_writers(config, config.instances)]
    [error] = path_writers.path_clashes(config, writers, synced=config.instances)
    assert error.instance == "b" and error.message.endswith("into the same host path /srv/models/m")
    token = Writer("/etc/vllm-fleet//a.env/", "a stray writer")
    [error] = path_writers.path_clashes(config, [*path_writers.declared_writers(config, config.instances[:1]), token])
    assert error.message == "/etc/vllm-fleet/a.env would be written by instance a's env and by a stray writer"
    assert (error.instance, error.key) == ("a", "name")


@pytest.mark.parametrize("spelling", ["/srv/models/m/", "/srv//models/m", "/srv/./models/m"])
def test_the_input_refuses_a_path_spelled_another_way(spelling):
    with pytest.raises(ConfigErrors) as info:
        _two_sources(model_b=spelling)
    assert [(e.instance, e.key) for e in info.value.errors] == [("b", "model")]
    assert "write '/srv/models/m'" in info.value.errors[0].message


def test_an_instance_named_hub_is_refused_where_the_host_downloads():
    # Its env file would be <vllm_config_dir>/hub.env, the downloads' token file.
    hub = parse_host("box", host_data(instances=[instance(name="hub", tokenizer="/srv/tok")]))
    assert Fleet.of([hub]).path_problems([hub]) == []  # all on the host: no downloads, no token file
    downloading = replace(hub, instances=[replace(hub.instances[0], tokenizer="google/gemma-3-12b-it")])
    [error] = Fleet.of([downloading]).path_problems([downloading])
    assert (error.instance, error.key) == ("hub", "name") and error.fix == "rename the instance (any name but 'hub')"
    assert error.message == ("instance hub's env file would be /etc/vllm-fleet/hub.env, the file of the Hugging Face "
                             "token the downloads use")


def test_a_split_instances_part_named_as_another_instance_is_refused_by_plan():
    # placement "split" names each part <name>-<GPU model>: the files of the planned names are
    # checked by `plan` (and render), as the deploy's prepare_host checks what it rendered.
    box = [*SEED_BOX, SEED_BOX[1]]
    config = parse_host("box", host_data(gpus=box, placement="split", instances=[
        instance(), instance(name="gemma-rtx-4090-d", served_model_name="other", gpus=[3], port=8100)]))
    fleet = Fleet.of([config])
    assert fleet.hosts() == [config]  # the declared names are distinct
    with pytest.raises(ConfigErrors) as info:
        fleet.plan()
    assert {(e.instance, e.key, e.fix) for e in info.value.errors} == {
        ("gemma-rtx-4090-d", "name", "give the instance another name")}
    assert sorted(e.message.split()[0] for e in info.value.errors) == [
        "/etc/systemd/system/vllm-gemma-rtx-4090-d.service", "/etc/vllm-fleet/gemma-rtx-4090-d.env",
        "/etc/vllm-fleet/gemma-rtx-4090-d.yaml"]
    assert "two planned instances named gemma-rtx-4090-d" in info.value.errors[0].message


@pytest.mark.parametrize("rendered, words", [
    (["/etc/a", "/etc/b", "/etc/a"], "/etc/a would be written by two of the host's rendered files"),
    (["/etc/vllm-fleet/x.env"], "/etc/vllm-fleet/x.env would be written by instance x's env and by the rendered "
                                "file x.env"),
    (["/opt/vllm-fleet/rollback"], "/opt/vllm-fleet/rollback would be written by the rollback directory and by "
                                   "the rendered file rollback"),
    (["/etc/vllm-fleet/x.yaml"], "/etc/vllm-fleet/x.yaml would be written by instance x's config and by the "
                                 "rendered file x.yaml"),
])
def test_what_a_host_rendered_is_checked_by_the_same_rule(rendered, words):
    config = _host()
    declared = [w.path for w in path_writers.declared_files(config, config.instances)]
    writers = path_writers.rendered_writers(config, config.instances, ["x"], [*declared, *rendered])
    [error] = path_writers.path_clashes(config, writers, synced=config.instances)
    assert error.message == words and error.located().startswith("host box") and error.fix


def test_the_deploys_prepared_host_is_refused_before_any_change():
    # prepare_host (the deploy's plan and render, and status') applies the rule to what it rendered.
    with pytest.raises(ConfigErrors) as info:
        prepare_host(Discovered(_two_sources(), None, None, None))
    assert [(e.instance, e.key) for e in info.value.errors] == [("b", "model")]
    assert "sync different model_source directories" in info.value.errors[0].message


@pytest.mark.parametrize("name", ["fleet-exporter", "fleet-node-exporter", "fleet-prometheus", "fleet-front"])
def test_an_instance_cannot_take_a_name_of_vllm_fleets_own_units(name):
    # vllm-fleet-<x>.service are the front, gateway, Ray, exporters and Prometheus.
    with pytest.raises(ConfigErrors) as info:
        _host(name=name)
    assert any(e.key == "name" and "'fleet-'" in e.fix for e in info.value.errors)


def test_a_writer_below_a_model_two_instances_sync_is_said_once():
    config = parse_host("box", host_data(gpus=None, vllm_target="cpu", instances=[
        instance(name=n, model="/srv/models/m", model_source="/tmp", tokenizer="someone/tok", port=p,
                 max_model_len=1024) for n, p in (("a", 8000), ("b", 8100))]))
    writers = [*path_writers.declared_writers(config, config.instances), Writer("/srv/models/m/x", "a stray writer")]
    [error] = path_writers.path_clashes(config, writers, synced=config.instances)
    assert error.instance == "a" and "/srv/models/m/x (a stray writer) is inside it" in error.message


def test_nothing_but_its_own_sync_lives_below_a_synced_model():
    # A backstop behind parse_host's own rules (which refuse the knobs' directories inside a model):
    # any writer below the model path is refused, naming it.
    config = _host(model="/srv/m")
    writers = [*path_writers.declared_writers(config, config.instances), Writer("/srv/m/keys.conf", "the front's keys")]
    [error] = path_writers.path_clashes(config, writers, synced=config.instances)
    assert error.located().startswith("host box, instance x, key model")
    assert "and /srv/m/keys.conf (the front's keys) is inside it" in error.message
