"""The instance key `adapters`: the LoRA adapters an instance serves beside its base model, each
under a name of its own that clients send as 'model'.

    adapters = [{"name": "support-bot", "source": "/srv/adapters/support-bot"},
                {"name": "sql", "model": "org/llama-sql-lora", "rank": 16,
                 "revision": "0123456789abcdef0123456789abcdef01234567"}]

An adapter comes from a directory on the workstation (`source`, synced to the host like a
model_source) or from the Hugging Face hub (`model`, downloaded before vLLM needs it; `revision`: a
commit). What vLLM needs to size its LoRA buffers is read from the adapter itself: the rank of a
source's adapter_config.json (its `r` and any `rank_pattern`); a hub adapter, which the plan cannot
read offline, gives it as `rank` (its adapter_config.json's `r`). The adapter's config is checked
here against what the pinned vLLM refuses at load time (vllm/lora/peft_helper.py:54-86), so a bad
adapter is refused before any host changes.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_fleet import kinds
from vllm_fleet.config.errors import Checker
from vllm_fleet.config.model_files import ModelFilesError, read_json

#: The ranks vLLM's --max-lora-rank takes (vllm/config/lora.py:27, MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
MAX_LORA_RANK = LORA_RANKS[-1]
#: A model whose vocabulary is larger cannot serve LoRA: vLLM's LogitsProcessorWithLoRA refuses it
#: (vllm/lora/layers/logits_processor.py:91-92).
MAX_LORA_VOCAB = 258048
#: The keys of one adapter entry.
ADAPTER_KEYS = ("name", "source", "model", "revision", "rank")
ADAPTER_CONFIG = "adapter_config.json"
_ADAPTER_CONFIG_BYTES = 1024 * 1024
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
EXAMPLE = ('adapters = [{"name": "support-bot", "source": "/srv/adapters/support-bot"}] (or "model": '
           '"org/adapter" with "rank": its adapter_config.json\'s r)')


@dataclass(frozen=True)
class Adapter:
    """One LoRA adapter of an instance."""

    name: str  # what clients send as 'model'
    rank: int  # the largest rank of its modules (r, rank_pattern)
    source: str | None = None  # a workstation directory, synced to the host
    model: str | None = None  # a Hugging Face id, downloaded on the host
    revision: str | None = None  # a commit of `model`

    @property
    def token(self) -> str:
        """A short, path-safe stand-in for the name (names may hold '/', ':' or '@'): the adapter's
        directory under the instance's, and the gateway's path to it."""
        return hashlib.sha256(self.name.encode()).hexdigest()[:16]

    def identity(self) -> tuple[str, str | None, int]:
        """What the adapter is, wherever it is served: its source directory, or its hub id and commit,
        and its rank (declared for a hub adapter: two ranks for one adapter size vLLM's buffers
        differently, and one of them is wrong)."""
        if self.source:
            return f"source:{self.source}", None, self.rank
        return f"hub:{self.model}", self.revision, self.rank

    def words(self) -> str:
        if self.source:
            return f"source {self.source}"
        return f"model {self.model}" + (f" at {self.revision}" if self.revision else "") + f" of rank {self.rank}"


def host_directory(models_dir: str, instance: str, adapter: Adapter) -> str:
    """Where a source adapter is synced on the host: a directory of its own under vllm_models_dir,
    outside every model directory (a synced model owns its whole subtree)."""
    return f"{models_dir.rstrip('/')}/.adapters/{instance}/{adapter.token}"


def hub_path(hf_home: str, adapter: Adapter) -> str:
    """Where a hub adapter is in the cache (huggingface_hub's layout: models--org--name), always an
    absolute path: with a revision its snapshot directory; without one the cache's refs/main, whose
    commit the loader (templates/vllm-adapters.py.j2) turns into the snapshot directory. Never the
    bare id: vLLM tries an id as a path relative to its working directory first
    (lora/utils.py get_adapter_absolute_path), the service user's own state directory."""
    assert adapter.model is not None
    folder = f"{hf_home.rstrip('/')}/hub/models--" + adapter.model.replace("/", "--")
    return f"{folder}/snapshots/{adapter.revision}" if adapter.revision else f"{folder}/refs/main"


def lora_rank(ranks: list[int]) -> int:
    """--max-lora-rank for adapters of these ranks: the smallest rank vLLM takes that holds them all,
    and at least vLLM's own default (16), so that adding a small adapter later changes nothing that
    needs a restart."""
    wanted = max([16, *ranks])
    return next(r for r in LORA_RANKS if r >= wanted)


#: The most adapters one batch serves (--max-loras): vLLM allocates LoRA buffers for every slot on
#: every GPU (plan/memory.py LoraBuffers), so past this more adapters share the slots, batch by batch.
MAX_LORAS_PER_BATCH = 16


def _power_of_two_at_least(count: int, floor: int) -> int:
    slots = floor
    while slots < count:
        slots *= 2
    return slots


def max_loras(count: int) -> int:
    """--max-loras (adapters in one batch) for `count` adapters: all of them, rounded up to a power of
    two and at least 4, so that adding an adapter rarely changes it (a change restarts vLLM: its LoRA
    buffers are sized by it), and at most MAX_LORAS_PER_BATCH."""
    return min(_power_of_two_at_least(count, 4), MAX_LORAS_PER_BATCH)


def max_cpu_loras(count: int) -> int | None:
    """--max-cpu-loras (adapters vLLM keeps loaded, in host memory) when more adapters than a batch
    holds: all of them, rounded up as max_loras is; None (vLLM's default, max-loras) otherwise."""
    return _power_of_two_at_least(count, 4) if count > MAX_LORAS_PER_BATCH else None


def read_rank(directory: str) -> tuple[int, str | None]:
    """(the largest rank, None) of an adapter directory's adapter_config.json, or (0, problem)."""
    path = Path(directory) / ADAPTER_CONFIG
    if not (path.is_file() or path.is_symlink()):
        return 0, f"{directory} has no {ADAPTER_CONFIG} on this workstation (not a PEFT LoRA adapter directory)"
    try:
        config = read_json(path, Path(directory), _ADAPTER_CONFIG_BYTES)
    except ModelFilesError as exc:
        return 0, str(exc)
    if not isinstance(config, dict):
        return 0, f"{path} is not a JSON object"
    problem = unsupported_problem(config)
    if problem:
        return 0, f"{path}: {problem}"
    ranks = [config.get("r"), *((config.get("rank_pattern") or {}).values())]
    if any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        return 0, f"{path}: r (and rank_pattern's ranks) must be positive whole numbers, got {ranks!r}"
    return max(ranks), None


def unsupported_problem(config: dict) -> str | None:
    """What vLLM refuses in an adapter_config.json as it loads it (PEFTHelper._validate_features and
    validate_legal, vllm/lora/peft_helper.py:54-86, 188-200), or None."""
    peft_type = config.get("peft_type", "LORA")
    if str(peft_type).upper() != "LORA":
        return f"peft_type {peft_type!r}: vLLM serves LoRA adapters only"
    if config.get("use_dora"):
        return "use_dora: vLLM does not support DoRA"
    if config.get("bias", "none") != "none" or config.get("lora_bias"):
        return "bias: vLLM does not support LoRA bias"
    if config.get("modules_to_save"):
        return "modules_to_save: vLLM loads an adapter's A/B matrices only (not whole modules)"
    if "lora_alpha" not in config or "target_modules" not in config or "r" not in config:
        return "r, lora_alpha and target_modules are required (vLLM's PEFTHelper)"
    return None


def parse_adapters(check: Checker, raw: Any, instance: str, key: str = "adapters",
                   settings: Any = None) -> tuple[Adapter, ...]:
    """`adapters`: a list of {"name", "source"} or {"name", "model"[, "revision"], "rank"} entries."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)):
        check.error(f"expected a list of adapters, got {type(raw).__name__}", instance=instance, key=key,
                    fix=EXAMPLE)
        return ()
    out: list[Adapter] = []
    seen: set[str] = set()
    for position, entry in enumerate(raw):
        where = f"{key}[{position}]"
        if not isinstance(entry, dict):
            check.error(f"expected a dict, got {type(entry).__name__}", instance=instance, key=where, fix=EXAMPLE)
            continue
        adapter = _parse_entry(check, entry, instance, where)
        if adapter is None:
            continue
        if adapter.name in seen:
            check.error(f"the adapter name {adapter.name!r} is listed twice", instance=instance,
                        key=f"{where}.name", fix="give each adapter its own name")
            continue
        seen.add(adapter.name)
        out.append(adapter)
    return tuple(out)


def _parse_entry(check: Checker, entry: dict, instance: str, where: str) -> Adapter | None:
    errors = len(check.errors)
    check.unknown_keys(entry, ADAPTER_KEYS, instance=instance, prefix=f"{where}.")
    name = entry.get("name")
    problem = kinds.served_name_problem(name)
    if problem:
        check.error(problem, instance=instance, key=f"{where}.name",
                    fix='"name": "support-bot" (what clients send as model: letters, digits and . _ : / @ + = % , -)')
    source, model, revision, rank = (entry.get(k) for k in ("source", "model", "revision", "rank"))
    if (source is None) == (model is None):
        check.error("an adapter has either 'source' (a directory on this workstation) or 'model' (a Hugging "
                    "Face id), and not both", instance=instance, key=where, fix=EXAMPLE)
        return None
    if revision is not None and (model is None or not isinstance(revision, str)
                                 or not _COMMIT_RE.fullmatch(revision)):
        check.error(f"revision {revision!r}: a hub adapter's commit, 40 lowercase hex digits", instance=instance,
                    key=f"{where}.revision", fix='"revision": "<the commit hash the hub shows>", or leave it out')
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
        check.error(f"rank must be a whole number of at least 1, got {rank!r}", instance=instance,
                    key=f"{where}.rank", fix='"rank": 16 (the r of its adapter_config.json)')
        rank = None
    if source is not None:
        read = _source_rank(check, source, instance, where)
        if read and rank is not None and rank != read:
            check.error(f"rank {rank} but {source}/{ADAPTER_CONFIG} says {read}", instance=instance,
                        key=f"{where}.rank", fix="leave 'rank' out for a source adapter (it is read from it)")
        rank = read
    else:
        problem = kinds.model_reference_problem(model) if isinstance(model, str) else f"{model!r} is not a string"
        if problem or not isinstance(model, str) or model.startswith("/"):
            check.error(problem or f"{model!r}: a hub adapter is a Hugging Face id (an adapter on the workstation "
                        "is a 'source')", instance=instance, key=f"{where}.model",
                        fix='"model": "org/adapter-name" (or "source": "/path/on/this/workstation")')
        if rank is None and not problem:
            check.error("a hub adapter needs 'rank': the plan sizes vLLM's LoRA buffers without reaching the hub",
                        instance=instance, key=f"{where}.rank",
                        fix='"rank": 16 (the r of its adapter_config.json on the hub)')
    if rank and rank > MAX_LORA_RANK:
        check.error(f"rank {rank} is above {MAX_LORA_RANK}, the largest --max-lora-rank vLLM takes "
                    f"({', '.join(map(str, LORA_RANKS))})", instance=instance, key=f"{where}.rank",
                    fix=f"use an adapter of rank at most {MAX_LORA_RANK} (retrain it with a smaller r)")
    if len(check.errors) > errors or not isinstance(name, str) or not rank:
        return None
    return Adapter(name=name, rank=rank, source=source, model=model, revision=revision)


def _source_rank(check: Checker, source: Any, instance: str, where: str) -> int:
    """The rank of a source adapter's directory, reporting why it cannot be read."""
    if not isinstance(source, str) or not source.strip() or not kinds.printable(source):
        check.error(f"{source!r} is not a directory path", instance=instance, key=f"{where}.source",
                    fix='"source": "/srv/adapters/support-bot" (a PEFT adapter directory on this workstation)')
        return 0
    path = Path(source).expanduser()
    if not path.is_absolute():
        check.error(f"{source!r} is not an absolute path (it would depend on where vllm-fleet runs)",
                    instance=instance, key=f"{where}.source", fix=f'"source": "/.../{source}"')
        return 0
    if not path.is_dir():
        check.error(f"{source} is not a directory on this workstation", instance=instance, key=f"{where}.source",
                    fix="point source at the adapter's directory (adapter_config.json and "
                        "adapter_model.safetensors)")
        return 0
    rank, problem = read_rank(str(path))
    if problem:
        check.error(problem, instance=instance, key=f"{where}.source",
                    fix="point source at a PEFT LoRA adapter directory vLLM can load")
    return rank
