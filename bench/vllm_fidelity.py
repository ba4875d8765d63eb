"""Fidelity of vllm-fleet's rendered configs against the genuine vLLM 0.33.0 (a script; CI never runs it).

    .venv/bin/python bench/vllm_fidelity.py [--json] [--keep DIR]

Prepares once, in ${VLLM_FLEET_CACHE:-~/.cache/vllm-fleet}/vllm-fidelity-0.33.0/, a virtual environment
with the real vllm 0.33.0 wheel (installed without its dependencies), PyTorch 2.14.0 (the CUDA build) and
the pure packages vLLM imports at start, plus an empty libcuda.so.1 so that the CUDA build loads on a
machine without a GPU. Then, for every inventory in inventory/ and the variants below, it runs
`vllm-fleet render` and `vllm-fleet plan --json` and hands each rendered instance to a child process in
that environment, which:

- parses the YAML with vLLM's own `vllm serve` parser, built as `vllm`'s main() builds it, and given
  `serve --config FILE` as the unit's ExecStart gives it; it reports accepted or rejected (vLLM's
  message), the value every YAML key ends up with, whether each key is a whole flag name (no reliance
  on abbreviations) and whether every false arrives as False;
- runs `AsyncEngineArgs.from_cli_args(args).create_engine_config(OPENAI_API_SERVER)` as `vllm serve`
  does (vllm/entrypoints/cli/serve.py), with vLLM's CudaPlatform as the current platform and device
  0's name, memory and compute capability taken from the plan; the model's config.json comes from a
  local directory written from vllm_fleet/catalog.py's facts (the hub is not reachable here);
- builds the per-layer KV cache specs from that VllmConfig, groups them with vLLM's own
  get_global_kv_cache_groups and computes get_max_concurrency_for_kv_cache_config and
  get_kv_cache_capacity with the planner's number of blocks, against the planner's blocks per
  request, max concurrency (as vLLM logs it, '%.2f') and KV cache size;
- checks every environment variable name the unit and env file set against vllm/envs.py's names, or
  the allow-list below.

Exits 1 when anything disagrees or fails (the table says what), 0 when all agree.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from vllm_fidelity_env import MODELS, REPO, VENV, VLLM_VERSION, child_env, log, prepare

CHILD = Path(__file__).resolve().parent / "vllm_fidelity_child.py"  # run by the genuine vLLM's python


# --- the cases ----------------------------------------------------------------------------------

_A100_40G = {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": 8.0}
_A100_80G = {"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "compute_capability": 8.0}
_RTX_4090D = {"name": "NVIDIA GeForce RTX 4090 D", "memory_mib": 24564, "compute_capability": 8.9}
_H100_80G = {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute_capability": 9.0}
_B200 = {"name": "NVIDIA B200", "memory_mib": 183359, "compute_capability": 10.0}
_GEMMA_GGUF = {
    "name": "gemma",
    "model": "/data/vllm/models/gemma-3-12b-it-qat-q4_0-gguf/gemma-3-12b-it-q4_0.gguf",
    "tokenizer": "google/gemma-3-12b-it",
    "served_model_name": "gemma3-12b-q4",
    "port": 8000,
    "max_model_len": 16384,
    "max_num_seqs": 64,
    "engine_args": {"language-model-only": True},
}

# Variants of the example inventories, each a host list written to a temporary inventory.
VARIANTS: dict[str, tuple[str, list]] = {
    "pp-uneven": ("the mixed box as one instance: PP=3 over 4090 D + 2xA100, uneven layers", [
        ("gpu-mixed-pp", {"ssh_hostname": "10.0.0.41", "placement": "single-instance",
                          "gpus": [_RTX_4090D, _A100_40G, _A100_40G], "vllm_instances": [_GEMMA_GGUF]})]),
    "tp-consumer": ("2x RTX 4090 D, TP=2 with NCCL_P2P_DISABLE", [
        ("gpu-4090x2", {"ssh_hostname": "10.0.0.42", "gpus": [_RTX_4090D, _RTX_4090D], "vllm_instances": [{
            "name": "qwen14b", "model": "Qwen/Qwen2.5-14B-Instruct", "served_model_name": "qwen2.5-14b",
            "port": 8000, "max_model_len": 4096}]})]),
    "dp": ("2x H100, Qwen2.5-7B: data parallel", [
        ("gpu-h100x2", {"ssh_hostname": "10.0.0.43", "gpus": [_H100_80G, _H100_80G], "vllm_instances": [{
            "name": "qwen7b", "model": "Qwen/Qwen2.5-7B-Instruct", "served_model_name": "qwen2.5-7b",
            "port": 8000, "max_model_len": 32768}]})]),
    "engine-false": ("user engine_args with a false: enable-prefix-caching False", [
        ("gpu-a100-80", {"ssh_hostname": "10.0.0.44", "gpus": [_A100_80G], "vllm_instances": [{
            "name": "llama8b", "model": "meta-llama/Meta-Llama-3-8B-Instruct", "served_model_name": "llama-3-8b",
            "port": 8000, "max_model_len": 8192,
            "engine_args": {"enable-prefix-caching": False, "enforce-eager": True}}]})]),
    "gguf-h100": ("GGUF Gemma-3 with its tokenizer on one H100 (8192-token scheduler tier)", [
        ("gpu-h100-gguf", {"ssh_hostname": "10.0.0.45", "gpus": [_H100_80G], "vllm_instances": [
            dict(_GEMMA_GGUF, max_model_len=32768)]})]),
    "b200-tier": ("one B200: the 16384-token scheduler tier from 160 GiB; Gemma-3-27B's 10 full + 52 sliding layers", [
        ("gpu-b200", {"ssh_hostname": "10.0.0.46", "gpus": [_B200], "vllm_instances": [{
            "name": "gemma27b", "model": "google/gemma-3-27b-it", "served_model_name": "gemma3-27b",
            "port": 8000, "max_model_len": 32768}]})]),
}


def _write_variants(root: Path) -> list[tuple[str, Path, str]]:
    cases = []
    for name, (what, hosts) in VARIANTS.items():
        path = root / f"{name.replace('-', '_')}.py"
        path.write_text(f'"""{what} (written by bench/vllm_fidelity.py)."""\n\nhosts = {hosts!r}\n')
        cases.append((name, path, what))
    return cases


def _fleet(*args: str) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("vllm-fleet")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "vllm_fleet.cli"]
    return subprocess.run(cmd + list(args), cwd=REPO, capture_output=True, text=True)


def _runtime_of(unit: Path) -> str:
    """The environment the unit's ExecStart runs vllm from (cuda-0.33.0-..., cpu-0.32.0-...)."""
    m = re.search(r"^ExecStart=\S*/envs/([^/]+)/bin/vllm\b", unit.read_text(), re.M)
    return m.group(1) if m else "?"


def _environment_of(unit: Path, env_file: Path | None) -> dict[str, str]:
    names: dict[str, str] = {}
    for line in unit.read_text().splitlines():
        if line.startswith("Environment="):
            for word in shlex.split(line[len("Environment="):]):
                key, _, value = word.partition("=")
                names[key] = value
    if env_file and env_file.exists():
        for line in env_file.read_text().splitlines():
            if line.strip() and not line.lstrip().startswith("#") and "=" in line:
                key, _, value = line.partition("=")
                names[key.strip()] = "<env file>"
    return names


# --- the model configs the hub would give ---------------------------------------------------------

# What catalog.ModelInfo does not hold: each family's config.json fields beyond the shape.
_FAMILY = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rope_theta": 500000.0,
              "rms_norm_eps": 1e-05, "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128009},
    "qwen2": {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_theta": 1000000.0,
              "rms_norm_eps": 1e-06, "hidden_act": "silu", "use_sliding_window": False, "sliding_window": 131072,
              "max_window_layers": 70, "bos_token_id": 151643, "eos_token_id": 151645},
}
# google/gemma-3-*-it as published: a multimodal Gemma3ForConditionalGeneration around the text model.
_GEMMA3_VISION = {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
                  "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False}


def _model_config(model: str) -> dict | None:
    from vllm_fleet import catalog
    info = catalog.lookup(model)
    if info is None:
        return None
    text = {"hidden_size": info.hidden_size, "intermediate_size": info.intermediate_size,
            "num_hidden_layers": info.num_hidden_layers, "num_attention_heads": info.num_attention_heads,
            "num_key_value_heads": info.num_key_value_heads, "head_dim": info.head_dim,
            "vocab_size": info.vocab_size, "max_position_embeddings": info.max_position_embeddings,
            "tie_word_embeddings": info.tie_word_embeddings,
            "torch_dtype": "bfloat16" if info.dtype == "gguf" else info.dtype}
    lowered = model.lower()
    if "gemma-3" in lowered:
        text.update(model_type="gemma3_text", sliding_window=info.sliding_window,
                    sliding_window_pattern=info.sliding_window_pattern, query_pre_attn_scalar=info.head_dim,
                    rope_scaling={"factor": 8.0, "rope_type": "linear"}, rope_theta=1000000.0,
                    rope_local_base_freq=10000.0, hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-06)
        return {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
                "text_config": text, "vision_config": _GEMMA3_VISION, "mm_tokens_per_image": 256,
                "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
                "eos_token_id": [1, 106], "torch_dtype": "bfloat16"}
    family = "llama" if "llama" in lowered else "qwen2" if "qwen2" in lowered else None
    return {**_FAMILY[family], **text} if family else None


def _model_dir(model: str) -> tuple[Path | None, str]:
    """A local directory with the model's config.json, and what it stands for."""
    from vllm_fleet import catalog
    if model.rstrip("/").endswith("tiny-llama"):
        from vllm_fleet.sandbox import tiny_model
        target = MODELS / "tiny-llama"
        target.mkdir(parents=True, exist_ok=True)
        for name, data in tiny_model.build_files().items():
            if name.endswith(".json") or name.endswith(".jinja"):
                (target / name).write_bytes(data)
        return target, "the sandbox tiny-llama's config.json (vllm_fleet.sandbox.tiny_model)"
    config = _model_config(model)
    if config is None:
        return None, f"{model}: not in vllm_fleet/catalog.py, no config.json to write"
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", model.strip("/"))[-80:]
    target = MODELS / slug
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    what = "config.json from vllm_fleet/catalog.py"
    if catalog.is_gguf(model):
        what += " (GGUF file not here: the base model's config, as vllm-gguf-plugin would read it)"
    return target, what


# --- the planner's side -------------------------------------------------------------------------

def _planner_kv(inst: dict) -> dict:
    """Blocks and concurrency as the plan states them (--json, reasons) or vllm_fleet.catalog computes them."""
    from vllm_fleet import catalog
    text = " ".join(inst.get("reasons", []))
    out: dict = {"blocks": None, "blocks_per_request": None, "max_num_batched_tokens": None,
                 "concurrent_batches": None}
    out["blocks"] = inst.get("kv_cache_blocks")
    out["blocks_per_request"] = inst.get("kv_blocks_per_request")
    if m := re.search(r"(\d+) concurrent batches .*? x max_num_batched_tokens (\d+)", text):
        out["concurrent_batches"], out["max_num_batched_tokens"] = int(m.group(1)), int(m.group(2))
    info = catalog.lookup(inst["model"])
    if out["blocks_per_request"] is None and info is not None and inst.get("max_model_len"):
        groups = catalog.KvGroups.of(info)
        in_flight = (out["concurrent_batches"] or 0) * (out["max_num_batched_tokens"] or 0)
        out["blocks_per_request"] = groups.blocks_per_request(inst["max_model_len"], in_flight)
    if info is not None:
        full, sliding = info.attention_layers()
        out["layers"] = {"full": full, "sliding": sliding, "window": info.sliding_window,
                         "kv_heads": info.num_key_value_heads, "head_dim": info.head_dim}
    return out


def collect(work: Path, only: set[str] | None) -> tuple[list[dict], list[dict]]:
    """Render and plan every case; one job per rendered vLLM instance (and Ray unit)."""
    cases = [(p.stem, p, "example inventory") for p in sorted((REPO / "inventory").glob("*.py"))]
    cases += _write_variants(work / "variants")
    jobs, failures = [], []
    for name, path, _what in cases:
        if only and name not in only:
            continue
        out = work / "rendered" / name
        render = _fleet("render", str(path), "--out", str(out))
        plan = _fleet("plan", str(path), "--json")
        if render.returncode or plan.returncode:
            failures.append({"case": name, "error": (render.stderr or plan.stderr).strip()[-800:]})
            continue
        fleet = json.loads(plan.stdout)
        for host in fleet["hosts"]:
            etc = out / host["name"] / "etc"
            for inst in host["instances"]:
                yaml_path = etc / "vllm-fleet" / f"{inst['name']}.yaml"
                unit = etc / "systemd" / "system" / inst["unit"]
                if not yaml_path.exists():
                    failures.append({"case": name, "error": f"{yaml_path} not rendered"})
                    continue
                gpus = {g["index"]: g for g in host["gpus"]}
                visible = [int(i) for i in (inst["cuda_visible_devices"] or "").split(",") if i]
                device0 = gpus.get(visible[0]) if visible else None
                model_dir, model_what = _model_dir(inst["model"])
                jobs.append({
                    "case": name, "host": host["name"], "instance": inst["name"], "target": host["target"],
                    "file": str(yaml_path.relative_to(work / "rendered")), "yaml": str(yaml_path),
                    "env": _environment_of(unit, etc / "vllm-fleet" / f"{inst['name']}.env"),
                    "runtime": _runtime_of(unit), "device0": device0, "model_dir": str(model_dir) if model_dir else None,
                    "model_what": model_what, "plan": {k: inst.get(k) for k in (
                        "tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size",
                        "pp_layer_partition", "max_model_len", "kv_cache_tokens", "kv_cache_blocks",
                        "max_concurrency", "nodes")},
                    "planner_kv": _planner_kv(inst),
                })
            ray_unit = etc / "systemd" / "system" / "vllm-fleet-ray.service"
            if ray_unit.exists():
                jobs.append({"case": name, "host": host["name"], "instance": None, "ray_unit": True,
                             "file": str(ray_unit.relative_to(work / "rendered")),
                             "env": _environment_of(ray_unit, None)})
    return jobs, failures


def control_jobs(work: Path) -> list[dict]:
    """What vLLM does with a plain YAML false (the form vllm-fleet must not render): shown, not judged."""
    path = work / "controls" / "plain-false.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("model: /models/none\nenable-prefix-caching: false\nenforce-eager: false\n")
    return [{"case": "control", "file": "controls/plain-false.yaml", "yaml": str(path), "env": {},
             "control": True, "device0": None, "model_dir": None, "model_what": "control"}]


# --- judging and the report ---------------------------------------------------------------------

def judge(job: dict, res: dict) -> dict:
    """Agreement per column; `problems` lists every disagreement in words."""
    problems: list[str] = []
    row = {"file": job["file"], "case": job["case"], "model": job.get("model_what", "-")}
    if res.get("env_unknown"):
        problems.append("unknown env: " + ", ".join(res["env_unknown"]))
    row["env"] = "ok" if not res.get("env_unknown") else "unknown: " + ",".join(res["env_unknown"])
    row["env"] += f" ({res.get('env_checked', 0)} names)"
    if job.get("ray_unit"):
        row.update(parse="(Ray unit)", falses="-", engine="-", kv="-", model="-")
        row["problems"] = problems + res.get("errors", [])
        return row
    for err in res.get("errors", []):
        problems.append(err)
    parse = res.get("parse", {})
    if not parse.get("accepted"):
        row["parse"] = "REJECTED: " + parse.get("error", "?")
        problems.append(row["parse"])
    else:
        row["parse"] = "accepted"
        if job.get("runtime") and not job["runtime"].startswith(f"cuda-{VLLM_VERSION}"):
            row["parse"] += f" (the host runs {job['runtime']}; checked against vllm {VLLM_VERSION})"
        bad = res.get("not_whole_flags", []) + res.get("value_mismatch", [])
        if bad:
            row["parse"] += " but " + "; ".join(bad)
            problems.extend(bad)
    if res.get("false_bad"):
        row["falses"] = "WRONG: " + "; ".join(res["false_bad"])
        problems.append(row["falses"])
    else:
        row["falses"] = f"ok ({res.get('falses', 0)})" if parse.get("accepted") else "-"
    engine = res.get("engine", {})
    plan = job.get("plan", {})
    if "skipped" in engine:
        row["engine"] = "skipped: " + engine["skipped"]
    elif "error" in engine:
        row["engine"] = "ERROR: " + engine["error"]
        problems.append(row["engine"])
    elif engine:
        diffs = []
        for key, short in (("tensor_parallel_size", "TP"), ("pipeline_parallel_size", "PP"),
                           ("data_parallel_size", "DP")):
            if plan.get(key) != engine.get(key):
                diffs.append(f"{short} plan {plan.get(key)} vLLM {engine.get(key)}")
        planned_tokens = job["planner_kv"].get("max_num_batched_tokens")
        if planned_tokens is not None and planned_tokens != engine["max_num_batched_tokens"]:
            diffs.append(f"max_num_batched_tokens plan {planned_tokens} vLLM {engine['max_num_batched_tokens']}")
        batches = job["planner_kv"].get("concurrent_batches")
        if batches is not None and batches != engine["max_concurrent_batches"]:
            diffs.append(f"concurrent batches plan {batches} vLLM {engine['max_concurrent_batches']}")
        if plan.get("max_model_len") != engine["max_model_len"]:
            diffs.append(f"max_model_len plan {plan.get('max_model_len')} vLLM {engine['max_model_len']}")
        backend = engine.get("yaml_backend")
        if backend and backend != engine["distributed_executor_backend"]:
            diffs.append(f"backend rendered {backend} vLLM {engine['distributed_executor_backend']}")
        summary = (f"TP{engine['tensor_parallel_size']} PP{engine['pipeline_parallel_size']} "
                   f"DP{engine['data_parallel_size']} {engine['distributed_executor_backend']} "
                   f"mnbt {engine['max_num_batched_tokens']} seqs {engine['max_num_seqs']} "
                   f"async {engine['async_scheduling']} V2 {engine['v2_model_runner']} "
                   f"batches {engine['max_concurrent_batches']} prefix-caching {engine['enable_prefix_caching']}")
        row["engine"] = ("agree: " if not diffs else "DIFFER: " + "; ".join(diffs) + " | ") + summary
        problems.extend(diffs)
    else:
        row["engine"] = "-"
    kv = res.get("kv", {})
    if "vllm_max_concurrency" in kv:
        planner_c, vllm_c = kv["planner_max_concurrency"], kv["vllm_max_concurrency"]
        exact = (kv["planner_blocks"] / kv["planner_blocks_per_request"]
                 if kv["planner_blocks_per_request"] else planner_c)
        ratio = exact / vllm_c if exact and vllm_c else None
        same_blocks = kv["planner_blocks_per_request"] == kv["vllm_blocks_per_request"]
        # The digits vLLM logs ('%.2fx', update_kv_cache_capacity) and its KV cache size, exactly.
        same_c = planner_c is not None and planner_c == float("%.2f" % vllm_c)
        same_size = kv.get("planner_kv_cache_size") == kv.get("vllm_kv_cache_size")
        size_text = ("" if same_size else f"; KV cache size planner {kv.get('planner_kv_cache_size')} "
                                          f"vLLM {kv.get('vllm_kv_cache_size')}")
        row["kv"] = (f"{'agree' if same_blocks and same_c and same_size else 'DIFFER'}: blocks/request planner "
                     f"{kv['planner_blocks_per_request']} vLLM {kv['vllm_blocks_per_request']}; concurrency "
                     f"planner {planner_c} vLLM {vllm_c:.2f} (ratio {ratio:.3f}) on {kv['planner_blocks']} blocks; "
                     f"vLLM's groups {_groups_text(kv)}{size_text}"
                     if ratio else f"vLLM {vllm_c:.2f}, planner {planner_c}{size_text}")
        if not (same_blocks and same_c and same_size):
            problems.append("KV: " + row["kv"])
    elif "skipped" in kv:
        row["kv"] = "skipped: " + kv["skipped"]
    else:
        row["kv"] = "-"
    row["problems"] = problems
    return row


def _groups_text(kv: dict) -> str:
    kinds = " + ".join(f"{n} {kind.replace('AttentionSpec', '').replace('Spec', '')}"
                       for kind, n in kv.get("groups", {}).items())
    return f"{kinds} of {kv.get('group_size')} layers"


def table(rows: list[dict]) -> str:
    lines = []
    for row in rows:
        mark = "OK  " if not row["problems"] else "FAIL"
        lines.append(f"{mark} {row['file']}  [{row['case']}]")
        for col in ("parse", "falses", "env", "model", "engine", "kv"):
            if row[col] == "-" and col in ("falses", "model", "engine", "kv"):
                continue
            lines.append(f"       {col:<7} {row[col]}")
        shown = " ".join(str(row[col]) for col in ("parse", "falses", "env", "engine", "kv"))
        for problem in row["problems"]:
            if problem not in shown:
                lines.append(f"       error   {problem}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--keep", metavar="DIR", help="render into DIR and keep it (default: a temporary one)")
    parser.add_argument("--only", action="append", help="only this case (an inventory stem or a variant)")
    opts = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    prepare()
    with tempfile.TemporaryDirectory(prefix="vllm-fidelity-") as tmp:
        work = Path(opts.keep) if opts.keep else Path(tmp)
        (work / "variants").mkdir(parents=True, exist_ok=True)
        jobs, failures = collect(work, set(opts.only) if opts.only else None)
        jobs += control_jobs(work)
        job_file, out_file = work / "jobs.json", work / "results.json"
        job_file.write_text(json.dumps(jobs, indent=1))
        log(f"checking {len(jobs)} rendered files with vLLM {VLLM_VERSION} (one child process)")
        proc = subprocess.run([str(VENV / "bin" / "python"), str(CHILD), str(job_file), str(out_file)],
                              env=child_env(), capture_output=True, text=True)
        if proc.returncode or not out_file.exists():
            sys.exit(f"the vLLM child failed ({proc.returncode}):\n{proc.stderr[-6000:]}")
        results = json.loads(out_file.read_text())
    controls = [(job, res) for job, res in zip(jobs, results, strict=True) if job.get("control")]
    rows = [judge(job, res) for job, res in zip(jobs, results, strict=True) if not job.get("control")]
    bad = failures or any(r["problems"] for r in rows)
    if opts.json:
        json.dump({"vllm": VLLM_VERSION, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                   "rows": rows, "results": results, "jobs": jobs, "render_failures": failures,
                   "agree": not bad}, sys.stdout, indent=1, default=str)
        print()
    else:
        print(f"vLLM {VLLM_VERSION} fidelity of vllm-fleet's rendered configs "
              f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
        print(table(rows))
        for job, res in controls:
            parsed = ", ".join(f"{k['key']}: {k['yaml']!r} -> {k.get('dest')}={k['parsed']!r}"
                               for k in res.get("keys", []) if k["key"] != "model")
            print(f"control (not judged) {job['file']}: a plain YAML false, as vLLM's own loader passes it: "
                  f"{parsed or res.get('parse')}")
        for failure in failures:
            print(f"FAIL render/plan [{failure['case']}]: {failure['error']}")
        print(f"{sum(1 for r in rows if not r['problems'])}/{len(rows)} files agree"
              + (f", {len(failures)} cases failed to render" if failures else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
