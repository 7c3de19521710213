"""The decoder's shape, as one typed dataclass that checkpoints store and compare.

Annotations use ``typing`` forms because Hydra's structured configs (OmegaConf) read them.
"""

from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional  # noqa: UP035 (OmegaConf reads these annotations on Python 3.10)

# ruff: noqa: UP006, UP045

EMBED_SCALES = (
    "none",
    "sqrt_d",
    "learned",
)  # none | x sqrt(d_model) (Gemma) | a learned scalar from sqrt(d_model) (DyT)
INIT_OUT_SCALES = ("inverse_sqrt_2l", "none")  # output projections' init std divided by sqrt(2 n_layers), or not
DEPTH_SCALINGS = ("none", "inverse_sqrt")  # LayerNorm Scaling: the norms of layer l (1-based) scaled by 1/sqrt(l)
ATTN_GATES = ("none", "headwise", "elementwise")  # sigmoid gate on attention's output (model/attention.py)
ATTN_SINKS = ("none", "learned")  # a learned logit per head in the softmax's denominator (gpt-oss)


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 4  # grouped-query attention: n_heads must be a multiple of it
    head_size: Optional[int] = None  # features per attention head; None: d_model // n_heads (Qwen3's are wider)
    mlp_hidden: Optional[int] = None  # noqa: UP045  # None: LLaMA's rule, 2/3 * 4 * d_model rounded up to mlp_multiple_of
    mlp_multiple_of: int = 64
    max_seq_len: int = 256
    rope_theta: float = 10000.0
    # Llama 3's stretch of RoPE's low frequencies (model/rope.py): {rope_type: llama3, factor, low_freq_factor,
    # high_freq_factor, original_max_position_embeddings}; empty for plain RoPE (a dict, which Hydra can fill)
    rope_scaling: Dict[str, Any] = field(default_factory=dict)
    norm: str = "rmsnorm"
    norm_options: Dict[str, Any] = field(default_factory=dict)  # noqa: UP006
    placement: str = "pre"  # pre | post | peri | reordered | deepnorm | mix_ln (model/blocks.py) | ngpt (model/ngpt.py)
    layer_placements: Optional[List[str]] = None  # one placement per layer; overrides placement
    post_fraction: float = 0.25  # mix_ln: post-norm in the first floor(post_fraction * n_layers) layers
    qk_norm: Optional[str] = None  # a norm type on q and k before RoPE, or None
    qk_axis: str = "head"  # head: over each head's features (Qwen3); all: over all heads at once (OLMo 2); v too
    v_norm: Optional[str] = None  # a norm type on v (QKV-norm with qk_norm), over qk_axis, or None
    # SimpleNorm (SimpleGPT, arXiv 2602.01212): a norm of this type after every linear layer of the blocks
    after_linear_norm: Optional[str] = None
    norm_role_options: Dict[str, Dict[str, Any]] = field(default_factory=dict)  # role -> options
    norm_depth_scaling: str = "none"  # none | inverse_sqrt (LayerNorm Scaling, arXiv 2502.05795)
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    init_out_scale: str = "inverse_sqrt_2l"  # inverse_sqrt_2l | none (see Transformer.reset_parameters)
    embed_scale: str = "none"  # none | sqrt_d | learned
    logit_softcap: Optional[float] = None  # final logits c * tanh(logits / c) (Gemma 2: 30)
    attn_softcap: Optional[float] = None  # pre-softmax attention scores c * tanh(s / c) (Gemma 2: 50)
    # Each residual branch's output times this constant (He et al.'s OP block: 0.2, O(1/sqrt(depth)))
    residual_scale: Optional[float] = None
    # A norm type on the embeddings and before the LM head, whatever the blocks use (the OP block's
    # LayerNorms at both ends of a stack without norms); None: no embedding norm, the final norm is `norm`
    outer_norm: Optional[str] = None
    attn_gate: str = "none"  # none | headwise | elementwise: sigmoid output gate (Qiu et al. 2025)
    attn_sink: str = "none"  # none | learned: one learned logit per head in the softmax's denominator (gpt-oss)

    def __post_init__(self) -> None:
        if self.head_size is None and self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads={self.n_heads} must be a multiple of model.n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(
                f"the head size {self.head_dim} (model.head_size or d_model/n_heads) must be even for RoPE"
            )
        for key, value, allowed in (
            ("model.embed_scale", self.embed_scale, EMBED_SCALES),
            ("model.init_out_scale", self.init_out_scale, INIT_OUT_SCALES),
            ("norm.depth_scaling", self.norm_depth_scaling, DEPTH_SCALINGS),
            ("model.attn_gate", self.attn_gate, ATTN_GATES),
            ("model.attn_sink", self.attn_sink, ATTN_SINKS),
        ):
            if value not in allowed:
                raise ValueError(f"{key} must be one of {', '.join(allowed)}, got {value!r}")
        for key, cap in (("model.logit_softcap", self.logit_softcap), ("model.attn_softcap", self.attn_softcap)):
            if cap is not None and not cap > 0:
                raise ValueError(f"{key} must be > 0 (or null for no cap), got {cap}")
        if self.residual_scale is not None and not self.residual_scale > 0:
            raise ValueError(f"model.residual_scale must be > 0 (or null for none), got {self.residual_scale}")
        if not 0 <= self.post_fraction <= 1:
            raise ValueError(f"norm.post_fraction must be in [0, 1], got {self.post_fraction}")
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
