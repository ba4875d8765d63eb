"""placement 'auto' on mixed GPU models: every way to serve the instance on some of the host's GPU
models is weighed by one objective (full-length requests, then fewer pipeline stages, then fewer
GPUs), and the plan shows the chosen layout and the runner-up with both their numbers."""

from __future__ import annotations

import json
import math

from support.planning_fixtures import A100_40G, H100_80G, RTX_4090D, host_data, instance, run_cli
from vllm_fleet.config import parse_host
from vllm_fleet.plan import plan_host

# The seed's mixed box serving Gemma-3-12B in bf16 at its full 128k context.
GEMMA_128K = instance(model="google/gemma-3-12b-it", tokenizer=None, max_model_len=131072)


def plan(data: dict):
    return plan_host(parse_host("box", data))


def test_the_seed_box_at_128k_serves_on_the_a100_pair_and_leaves_the_4090d_free():
    hp = plan(host_data(instances=[GEMMA_128K]))
    (inst,) = hp.instances
    assert inst.gpu_indices == (1, 2)
    assert (inst.tensor_parallel_size, inst.pipeline_parallel_size, inst.data_parallel_size) == (2, 1, 1)
    choice = inst.placement_choice
    assert choice is not None
    chosen, runner_up = choice["chosen"], choice["runner_up"]
    # The chosen numbers are the plan's own.
    assert chosen["max_concurrency"] == inst.as_dict()["max_concurrency"]
    assert chosen["full_length_requests"] == math.floor(inst.max_concurrency)
    assert (chosen["pipeline_stages"], chosen["gpu_count"], chosen["left_free"]) == (1, 2, [0])
    # The runner-up: PP=3 over every GPU, as many whole requests but three stages.
    assert runner_up["gpus"] == [0, 1, 2] and runner_up["pipeline_stages"] == 3
    assert runner_up["full_length_requests"] == chosen["full_length_requests"]
    assert runner_up["lost_on"] == "more pipeline stages (3 vs 1)"
    text = "\n".join(inst.reasons)
    assert "chosen: TP=2 PP=1 DP=1 on 2xA100-SXM4-40GB (GPUs 1,2): max concurrency" in text
    assert "runner-up: TP=1 PP=3 DP=1 on 1xRTX 4090 D+2xA100-SXM4-40GB (GPUs 0,1,2)" in text
    assert "GPU 0 (RTX 4090 D) left free" in text and "'gpus'" in text
    assert any("GPU 0 (RTX 4090 D) is used by no instance" in w for w in hp.warnings)


def test_the_runner_up_numbers_are_those_its_own_plan_would_have():
    forced = plan(host_data(instances=[GEMMA_128K], placement="single-instance"))
    (single,) = forced.instances
    (auto,) = plan(host_data(instances=[GEMMA_128K])).instances
    runner_up = auto.placement_choice["runner_up"]
    assert single.pipeline_parallel_size == 3
    assert runner_up["max_concurrency"] == single.as_dict()["max_concurrency"]
    assert runner_up["full_length_requests"] == math.floor(single.max_concurrency)


def test_placement_still_forces_one_layout():
    (single,) = plan(host_data(instances=[GEMMA_128K], placement="single-instance")).instances
    assert single.gpu_indices == (0, 1, 2) and single.placement_choice is None
    split = plan(host_data(placement="split")).instances
    assert {p.gpu_indices for p in split} == {(0,), (1, 2)}
    assert all(p.placement_choice is None for p in split)


def test_the_seed_gguf_box_keeps_its_split_and_says_what_it_beat():
    hp = plan(host_data())
    assert {p.gpu_indices for p in hp.instances} == {(0,), (1, 2)}
    for inst in hp.instances:
        choice = inst.placement_choice
        assert choice["chosen"]["instances"] == ["gemma-rtx-4090-d", "gemma-a100-sxm4-40gb"]
        assert choice["chosen"]["left_free"] == []
        assert choice["runner_up"]["full_length_requests"] < choice["chosen"]["full_length_requests"]
        assert choice["runner_up"]["lost_on"].startswith("fewer full-length requests")
    assert not hp.warnings


def test_every_weighed_layout_ranks_below_the_chosen_one():
    # bf16 Gemma-3-12B at 16k: the 4090 D cannot hold it alone; PP over all three GPUs and the A100
    # pair (DP=2) are both weighed, and the plan's choice is the objective's.
    (inst,) = plan(host_data(instances=[instance(model="google/gemma-3-12b-it", tokenizer=None)])).instances
    choice = inst.placement_choice
    chosen, runner_up = choice["chosen"], choice["runner_up"]
    key = lambda option: (-option["full_length_requests"], option["pipeline_stages"], option["gpu_count"])  # noqa: E731
    assert key(chosen) <= key(runner_up)
    assert any("1xRTX 4090 D: does not fit" in a for a in inst.alternatives)


class _Plan:
    """What the objective reads of an InstancePlan."""

    def __init__(self, gpus, concurrency, pp=1, dp=1):
        self.layout = type("Layout", (), {"gpus": tuple(type("Gpu", (), {"index": i})() for i in gpus)})()
        self.max_concurrency, self.pipeline_parallel_size, self.data_parallel_size = concurrency, pp, dp


def test_more_whole_requests_beat_fewer_stages():
    from vllm_fleet.plan.objective import PlacementOption, choose, why_lost

    pipeline = PlacementOption([_Plan([0, 1, 2], 5.2, pp=3)], split=False, free=())
    pair = PlacementOption([_Plan([1, 2], 4.9)], split=False, free=())
    best, runner_up = choose([pipeline, pair])
    assert best is pipeline and why_lost(best, runner_up) == "fewer full-length requests (4 vs 5)"
    # A fraction of a request is no request: 4.9 and 4.1 are both 4, and the stages decide.
    pipeline = PlacementOption([_Plan([0, 1, 2], 4.9, pp=3)], split=False, free=())
    pair = PlacementOption([_Plan([1, 2], 4.1)], split=False, free=())
    assert choose([pipeline, pair])[0] is pair


def test_replicas_count_each_their_own_requests():
    from vllm_fleet.plan.objective import PlacementOption

    option = PlacementOption([_Plan([0], 4.51), _Plan([1, 2], 10.12, dp=2)], split=True, free=())
    assert option.full_length_requests == 4 + 2 * 10


def test_a_tie_on_requests_and_stages_goes_to_fewer_gpus():
    from vllm_fleet.plan.objective import PlacementOption, choose, why_lost

    three = PlacementOption([_Plan([0, 1, 2], 4.9)], split=False, free=())
    two = PlacementOption([_Plan([1, 2], 4.1)], split=False, free=())
    best, runner_up = choose([three, two])
    assert best is two and runner_up is three
    assert why_lost(best, runner_up) == "more GPUs (3 vs 2) for the same requests and stages"


def test_homogeneous_hosts_weigh_nothing():
    (inst,) = plan(host_data(gpus=[H100_80G] * 2)).instances
    assert inst.placement_choice is None
    assert not any("weighed" in r for r in inst.reasons)


def test_an_instance_with_fixed_sizes_is_weighed_on_the_gpus_they_fit():
    # TP=2 cannot span three GPUs; the A100 pair alone takes it.
    (inst,) = plan(host_data(instances=[instance(tensor_parallel_size=2)])).instances
    assert inst.gpu_indices == (1, 2) and inst.tensor_parallel_size == 2


def test_plan_command_shows_chosen_and_runner_up_in_text_and_json(tmp_path):
    gpus = [RTX_4090D, A100_40G, A100_40G]
    (tmp_path / "inv.py").write_text(
        f"mixed = [('gpu-mixed-01', {{'gpus': {gpus!r}, 'vllm_instances': [{GEMMA_128K!r}]}})]\n")
    text = run_cli("plan", "inv.py", cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    flat = " ".join(text.stdout.split())
    assert "chosen: TP=2 PP=1 DP=1 on 2xA100-SXM4-40GB (GPUs 1,2)" in flat
    assert "runner-up: TP=1 PP=3 DP=1" in flat and "lost on more pipeline stages (3 vs 1)" in flat
    # Which total each GPU's budget came from, under the host's line.
    assert "budget from GPU 0: CUDA total 23.55 GiB (RTX 4090 table" in flat
    assert "GPU 1,2: CUDA total 39.38 GiB (nvidia-smi's total 40.00 GiB less a conservative 640 MiB" in flat
    as_json = run_cli("plan", "inv.py", "--json", cwd=tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    (host,) = json.loads(as_json.stdout)["hosts"]
    assert [g["budget_source"] for g in host["gpus"]] == ["table", "rule", "rule"]
    (inst,) = host["instances"]
    choice = inst["placement_choice"]
    assert choice["chosen"]["max_concurrency"] == inst["max_concurrency"]
    assert choice["runner_up"]["pipeline_stages"] == 3 and choice["chosen"]["left_free"] == [0]
