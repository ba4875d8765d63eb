"""Planner rules, one test each, on the seeds' mixed box and common servers (no hosts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.planning_fixtures import (A100_40G, H100_80G, RTX_3090, RTX_4090D, T4, TINY_MODEL_INFO, host_data, instance,
                               plan_errors)
from vllm_fleet.config import GpuSpec, parse_host
from vllm_fleet.plan import even_partition, plan_host


def plan(data: dict, live=None):
    return plan_host(parse_host("box", data), live)


def test_seed_tp3_rejected_with_both_reasons():
    errs = plan_errors(host_data(instances=[instance(gpus=[0, 1, 2], tensor_parallel_size=3)]))
    text = "\n".join(e.located() for e in errs)
    assert "Total number of attention heads (16) must be divisible by tensor parallel size (3)" in text
    assert "different GPU models in one TP group" in text
    assert all(e.host == "box" and e.instance == "gemma" for e in errs)
    assert errs[0].key == "tensor_parallel_size"


def test_world_size_larger_than_visible_gpus_uses_the_seeds_words():
    # The seed's unit: TP=1 PP=3 but CUDA_VISIBLE_DEVICES exposed only two GPUs.
    errs = plan_errors(host_data(instances=[instance(gpus=[1, 2], tensor_parallel_size=1,
                                                     pipeline_parallel_size=3)]))
    assert len(errs) == 1
    msg = errs[0].located()
    assert "World size (3) is larger than the number of available GPUs (2)" in msg
    assert "CUDA_VISIBLE_DEVICES=1,2" in msg
    assert "fix:" in msg


def test_plan_a_single_instance_uneven_split_beats_even_split():
    hp = plan(host_data(placement="single-instance"))
    (inst,) = hp.instances
    assert (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size) == (1, 3, 1)
    assert sorted(inst.gpu_indices) == [0, 1, 2]
    assert sum(inst.pp_layer_partition) == 48
    assert inst.pp_layer_partition != (16, 16, 16)
    assert inst.kv_cache_tokens > inst.kv_cache_tokens_even_split
    # The 4090D stage (least memory) gets the fewest layers.
    stage_of_4090 = inst.gpu_indices.index(0)
    assert inst.pp_layer_partition[stage_of_4090] == min(inst.pp_layer_partition)
    assert inst.env["VLLM_PP_LAYER_PARTITION"] == ",".join(map(str, inst.pp_layer_partition))
    assert inst.env["CUDA_VISIBLE_DEVICES"] == inst.cuda_visible_devices
    assert inst.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_auto_splits_the_seed_box_by_gpu_model():
    hp = plan(host_data())
    by_gpus = {inst.gpu_indices: inst for inst in hp.instances}
    assert set(by_gpus) == {(0,), (1, 2)}
    assert len({i.port for i in hp.instances}) == 2
    assert {i.config.served_model_name for i in hp.instances} == {"gemma3-12b-q4"}
    for inst in hp.instances:
        assert any("split by GPU model" in r for r in inst.reasons)
        assert inst.pipeline_parallel_size == 1


def test_auto_weighs_pipeline_when_a_group_cannot_hold_the_model():
    # Gemma-3-12B bf16 (22.7 GiB) does not fit the 4090D alone: PP over all three GPUs is weighed
    # against the A100 pair alone, which holds more full-length requests at 16k (two replicas).
    hp = plan(host_data(instances=[instance(model="google/gemma-3-12b-it", tokenizer=None)]))
    (inst,) = hp.instances
    assert inst.gpu_indices == (1, 2) and inst.pipeline_parallel_size == 1
    assert any("cannot hold" in a for a in inst.alternatives)
    runner_up = inst.placement_choice["runner_up"]
    assert runner_up["pipeline_stages"] == 3 and runner_up["lost_on"].startswith("fewer full-length requests")


def test_tp_must_divide_heads_kv_heads_and_intermediate():
    gpus = [H100_80G] * 3
    # Qwen2.5-7B has 28 heads, 4 KV heads: TP=3 divides neither.
    errs = plan_errors(host_data(gpus=gpus, instances=[instance(
        model="Qwen/Qwen2.5-7B-Instruct", tokenizer=None, tensor_parallel_size=3, gpus=[0, 1, 2],
        max_model_len=4096)]))
    text = errs[0].located()
    assert "attention heads (28) must be divisible by tensor parallel size (3)" in text
    assert "KV heads (4)" in text
    assert errs[0].key == "tensor_parallel_size" and "(1, 2)" in errs[0].fix
    # TP=8 > 4 KV heads is allowed (KV heads are replicated), as in vLLM.
    ok = plan(host_data(gpus=[H100_80G] * 8, instances=[instance(
        model="Qwen/Qwen2.5-7B-Instruct", tokenizer=None, tensor_parallel_size=4, gpus=[0, 1, 2, 3],
        max_model_len=4096)]))
    assert ok.instances[0].tensor_parallel_size == 4


def test_never_mixes_gpu_models_in_a_tp_group():
    errs = plan_errors(host_data(instances=[instance(gpus=[0, 1], tensor_parallel_size=2)]))
    assert "different GPU models in one TP group" in errs[0].located()


def test_model_that_does_not_fit_is_an_error_with_numbers():
    # Llama-3-70B bf16 (131 GiB) on 4x A100-40GB (160 GiB by nvidia-smi; CUDA's total is 640 MiB less
    # each by the rule for GPU models without a recorded reserve: 141.75 GiB at 0.9): no KV room left.
    errs = plan_errors(host_data(gpus=[A100_40G] * 4, instances=[instance(
        model="meta-llama/Meta-Llama-3-70B-Instruct", tokenizer=None, max_model_len=8192)]))
    msg = errs[0].located()
    assert "131.4 GiB of weights" in msg
    assert "4xA100-SXM4-40GB" in msg and "141.8 GiB usable" in msg
    assert "TP=4 PP=1 DP=1: rejected — weights do not fit" in msg and "of a 35.4 GiB budget" in msg
    assert errs[0].host == "box" and errs[0].instance == "gemma"


def test_homogeneous_auto_picks_smallest_tp_then_data_parallel():
    hp = plan(host_data(gpus=[H100_80G] * 8, instances=[instance(
        model="meta-llama/Meta-Llama-3-70B-Instruct", tokenizer=None, max_model_len=8192)]))
    (inst,) = hp.instances
    # TP=2 fits the weights but leaves < 4 sequences of KV; TP=4 is the smallest with headroom.
    assert (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size) == (4, 1, 2)
    assert inst.gpu_indices == tuple(range(8))
    assert any(a.startswith("TP=2 PP=1 DP=4") and "< vllm_min_kv_sequences 4" in a
               for a in inst.alternatives)


def test_bf16_on_old_gpus_becomes_float16_with_warning():
    hp = plan(host_data(gpus=[T4, T4], instances=[instance(
        model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=2048,
        gpu_memory_utilization=0.95)]))
    (inst,) = hp.instances
    assert inst.dtype == "float16"
    assert inst.engine_args["dtype"] == "float16"
    assert any("compute capability" in w for w in inst.warnings)


def test_tp_on_consumer_cards_disables_p2p_and_custom_allreduce():
    hp = plan(host_data(gpus=[RTX_3090, RTX_3090], instances=[instance(
        model="Qwen/Qwen2.5-14B-Instruct", tokenizer=None, max_model_len=4096)]))
    (inst,) = hp.instances
    assert inst.tensor_parallel_size == 2
    assert inst.env["NCCL_P2P_DISABLE"] == "1"
    assert inst.engine_args["disable-custom-all-reduce"] is True
    assert any("vllm#14449" in r for r in inst.reasons)


def test_nvlink_cards_keep_p2p():
    hp = plan(host_data(gpus=[A100_40G] * 2, instances=[instance(
        model="Qwen/Qwen2.5-14B-Instruct", tokenizer=None, max_model_len=32768)]))
    (inst,) = hp.instances
    assert inst.tensor_parallel_size == 2
    assert "NCCL_P2P_DISABLE" not in inst.env
    assert "disable-custom-all-reduce" not in inst.engine_args


def test_gguf_gets_plugin_and_tokenizer():
    hp = plan(host_data(placement="single-instance"))
    (inst,) = hp.instances
    assert "vllm-gguf-plugin==0.0.5" in inst.packages  # pinned: part of the environment's hash
    assert inst.engine_args["tokenizer"] == "google/gemma-3-12b-it"
    other = plan(host_data(placement="single-instance", vllm_gguf_plugin_version="0.0.4")).instances[0]
    assert "vllm-gguf-plugin==0.0.4" in other.packages


def test_gpus_and_ports_never_shared_on_a_host():
    two = [instance(name="a", gpus=[1]), instance(name="b", gpus=[1], port=8001)]
    errs = plan_errors(host_data(instances=two))
    assert any(e.key == "gpus" and e.instance == "b" for e in errs)
    same_port = [instance(name="a", gpus=[1]), instance(name="b", gpus=[2])]
    errs = plan_errors(host_data(instances=same_port))
    assert any(e.key == "port" and "already used by instance a" in e.message for e in errs)


def test_gpu_index_out_of_range():
    errs = plan_errors(host_data(instances=[instance(gpus=[3])]))
    assert errs[0].key == "gpus" and "does not exist" in errs[0].message


def test_live_gpus_win_and_mismatch_shows_both():
    live = tuple(GpuSpec(i, g["name"], g["memory_mib"]) for i, g in enumerate([A100_40G] * 3))
    errs = plan_errors(host_data(), live=live)
    assert "declared: 0: NVIDIA GeForce RTX 4090 D" in errs[0].message
    assert "live:     0: NVIDIA A100-SXM4-40GB" in errs[0].message
    no_decl = host_data(gpus=None)
    del no_decl["gpus"]
    hp = plan(no_decl, live=live)
    assert hp.gpu_source == "live" and len(hp.instances) == 1


def test_several_auto_instances_take_the_fewest_identical_gpus():
    insts = [instance(name="a"), instance(name="b", port=8001)]
    hp = plan(host_data(gpus=[A100_40G] * 4, instances=insts))
    used = [i.gpu_indices for i in hp.instances]
    assert used == [(0,), (1,)]
    assert hp.unused_gpus == (2, 3)
    assert hp.warnings


def test_cpu_target_plans_without_gpus_and_rejects_parallelism():
    data = {"vllm_target": "cpu", "vllm_instances": [instance(model="/srv/tiny", tokenizer=None,
                                                              max_model_len=512)]}
    hp = plan(data)
    assert hp.instances[0].env["CUDA_VISIBLE_DEVICES"] == ""
    assert "tensor-parallel-size" not in hp.instances[0].engine_args
    errs = plan_errors({"vllm_target": "cpu", "vllm_instances": [instance(tensor_parallel_size=2)]})
    assert errs[0].key == "tensor_parallel_size"


def tiny(**overrides) -> dict:
    """An instance of the sandbox's tiny model (max_position_embeddings 2048)."""
    return instance(**{"model": "/srv/tiny", "tokenizer": None, "max_model_len": None, "model_info": TINY_MODEL_INFO,
                       **overrides})


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_every_planner_refuses_a_max_model_len_above_the_models_length(target):
    """One resolution of max_model_len for the GPU and the CPU planner: vLLM refuses a length
    above max_position_embeddings on either."""
    gpus = None if target == "cpu" else [A100_40G]
    errs = plan_errors(host_data(gpus=gpus, vllm_target=target, instances=[tiny(max_model_len=4096)]))
    assert [(e.host, e.instance, e.key, e.message, e.fix) for e in errs] == [
        ("box", "gemma", "max_model_len",
         "max_model_len 4096 exceeds the model's max_position_embeddings (2048); vLLM refuses it",
         "set max_model_len <= 2048")]


@pytest.mark.parametrize("given, planned", [(None, 2048), (1024, 1024), (2048, 2048)])
def test_the_gpu_and_the_cpu_planner_take_the_same_max_model_len(given, planned):
    for target, gpus in (("cpu", None), ("cuda", [A100_40G])):
        [inst] = plan(host_data(gpus=gpus, vllm_target=target, instances=[tiny(max_model_len=given)])).instances
        assert (inst.max_model_len, inst.engine_args["max-model-len"]) == (planned, planned), target


def test_a_cpu_host_leaves_an_unknown_length_to_vllm_and_notes_an_unchecked_one():
    unknown = {key: value for key, value in TINY_MODEL_INFO.items() if key != "max_position_embeddings"}
    [inst] = plan(host_data(gpus=None, vllm_target="cpu", instances=[tiny(model_info=unknown)])).instances
    assert inst.max_model_len == 0 and "max-model-len" not in inst.engine_args
    assert not any("not checked offline" in reason for reason in inst.reasons)
    [inst] = plan(host_data(gpus=None, vllm_target="cpu", instances=[tiny(model_info=unknown, max_model_len=4096)])
                  ).instances
    assert inst.engine_args["max-model-len"] == 4096
    assert any("max_model_len 4096 is not checked offline" in reason for reason in inst.reasons)
    # The GPU planner sizes the KV cache with the length: it needs one.
    errs = plan_errors(host_data(gpus=[A100_40G], instances=[tiny(model_info=unknown)]))
    assert [e.key for e in errs] == ["max_model_len"] and "not known offline" in errs[0].message


def test_even_partition_matches_vllm():
    # vllm.distributed.utils.get_pp_indices: remainder to the stages before the last.
    assert even_partition(48, 3) == (16, 16, 16)
    assert even_partition(10, 4) == (2, 3, 3, 2)
    assert even_partition(7, 2) == (4, 3)


def test_unknown_model_without_model_info_says_how_to_fix():
    errs = plan_errors(host_data(instances=[instance(model="acme/secret-model", tokenizer=None)]))
    assert errs[0].key == "model_info" and "model_info" in errs[0].fix


# --- KV capacity as vLLM computes it (hybrid KV cache manager) ------------------------------------

def test_gemma3_hybrid_kv_max_concurrency_on_the_4090d_at_16k():
    """Gemma-3-12B (48 layers, sliding window 1024, 5 sliding : 1 full) on the seed's 4090 D.

    vLLM 0.33.0 (v1/core/kv_cache_planning.py, v1/kv_cache_interface.py, config/vllm.py): 8 full +
    40 sliding layers -> group size min(8, 40) = 8 -> 1 full group + 5 sliding groups of 8 layers,
    one block pool whose block holds 16 tokens for 8 layers (one KV tensor per layer slot).
      page per layer  = 16 tokens x 2 (K,V) x 8 kv heads x 256 head_dim x 2 bytes = 131072 B
      CUDA's total    = 24564 MiB (nvidia-smi) - 449 MiB the driver keeps (the RTX 4090 row of
                        gpu_models.DRIVER_RESERVES) = 24115 MiB = 23.5498 GiB
      KV memory       = 23.5498 GiB x 0.90 - 2.5 GiB reserve - 7.52 GiB weights = 11.174805 GiB
      blocks          = 11.174805 GiB / (131072 B x 8 slots) = 11443 (183088 tokens of pool)
      tokens in flight = max_concurrent_batches 2 (async scheduling, no PP) x max_num_batched_tokens
                         2048 (vLLM's API-server default below 70 GiB) = 4096
      one 16384-token request: full group  cdiv(16384, 16)                          = 1024 blocks
                               each sliding group cdiv(min(1024-1+4096, 16384), 16) + 1 = 321
                               1024 + 5 x 321                                        = 2629 blocks
      max concurrency = 11443 / 2629 = 4.353
    """
    hp = plan(host_data(gpus=[RTX_4090D], instances=[instance()]))
    (inst,) = hp.instances
    assert (inst.kv_cache_blocks, inst.kv_blocks_per_request) == (11443, 2629)
    assert inst.max_concurrency == pytest.approx(11443 / 2629)
    assert inst.as_dict()["max_concurrency"] == 4.35
    assert not any("KV cache holds" in w for w in inst.warnings)  # 4.35 >= vllm_min_kv_sequences 4
    assert any("1 + 5 groups of 8" in r and "window 1024" in r for r in inst.reasons)
    assert any("takes 2629 blocks over all KV cache groups" in r for r in inst.reasons)
    assert any("2 concurrent batches (async scheduling on the V2 model runner) x max_num_batched_tokens "
               "2048 (vLLM's default for RTX 4090 D) = 4096" in r for r in inst.reasons)
    # With the hybrid manager off, vLLM stores every layer in full: the old number comes back.
    off = plan(host_data(gpus=[RTX_4090D], instances=[instance(
        engine_args={"disable-hybrid-kv-cache-manager": True})])).instances[0]
    assert off.kv_cache_blocks == 30514 // 16 and off.max_concurrency == pytest.approx((30514 // 16) / 1024)
    assert any("1.86 requests of max_model_len 16384" in w for w in off.warnings)


def test_tokens_in_flight_follow_vllms_concurrent_batches():
    """VllmConfig.max_concurrent_batches (config/vllm.py:587-598) on the mixed box's Gemma-3-12B:
    PP=3 on the V2 model runner keeps PP + 1 = 4 batches in flight; the V1 runner turns async
    scheduling off with PP (config/vllm.py:1665-1712), leaving PP = 3; async scheduling off without
    PP leaves one batch. Each sliding group then takes cdiv(1023 + batches x 2048, 16) + 1 blocks."""
    single = plan(host_data(placement="single-instance")).instances[0]
    assert single.pipeline_parallel_size == 3
    blocks = single.kv_cache_blocks
    assert single.max_concurrency == pytest.approx(blocks / (1024 + 5 * 577))  # 1023 + 8192
    v1 = plan(host_data(placement="single-instance", instances=[instance(
        env={"VLLM_USE_V2_MODEL_RUNNER": "0"})])).instances[0]
    assert v1.max_concurrency == pytest.approx(v1.kv_cache_blocks / (1024 + 5 * 449))  # 1023 + 6144
    assert any("3 concurrent batches (no async scheduling, PP=3)" in r for r in v1.reasons)
    sync = plan(host_data(gpus=[RTX_4090D], instances=[instance(
        engine_args={"async-scheduling": False})])).instances[0]
    assert sync.max_concurrency == pytest.approx(11443 / 1989)  # 1024 + 5 x cdiv(1023 + 2048, 16) + 5
    own = plan(host_data(gpus=[RTX_4090D], instances=[instance(max_num_batched_tokens=512)])).instances[0]
    assert own.max_concurrency == pytest.approx(11443 / (1024 + 5 * 129))  # cdiv(1023 + 2 x 512, 16) + 1


@pytest.mark.parametrize("gpu, tokens", [
    ({"name": "NVIDIA B200", "memory_mib": 183359}, 16384),  # >= 160 GiB: the third tier
    (H100_80G, 8192),
    ({"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}, 2048),  # A100s are kept small
    ({"name": "NVIDIA GB10", "memory_mib": 122570, "compute_capability": 12.1}, 2048),
    (RTX_4090D, 2048),
])
def test_default_batched_tokens_are_vllms_three_tiers(gpu, tokens):
    """EngineArgs.get_batch_defaults (engine/arg_utils.py:2970-3006), API-server column; what it
    sets decides the tokens in flight: (1023 + 2 x tokens) per sliding group, capped at max_model_len."""
    from vllm_fleet.catalog import GIB, MIB
    from vllm_fleet.plan import api_server_batched_tokens
    spec = GpuSpec(0, gpu["name"], gpu["memory_mib"], compute_capability=gpu.get("compute_capability"))
    assert api_server_batched_tokens(spec) == tokens
    assert (spec.memory_mib * MIB >= 160 * GIB) == (tokens == 16384)


def test_group_size_pads_the_smaller_type_below_one_and_a_half():
    """kv_cache_planning.py:524: with max < 1.5 x min layers per type, every group holds the larger
    count (the smaller type padded); at or above it, groups hold the smaller count."""
    from vllm_fleet.catalog import KvGroups, ModelInfo
    def groups(full: int, sliding: int) -> KvGroups:
        types = ("full_attention",) * full + ("sliding_attention",) * sliding
        return KvGroups.of(ModelInfo(num_hidden_layers=full + sliding, num_attention_heads=8,
                                     num_key_value_heads=8, head_dim=128, hidden_size=1024,
                                     intermediate_size=4096, vocab_size=1000, weights_gib=1.0,
                                     sliding_window=512, layer_types=types))
    assert (groups(10, 14).group_size, groups(10, 14).full_groups, groups(10, 14).sliding_groups) == (14, 1, 1)
    assert (groups(10, 15).group_size, groups(10, 15).full_groups, groups(10, 15).sliding_groups) == (10, 1, 2)
    assert groups(8, 40).group_size == 8  # Gemma-3: 5 : 1


def test_full_attention_model_is_unchanged_by_the_hybrid_arithmetic():
    """Llama-3-8B (full attention, 32 layers) on one A100-40GB at 8192 tokens:
      CUDA's total = 40960 MiB - 640 MiB (the rule for GPU models without a recorded reserve) = 39.375 GiB
      KV memory = 39.375 GiB x 0.90 - 2.5 GiB - 14.96 GiB = 17.9775 GiB; per token 32 x 2 x 8 x 128 x 2 B
      tokens = 17.9775 x 2^30 / 131072 = 147271; concurrency = (147271 // 16) / cdiv(8192, 16) = 9204 / 512."""
    hp = plan(host_data(gpus=[A100_40G], instances=[instance(
        model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192)]))
    (inst,) = hp.instances
    assert inst.kv_cache_blocks == 147271 // 16 == 9204
    assert inst.max_concurrency == pytest.approx(9204 / 512)
    assert inst.kv_cache_tokens == 9204 * 16  # full attention, max_model_len a multiple of 16
    assert not any("hybrid KV cache" in r for r in inst.reasons)


def test_the_seed_inventory_plan_has_no_false_kv_warning():
    from vllm_fleet.fleet import load_fleet
    from vllm_fleet.plan import plan_fleet
    root = Path(__file__).resolve().parents[2]
    hosts = load_fleet(root / "inventory" / "prod.py", limit=["gpu-mixed-01"], cwd=root)
    (box,) = plan_fleet(hosts).hosts
    assert [i.name for i in box.instances] == ["gemma-rtx-4090-d", "gemma-a100-sxm4-40gb"]
    for inst in box.instances:
        assert inst.max_concurrency >= 4, inst.name
        assert not any("KV cache holds" in w for w in inst.warnings), inst.warnings
    single = plan(host_data(placement="single-instance")).instances[0]  # PP=3 across GPU models
    assert single.pipeline_parallel_size == 3 and single.max_concurrency > 4


# --- parallel sizes against the GPUs: the words name what the user wrote ---------------------------

LLAMA_8B = dict(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None, max_model_len=8192)


def test_auto_gpus_with_a_tp_the_model_refuses_says_so_not_that_gpus_were_given():
    """gpus 'auto' on 8 H100s, tensor_parallel_size 3: 6 of them could hold TP=3 x DP=2, but Llama-3-8B's
    32 heads refuse TP=3; the user gave no GPUs, so no message says they did."""
    (err,) = plan_errors(host_data(gpus=[H100_80G] * 8, instances=[instance(**LLAMA_8B, tensor_parallel_size=3)]))
    assert err.key == "tensor_parallel_size"
    assert ("tensor_parallel_size 3 (the instance's) does not work for meta-llama/Meta-Llama-3-8B-Instruct"
            in err.message)
    assert "attention heads (32) must be divisible by tensor parallel size (3)" in err.message
    assert "given" not in err.message and "make up" not in err.message and "3 = 3" not in err.message
    assert "(1, 2, 4)" in err.fix and "leave it out" in err.fix


def test_pinned_gpus_that_the_tp_does_not_divide_name_the_list_and_the_valid_sizes():
    (err,) = plan_errors(host_data(gpus=[H100_80G] * 8, instances=[instance(
        **LLAMA_8B, gpus=[0, 1, 2, 3, 4], tensor_parallel_size=2)]))
    assert err.key == "gpus"
    assert "its 'gpus' lists 5 GPU(s) (0,1,2,3,4), but tensor_parallel_size 2 does not divide 5" in err.message
    assert "2 = 2" not in err.message
    assert "a multiple of 2 GPUs in 'gpus' (e.g. [0, 1, 2, 3])" in err.fix
    assert "tensor_parallel_size to one that divides 5 (1, 5)" in err.fix


def test_all_three_sizes_must_equal_the_pinned_gpus():
    (err,) = plan_errors(host_data(gpus=[H100_80G] * 8, instances=[instance(
        **LLAMA_8B, gpus=[0, 1, 2, 3, 4], tensor_parallel_size=2, pipeline_parallel_size=1, data_parallel_size=2)]))
    assert ("tensor_parallel_size 2 x pipeline_parallel_size 1 x data_parallel_size 2 = 4 is not 5"
            in err.message)
    assert "exactly 4 GPUs in 'gpus' (e.g. [0, 1, 2, 3])" in err.fix


def test_auto_gpus_fewer_than_the_sizes_say_what_auto_left():
    (err,) = plan_errors(host_data(gpus=[H100_80G] * 2, instances=[instance(**LLAMA_8B, tensor_parallel_size=4)]))
    assert err.key == "tensor_parallel_size"
    assert "World size (4) is larger than the number of available GPUs (2)" in err.message
    assert "gpus 'auto' leaves it the host's 2 free GPU(s) (0,1)" in err.message
    assert "leave 4 GPUs free for it" in err.fix and "at most 2" in err.fix


def test_unused_gpus_are_named_with_their_model_and_what_the_instances_have():
    one = plan(host_data(gpus=[H100_80G] * 3, instances=[instance(**LLAMA_8B, gpus=[1, 2])]))
    (text,) = one.warnings
    assert text.startswith("GPU 0 (H100 80GB HBM3) is used by no instance") and "gemma: 1,2" in text
    assert "GPUs 0" not in text
    two = plan(host_data(gpus=[H100_80G] * 3, instances=[instance(**LLAMA_8B, gpus=[1])]))
    assert two.warnings[0].startswith("GPUs 0 (H100 80GB HBM3), 2 (H100 80GB HBM3) are used by no instance")
