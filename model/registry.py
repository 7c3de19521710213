"""Where the model's names become code: each placement's block, and each switch's variant (variants/).

The core is plain Llama; every paper's change lives in a file of its own under variants/, which the core never
imports by name. Here each placement and each switch maps to an import path, resolved (norms.registry.resolve)
only when a config chooses it: ``python train.py norm=rmsnorm`` imports none of variants/, and choosing a switch
imports its file alone.

A placement names a block class (every layer), a function of the config that gives each layer's placement (a
mix), or a model class of its own. A switch is a ModelConfig field; when it is off its default, its variant's
module plugs in through what it exports, each optional:

    ATTENTION, MLP, BLOCK   a subclass of model.attention.Attention, model.mlp.SwiGLU or model.blocks.Block that
                            overrides a slot (Attention.project, .attend, .mix_heads, .project_out; a block's
                            branches); the model combines the chosen ones into one class each
    refusal(cfg)            why the config cannot take the variant (one line naming the fix), or None

A placement's file may word its part of the run's label (``label(placement, get)``, training/variant.py); a
switch's part is declared beside its field in the schema (model/config.py), which must be known before any
variant is imported.
"""

from __future__ import annotations

import functools
from types import ModuleType

from norms.registry import resolve

PLACEMENTS = {
    "pre": "model.blocks:PreNormBlock",
    "post": "model.blocks:PostNormBlock",
    "peri": "model.blocks:PeriNormBlock",
    "reordered": "model.blocks:ReorderedBlock",
    "deepnorm": "variants.deepnorm:DeepNormBlock",
    "hybrid": "variants.hybridnorm:HybridBlock",
    "pre_qkv": "variants.hybridnorm:PreQKVNormBlock",
    "hybrid_star": "variants.hybridnorm:hybrid_star",
    "mix_ln": "variants.mix_ln:mix_ln",
    "ngpt": "variants.ngpt:NormalizedTransformer",
}

# A ModelConfig field -> its variant, in the order their parts are added to a module (their parameters' order).
SWITCHES = {
    "after_linear_norm": "variants.simplenorm",
    "attn_gate": "variants.gated_attention",
    "attn_sink": "variants.attention_sinks",
    "attn_softcap": "variants.score_softcap",
    "norm_depth_scaling": "variants.layernorm_scaling",
    "residual_scale": "variants.op_block",
}


def chosen_variants(cfg) -> list[ModuleType]:
    """The variants' modules that ``cfg`` (a ModelConfig) switches on, each once, in SWITCHES' order; each
    refuses a config it cannot take (ValueError, one line naming the fix)."""
    default = type(cfg)()
    modules = []
    for name, path in SWITCHES.items():
        if getattr(cfg, name) != getattr(default, name) and (module := resolve(path)) not in modules:
            modules.append(module)
    for module in modules:
        refusal = getattr(module, "refusal", lambda cfg: None)(cfg)
        if refusal:
            raise ValueError(refusal)
    return modules


def combined(base: type, variants: list[ModuleType], part: str, **attributes) -> type:
    """``base`` with each chosen variant's subclass for ``part`` (ATTENTION, MLP or BLOCK) mixed in, the first
    variant's innermost (its parts added first), and ``attributes`` set: one class per combination."""
    extensions = tuple(getattr(module, part) for module in reversed(variants) if hasattr(module, part))
    return _combined(base, extensions, tuple(attributes.items()))


@functools.cache
def _combined(base: type, extensions: tuple[type, ...], attributes: tuple) -> type:
    changed = {name: value for name, value in attributes if getattr(base, name) is not value}
    if not extensions and not changed:
        return base
    return type(base.__name__, (*extensions, base), changed)
