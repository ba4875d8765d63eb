"""Hub file selection on real (public, cited) repo listings; timeout; failure classifier; host script."""

import fnmatch
import json
import os
import re
from pathlib import Path

import pytest

from vllm_fleet.rules import hub

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "hub"


def load(name):
    data = json.loads((FIX / name).read_text())
    assert data["source"].startswith("http") and data["note"]  # every fixture names its page
    return data


LLAMA = load("meta-llama--Meta-Llama-3-70B-Instruct.json")
QWEN = load("Qwen--Qwen2.5-14B-Instruct.json")
GGUF_MANY = load("Mungert--gemma-3-12b-it-qat-q4_0-GGUF.json")
GGUF_GOOGLE = load("google--gemma-3-12b-it-qat-q4_0-gguf.json")
GEMMA_LAYOUT = load("gemma-3-12b-it--layout.json")  # stands for google/gemma-3-12b-it (see its note)


def matched(patterns, listing):
    """What snapshot_download(allow_patterns=...) would fetch (it uses fnmatch on the paths)."""
    return sorted(f["path"] for f in listing if any(fnmatch.fnmatch(f["path"], p) for p in patterns))


def test_llama3_70b_safetensors_only_no_original_pth():
    sel = hub.select_files(LLAMA["files"])
    assert sel.weight_format == "safetensors"
    paths = set(sel.paths)
    shards = {f"model-{i:05d}-of-00030.safetensors" for i in range(1, 31)}
    assert shards <= paths
    assert {"config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
            "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model"} <= paths
    assert not [p for p in paths if p.startswith("original/") or p.endswith((".pth", ".pt"))]
    # nothing vLLM does not read: docs, licence, mirror files
    assert not paths & {"README.md", "LICENSE", "USE_POLICY.md", ".gitattributes", "index.html",
                        "configuration.json"}
    assert paths == shards | {"config.json", "generation_config.json", "model.safetensors.index.json",
                              "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                              "tokenizer.model"}
    # the allow_patterns fetch exactly that (fnmatch, as snapshot_download applies them)
    assert matched(sel.allow_patterns, LLAMA["files"]) == sorted(paths)


def test_qwen25_14b_selection_and_sizes():
    sel = hub.select_files(QWEN["files"])
    assert sel.weight_format == "safetensors"
    assert set(sel.paths) == ({f"model-{i:05d}-of-00008.safetensors" for i in range(1, 9)}
                              | {"config.json", "generation_config.json", "model.safetensors.index.json",
                                 "tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"})
    by_path = {f["path"]: f["size"] for f in QWEN["files"]}
    assert sel.total_bytes == sum(by_path[p] for p in sel.paths)
    assert sel.unknown_sizes == ()
    # ~27.4 GiB of weights as published (3.6 + 6 x 3.7 + 1.6 GB), the rest is a few MB
    weights = sum(by_path[p] for p in sel.paths if p.endswith(".safetensors"))
    assert abs(weights - 27.4 * 1024**3) < 1024**2
    skipped = sum(s for p, s in by_path.items() if p not in sel.paths)
    assert sel.total_bytes + skipped == sum(by_path.values())


def test_llama_sizes_sum_and_unknown_sizes_reported():
    sel = hub.select_files(LLAMA["files"])
    by_path = {f["path"]: f["size"] for f in LLAMA["files"]}
    assert sel.total_bytes == sum(by_path[p] for p in sel.paths)
    assert sel.unknown_sizes == ()  # the original/ entries (sizes unknown) are not selected
    assert 125 * 1024**3 < sel.total_bytes < 135 * 1024**3


def test_gguf_repo_only_the_named_file():
    sel = hub.select_files(GGUF_MANY["files"], gguf_file="gemma-3-12b-it-qat-q4_0-q3_k_m.gguf")
    assert sel.paths == ["gemma-3-12b-it-qat-q4_0-q3_k_m.gguf"] and sel.weight_format == "gguf"
    assert matched(sel.allow_patterns, GGUF_MANY["files"]) == sel.paths
    assert sel.unknown_sizes == ("gemma-3-12b-it-qat-q4_0-q3_k_m.gguf",)
    with pytest.raises(ValueError, match="not in the repo"):
        hub.select_files(GGUF_MANY["files"], gguf_file="gemma-3-12b-it-q4_0.gguf")


def test_gguf_instance_fetches_its_tokenizer_repo():
    listings = {"google/gemma-3-12b-it-qat-q4_0-gguf": GGUF_GOOGLE["files"],
                # the layout of a gemma-3-12b-it upload stands in for google/gemma-3-12b-it (fixture note)
                "google/gemma-3-12b-it": GEMMA_LAYOUT["files"]}
    plan = hub.instance_downloads("google/gemma-3-12b-it-qat-q4_0-gguf/gemma-3-12b-it-q4_0.gguf",
                                  tokenizer="google/gemma-3-12b-it", listings=listings)
    assert [d.repo for d in plan] == ["google/gemma-3-12b-it-qat-q4_0-gguf", "google/gemma-3-12b-it"]
    weights, tok = plan
    assert list(weights.allow_patterns) == ["gemma-3-12b-it-q4_0.gguf"]
    assert weights.total_bytes == 8_070_000_000
    fetched = matched(tok.allow_patterns, GEMMA_LAYOUT["files"])
    assert fetched == sorted(["added_tokens.json", "chat_template.json", "config.json", "generation_config.json",
                              "preprocessor_config.json", "processor_config.json", "special_tokens_map.json",
                              "tokenizer.json", "tokenizer.model", "tokenizer_config.json"])
    assert not [p for p in fetched if p.endswith(".safetensors")]  # config + tokenizer only
    assert "config" in tok.why


def test_local_gguf_with_hub_tokenizer_still_fetches_the_tokenizer():
    # inventory/prod.py: a GGUF file on the host, tokenizer = "google/gemma-3-12b-it"
    plan = hub.instance_downloads("/data/vllm/models/gemma-3-12b-it-qat-q4_0-gguf/gemma-3-12b-it-q4_0.gguf",
                                  tokenizer="google/gemma-3-12b-it")
    assert [d.repo for d in plan] == ["google/gemma-3-12b-it"]
    assert "config.json" in plan[0].allow_patterns and "tokenizer.model" in plan[0].allow_patterns
    assert not [p for p in plan[0].allow_patterns if "safetensors" in p]
    assert plan[0].total_bytes is None


@pytest.mark.parametrize("model", ["Qwen/Qwen2.5-7B-Instruct", "/data/vllm/models/qwen2.5-7b"])
def test_any_hub_tokenizer_is_fetched_before_the_offline_start(model):
    """Instances start with HF_HUB_OFFLINE=1, and then vLLM swaps the --tokenizer id for its local
    snapshot as it does the model's (vllm 0.33.0 engine/arg_utils.py:933-956): a tokenizer repo
    that is not in HF_HOME fails the start, whatever the model's format."""
    downloads = hub.instance_downloads(model, tokenizer="Qwen/Qwen2.5-7B-Instruct-1M")
    tokenizer = downloads[-1]
    assert tokenizer.repo == "Qwen/Qwen2.5-7B-Instruct-1M" and tokenizer.why == "tokenizer"
    assert "tokenizer_config.json" in tokenizer.allow_patterns
    assert not [p for p in tokenizer.allow_patterns if "safetensors" in p]
    assert [d.repo for d in downloads] == ([model] if not model.startswith("/") else []) + [tokenizer.repo]


def test_plain_hub_model_without_listing_stays_at_top_level():
    [d] = hub.instance_downloads("meta-llama/Meta-Llama-3-70B-Instruct")
    got = matched(d.allow_patterns, LLAMA["files"])
    assert not [p for p in got if p.startswith("original/")]
    assert "model-00001-of-00030.safetensors" in got


def test_bin_only_when_no_safetensors_and_never_training_files():
    # derived from the Qwen listing: the same repo as if it shipped pytorch_model*.bin instead
    files = [f for f in QWEN["files"] if not f["path"].endswith(".safetensors")
             and f["path"] != "model.safetensors.index.json"]
    files += [{"path": "pytorch_model.bin", "size": 10}, {"path": "training_args.bin", "size": 5}]
    sel = hub.select_files(files)
    assert sel.weight_format == "bin" and "pytorch_model.bin" in sel.paths
    assert "training_args.bin" not in sel.paths
    both = QWEN["files"] + [{"path": "pytorch_model.bin", "size": 10}]
    assert not [p for p in hub.select_files(both).paths if p.endswith(".bin")]


def test_no_loadable_weights_is_an_error():
    with pytest.raises(ValueError, match="original/"):
        hub.select_files([f for f in LLAMA["files"] if not f["path"].endswith(".safetensors")])


def test_timeout_scales_with_size():
    assert hub.download_timeout_s(0) == hub.DOWNLOAD_TIMEOUT_FLOOR_S
    assert hub.download_timeout_s(None) == hub.DOWNLOAD_TIMEOUT_CAP_S
    assert hub.download_timeout_s(10**15) == hub.DOWNLOAD_TIMEOUT_CAP_S
    llama = hub.select_files(LLAMA["files"]).total_bytes
    qwen = hub.select_files(QWEN["files"]).total_bytes
    t_llama, t_qwen = hub.download_timeout_s(llama), hub.download_timeout_s(qwen)
    assert hub.DOWNLOAD_TIMEOUT_FLOOR_S < t_qwen < t_llama < hub.DOWNLOAD_TIMEOUT_CAP_S
    assert t_llama > 3600  # the old fixed hour could never fetch 140 GB at 50 Mbit/s
    assert t_llama >= llama / hub.MIN_LINK_BYTES_PER_S
    assert t_llama / t_qwen == pytest.approx(llama / qwen, rel=0.05)


GATED_NO_TOKEN = """Traceback (most recent call last):
huggingface_hub.errors.GatedRepoError: 401 Client Error. (Request ID: Root=1-67d2...)

Cannot access gated repo for url https://huggingface.co/google/gemma-3-12b-it/resolve/main/config.json.
Access to model google/gemma-3-12b-it is restricted. You must have access to it and be authenticated to access it. Please log in.
"""
MISSING = """huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. (Request ID: Root=1-67d2...)

Repository Not Found for url: https://huggingface.co/api/models/Qwen/Qwen2.5-14B-Instrukt/revision/main.
Please make sure you specified the correct `repo_id` and `repo_type`.
"""
NO_DNS = """httpx.ConnectError: [Errno -3] Temporary failure in name resolution
huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the files on the Hub and we cannot find the appropriate snapshot folder for the specified revision on the local disk. Please check your internet connection and try again.
"""
SLOW = (f"{hub.PROGRESS_PREFIX} repo=meta-llama/Meta-Llama-3-70B-Instruct bytes=1200000000 rate=0.4MB/s elapsed=3000s\n"
        f"{hub.PROGRESS_PREFIX} repo=meta-llama/Meta-Llama-3-70B-Instruct bytes=1300000000 rate=0.3MB/s elapsed=3030s\n"
        f"{hub.TIMEOUT_MARKER} after 3600 s\n")
HUNG = f"{hub.TIMEOUT_MARKER} after 900 s\n"


def test_classifier_on_realistic_errors():
    assert hub.explain_download_failure(GATED_NO_TOKEN, has_token=False).startswith("gated repo and no token")
    assert "no access" in hub.explain_download_failure(GATED_NO_TOKEN, has_token=True)
    assert hub.explain_download_failure(MISSING, has_token=True).startswith("missing repo")
    assert "private/gated" in hub.explain_download_failure(MISSING, has_token=False)
    assert hub.explain_download_failure(NO_DNS, has_token=True).startswith("no network")
    assert hub.explain_download_failure(SLOW, has_token=True).startswith("slow link")
    assert "1300000000 bytes" in hub.explain_download_failure(SLOW, has_token=True)
    assert hub.explain_download_failure(HUNG, has_token=True).startswith("no network")
    # the script's own result line is enough too
    line = hub.RESULT_PREFIX + json.dumps({"ok": False, "error": "GatedRepoError", "message": "401", "bytes": 0})
    assert hub.explain_download_failure(line, has_token=False).startswith("gated repo and no token")


def test_download_script_never_holds_the_token(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secretsecret")
    sel = hub.select_files(QWEN["files"])
    script = hub.download_script("Qwen/Qwen2.5-14B-Instruct", sel.allow_patterns, expected_bytes=sel.total_bytes)
    compile(script, "download", "exec")
    assert "hf_secretsecret" not in script and "token=" not in script
    assert 'snapshot_download(REPO, allow_patterns=ALLOW, **({"revision": REVISION} if REVISION else {}))' in script
    cmd = hub.download_command("/opt/env/bin/python", script, hf_home="/var/lib/vllm-fleet/hf", user="vllm",
                               timeout_s=hub.download_timeout_s(sel.total_bytes),
                               token_file="/etc/vllm-fleet/hub.env")
    assert "hf_secretsecret" not in cmd and "HF_TOKEN=" not in cmd
    assert re.search(r"timeout \d+ runuser -u vllm -- /opt/env/bin/python -c ", cmd)


def test_download_script_runs_and_reports(tmp_path, monkeypatch):
    """Run the script with a stand-in huggingface_hub (no network): progress lines and a result line."""
    fake = tmp_path / "fake" / "huggingface_hub"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(
        "import os, time\n"
        "def snapshot_download(repo, allow_patterns=None):\n"
        "    d = os.path.join(os.environ['HF_HOME'], 'hub', 'models--' + repo.replace('/', '--'), 'blobs')\n"
        "    os.makedirs(d, exist_ok=True)\n"
        "    for i in range(3):\n"
        "        open(os.path.join(d, str(i)), 'wb').write(b'x' * 1000)\n"
        "        time.sleep(0.15)\n"
        "    assert allow_patterns == ['config.json']\n"
        "    return d\n")
    import subprocess
    import sys
    script = hub.download_script("a/b", ["config.json"], expected_bytes=3000, interval_s=0.1)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(tmp_path / "fake")}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert hub.PROGRESS_PREFIX in out.stdout and "rate=" in out.stdout and "total=3000" in out.stdout
    result = hub.parse_result(out.stdout)
    assert result["ok"] and result["bytes"] == 3000 and result["repo"] == "a/b"


def test_a_repo_counts_as_downloaded_only_once_its_download_finished(tmp_path):
    """config.json is there after an interrupted download too (shards missing), and a GGUF repo has
    none: only the marker the deploy writes after a finished download counts."""
    import subprocess

    from vllm_fleet.facts.host import HubModelCached

    fact = HubModelCached()
    command = fact.command(hf_home=str(tmp_path), model="owner/repo")

    def cached() -> bool:
        out = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout
        return fact.process(out.splitlines())

    snapshot = tmp_path / "hub" / "models--owner--repo" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    assert not cached()
    marker = Path(hub.complete_marker(str(tmp_path), "owner/repo"))
    marker.parent.mkdir()
    marker.write_text("")
    assert cached()


def test_a_repos_own_code_comes_along_for_trust_remote_code():
    listing = [{"path": "config.json", "size": 900}, {"path": "modeling_custom.py", "size": 20_000},
               {"path": "model.safetensors", "size": 10**9}, {"path": "scripts/train.py", "size": 5_000}]
    chosen = hub.select_files(listing).paths
    assert "modeling_custom.py" in chosen and "scripts/train.py" not in chosen  # top level only, as vLLM


# The shape of a sentence-transformers embedding repo (BAAI/bge-m3's kind): its modules' own files
# beside the model's, module folders named <index>_<Class> by sentence-transformers. Sizes invented.
SENTENCE_TRANSFORMERS_REPO = [
    {"path": p, "size": 1000} for p in (
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "sentencepiece.bpe.model", "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
        "1_Pooling/config.json", "2_Dense/config.json", "2_Dense/model.safetensors", "2_Dense/pytorch_model.bin",
        "onnx/model.onnx", "onnx/config.json", "colbert_linear.pt", "README.md", "imgs/bench.jpg")]


def test_an_embedding_models_sentence_transformers_files_come_along():
    """vLLM reads modules.json (pooling, normalisation, Dense layers), each module's config.json and a
    Dense module's weights, and the sentence_*_config.json tokenizer settings: an offline start
    without them pools differently from the model's own definition, or fails on a missing file."""
    sel = hub.select_files(SENTENCE_TRANSFORMERS_REPO)
    assert sel.weight_format == "safetensors"
    assert set(sel.paths) == {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                              "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
                              "config_sentence_transformers.json", "1_Pooling/config.json", "2_Dense/config.json",
                              "2_Dense/model.safetensors"}  # the Dense weights once, as vLLM loads them
    assert matched(sel.allow_patterns, SENTENCE_TRANSFORMERS_REPO) == sorted(sel.paths)
    # Without a listing the same files are asked for by pattern; the ONNX export's config is not one.
    [d] = hub.instance_downloads("BAAI/bge-m3")
    got = matched(d.allow_patterns, SENTENCE_TRANSFORMERS_REPO)
    assert {"modules.json", "1_Pooling/config.json", "2_Dense/model.safetensors"} <= set(got)
    assert "onnx/config.json" not in got and "onnx/model.onnx" not in got


def test_a_repo_without_modules_json_gets_no_module_folders():
    plain = [f for f in SENTENCE_TRANSFORMERS_REPO if f["path"] != "modules.json"]
    assert not [p for p in hub.select_files(plain).paths if "/" in p]


def test_old_format_module_weights_are_not_fetched_twice_and_a_tokenizer_repo_gets_no_module_weights():
    # 0_Transformer/ is the base model again in old repos: vLLM loads the top level's weights only.
    old = [*SENTENCE_TRANSFORMERS_REPO, {"path": "0_Transformer/pytorch_model.bin", "size": 10**9},
           {"path": "2_Dense/sub/model.safetensors", "size": 10}]
    paths = hub.select_files(old).paths
    assert "0_Transformer/pytorch_model.bin" not in paths and "2_Dense/sub/model.safetensors" not in paths
    tokenizer_only = hub.select_files(old, weights=False).paths
    assert "sentence_bert_config.json" in tokenizer_only  # tokenizers/hf.py reads it from a tokenizer repo
    assert not [p for p in tokenizer_only if "/" in p]
    # Without a listing the patterns name the usual folders and never reach deeper.
    [d] = hub.instance_downloads("BAAI/bge-m3")
    assert matched(d.allow_patterns, [{"path": "10_x/onnx/config.json"}, {"path": "2_Dense/sub/config.json"},
                                      {"path": "2_Dense/sub/pytorch_model.bin"}]) == []


# The shape of quantized checkpoints that keep their quantization in a file of their own beside
# config.json: GPTQ repos (TheBloke/Llama-2-7B-GPTQ: quantize_config.json) and ModelOpt exports
# (nvidia/Llama-3.1-8B-Instruct-FP8: hf_quant_config.json). Sizes invented.
@pytest.mark.parametrize("quant_file", ["quantize_config.json", "quant_config.json", "hf_quant_config.json"])
def test_a_quantized_checkpoints_own_quantization_file_comes_along(quant_file):
    """vLLM globs the model directory for the quant method's file when config.json has no
    quantization_config: offline, a start without it fails ("Cannot find the config file")."""
    listing = [{"path": p, "size": 1000} for p in ("config.json", "model.safetensors", "tokenizer.json",
                                                     quant_file, "README.md", "training_args.json")]
    sel = hub.select_files(listing)
    assert quant_file in sel.paths and "training_args.json" not in sel.paths
    assert matched(sel.allow_patterns, listing) == sorted(sel.paths)
    [d] = hub.instance_downloads("nvidia/Llama-3.1-8B-Instruct-FP8")  # no listing: asked for by name
    assert quant_file in matched(d.allow_patterns, listing)
