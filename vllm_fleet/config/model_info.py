"""The instance key `model_info`: a model's shape from its config.json as it is, pasted as a dict or
given as the path of the model's directory (or of its config.json) on this workstation.

config.json is read as transformers and vLLM read it: a multimodal config keeps the language model
in `text_config` (Gemma 3, Mistral Small 3.1); a key a published config leaves out takes the
default of its model_type's transformers config class (_DEFAULTS: Gemma 3's head_dim 256);
`dtype` (transformers >= 4.56) or `torch_dtype`; the sliding window as catalog.attention_from_config
reads it (sliding_window, use_sliding_window, layer_types, sliding_window_pattern); a MoE model's
experts (num_experts, num_local_experts or n_routed_experts, and moe_intermediate_size). Every other
key is ignored. What the planner uses is checked strictly (types, bounds), each refusal naming the
host, the instance, the key and the fix. The compact entry `vllm-fleet model-info` prints uses the
same names (ModelInfo's fields), so both read alike.

The weights' size: `weights_gib` when given; for a path, the safetensors index or files beside
config.json (model_files.py); else derived from the shape as the catalog derives it
(catalog.derived_weights_gib), which a quantized or multimodal config cannot be.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Mapping

from vllm_fleet.catalog import DTYPE_BYTES, GIB, ModelInfo, attention_from_config, derived_weights_gib
from vllm_fleet.config.errors import Checker, ConfigError, did_you_mean
from vllm_fleet.config.model_files import ModelFilesError, read_model_files

#: The largest value each number may take: beyond what any model has (a typo, or hostile input
#: that would make the planner build huge tables).
BOUNDS = {
    "num_hidden_layers": 4096, "num_attention_heads": 16384, "num_key_value_heads": 16384,
    "head_dim": 65536, "hidden_size": 1 << 20, "intermediate_size": 1 << 24, "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 31, "sliding_window": 1 << 31, "sliding_window_pattern": 4096,
    "num_experts": 1 << 16, "moe_intermediate_size": 1 << 24,
}
MAX_WEIGHTS_GIB = float(1 << 20)
REQUIRED = ("num_hidden_layers", "num_attention_heads", "hidden_size", "intermediate_size", "vocab_size")
#: What config.json's dtype may say, and the quantized GGUF of a catalog-like entry.
DTYPES = tuple(sorted(DTYPE_BYTES)) + ("gguf",)
LAYER_KINDS = ("full_attention", "sliding_attention")
#: transformers' defaults for keys published configs leave out, by the text model's model_type
#: (Gemma3TextConfig, Gemma2Config, GemmaConfig __init__): google/gemma-3-12b-it's text_config has
#: no head_dim (256, not hidden_size / heads = 240), vocab_size or max_position_embeddings.
_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"head_dim": 256, "vocab_size": 262208, "max_position_embeddings": 131072,
                    "sliding_window": 4096, "tie_word_embeddings": True},
    "gemma2": {"head_dim": 256, "vocab_size": 256000, "max_position_embeddings": 8192,
               "sliding_window": 4096, "tie_word_embeddings": True},
    "gemma": {"head_dim": 256, "tie_word_embeddings": True},
}
_TEXT_MODEL_TYPE = {"gemma3": "gemma3_text"}  # a multimodal config's text model, by its own model_type
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")
#: Every key of config.json (or of its text_config) the shape is read from; the others are ignored.
READ_KEYS = frozenset(REQUIRED + _EXPERT_KEYS + (
    "num_key_value_heads", "head_dim", "max_position_embeddings", "moe_intermediate_size", "sliding_window",
    "sliding_window_pattern", "use_sliding_window", "layer_types", "dtype", "torch_dtype", "tie_word_embeddings",
    "model_type", "text_config", "quantization_config", "kv_lora_rank", "weights_gib", "architectures",
    "sentence_transformers"))
#: vllm-fleet's own keys beside a pasted config.json's.
OWN_KEYS = ("weights_gib", "sentence_transformers")
#: At most this many architectures, each a Python class name of at most 128 characters.
MAX_ARCHITECTURES = 16
EXAMPLE = ("model_info = {...the model's config.json...} (pasted as it is), or "
           "model_info = '/srv/models/<model>' (its directory on this workstation)")


@dataclass
class _Reading:
    """One model_info being read: where errors go and how they name keys."""

    check: Checker
    instance: str
    prefix: str  # "model_info." for a dict, "" when the errors name the file
    source: str  # "" for a dict, "<path>: " for a file
    ok: bool = True

    def error(self, key: str, message: str, fix: str) -> None:
        """A refused value: a dict's errors name model_info.<key>; a file's name the file and its key."""
        self.ok = False
        if self.prefix:
            self.check.error(message, instance=self.instance, key=self.prefix + key if key else "model_info",
                             fix=fix)
        else:
            self.check.error(f"{self.source}{key + ' ' if key else ''}{message}", instance=self.instance,
                             key="model_info", fix=fix)


def _value(text: Mapping[str, Any], defaults: Mapping[str, Any], key: str) -> Any:
    """config.json's value of `key` (null as absent), else its model type's default."""
    value = text.get(key)
    return defaults.get(key) if value is None else value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(reading: _Reading, key: str, value: Any, fix: str) -> int | None:
    bound = BOUNDS[key.split(".")[-1]]
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= bound:
        reading.error(key, f"must be a whole number from 1 to {bound}, got {_shown(value)}", fix)
        return None
    return value


def _text_part(config: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """(the language model's config, the key prefix it was found under)."""
    text = config.get("text_config")
    if "num_hidden_layers" not in config and isinstance(text, Mapping):
        return text, "text_config."
    return config, ""


def _weights(reading: _Reading, config: Mapping[str, Any], text: Mapping[str, Any], given: Any,
             weights_bytes: int | None, shape: ModelInfo) -> float | None:
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, (int, float)) or not math.isfinite(given) \
                or not 0 < given <= MAX_WEIGHTS_GIB:
            reading.error("weights_gib", f"must be the weights' size in GiB (a number above 0), got {_shown(given)}",
                          "'weights_gib': 15.26 (the *.safetensors files' bytes / 1024**3)")
            return None
        return float(given)
    if weights_bytes:
        return weights_bytes / GIB
    why = ("it is quantized (quantization_config): its files are smaller than its shape says"
           if "quantization_config" in config or "quantization_config" in text else
           "it is multimodal: its encoders' weights are not in the text model's shape"
           if text is not config else
           f"its dtype {shape.dtype!r} has no fixed size" if derived_weights_gib(shape) is None else None)
    if why is None:
        return derived_weights_gib(shape)
    reading.error("weights_gib", f"the weights' size is not in config.json, and cannot be derived from the shape: "
                  f"{why}", "add 'weights_gib': <the *.safetensors files' bytes / 1024**3> beside the pasted "
                  "config, or give model_info as the model's directory (its safetensors index says it); "
                  "`vllm-fleet model-info MODEL_DIR|HF_ID` prints both")
    return None


def _attention(reading: _Reading, text: Mapping[str, Any], model_type: str, layers: int,
               defaults: Mapping[str, Any], p: str) -> dict[str, Any] | None:
    """The sliding-window fields, checked, as attention_from_config reads them."""
    cfg = {k: _value(text, defaults, k) for k in ("sliding_window", "sliding_window_pattern")}
    cfg["use_sliding_window"] = text.get("use_sliding_window")
    for key in ("sliding_window", "sliding_window_pattern"):
        if cfg[key] is not None and _integer(reading, p + key, cfg[key], f"copy {key} from the model's "
                                             "config.json (null: none)") is None:
            return None
    types = text.get("layer_types")
    if types is not None:
        if not isinstance(types, (list, tuple)) or not types or not all(isinstance(t, str) for t in types):
            reading.error(p + "layer_types", f"must be a list of layer kinds, one per layer, got {_shown(types)}",
                          "copy layer_types from the model's config.json")
            return None
        other = sorted({t for t in types if t not in LAYER_KINDS})
        if other:
            reading.error(p + "layer_types", f"holds {', '.join(map(_shown, other[:3]))}: the planner's memory "
                          f"model knows {' and '.join(LAYER_KINDS)} layers only",
                          "this model's attention (linear or state-space layers) cannot be planned by vllm-fleet")
            return None
        if len(types) != layers:
            reading.error(p + "layer_types", f"lists {len(types)} layers but num_hidden_layers is {layers}",
                          "one entry per layer, as in the model's config.json")
            return None
        cfg["layer_types"] = list(types)
    return attention_from_config(cfg, model_type)


_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _architectures(reading: _Reading, config: Mapping[str, Any]) -> tuple[str, ...] | None:
    """config.json's architectures (the model classes vLLM picks from): a list of class names."""
    value = config.get("architectures")
    if value is None:
        return ()
    if (not isinstance(value, (list, tuple)) or len(value) > MAX_ARCHITECTURES
            or not all(isinstance(a, str) and _CLASS_NAME.fullmatch(a) for a in value)):
        reading.error("architectures", f"must be a list of at most {MAX_ARCHITECTURES} model class names "
                      f"(letters, digits and _), got {_shown(value)}",
                      "copy architectures from the model's config.json (e.g. ['XLMRobertaModel'])")
        return None
    return tuple(value)


def shape_from_config(reading: _Reading, config: Mapping[str, Any], weights_bytes: int | None,
                      weights_gib: Any = None, sentence_transformers: Any = False) -> ModelInfo | None:
    """The ModelInfo config.json describes (see the module's docstring), its weights `weights_gib` when
    given, else `weights_bytes` (its files), else derived; None after errors on `reading`."""
    text, p = _text_part(config)
    model_type = str(text.get("model_type") or _TEXT_MODEL_TYPE.get(str(config.get("model_type")),
                                                                     config.get("model_type")) or "")
    defaults = _DEFAULTS.get(model_type, {})
    if "kv_lora_rank" in text:
        reading.error(p + "kv_lora_rank", "multi-head latent attention (DeepSeek V2/V3 and alike) keeps a KV "
                      "cache the planner's memory model does not know", "this model cannot be planned by vllm-fleet")
        return None
    missing = [k for k in REQUIRED if _value(text, defaults, k) is None]
    if missing:
        reading.error("", f"missing {', '.join(p + k for k in missing)}: neither the config nor a text_config "
                      "in it has them", f"paste the model's whole config.json ({EXAMPLE}); "
                      "`vllm-fleet model-info MODEL_DIR|HF_ID` prints the entry")
        return None
    fix = "copy it from the model's config.json"
    values: dict[str, Any] = {k: _integer(reading, p + k, _value(text, defaults, k), fix) for k in REQUIRED}
    if not reading.ok:
        return None
    heads, hidden = values["num_attention_heads"], values["hidden_size"]
    for key, default in (("num_key_value_heads", heads), ("head_dim", defaults.get("head_dim"))):
        given = text.get(key)
        if given is None and default is None and hidden % heads:
            reading.error(p + key, f"missing, and hidden_size {hidden} is not a multiple of num_attention_heads "
                          f"{heads}", fix)
            return None
        values[key] = _integer(reading, p + key, given if given is not None else
                               default if default is not None else hidden // heads, fix)
    position = _value(text, defaults, "max_position_embeddings")
    values["max_position_embeddings"] = position if position is None else _integer(
        reading, p + "max_position_embeddings", position, fix)
    experts = next((text[k] for k in _EXPERT_KEYS if text.get(k)), None)
    if experts is not None:
        values["num_experts"] = _integer(reading, p + "num_experts", experts, fix)
        width = text.get("moe_intermediate_size") or values["intermediate_size"]
        values["moe_intermediate_size"] = _integer(reading, p + "moe_intermediate_size", width, fix)
    if not reading.ok:
        return None
    if heads % values["num_key_value_heads"]:
        reading.error(p + "num_key_value_heads", f"num_attention_heads {heads} is not a multiple of "
                      f"num_key_value_heads {values['num_key_value_heads']}: each KV head serves a whole group "
                      "of query heads, so no model has this shape", "copy both from the model's config.json")
        return None
    attention = _attention(reading, text, model_type, values["num_hidden_layers"], defaults, p)
    dtype = _dtype(reading, config, text)
    tie = _tie(reading, config, text, defaults)
    architectures = _architectures(reading, config)
    if not isinstance(sentence_transformers, bool):
        reading.error("sentence_transformers", f"must be true or false, got {_shown(sentence_transformers)}",
                      "'sentence_transformers': True when the model's repository has modules.json")
        return None
    if attention is None or dtype is None or tie is None or architectures is None:
        return None
    shape = ModelInfo(weights_gib=1.0, dtype=dtype, tie_word_embeddings=tie, **attention, **values)
    weights = _weights(reading, config, text, weights_gib, weights_bytes, shape)
    if weights is None:
        return None
    return ModelInfo(weights_gib=weights, dtype=dtype, tie_word_embeddings=tie, architectures=architectures,
                     sentence_transformers=sentence_transformers, **attention, **values)


def _dtype(reading: _Reading, config: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    for where, part in (("", config), ("text_config.", text)):
        for key in ("dtype", "torch_dtype"):
            value = part.get(key)
            if value is None:
                continue
            name = value.removeprefix("torch.") if isinstance(value, str) else value
            if name not in DTYPES:
                reading.error(where + key, f"must be one of {', '.join(DTYPES)}, got {_shown(value)}",
                              "copy torch_dtype from the model's config.json (e.g. 'bfloat16')")
                return None
            return name
    return "bfloat16"


def _tie(reading: _Reading, config: Mapping[str, Any], text: Mapping[str, Any],
         defaults: Mapping[str, Any]) -> bool | None:
    value = config.get("tie_word_embeddings", text.get("tie_word_embeddings"))
    value = defaults.get("tie_word_embeddings", False) if value is None else value
    if not isinstance(value, bool):
        reading.error("tie_word_embeddings", f"must be true or false, got {_shown(value)}",
                      "copy tie_word_embeddings from the model's config.json")
        return None
    return value


def parse_model_info(check: Checker, raw: Any, instance: str, key: str = "model_info",
                     settings: Any = None) -> ModelInfo | None:
    """The `model_info` of an instance: a config.json dict (with `weights_gib` if wanted) or a path."""
    if isinstance(raw, str):
        try:
            files = read_model_files(raw)
        except ModelFilesError as exc:
            check.error(str(exc), instance=instance, key="model_info", fix=exc.fix)
            return None
        reading = _Reading(check, instance, prefix="", source=f"{files.config_path}: ")
        return shape_from_config(reading, files.config, files.weights_bytes,
                                 sentence_transformers=files.sentence_transformers)
    if not isinstance(raw, Mapping):
        check.error(f"expected the model's config.json (a dict) or its directory's path, got {type(raw).__name__}",
                    instance=instance, key="model_info", fix=EXAMPLE)
        return None
    for name in raw:  # config.json has many keys the planner ignores; OWN_KEYS are vllm-fleet's own
        guess = did_you_mean(name, list(OWN_KEYS)) if isinstance(name, str) and name not in OWN_KEYS else None
        if guess:
            check.error(f"unknown key {_shown(name)}", instance=instance, key="model_info",
                        fix=f"did you mean 'model_info.{guess}'?")
            return None
    return shape_from_config(_Reading(check, instance, prefix="model_info.", source=""), raw, None,
                             raw.get("weights_gib"), raw.get("sentence_transformers", False))


def read_config(config: Any, weights_bytes: int | None = None, source: str = "config.json",
                sentence_transformers: bool = False) -> tuple[ModelInfo | None, list[ConfigError]]:
    """A config.json read as model_info reads it, its weights `weights_bytes` (else derived): the
    ModelInfo, or None and the errors (each naming `source` and its key) where model_info refuses it."""
    check = Checker("-")
    if not isinstance(config, Mapping):
        check.error(f"{source} is not a JSON object", key="model_info", fix="give the model's config.json")
        return None, check.errors
    return shape_from_config(_Reading(check, "-", prefix="", source=f"{source}: "), config, weights_bytes,
                             sentence_transformers=sentence_transformers), check.errors


def model_info_of_config(config: Any, weights_bytes: int | None = None) -> ModelInfo | None:
    """read_config with nothing reported: None where model_info would refuse the config (discovery:
    a model's config.json on a host)."""
    return read_config(config, weights_bytes)[0]
