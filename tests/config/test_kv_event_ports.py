"""vllm_kv_events_port_offset: each instance's KV-event port, declared once and checked against every
other listener of its host."""

from __future__ import annotations

import pytest

from support.planning_fixtures import host_data, instance, parse_errors
from vllm_fleet.config import host_ports, parse_host
from vllm_fleet.config.ports import kv_event_port


def test_without_the_knob_no_event_port_is_reserved():
    config = parse_host("box", host_data())
    assert config.settings.vllm_kv_events_port_offset is None
    assert kv_event_port(config.instances[0], config.settings) is None
    assert not any("KV-event" in what for what in host_ports(config.settings, config.instances).values())


def test_the_event_port_is_the_instance_port_plus_the_offset_and_is_a_listener_of_the_host():
    config = parse_host("box", host_data(vllm_kv_events_port_offset=20000))
    inst = config.instances[0]
    assert kv_event_port(inst, config.settings) == inst.port + 20000
    taken = host_ports(config.settings, config.instances)
    assert taken[inst.port + 20000] == (f"the KV-event port of instance {inst.name} "
                                        f"({inst.port} + vllm_kv_events_port_offset 20000)")


def test_an_event_port_on_another_instance_port_is_refused_naming_both():
    # a on 8000, b on 8010: a's event port (8000 + 10) is b's port.
    errs = parse_errors(host_data(instances=[instance(name="a", gpus=[1]), instance(name="b", gpus=[2], port=8010)],
                                  vllm_kv_events_port_offset=10))
    [err] = [e for e in errs if e.key == "vllm_kv_events_port_offset"]
    assert err.instance == "a" and "8010" in err.message and "the port of instance b" in err.message
    assert "vllm_kv_events_port_offset" in err.fix


def test_an_event_port_on_an_engine_port_is_refused():
    # the engine port is port + vllm_backend_port_offset (10000): the same offset clashes with it.
    errs = parse_errors(host_data(vllm_kv_events_port_offset=10000))
    [err] = [e for e in errs if e.key == "vllm_kv_events_port_offset"]
    assert "the engine port of instance" in err.message


def test_an_event_port_above_65535_is_refused():
    errs = parse_errors(host_data(instances=[instance(port=60000)], vllm_kv_events_port_offset=6000))
    [err] = [e for e in errs if e.key == "vllm_kv_events_port_offset"]
    assert "66000" in err.message and "above 65535" in err.message


def test_the_gateway_port_on_an_event_port_is_refused():
    port = instance()["port"]
    errs = parse_errors(host_data(vllm_gateway=True, vllm_gateway_port=port + 20000, vllm_kv_events_port_offset=20000))
    [err] = [e for e in errs if e.key == "vllm_gateway_port"]
    assert "the KV-event port of instance" in err.message


def test_a_monitoring_port_on_an_event_port_is_refused():
    port = instance()["port"]
    errs = parse_errors(host_data(vllm_metrics=True, vllm_metrics_port=port + 20000, vllm_kv_events_port_offset=20000))
    [err] = [e for e in errs if e.key == "vllm_metrics_port"]
    assert "the KV-event port of instance" in err.message


RANGE = ("from 1 to 65534", "vllm_kv_events_port_offset = 20000")


@pytest.mark.parametrize("value, words", [
    (0, RANGE), (-5, RANGE), (65535, RANGE), (10 ** 30, RANGE), ("20000", RANGE), (True, RANGE), (2.5, RANGE),
    ("２００００", RANGE), ("20000\n", ("control character", "remove it")),
])
def test_hostile_offsets_are_refused_with_the_fix(value, words):
    errs = parse_errors(host_data(vllm_kv_events_port_offset=value))
    [err] = [e for e in errs if e.key == "vllm_kv_events_port_offset"]
    message, fix = words
    assert message in err.message and fix in err.fix


def test_a_split_instances_next_port_on_the_first_ones_event_port_is_refused():
    # placement "split": one instance per GPU model, on 8000 and 8001; an offset of 1 puts the first
    # one's event port on the second one's port.
    from support.planning_fixtures import plan_errors
    errs = plan_errors(host_data(placement="split", vllm_kv_events_port_offset=1))
    assert [(e.instance, e.key) for e in errs] == [("gemma-a100-sxm4-40gb", "port")]
    assert "its port 8001 is the KV-event port of instance gemma-rtx-4090-d" in errs[0].message
    # an offset that clears every listener plans
    from vllm_fleet.plan import plan_host
    plans = plan_host(parse_host("box", host_data(placement="split", vllm_kv_events_port_offset=20000))).instances
    assert [p.port for p in plans] == [8000, 8001]
