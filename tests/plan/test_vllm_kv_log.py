"""The KV cache figures of a plan are the ones vLLM 0.33.0 logs at start, digit for digit.

vLLM's line (vllm/v1/core/kv_cache_utils.py, update_kv_cache_capacity, 1136-1154):
    "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
with "GPU" on CUDA, f"{num_tokens:,}", f"{max_model_len:,}" and max_concurrency, where
    max_concurrency = num_blocks / sum over groups of cdiv(max_memory_usage_bytes, page_size_bytes)
                      (get_max_concurrency_for_kv_cache_config, 1061-1093)
    num_tokens      = int(max_concurrency * max_model_len)   (get_kv_cache_capacity, 1120-1128)
So the size is not blocks x 16: a sliding-window group's request takes fewer blocks than its length,
and int() drops the fraction; the concurrency is rounded to the nearest, not down.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from support.planning_fixtures import A100_40G, RTX_4090D, host_data, instance
from vllm_fleet.config import parse_host
from vllm_fleet.plan import plan_host

REPO = Path(__file__).resolve().parents[2]
LOG_LINE = re.compile(r"GPU KV cache size: ([\d,]+) tokens, Maximum concurrency for ([\d,]+) tokens per "
                      r"request: (\d+\.\d\d)x")


def only_instance(data: dict):
    (inst,) = plan_host(parse_host("box", data)).instances
    return inst


def logged(inst) -> tuple[str, str, str]:
    (line,) = [m.groups() for r in inst.reasons for m in LOG_LINE.finditer(r)]
    return line


def test_sliding_window_model_logs_concurrency_times_length_not_its_pool():
    """Gemma-3-12B on the RTX 4090 D at 16384 tokens (the blocks: test_plan's hybrid test): 11443
    blocks; a request takes 1024 blocks in the full-attention group and cdiv(1023 + 4096, 16) + 1 =
    321 in each of the 5 sliding-window groups, 2629 in all.
      max_concurrency = 11443 / 2629 = 4.35260...  -> '%.2f' -> 4.35
      num_tokens      = int(4.35260... x 16384) = int(71313.3) = 71313 -> '71,313'
      (the pool itself is 11443 x 16 = 183088 tokens)"""
    inst = only_instance(host_data(gpus=[RTX_4090D], instances=[instance()]))
    assert (inst.kv_cache_blocks, inst.kv_blocks_per_request) == (11443, 2629)
    assert inst.kv_cache_tokens == 71313
    assert logged(inst) == ("71,313", "16,384", "4.35")
    assert inst.as_dict()["max_concurrency"] == 4.35


def test_full_attention_model_logs_whole_blocks_only_at_a_multiple_of_16():
    """Llama-3-8B (full attention) on one A100-40GB: 9204 blocks (test_plan's full-attention test).
    At 8192 tokens a request takes cdiv(8192, 16) = 512 blocks:
      max_concurrency = 9204 / 512 = 17.9765625 -> 17.98; num_tokens = int(17.9765625 x 8192) = 147264
    At 8001 tokens it takes cdiv(8001, 16) = 501 blocks, the last one partly used:
      max_concurrency = 9204 / 501 = 18.37125... -> 18.37; num_tokens = int(18.37125... x 8001)
                      = int(146988.4) = 146988, not 9204 x 16"""
    llama = dict(model="meta-llama/Meta-Llama-3-8B-Instruct", tokenizer=None)
    whole = only_instance(host_data(gpus=[A100_40G], instances=[instance(**llama, max_model_len=8192)]))
    assert (whole.kv_cache_blocks, whole.kv_blocks_per_request, whole.kv_cache_tokens) == (9204, 512, 147264)
    assert logged(whole) == ("147,264", "8,192", "17.98")
    partial = only_instance(host_data(gpus=[A100_40G], instances=[instance(**llama, max_model_len=8001)]))
    assert (partial.kv_cache_blocks, partial.kv_blocks_per_request) == (9204, 501)
    assert partial.kv_cache_tokens == 146988
    assert logged(partial) == ("146,988", "8,001", "18.37")


def test_text_table_and_json_give_the_same_figures_for_every_example_instance():
    """One rounding: the reason's log line, the table's column and --json agree for each instance of
    the example inventories, and JSON keeps every digit the text shows."""
    from vllm_fleet.cli import print_plan
    from vllm_fleet.fleet import Fleet

    checked = 0
    for inventory in ("prod.py", "multinode.py"):
        plan = Fleet.load(REPO / "inventory" / inventory, cwd=REPO).plan()
        table = io.StringIO()
        print_plan(plan, table)
        for host in plan.hosts:
            for inst in host.instances:
                if inst.max_concurrency is None:
                    continue
                as_json = inst.as_dict()
                size, length, concurrency = logged(inst)
                assert size == f"{as_json['kv_cache_tokens']:,}" and length == f"{inst.max_model_len:,}"
                assert concurrency == f"{as_json['max_concurrency']:.2f}"
                assert as_json["max_concurrency"] == float(concurrency)
                assert as_json["kv_cache_blocks"] / as_json["kv_blocks_per_request"] == inst.max_concurrency
                assert size in table.getvalue()
                checked += 1
    assert checked >= 6
