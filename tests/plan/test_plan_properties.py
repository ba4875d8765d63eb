"""Property-based tests: every plan the planner produces satisfies vLLM's invariants."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.planning_fixtures import A100_40G, H100_80G, RTX_3090, RTX_4090D, T4
from vllm_fleet.catalog import CATALOG, MIB
from vllm_fleet.config import ConfigErrors, parse_host
from vllm_fleet.plan import plan_host

GPU_KINDS = [A100_40G, H100_80G, RTX_4090D, RTX_3090, T4]
MODELS = sorted(CATALOG)


@st.composite
def hosts(draw):
    gpus = draw(st.lists(st.sampled_from(GPU_KINDS), min_size=1, max_size=8))
    model = draw(st.sampled_from(MODELS))
    inst = {"name": "m", "model": model, "served_model_name": "m", "port": 8000,
            "max_model_len": draw(st.sampled_from([2048, 4096, 8192])),
            "gpu_memory_utilization": draw(st.sampled_from([0.8, 0.9, 0.95]))}
    if model.endswith(".gguf"):
        inst["tokenizer"] = "google/gemma-3-12b-it"
    for key in ("tensor_parallel_size", "pipeline_parallel_size"):
        if draw(st.booleans()):
            inst[key] = draw(st.integers(1, 4))
    placement = draw(st.sampled_from(["auto", "single-instance", "split"]))
    return {"gpus": [dict(g) for g in gpus], "placement": placement, "vllm_instances": [inst]}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hosts())
def test_every_plan_satisfies_the_invariants(data):
    host = parse_host("h", data)
    try:
        plan = plan_host(host)
    except ConfigErrors as exc:
        for err in exc.errors:  # a rejection is always located and has a fix
            assert err.host == "h" and err.key and err.fix
        return
    used: set[int] = set()
    ports: set[int] = set()
    for inst in plan.instances:
        info = inst.config.model_info
        tp, pp, dp = inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size
        gpus = inst.layout.gpus
        assert tp * pp * dp == len(gpus) == len(inst.cuda_visible_devices.split(","))
        assert info.num_attention_heads % tp == 0
        assert info.num_key_value_heads % tp == 0 or tp % info.num_key_value_heads == 0
        assert info.intermediate_size % tp == 0
        for start in range(0, len(gpus), tp):  # every TP group is one GPU model
            assert len({(g.name, g.memory_mib) for g in gpus[start:start + tp]}) == 1
        partition = inst.pp_layer_partition or (info.num_hidden_layers,)
        assert sum(partition) == info.num_hidden_layers and min(partition) >= 1
        assert len(partition) == pp
        assert inst.kv_cache_tokens >= inst.max_model_len
        for use in inst.layout.per_gpu:
            assert use.weights_gib + use.kv_cache_gib <= use.budget_gib + 1e-6
            gpu = next(g for g in gpus if g.index == use.index)
            assert abs(use.budget_gib - gpu.cuda_total.total_gib * inst.config.gpu_memory_utilization) < 1e-6
            assert gpu.cuda_total.total_bytes < gpu.memory_mib * MIB  # the driver keeps a share
        indices = {g.index for g in gpus}
        assert not indices & used  # GPUs are never shared
        used |= indices
        assert inst.port not in ports
        ports.add(inst.port)
        assert inst.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert inst.env["CUDA_VISIBLE_DEVICES"] == inst.cuda_visible_devices
        if any(g.capability is not None and g.capability < 8.0 for g in gpus):
            assert inst.dtype != "bfloat16"
