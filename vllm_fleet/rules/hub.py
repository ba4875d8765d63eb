"""What to fetch from the Hugging Face hub for an instance, how long to allow, and why it failed.

Pure functions (no I/O at import, no network). The deploy lists a repo (on the host, see
`listing_script`), picks the files here with `select_files`/`instance_downloads`, and runs
`download_script` on the host as the service user with HF_HOME set and the token in the environment.

Weight-format choice follows vLLM's own loader:
vllm/model_executor/model_loader/default_loader.py, `DefaultModelLoader._prepare_weights`
(vllm-project/vllm): with load_format "auto" it picks "mistral" when the repo has
`consolidated*.safetensors`, otherwise "hf", whose allow_patterns are ["*.safetensors", "*.bin"] plus
"*.pt" (fall_back_to_pt); `download_weights_from_hf` (weight_utils.py) lists the repo's TOP-LEVEL files
(`HfFileSystem.ls`, not recursive) and keeps only the FIRST pattern that matches anything, then globs
the top level of the snapshot. So: safetensors when present, *.bin only without safetensors, *.pt last;
`*.pth` never matches, files under `original/` are never looked at; with safetensors the
`model.safetensors.index.json` is fetched too (`download_safetensors_index_file_from_hf`); for *.bin/*.pt
`filter_files_not_needed_for_inference` drops training_args.bin, optimizer.bin/.pt, scheduler.pt,
scaler.pt. GGUF: vLLM loads the one named .gguf file and reads config and tokenizer from `--tokenizer`.

We return exact paths (glob-escaped) as allow_patterns rather than vLLM's "*.safetensors": fnmatch's
"*" crosses "/", so "*.safetensors" would also pull e.g. `original/model.safetensors` (gpt-oss).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from typing import Iterable, Mapping, TypeGuard

#: Files vLLM (transformers' AutoConfig/AutoTokenizer/AutoProcessor) reads besides the weights.
#: A quantized checkpoint whose config.json has no quantization_config keeps it in a file of its own,
#: which vLLM globs in the model directory (model_loader/weight_utils.py get_quant_config: the quant
#: method's get_config_filenames: GPTQ, AWQ, MoE-WNA16 quantize_config.json, AWQ quant_config.json,
#: ModelOpt hf_quant_config.json, which transformers_utils/config.py also reads for the method).
CONFIG_FILES = ("config.json", "generation_config.json",
                "quantize_config.json", "quant_config.json", "hf_quant_config.json")
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
    "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt", "chat_template.jinja",
    "chat_template.json",
    # multimodal processors (Gemma 3, Qwen-VL, ...)
    "preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
    # mistral_common tokenizers (tokenizer_mode auto picks them when present)
    "tekken.json",
)
#: A sentence-transformers repo (embedding models): vLLM reads its modules (modules.json: the pooling
#: and normalisation it applies, the Dense projections it loads), its tokenizer settings
#: (sentence_*_config.json), and the prompts of config_sentence_transformers.json
#: (transformers_utils/config.py: get_pooling_config, get_sentence_transformer_tokenizer_config,
#: try_get_dense_modules; entrypoints/pooling/embed/io_processor.py).
SENTENCE_TRANSFORMERS_FILES = (
    "modules.json", "config_sentence_transformers.json", "sentence_bert_config.json",
    "sentence_roberta_config.json", "sentence_distilbert_config.json", "sentence_camembert_config.json",
    "sentence_albert_config.json", "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json",
)
#: A module's own folder (sentence-transformers names it <index>_<Class>: 1_Pooling, 2_Dense): its
#: config; a Dense module's weights too (adapters._load_dense_weights: model.safetensors, else
#: pytorch_model.bin).
SENTENCE_TRANSFORMERS_MODULE_CONFIG = re.compile(r"[0-9]+_[^/]+/config\.json")
SENTENCE_TRANSFORMERS_DENSE_WEIGHTS = re.compile(r"([0-9]+_Dense[^/]*)/(model\.safetensors|pytorch_model\.bin)")
#: The module files without a listing, as snapshot_download's patterns (fnmatch: "*" would cross
#: "/", so none is used): the usual single-digit module folders.
SENTENCE_TRANSFORMERS_MODULE_PATTERNS = ("[0-9]_Pooling/config.json", "[0-9]_Dense/config.json",
                                         "[0-9]_Dense/model.safetensors", "[0-9]_Dense/pytorch_model.bin")
#: Mistral-format repos: config and index that go with consolidated*.safetensors.
MISTRAL_FILES = ("params.json", "consolidated.safetensors.index.json")
SAFETENSORS_INDEX = "model.safetensors.index.json"
#: weight_utils.filter_files_not_needed_for_inference
NOT_FOR_INFERENCE = ("training_args.bin", "optimizer.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")


@dataclass(frozen=True)
class RepoFile:
    path: str
    size: int | None  # bytes; None where the listing did not say


@dataclass(frozen=True)
class Selection:
    """The files of one repo that vLLM loads."""

    files: tuple[RepoFile, ...]
    #: "safetensors", "mistral", "bin", "pt", "gguf" or "none" (config/tokenizer only)
    weight_format: str
    total_bytes: int  # sum of the known sizes
    unknown_sizes: tuple[str, ...] = ()  # paths whose size the listing did not give

    @property
    def paths(self) -> list[str]:
        return [f.path for f in self.files]

    @property
    def allow_patterns(self) -> list[str]:
        """For `snapshot_download(allow_patterns=...)`: each exact path, fnmatch-escaped."""
        return [_fnmatch_escape(p) for p in self.paths]


@dataclass(frozen=True)
class RepoDownload:
    """One snapshot_download an instance needs."""

    repo: str
    allow_patterns: tuple[str, ...]
    total_bytes: int | None  # None without a listing
    why: str
    selection: Selection | None = field(default=None, compare=False)
    revision: str | None = None  # a commit (a LoRA adapter's "revision"); None: the repo's main
    adapter: bool = False  # a LoRA adapter's files (adapter_download), not a model's

    @property
    def marker_key(self) -> str:
        """What complete_marker and the HubModelCached fact name it by: a revision is a download of its own."""
        return f"{self.repo}@{self.revision}" if self.revision else self.repo


def _fnmatch_escape(path: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", path)


def _normalise(listing) -> list[RepoFile]:
    """Accept RepoFile, {"path", "size"} dicts (HF tree API / fixtures) or (path, size) pairs."""
    out = []
    for item in listing:
        if isinstance(item, RepoFile):
            out.append(item)
        elif isinstance(item, Mapping):
            size = item.get("size")
            if isinstance(item.get("lfs"), Mapping) and item["lfs"].get("size") is not None:
                size = item["lfs"]["size"]
            out.append(RepoFile(str(item.get("path") or item.get("rfilename")),
                                None if size is None else int(size)))
        else:
            path, size = item
            out.append(RepoFile(str(path), None if size is None else int(size)))
    return out


def select_files(listing: Iterable, *, gguf_file: str | None = None, weights: bool = True) -> Selection:
    """Choose what vLLM loads from a repo listing (paths with sizes).

    gguf_file: a GGUF repo: only that file (config and tokenizer come from the tokenizer repo).
    weights=False: config and tokenizer files only (the tokenizer repo of a GGUF instance).
    Raises ValueError when the repo holds nothing vLLM could load.
    """
    files = _normalise(listing)
    by_path = {f.path: f for f in files}
    if gguf_file is not None:
        if gguf_file not in by_path:
            ggufs = sorted(p for p in by_path if p.endswith(".gguf"))
            raise ValueError(f"{gguf_file} is not in the repo (its .gguf files: {', '.join(ggufs) or 'none'})")
        return _selection([by_path[gguf_file]], "gguf")

    top = [f for f in files if "/" not in f.path]  # vLLM only looks at the top level
    names = {f.path for f in top}
    # Top-level *.py: a repo's own model/tokenizer code, which `trust-remote-code` imports at start
    # (offline then, so it must be here); a few KB, harmless without that flag.
    # A sentence-transformers model's settings come too (the tokenizer's as well: tokenizers/hf.py
    # reads them from a tokenizer repo), and its modules' files where it has them (modules.json).
    chosen = [f for f in top if f.path in CONFIG_FILES or f.path in TOKENIZER_FILES
              or f.path in SENTENCE_TRANSFORMERS_FILES or f.path.endswith(".py")]
    if weights and "modules.json" in names:
        chosen += _sentence_transformers_modules(files)
    if not weights:
        if "config.json" not in names:
            raise ValueError("no config.json at the top of the repo (vLLM reads the model config from it)")
        return _selection(chosen, "none")

    def glob(suffix: str, prefix: str = "") -> list[RepoFile]:
        return [f for f in top if f.path.endswith(suffix) and f.path.startswith(prefix)]

    mistral = glob(".safetensors", "consolidated")
    if mistral:  # load_format auto -> "mistral" (default_loader._prepare_weights)
        extra = [f for f in top if f.path in MISTRAL_FILES and f not in chosen]
        return _selection(chosen + extra + mistral, "mistral")
    for fmt, suffix in (("safetensors", ".safetensors"), ("bin", ".bin"), ("pt", ".pt")):
        found = [f for f in glob(suffix) if f.path not in NOT_FOR_INFERENCE]
        if found:
            if fmt == "safetensors" and SAFETENSORS_INDEX in names:
                found.append(by_path[SAFETENSORS_INDEX])
            if "config.json" not in names:
                raise ValueError("no config.json at the top of the repo (vLLM reads the model config from it)")
            return _selection(chosen + found, fmt)
    raise ValueError("no weights vLLM loads at the top of the repo (*.safetensors, *.bin or *.pt); "
                     "*.pth and files under subfolders such as original/ are not loaded")


def _sentence_transformers_modules(files: list[RepoFile]) -> list[RepoFile]:
    """Each module folder's config.json, and a Dense module's weights in one format (safetensors
    first, as vLLM loads them)."""
    out = [f for f in files if SENTENCE_TRANSFORMERS_MODULE_CONFIG.fullmatch(f.path)]
    weights: dict[str, RepoFile] = {}
    for f in sorted(files, key=lambda f: not f.path.endswith(".safetensors")):
        found = SENTENCE_TRANSFORMERS_DENSE_WEIGHTS.fullmatch(f.path)
        if found:
            weights.setdefault(found.group(1), f)
    return out + list(weights.values())


def _selection(files: list[RepoFile], fmt: str) -> Selection:
    files = sorted(dict.fromkeys(files), key=lambda f: f.path)
    return Selection(files=tuple(files), weight_format=fmt,
                     total_bytes=sum(f.size for f in files if f.size is not None),
                     unknown_sizes=tuple(f.path for f in files if f.size is None))


def split_hub_gguf(model: str) -> tuple[str, str] | None:
    """'owner/repo/file.gguf' -> ('owner/repo', 'file.gguf'); None for anything else."""
    parts = model.split("/")
    if len(parts) >= 3 and model.lower().endswith(".gguf") and not model.startswith("/"):
        return "/".join(parts[:2]), "/".join(parts[2:])
    return None


def is_hub_id(name: str | None) -> TypeGuard[str]:
    if not name:
        return False
    return not name.startswith(("/", ".", "~")) and name.count("/") >= 1


def instance_downloads(model: str, tokenizer: str | None = None, *,
                       listings: Mapping[str, Iterable] | None = None) -> list[RepoDownload]:
    """Every (repo, allow_patterns) an instance loads from the hub, before it may start offline.

    model: a hub id ('Qwen/Qwen2.5-14B-Instruct'), a hub GGUF ('owner/repo/file.gguf') or a local
    path (nothing to fetch). tokenizer: the instance's tokenizer; a hub id is fetched with config and
    tokenizer files only (for a GGUF model the loader also reads the model config from it).
    listings: repo -> file listing; without one for a repo, allow_patterns fall back to the
    config/tokenizer names plus the weight globs vLLM itself would use, and total_bytes is None.
    """
    listings = listings or {}
    out: list[RepoDownload] = []
    gguf = split_hub_gguf(model)
    if gguf:
        repo, fname = gguf
        out.append(_download(repo, listings, why=f"GGUF weights {fname}", gguf_file=fname))
    elif is_hub_id(model) and not model.lower().endswith(".gguf"):
        out.append(_download(model, listings, why="config, tokenizer and weights"))
    if is_hub_id(tokenizer) and tokenizer != model and not any(d.repo == tokenizer for d in out):
        why = ("tokenizer and model config of the GGUF model" if model.lower().endswith(".gguf")
               else "tokenizer")
        out.append(_download(tokenizer, listings, why=why, weights=False))
    return out


#: A PEFT LoRA adapter as vLLM loads it (vllm/lora/lora_model.py: adapter_config.json, then
#: adapter_model.safetensors, else adapter_model.bin).
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")


def adapter_download(repo: str, revision: str | None = None, *, name: str,
                     listing: Iterable | None = None) -> RepoDownload:
    """The files of a LoRA adapter's repo that vLLM loads: its config and one weights file (the
    safetensors where the repo has both). ValueError for a listing without them."""
    why = f"LoRA adapter {name}"
    if listing is None:
        patterns = (ADAPTER_CONFIG_FILE, *ADAPTER_WEIGHTS)
        return RepoDownload(repo, patterns, None, why, revision=revision, adapter=True)
    sizes = {f.path: f.size for f in _normalise(listing)}
    weights = next((w for w in ADAPTER_WEIGHTS if w in sizes), None)
    if ADAPTER_CONFIG_FILE not in sizes or weights is None:
        raise ValueError(f"{repo} has no {ADAPTER_CONFIG_FILE} and adapter_model.safetensors (or .bin) at its "
                         "top level: not a PEFT LoRA adapter vLLM loads")
    chosen = (ADAPTER_CONFIG_FILE, weights)
    return RepoDownload(repo, tuple(_fnmatch_escape(p) for p in chosen), sum(sizes[p] or 0 for p in chosen), why,
                        revision=revision, adapter=True)


def _download(repo: str, listings, *, why: str, gguf_file: str | None = None,
              weights: bool = True) -> RepoDownload:
    if repo in listings:
        sel = select_files(listings[repo], gguf_file=gguf_file, weights=weights)
        return RepoDownload(repo, tuple(sel.allow_patterns), sel.total_bytes, why, sel)
    if gguf_file:
        patterns = [_fnmatch_escape(gguf_file)]
    else:
        # No listing: names at the top level only ("[!/]" keeps "*" out of subfolders).
        patterns = list(CONFIG_FILES + TOKENIZER_FILES + SENTENCE_TRANSFORMERS_FILES)
        if weights:
            patterns += ["[!/]*.safetensors", SAFETENSORS_INDEX, *SENTENCE_TRANSFORMERS_MODULE_PATTERNS]
    return RepoDownload(repo, tuple(patterns), None, why)


# --- timeout -----------------------------------------------------------------------------------

#: The slowest link we plan for: 50 Mbit/s (6.25 MB/s) sustained from the hub (or its mirror).
MIN_LINK_BYTES_PER_S = 50_000_000 // 8
DOWNLOAD_TIMEOUT_FLOOR_S = 15 * 60  # resolving, listing and small files on a slow start
DOWNLOAD_TIMEOUT_CAP_S = 24 * 3600  # past a day something is wrong; pre-seed the host instead
DOWNLOAD_OVERHEAD_S = 120


COMPLETE_DIR = ".vllm-fleet-complete"  # under HF_HOME: one file per repo whose download finished


def complete_marker(hf_home: str, repo: str) -> str:
    """Written after a download of `repo` succeeded: config.json alone would also be there after an
    interrupted one (shards missing), and a GGUF repo has none."""
    return f"{hf_home}/{COMPLETE_DIR}/{repo.replace('/', '--')}"


def download_timeout_s(total_bytes: int | None) -> int:
    """Seconds allowed for a download of total_bytes at MIN_LINK_BYTES_PER_S, within floor and cap.

    Unknown size (None) gets the cap: refusing a big download too early costs more than waiting.
    """
    if total_bytes is None:
        return DOWNLOAD_TIMEOUT_CAP_S
    seconds = DOWNLOAD_OVERHEAD_S + -(-int(total_bytes) // MIN_LINK_BYTES_PER_S)
    return int(min(DOWNLOAD_TIMEOUT_CAP_S, max(DOWNLOAD_TIMEOUT_FLOOR_S, seconds)))


# --- the script on the host ----------------------------------------------------------------------

PROGRESS_PREFIX = "vllm-fleet-download: progress"
RESULT_PREFIX = "vllm-fleet-download: result "
TIMEOUT_MARKER = "vllm-fleet-download: timed out"

_SCRIPT = r'''
import json, os, sys, threading, time
REPO = {repo!r}
REVISION = {revision!r}
ALLOW = {allow!r}
EXPECTED = {expected!r}
INTERVAL = {interval!r}
RESULT = {result_prefix!r}
PROGRESS = {progress_prefix!r}
start = time.time()
# The token comes from the environment only (HF_TOKEN, read by huggingface_hub itself).
hf_home = os.environ.get("HF_HOME") or os.path.expanduser("~/.cache/huggingface")
blobs = os.path.join(hf_home, "hub", "models--" + REPO.replace("/", "--"), "blobs")

def on_disk():
    total = 0
    try:
        for entry in os.scandir(blobs):
            try:
                total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                pass
    except OSError:
        pass
    return total

base = on_disk()
done = threading.Event()

def report():
    last_t, last_b = time.time(), 0
    while not done.wait(INTERVAL):
        now, got = time.time(), max(0, on_disk() - base)
        rate = (got - last_b) / max(now - last_t, 1e-6)
        total = " total=%d" % EXPECTED if EXPECTED else ""
        print("%s repo=%s bytes=%d%s rate=%.1fMB/s elapsed=%ds" % (
            PROGRESS, REPO, got, total, rate / 1e6, now - start), flush=True)
        last_t, last_b = now, got

threading.Thread(target=report, daemon=True).start()
try:
    from huggingface_hub import snapshot_download
    path = snapshot_download(REPO, allow_patterns=ALLOW, **({{"revision": REVISION}} if REVISION else {{}}))
except BaseException as exc:
    done.set()
    print(RESULT + json.dumps({{"ok": False, "repo": REPO, "error": type(exc).__name__,
                                "message": str(exc)[-2000:], "bytes": max(0, on_disk() - base),
                                "seconds": round(time.time() - start, 1)}}), flush=True)
    print("%s: %s" % (type(exc).__name__, exc), file=sys.stderr, flush=True)
    sys.exit(1)
done.set()
print(RESULT + json.dumps({{"ok": True, "repo": REPO, "path": path, "bytes": max(0, on_disk() - base),
                            "seconds": round(time.time() - start, 1)}}), flush=True)
'''


def download_script(repo: str, allow_patterns: Iterable[str], *, expected_bytes: int | None = None,
                    interval_s: float = 30.0, revision: str | None = None) -> str:
    """Python source run on the host (as the service user, HF_HOME set, HF_TOKEN in its environment).

    Calls snapshot_download(repo, allow_patterns=...), prints a progress line (bytes so far, rate)
    every interval_s, and ends with one `RESULT_PREFIX + json` line ({"ok", "repo", "path"|"error",
    "message", "bytes", "seconds"}). It holds no token and takes none as an argument.
    """
    return _SCRIPT.format(repo=repo, revision=revision, allow=list(allow_patterns), expected=expected_bytes,
                          interval=float(interval_s), result_prefix=RESULT_PREFIX,
                          progress_prefix=PROGRESS_PREFIX).lstrip()


def download_command(python_bin: str, script: str, *, hf_home: str, user: str, timeout_s: int,
                     token_file: str | None = None) -> str:
    """The shell line that runs `script` on the host (the tiny runner).

    The token is sourced from a root-only env file into the environment (runuser keeps it); argv
    holds the interpreter, `-c` and the script, which contains no token. A `timeout` kill prints
    TIMEOUT_MARKER so `explain_download_failure` can tell a slow link from a dead one.
    """
    env = f"set -a && . {shlex.quote(token_file)} && set +a && " if token_file else ""
    return (f"{env}HF_HOME={shlex.quote(hf_home)} timeout {int(timeout_s)} runuser -u {shlex.quote(user)} -- "
            f"{shlex.quote(python_bin)} -c {shlex.quote(script)}; rc=$?; "
            f"if [ $rc = 124 ]; then echo '{TIMEOUT_MARKER} after {int(timeout_s)} s' >&2; fi; exit $rc")


def listing_script(repo: str, revision: str | None = None) -> str:
    """Python source that prints the repo's file listing ([{"path", "size"}...]) as one JSON line."""
    at = f", revision={revision!r}" if revision else ""
    return ("import json\nfrom huggingface_hub import HfApi\n"
            f"files = [f for f in HfApi().list_repo_tree({repo!r}, recursive=True{at}) if hasattr(f, 'size')]\n"
            "print(json.dumps([{'path': f.path, 'size': f.size} for f in files]))\n")


def parse_result(output: str) -> dict | None:
    """The final machine-readable line of download_script's output, or None."""
    for line in reversed(output.splitlines()):
        if line.startswith(RESULT_PREFIX):
            try:
                return json.loads(line[len(RESULT_PREFIX):])
            except ValueError:
                return None
    return None


# --- why it failed ---------------------------------------------------------------------------------

# huggingface_hub.errors class names (huggingface_hub 2.x; also in 0.2x): GatedRepoError is a
# RepositoryNotFoundError subclass; LocalEntryNotFoundError is raised when the hub cannot be reached
# and nothing is cached; OfflineModeIsEnabled when HF_HUB_OFFLINE is set.
_GATED = re.compile(r"GatedRepoError|gated repo|Access to model \S+ is restricted", re.I)
_MISSING = re.compile(r"\b(?:RepositoryNotFoundError|RevisionNotFoundError|(?:Remote)?EntryNotFoundError)\b|"
                      r"Repository Not Found|Revision Not Found|404 Client Error", re.I)
_DENIED = re.compile(r"\b40[13] Client Error|\b40[13] (?:Unauthorized|Forbidden)", re.I)
_NO_NET = re.compile(r"LocalEntryNotFoundError|OfflineModeIsEnabled|Temporary failure in name resolution|"
                     r"Name or service not known|nodename nor servname|Failed to resolve|NameResolutionError|"
                     r"NewConnectionError|ConnectError|ConnectionError|Connection refused|"
                     r"Network is unreachable|No route to host|Max retries exceeded|"
                     r"connection (?:timed out|attempt failed)|ConnectTimeout", re.I)
_PROGRESS_BYTES = re.compile(re.escape(PROGRESS_PREFIX) + r".*?\bbytes=(\d+)")


def explain_download_failure(stderr_text: str, has_token: bool) -> str:
    """One sentence naming the cause of a failed download and what to do.

    stderr_text: the download's output (stdout and stderr together: the progress lines matter).
    """
    text = stderr_text or ""
    result = parse_result(text) or {}
    error = result.get("error", "")
    got = max([int(b) for b in _PROGRESS_BYTES.findall(text)] + [int(result.get("bytes") or 0)])
    if "No space left on device" in text:
        return "the disk holding HF_HOME is full: free space or point vllm_hf_home at a larger disk"
    if TIMEOUT_MARKER in text:
        if got > 0:
            return (f"slow link: the time limit ran out while data was still arriving ({got} bytes "
                    "received); raise the download timeout, use a faster mirror (HF_ENDPOINT) or copy "
                    "the model to the host and set 'model' to its path")
        return ("no network: the time limit ran out and no data arrived (the hub cannot be reached "
                "from the host); give it access or copy the model to the host")
    gated = error == "GatedRepoError" or (not error and _GATED.search(text))
    missing = error in ("RepositoryNotFoundError", "RevisionNotFoundError", "EntryNotFoundError",
                        "RemoteEntryNotFoundError") or (not error and not gated and _MISSING.search(text))
    if gated or (not missing and not error and _DENIED.search(text)):
        if not has_token:
            return ("gated repo and no token: accept the model's license on huggingface.co and set "
                    "the token on the workstation (HF_TOKEN, or the variable vllm_hf_token_env names)")
        return ("gated repo: the token has no access to it; accept the model's license on "
                "huggingface.co with the account the token belongs to")
    if missing:
        hint = "" if has_token else " (or it is private/gated and no token was given)"
        return f"missing repo: the hub has no such model, revision or file{hint}; check the 'model' id"
    if error in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or _NO_NET.search(text):
        return ("no network: the host cannot reach the Hugging Face hub (DNS or connection failed); "
                "give it access (or HF_ENDPOINT to a mirror) or copy the model to the host")
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "no output")
    return f"download failed: {last[-300:]}"
