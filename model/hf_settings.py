"""A Hugging Face config.json read as our model config: ``hf_model_config``, model/hf.py's ``hf_config`` inverted.

A config.json is someone else's file. Each value is checked for its type and range before it is used (a string
where a number belongs, an eps of 0, a RoPE factor that would divide by zero), and a key it leaves out takes
transformers' own default for that architecture (Qwen3's head_dim is 128 whatever the width, OLMo 2's eps 1e-5),
so that the model we build computes what transformers would load. A setting none of our variants has (biases,
sliding windows, RoPE scaling other than Llama 3's) is refused by name.
"""

from __future__ import annotations

import math
from typing import Any

from model.config import ModelConfig, NormConfig
from model.rope import LLAMA3_KEYS

HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "olmo2": "Olmo2ForCausalLM"}
ROPE_TYPES = ("default", "llama3")  # plain RoPE, and Llama 3's frequency scaling (model/rope.py)
# transformers' defaults (its LlamaConfig, Qwen3Config, Olmo2Config) for what a config.json may leave out and
# the rules below cannot derive; tests/unit/model/test_hf_settings.py holds them against transformers' classes.
DEFAULTS = {
    "llama": {"rms_norm_eps": 1e-6, "max_position_embeddings": 2048},
    "qwen3": {"rms_norm_eps": 1e-6, "max_position_embeddings": 32768, "head_dim": 128},
    "olmo2": {"rms_norm_eps": 1e-5, "max_position_embeddings": 2048},
}


class Settings:
    """The values of one config.json (or its RoPE part), each read as the type it must have."""

    def __init__(self, values: dict[str, Any], where: str, defaults: dict[str, Any] | None = None) -> None:
        self.values, self.where, self.defaults = values, where, defaults or {}

    def _value(self, key: str, default: Any) -> Any:
        value = self.values.get(key)
        return self.defaults.get(key, default) if value is None else value

    def refusal(self, key: str, value: Any, expected: str) -> ValueError:
        return ValueError(f"{self.where} {key}={value!r} is not {expected}")

    def count(self, key: str, default: Any = ..., minimum: int = 1) -> int:
        value = self._value(key, default)
        if value is ...:
            raise ValueError(f"{self.where} has no {key}")
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.refusal(key, value, f"a whole number >= {minimum}")
        return value

    def positive(self, key: str, default: Any = ...) -> float:
        value = self._value(key, default)
        if value is ...:
            raise ValueError(f"{self.where} has no {key}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise self.refusal(key, value, "a number > 0")
        return float(value)

    def number(self, key: str, default: float) -> float:
        value = self._value(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.refusal(key, value, "a finite number")
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self._value(key, default)
        if not isinstance(value, bool):
            raise self.refusal(key, value, "true or false")
        return value

    def word(self, key: str, default: str) -> str:
        value = self._value(key, default)
        if not isinstance(value, str):
            raise self.refusal(key, value, "a string")
        return value


def architecture(config: dict[str, Any]) -> str:
    """``llama``, ``qwen3`` or ``olmo2``, from config.json's ``architectures`` (else its ``model_type``)."""
    architectures = config.get("architectures") or [HF_CLASSES.get(config.get("model_type"), config.get("model_type"))]
    if not isinstance(architectures, list):
        raise ValueError(f"config.json's architectures={architectures!r} is not a list of class names")
    model_type = {name: key for key, name in HF_CLASSES.items()}.get(architectures[0])
    if len(architectures) != 1 or model_type is None:
        raise ValueError(
            f"architecture {', '.join(map(str, architectures))} has no equivalent here: normlab imports "
            f"{', '.join(HF_CLASSES.values())}"
        )
    return model_type


def rope_parameters(config: dict[str, Any]) -> dict[str, Any]:
    """RoPE's settings in the current layout (``rope_parameters``) from either it or the older ``rope_theta`` and
    ``rope_scaling`` (whose type key was once ``type``)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"config.json's RoPE settings {rope!r} are not a mapping")
    rope = dict(rope)
    rope.setdefault("rope_theta", config.get("rope_theta", 10000.0))
    rope["rope_type"] = rope.get("rope_type", rope.pop("type", "default"))
    return rope


def _unheld(config: Settings, rope: Settings, layer_types: set) -> list[str]:
    """The settings of ``config`` that none of our variants has, by name."""
    rope_type = rope.word("rope_type", "default")
    unheld = {
        f"hidden_act={config.values.get('hidden_act')}": config.word("hidden_act", "silu") != "silu",
        "attention_bias=true": config.flag("attention_bias", False),
        "mlp_bias=true": config.flag("mlp_bias", False),
        f"attention_dropout={config.values.get('attention_dropout')}": config.number("attention_dropout", 0.0) != 0,
        f"RoPE scaling {rope_type!r} (normlab has plain RoPE and Llama 3's, llama3)": rope_type not in ROPE_TYPES,
        f"partial_rotary_factor={rope.values.get('partial_rotary_factor')}": rope.number("partial_rotary_factor", 1.0)
        != 1,
        "use_sliding_window=true": config.flag("use_sliding_window", False),
        f"layer_types {sorted(map(str, layer_types))}": layer_types != {"full_attention"},
        "quantization_config (import the unquantized model)": "quantization_config" in config.values,
    }
    return [feature for feature, used in unheld.items() if used]


def _llama3_scaling(rope: Settings) -> dict[str, Any]:
    factor, low, high = rope.positive("factor"), rope.positive("low_freq_factor"), rope.positive("high_freq_factor")
    if high <= low:
        raise ValueError(f"{rope.where} high_freq_factor={high} must exceed low_freq_factor={low}")
    context = rope.count("original_max_position_embeddings")
    scaling = dict(zip(LLAMA3_KEYS, (factor, low, high, context)))
    return {"rope_type": "llama3", **scaling}


def hf_model_config(config: dict[str, Any]) -> ModelConfig:
    """Our model config for a Hugging Face config.json; a ValueError naming the first key whose value is not of
    its type or range, or the first setting that has no equivalent here."""
    model_type = architecture(config)
    settings = Settings(config, "config.json's", DEFAULTS[model_type])
    rope = Settings(rope_parameters(config), "config.json's RoPE setting")
    layer_types = config.get("layer_types") or ["full_attention"]
    if not isinstance(layer_types, list):
        raise settings.refusal("layer_types", layer_types, "a list")
    unheld = _unheld(settings, rope, set(map(str, layer_types)))
    if unheld:
        raise ValueError(f"{HF_CLASSES[model_type]} with {unheld[0]} has no equivalent in normlab's model")
    width, heads = settings.count("hidden_size"), settings.count("num_attention_heads")
    head_dim = settings.count("head_dim", width // heads if width % heads == 0 else ...)
    # Llama's and Qwen3's RMSNorm round to the input's dtype before the gain, OLMo 2's after it (our default).
    cast_order = {} if model_type == "olmo2" else {"cast_before_weight": True}
    return ModelConfig(
        vocab_size=settings.count("vocab_size"),
        d_model=width,
        n_layers=settings.count("num_hidden_layers"),
        n_heads=heads,
        n_kv_heads=settings.count("num_key_value_heads", heads),
        head_size=None if head_dim * heads == width else head_dim,
        mlp_hidden=settings.count("intermediate_size"),
        max_seq_len=settings.count("max_position_embeddings"),
        rope_theta=rope.positive("rope_theta"),
        rope_scaling=_llama3_scaling(rope) if rope.word("rope_type", "default") == "llama3" else {},
        tie_embeddings=settings.flag("tie_word_embeddings", False),
        init_std=settings.positive("initializer_range", 0.02),
        norm=NormConfig(
            name="rmsnorm",
            eps=settings.positive("rms_norm_eps"),
            **cast_order,
            placement="reordered" if model_type == "olmo2" else "pre",
            qk=None if model_type == "llama" else "rmsnorm",
            qk_axis="all" if model_type == "olmo2" else "head",
        ),
    )


def special_token_ids(config: dict[str, Any]) -> dict[str, int]:
    """config.json's bos, eos and pad token ids (each an id or a list of ids), by key; a non-integer is refused."""
    found = {}
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = config.get(key)
        for index, token in enumerate(value if isinstance(value, list) else [] if value is None else [value]):
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"config.json's {key}={value!r} is not a token id (a whole number >= 0)")
            found[f"{key}[{index}]" if isinstance(value, list) else key] = token
    return found
