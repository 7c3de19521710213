"""The decoder's shape and design choices: the one schema, as one typed dataclass that checkpoints store and compare.

Each field says where it sits in a run's config (``key``: ``model.<field>`` unless it says otherwise), which
values it allows (``choices``) and the rule its value must meet (``rule``). The run config's schema
(training/config.py) is built from these declarations, and ``ModelConfig`` checks them when built any other way
(an import, a test): every check is written once, beside its field. A check that needs two fields, or a
variant's refusal, sits with the variant (variants/) or in ``__post_init__``.

Annotations use ``typing`` forms because Hydra's structured configs (OmegaConf) read them.
"""

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Dict, List, Optional  # noqa: UP035 (OmegaConf reads these annotations on Python 3.10)

from model.registry import PLACEMENTS

# ruff: noqa: UP006, UP045

# What a numeric key may hold, checked before a run writes anything; a refusal names the key and the rule.
RULES = {
    "> 0": lambda v: math.isfinite(v) and v > 0,
    ">= 0": lambda v: math.isfinite(v) and v >= 0,
    ">= 1": lambda v: v >= 1,
    "in [0, 1]": lambda v: 0 <= v <= 1,
    "in [0, 1)": lambda v: 0 <= v < 1,
    "in (0, 1)": lambda v: 0 < v < 1,
    "in (0, 1]": lambda v: 0 < v <= 1,
}


def declared(default, *, key: str = "", choices: tuple = (), rule: str = "", label: str = "", factory=None):
    """A field with its place in the run config (``key``), its allowed values, its rule, and its part of the run's
    label away from its default (``label``: a format of ``value``, ``type`` and ``over_all``, training/variant.py)."""
    metadata = {"key": key, "choices": choices, "rule": rule, "label": label}
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def config_key(f) -> str:
    """The run config's key of a ModelConfig field: ``model.<name>`` unless it declares another."""
    return f.metadata.get("key") or f"model.{f.name}"


def rule_refusal(key: str, value, rule: str, nullable: bool) -> str | None:
    """Why ``value`` breaks ``rule`` (one of RULES), in one line naming the key; None when it meets it."""
    if not rule or value is None or (isinstance(value, (int, float)) and RULES[rule](value)):
        return None
    return f"{key}={value} is not allowed: it must be {rule}{' or null' if nullable else ''}"


@dataclass
class ModelConfig:
    vocab_size: int = declared(4096, rule=">= 1")
    d_model: int = declared(256, rule=">= 1")
    n_layers: int = declared(4, rule=">= 1")
    n_heads: int = declared(8, rule=">= 1")
    n_kv_heads: int = declared(4, rule=">= 1")  # grouped-query attention: n_heads must be a multiple of it
    # features per attention head; None: d_model // n_heads (Qwen3's are wider)
    head_size: Optional[int] = declared(None, rule=">= 1")
    # None: LLaMA's rule, 2/3 * 4 * d_model rounded up to mlp_multiple_of
    mlp_hidden: Optional[int] = declared(None, rule=">= 1")
    mlp_multiple_of: int = declared(64, rule=">= 1")
    max_seq_len: int = declared(256, rule=">= 1")
    rope_theta: float = declared(10000.0, rule="> 0")
    # Llama 3's stretch of RoPE's low frequencies (model/rope.py): {rope_type: llama3, factor, low_freq_factor,
    # high_freq_factor, original_max_position_embeddings}; empty for plain RoPE (a dict, which Hydra can fill)
    rope_scaling: Dict[str, Any] = declared(None, factory=dict)
    norm: str = declared("rmsnorm", key="norm.name")  # the stream's norm type, a registered name (norms/registry.py)
    norm_options: Dict[str, Any] = declared(None, key="norm", factory=dict)  # norm.<option>: the stream's options
    # model/registry.py PLACEMENTS: a block for every layer, a mix of blocks by layer, or a model of its own
    placement: str = declared("pre", key="norm.placement", choices=tuple(PLACEMENTS))
    # one placement per layer (a layer's block, e.g. [post, post, pre, pre]); overrides placement
    layer_placements: Optional[List[str]] = declared(None, key="norm.layer_placements")
    # mix_ln: post-norm in the first floor(post_fraction * n_layers) layers, pre-norm after them
    post_fraction: float = declared(0.25, key="norm.post_fraction", rule="in [0, 1]")
    qk_norm: Optional[str] = declared(None, key="norm.qk", label="qk{type}{over_all}")  # on q and k before RoPE
    # head: over each head's features (Qwen3); all: over all heads at once (OLMo 2); v too
    qk_axis: str = declared("head", key="norm.qk_axis", choices=("head", "all"))
    # a norm type on v (QKV-norm with qk_norm), over qk_axis
    v_norm: Optional[str] = declared(None, key="norm.v", label="v{type}{over_all}")
    # a norm type after every linear layer of the blocks (q, k, v, o, gate, up, down): variants/simplenorm.py
    after_linear_norm: Optional[str] = declared(None, key="norm.after_linear", label="after_linear{type}")
    norm_role_options: Dict[str, Dict[str, Any]] = declared(None, key="norm.roles", factory=dict)  # role -> options
    # inverse_sqrt: the norms of layer l (1-based) scaled by 1/sqrt(l) (variants/layernorm_scaling.py)
    norm_depth_scaling: str = declared("none", key="norm.depth_scaling", choices=("none", "inverse_sqrt"), label="lns")
    tie_embeddings: bool = True
    dropout: float = declared(0.0, rule="in [0, 1)")
    init_std: float = declared(0.02, rule="> 0")
    # the embeddings times nothing, sqrt(d_model) (Gemma), or a learned scalar from sqrt(d_model) (DyT)
    embed_scale: str = declared("none", choices=("none", "sqrt_d", "learned"), label="embed_{value}")
    # the output projections' init std divided by sqrt(2 n_layers), or not (see Transformer.reset_parameters)
    init_out_scale: str = declared("inverse_sqrt_2l", choices=("inverse_sqrt_2l", "none"), label="init_out_{value}")
    # final logits c * tanh(logits / c) (Gemma 2: 30)
    logit_softcap: Optional[float] = declared(None, rule="> 0", label="softcap{value:g}")
    # pre-softmax attention scores c * tanh(s / c) (Gemma 2: 50; variants/score_softcap.py)
    attn_softcap: Optional[float] = declared(None, rule="> 0", label="attncap{value:g}")
    # a sigmoid gate on attention's output, per head or per feature (variants/gated_attention.py)
    attn_gate: str = declared("none", choices=("none", "headwise", "elementwise"), label="gate_{value}")
    # one learned logit per head in the softmax's denominator (variants/attention_sinks.py)
    attn_sink: str = declared("none", choices=("none", "learned"), label="sink_{value}")
    # each residual branch's output times this constant (variants/op_block.py: 0.2, O(1/sqrt(depth)))
    residual_scale: Optional[float] = declared(None, rule="> 0", label="resid{value:g}")
    # a norm type on the embeddings and before the LM head, whatever the blocks use (a stack without norms
    # normalized at both ends); None: no embedding norm, the final norm is `norm`
    outer_norm: Optional[str] = declared(None, label="outer_{value}")

    def __post_init__(self) -> None:
        for f in fields(self):
            value, key = getattr(self, f.name), config_key(f)
            choices = f.metadata.get("choices")
            if choices and value not in choices:
                raise ValueError(f"{key} must be one of {', '.join(choices)}, got {value!r}")
            refusal = rule_refusal(key, value, f.metadata.get("rule"), f.default is None)
            if refusal:
                raise ValueError(refusal)
        if self.head_size is None and self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must be a multiple of model.n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(
                f"the head size {self.head_dim} (model.head_size or d_model/n_heads) must be even for RoPE"
            )
        if self.layer_placements is not None and len(self.layer_placements) != self.n_layers:
            raise ValueError(
                f"norm.layer_placements has {len(self.layer_placements)} entries for model.n_layers={self.n_layers}: "
                "give one placement per layer"
            )

    @property
    def head_dim(self) -> int:
        return self.head_size or self.d_model // self.n_heads

    @property
    def hidden_dim(self) -> int:
        if self.mlp_hidden is not None:
            return self.mlp_hidden
        hidden = int(2 * 4 * self.d_model / 3)
        return self.mlp_multiple_of * -(-hidden // self.mlp_multiple_of)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
