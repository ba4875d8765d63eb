"""Models outside the catalog, for the tests of model_info: the real config.json files under
tests/fixtures/model-configs/ (model_config_fixture), a model directory holding one (model_dir),
and the figures of one instance planned alone (planned)."""

from __future__ import annotations

import json
from pathlib import Path

from support.planning_fixtures import host_data, instance
from vllm_fleet import catalog
from vllm_fleet.config import parse_host
from vllm_fleet.plan import plan_host

MODEL_CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model-configs"


def model_config_fixture(name: str) -> dict:
    """tests/fixtures/model-configs/<name>.json: a model's config.json as it is published."""
    return json.loads((MODEL_CONFIGS / f"{name}.json").read_text())


def planned(model_info=None, model: str = "acme/model", gpus=None, max_model_len: int = 8192):
    """(weights GiB per GPU, KV blocks, max concurrency, TP/PP/DP) of one instance planned alone."""
    extra = {} if model_info is None else {"model_info": model_info}
    data = host_data(gpus=gpus, instances=[instance(model=model, tokenizer=None, max_model_len=max_model_len,
                                                    **extra)])
    (plan,) = plan_host(parse_host("box", data)).instances
    return ([round(u.weights_gib, 6) for u in plan.layout.per_gpu], plan.kv_cache_tokens // catalog.KV_BLOCK_SIZE,
            plan.max_concurrency, (plan.tensor_parallel_size, plan.pipeline_parallel_size, plan.data_parallel_size))


def model_dir(tmp_path: Path, config: dict, total_size: int | None = None) -> Path:
    """tmp_path/model holding `config` as its config.json, and a safetensors index of `total_size`
    bytes of weights when that is given."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    if total_size is not None:
        (folder / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total_size}, "weight_map": {"lm_head.weight": "model-1.safetensors"}}))
    return folder
