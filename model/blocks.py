"""Where the norms sit in a decoder block: one class per placement, chosen by name (model/registry.py).

With F the attention or MLP branch and N a norm, each block applies, for F = attention then MLP:

    pre        h = x + F(N(x))              GPT-2, LLaMA                  final norm before the head
    post       h = N(x + F(x))              the original Transformer, BERT  no final norm
    peri       h = x + N_out(F(N_in(x)))    Gemma 2/3, Peri-LN (Kim et al. 2025)
    reordered  h = x + N(F(x))              OLMo 2

The papers' placements are blocks, layer mixes or models of their own in variants/, named in
model/registry.py. A model may mix placements layer by layer (``layer_placements``). The model has a
final norm when its last block wants one.

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
    normalizes_branch_output = False  # whether a norm reads a branch's output before the residual add
    # The norms whose output only a branch's input linear layers read, and that branch: where a gain can fold
    # (model/fold.py).
    gain_readers: dict[str, str] = {}
    attention_class, mlp_class = Attention, SwiGLU

    @classmethod
    def base_block(cls) -> type:
        """The placement's own block class, without the variants' parts mixed in (model/assembly.py)."""
        return cls.__bases__[-1] if "variant_names" in cls.__dict__ else cls

    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
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
            setattr(self, _NORM_ATTRIBUTE[role], norm_for(cfg, role, cfg.d_model))

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
        """Slot: the attention branch's output as the residual stream receives it."""
        return self.dropout(self.attn(x, cos, sin, cache, start_pos))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        """Slot: the MLP branch's output as the residual stream receives it."""
        return self.dropout(self.mlp(x))


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
    normalizes_branch_output = True
    gain_readers = PreNormBlock.gain_readers  # the output norms' gains feed the residual stream

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        attn_out = self.attn_out_norm(self.attention(self.attn_norm(x), cos, sin, cache, start_pos))
        mlp_in, h = self.mlp_norm(attn_out, residual=x)
        return h + self.mlp_out_norm(self.feed_forward(mlp_in))


class ReorderedBlock(Block):
    """h = x + N(attn(x)); out = h + N(mlp(h))."""

    roles = ("attn_out", "mlp_out")
    normalizes_branch_output = True

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        h = x + self.attn_out_norm(self.attention(x, cos, sin, cache, start_pos))
        return h + self.mlp_out_norm(self.feed_forward(h))
