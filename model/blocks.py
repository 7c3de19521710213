"""Where the norms sit in a decoder block: one class per placement, chosen by name from ``BLOCKS``.

With F the attention or MLP branch and N a norm, each block applies, for F = attention then MLP:

    pre        h = x + F(N(x))              GPT-2, LLaMA                  final norm before the head
    post       h = N(x + F(x))              the original Transformer, BERT  no final norm
    peri       h = x + N_out(F(N_in(x)))    Gemma 2/3, Peri-LN (Kim et al. 2025)
    reordered  h = x + N(F(x))              OLMo 2
    deepnorm   h = N(alpha x + F(x))        DeepNet (Wang et al. 2022)    no final norm
    hybrid     h = x + A_qkv(x)             HybridNorm (Zhuo et al. 2025) A_qkv: q, k and v normalized
               out = N(h) + M(N(h))
    pre_qkv    h = x + A_qkv(N(x))          HybridNorm*'s first block
               out = h + M(N(h))

A model may mix placements layer by layer (``layer_placements``); ``mix_ln`` is the mix of
Mix-LN (Li et al. 2024, arXiv 2412.13795): post-norm in the first floor(post_fraction * L)
layers, pre-norm after them; ``hybrid_star`` is HybridNorm*: ``pre_qkv`` in the first layer, ``hybrid``
after it. The model has a final norm when its last block wants one.
``ngpt`` is no block of this table but a model of its own (model/ngpt.py), whose block is
h = N(h + a (N(F(h)) - h)) with h on the unit sphere.

Where a norm directly follows a residual add (pre, peri, post), the add is handed to the norm
(``norm(branch, residual=x)`` returns ``(N(x + branch), x + branch)``), which a fused norm
does in one pass over memory.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from model.attention import Attention, KVCache
from model.config import ModelConfig
from model.matrices import logical_matrices
from model.mlp import SwiGLU
from model.norm_roles import norm_for

# The attribute that holds each role's norm, so instance names are stable: layers.3.attn_norm, ...
_NORM_ATTRIBUTE = {
    "attn_in": "attn_norm",
    "attn_out": "attn_out_norm",
    "mlp_in": "mlp_norm",
    "mlp_out": "mlp_out_norm",
    "attn_update": "attn_update_norm",
    "mlp_update": "mlp_update_norm",
}


class Block(nn.Module):
    """The branches and the norms that a placement's ``roles`` name; subclasses write the formula."""

    roles: tuple[str, ...] = ()
    attention_norms: tuple[str, ...] = ()  # q, k, v: normalized inside attention by this placement
    has_final_norm = True
    # SimpleNorm's norm after every projection (norm.after_linear) composes with a placement that does not
    # normalize a projection's output again (a branch output, or q, k and v).
    takes_after_linear = True
    # The norms whose output only a branch's input linear layers read, and that branch: where a gain can fold
    # (model/fold.py).
    gain_readers: dict[str, str] = {}
    attention_class, mlp_class = Attention, SwiGLU

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        if cfg.after_linear_norm is not None and not self.takes_after_linear:
            raise ValueError(
                f"norm.after_linear normalizes every projection's output, which {type(self).__name__} normalizes "
                "again: use it with norm.placement=pre (SimpleGPT's blocks, whose input norm only adds a gain "
                "there), post or deepnorm"
            )
        self.cfg, self.layer = cfg, layer
        self._add_norm(cfg, "attn_in")
        self.attn = self.attention_class(cfg, self.attention_norms)
        self._add_norm(cfg, "attn_out")
        self._add_norm(cfg, "attn_update")
        self._add_norm(cfg, "mlp_in")
        self.mlp = self.mlp_class(cfg)
        self._add_norm(cfg, "mlp_out")
        self._add_norm(cfg, "mlp_update")
        self.dropout = nn.Dropout(cfg.dropout)

    def _add_norm(self, cfg: ModelConfig, role: str) -> None:
        if role in self.roles:
            norm = norm_for(cfg, role, cfg.d_model)
            if cfg.norm_depth_scaling == "inverse_sqrt":  # LayerNorm Scaling: layer l (1-based) scales by 1/sqrt(l)
                norm.output_scale = 1 / math.sqrt(self.layer + 1)
            setattr(self, _NORM_ATTRIBUTE[role], norm)

    def init_stds(self) -> dict[str, float]:
        """The Normal init std of this block's weights that differ from ``init_std``, by name in the block:
        the residual branches' output projections, divided by sqrt(2 n_layers) (GPT-2's rule;
        ``init_out_scale=none`` leaves them at init_std)."""
        if self.cfg.init_out_scale == "none":
            return {}
        std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        return {"attn.o_proj": std, "mlp.down_proj": std}

    def after_init(self) -> None:
        """Scaling that an init std per weight cannot say (a slice of a fused weight)."""

    def attention(self, x, cos, sin, cache: KVCache | None, start_pos: int) -> torch.Tensor:
        return self._scaled(self.dropout(self.attn(x, cos, sin, cache, start_pos)))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._scaled(self.dropout(self.mlp(x)))

    def _scaled(self, branch: torch.Tensor) -> torch.Tensor:
        """A branch's output, down-weighted by ``residual_scale`` when set (He et al.'s OP block)."""
        return branch if self.cfg.residual_scale is None else branch * self.cfg.residual_scale


class PreNormBlock(Block):
    """h = x + attn(N(x)); out = h + mlp(N(h))."""

    roles = ("attn_in", "mlp_in")
    gain_readers = {"attn_norm": "attn", "mlp_norm": "mlp"}

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        mlp_in, h = self.mlp_norm(self.attention(self.attn_norm(x), cos, sin, cache, start_pos), residual=x)
        return h + self.feed_forward(mlp_in)


class PostNormBlock(Block):
    """h = N(x + attn(x)); out = N(h + mlp(h)). The stream leaves every block normalized."""

    roles = ("attn_out", "mlp_out")
    has_final_norm = False

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        h, _ = self.attn_out_norm(self.attention(x, cos, sin, cache, start_pos), residual=x)
        out, _ = self.mlp_out_norm(self.feed_forward(h), residual=h)
        return out


class PeriNormBlock(Block):
    """h = x + N_out(attn(N_in(x))); out = h + N_out(mlp(N_in(h)))."""

    roles = ("attn_in", "attn_out", "mlp_in", "mlp_out")
    takes_after_linear = False
    gain_readers = PreNormBlock.gain_readers  # the output norms' gains feed the residual stream

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        attn_out = self.attn_out_norm(self.attention(self.attn_norm(x), cos, sin, cache, start_pos))
        mlp_in, h = self.mlp_norm(attn_out, residual=x)
        return h + self.mlp_out_norm(self.feed_forward(mlp_in))


class ReorderedBlock(Block):
    """h = x + N(attn(x)); out = h + N(mlp(h))."""

    roles = ("attn_out", "mlp_out")
    takes_after_linear = False

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        h = x + self.attn_out_norm(self.attention(x, cos, sin, cache, start_pos))
        return h + self.mlp_out_norm(self.feed_forward(h))


class DeepNormBlock(Block):
    """h = N(alpha x + attn(x)); out = N(alpha h + mlp(h)), alpha = (2L)^(1/4).

    Post-norm with the residual up-weighted, and DeepNet's initialization (Wang et al. 2022, arXiv
    2203.00555, Figure 2 and Table 1, decoder-only constants): every branch matrix Xavier-normal, std
    gain * sqrt(2 / (fan_in + fan_out)), with gain beta = (8L)^(-1/4) for the value, output and MLP
    matrices and 1 for q and k, which bounds the model update at any depth.
    """

    roles = ("attn_out", "mlp_out")
    has_final_norm = False
    QK_MATRICES = ("attn.qkv_proj.weight[q]", "attn.qkv_proj.weight[k]")

    @property
    def alpha(self) -> float:
        return (2 * self.cfg.n_layers) ** 0.25

    @property
    def beta(self) -> float:
        return (8 * self.cfg.n_layers) ** -0.25

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        h, _ = self.attn_out_norm(self.attention(x, cos, sin, cache, start_pos), residual=self.alpha * x)
        out, _ = self.mlp_out_norm(self.feed_forward(h), residual=self.alpha * h)
        return out

    def init_stds(self) -> dict[str, float]:
        return {}  # drawn at init_std, then rescaled to Xavier-normal by after_init

    @torch.no_grad()
    def after_init(self) -> None:
        """Each logical matrix (q, k and v of the fused weight on their own) rescaled from its N(0, init_std)
        draw to DeepNet's std: the same draws as every other placement's, so a seed's weights differ by scale."""
        for name, weight, rows in logical_matrices(self):
            fan_out, fan_in = weight[rows].shape
            gain = 1.0 if name in self.QK_MATRICES else self.beta
            weight[rows] *= gain * math.sqrt(2 / (fan_in + fan_out)) / self.cfg.init_std


class HybridBlock(Block):
    """h = x + attn(x) with q, k and v normalized; out = N(h) + mlp(N(h)).

    HybridNorm (Zhuo et al. 2025, arXiv 2503.04598, Sec. 3): QKV-norm inside attention and no norm on its
    input; the norm after the attention's residual add feeds the MLP and is the residual it adds to (the
    paper's "Post-Norm in the FFN"; its authors' 1.2B config: attn_norm false, ffn_norm true,
    ffn_residual_after_norm true, query, key and value norms on). q, k and v take norm.qk / norm.v where set,
    the stream's norm otherwise.
    """

    roles = ("mlp_in",)
    attention_norms = ("q", "k", "v")
    takes_after_linear = False

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        normed, _ = self.mlp_norm(self.attention(x, cos, sin, cache, start_pos), residual=x)
        return normed + self.feed_forward(normed)


class PreQKVNormBlock(PreNormBlock):
    """Pre-norm with q, k and v normalized inside attention: HybridNorm*'s first block (the paper's Sec. 3.3:
    its authors' code gives layer 0 an attention input norm and a pre-norm MLP)."""

    attention_norms = ("q", "k", "v")
    takes_after_linear = False


BLOCKS: dict[str, type[Block]] = {
    "pre": PreNormBlock,
    "post": PostNormBlock,
    "peri": PeriNormBlock,
    "reordered": ReorderedBlock,
    "deepnorm": DeepNormBlock,
    "hybrid": HybridBlock,
    "pre_qkv": PreQKVNormBlock,
}
# norm.placement: a block for every layer, a mix of blocks by layer, or nGPT's model (model/__init__.py MODELS).
WHOLE_MODEL_PLACEMENTS = ("mix_ln", "hybrid_star", "ngpt")
PLACEMENTS = (*BLOCKS, *WHOLE_MODEL_PLACEMENTS)


def layer_placements(cfg: ModelConfig) -> list[str]:
    """The placement of each layer: ``cfg.layer_placements`` if given, Mix-LN's mix, or one placement throughout."""
    if cfg.layer_placements is not None:
        wrong = next((placement for placement in cfg.layer_placements if placement not in BLOCKS), None)
        if wrong is not None:
            whole = f" ({wrong} places the whole model: set norm.placement={wrong})" if wrong in PLACEMENTS else ""
            raise ValueError(
                f"norm.layer_placements: {wrong!r} is not a layer's block; each layer takes one of: "
                f"{', '.join(BLOCKS)}{whole}"
            )
        return list(cfg.layer_placements)
    if cfg.placement == "mix_ln":
        post = math.floor(cfg.post_fraction * cfg.n_layers)
        return ["post"] * post + ["pre"] * (cfg.n_layers - post)
    if cfg.placement == "hybrid_star":
        return ["pre_qkv"] + ["hybrid"] * (cfg.n_layers - 1)
    return [cfg.placement] * cfg.n_layers


def block_class(placement: str) -> type[Block]:
    try:
        return BLOCKS[placement]
    except KeyError:
        if placement == "ngpt":
            raise ValueError(
                "norm.placement=ngpt is nGPT's own model (model/ngpt.py), not a block: build it with model.build_model"
            ) from None
        raise ValueError(f"unknown norm.placement {placement!r}; choose one of: {', '.join(PLACEMENTS)}") from None
