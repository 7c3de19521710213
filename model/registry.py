"""Where the model's names become code: each placement's block, and each switch's variant (variants/).

The core is plain Llama; every paper's change lives in a file of its own under variants/, which the core never
imports by name. Here each placement and each switch maps to an import path, resolved (``resolve``; assembled
into classes in model/assembly.py) only when a config chooses it: ``python train.py norm=rmsnorm`` imports none
of variants/, and choosing a switch imports its file alone.

A placement names a block class (every layer), a function of the config that gives each layer's placement (a
mix), or a model class of its own. A switch is a ModelConfig field; when it is off its default, its variant's
module plugs in through what it exports, each optional:

    ATTENTION, MLP, BLOCK   a subclass of model.attention.Attention, model.mlp.SwiGLU or model.blocks.Block that
                            overrides a slot (Attention.project, .attend, .mix_heads, .project_out; a block's
                            branches); the model combines the chosen ones into one class each
    refusal(cfg)            why the config cannot take the variant (one line naming the fix), or None

A placement's file may word its part of the run's label (``label(placement, get)``, training/run/label.py); a
switch's part is declared beside its field in the schema (model/config.py), which must be known before any
variant is imported.
"""

from __future__ import annotations

import importlib

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

# A switch (its config key) -> its variant, in the order their parts are added to a module (their parameters' order).
SWITCHES = {
    "norm.after_linear": "variants.simplenorm",
    "model.attn_gate": "variants.gated_attention",
    "model.attn_sink": "variants.attention_sinks",
    "model.attn_softcap": "variants.score_softcap",
    "norm.depth_scaling": "variants.layernorm_scaling",
    "model.residual_scale": "variants.op_block",
}


def resolve(path: str):
    """What ``package.module:name`` names (or the module itself, without ``:name``), its module imported now: the
    one resolver of normlab's lazy tables (placements and switches here; probes, post-step hooks, optimizers and
    corpora in training/)."""
    module, _, name = path.partition(":")
    imported = importlib.import_module(module)
    return getattr(imported, name) if name else imported
