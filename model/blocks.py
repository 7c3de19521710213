"""Where the norms sit in a decoder block: one class per placement, chosen by name from ``BLOCKS``.

With F the attention or MLP branch and N a norm, each block applies, for F = attention then MLP:

    pre        h = x + F(N(x))              GPT-2, LLaMA                  final norm before the head
    post       h = N(x + F(x))              the original Transformer, BERT  no final norm
    peri       h = x + N_out(F(N_in(x)))    Gemma 2/3, Peri-LN (Kim et al. 2025)
    reordered  h = x + N(F(x))              OLMo 2

Where a norm directly follows a residual add (pre, peri, post), the add is handed to the norm
(``norm(branch, residual=x)`` returns ``(N(x + branch), x + branch)``), which a fused norm
does in one pass over memory.
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import Attention, KVCache
from model.config import ModelConfig
from model.mlp import SwiGLU
from model.norm_roles import norm_for

# The attribute that holds each role's norm, so instance names are stable: layers.3.attn_norm, ...
_NORM_ATTRIBUTE = {"attn_in": "attn_norm", "attn_out": "attn_out_norm", "mlp_in": "mlp_norm", "mlp_out": "mlp_out_norm"}


class Block(nn.Module):
    """The branches and the norms that a placement's ``roles`` name; subclasses write the formula."""

    roles: tuple[str, ...] = ()
    has_final_norm = True

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self._add_norm(cfg, "attn_in")
        self.attn = Attention(cfg)
        self._add_norm(cfg, "attn_out")
        self._add_norm(cfg, "mlp_in")
        self.mlp = SwiGLU(cfg)
        self._add_norm(cfg, "mlp_out")
        self.dropout = nn.Dropout(cfg.dropout)

    def _add_norm(self, cfg: ModelConfig, role: str) -> None:
        if role in self.roles:
            setattr(self, _NORM_ATTRIBUTE[role], norm_for(cfg, role, cfg.d_model))

    def attention(self, x, cos, sin, cache: KVCache | None, start_pos: int) -> torch.Tensor:
        return self.dropout(self.attn(x, cos, sin, cache, start_pos))

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.mlp(x))


class PreNormBlock(Block):
    """h = x + attn(N(x)); out = h + mlp(N(h))."""

    roles = ("attn_in", "mlp_in")

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

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        attn_out = self.attn_out_norm(self.attention(self.attn_norm(x), cos, sin, cache, start_pos))
        mlp_in, h = self.mlp_norm(attn_out, residual=x)
        return h + self.mlp_out_norm(self.feed_forward(mlp_in))


class ReorderedBlock(Block):
    """h = x + N(attn(x)); out = h + N(mlp(h))."""

    roles = ("attn_out", "mlp_out")

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        h = x + self.attn_out_norm(self.attention(x, cos, sin, cache, start_pos))
        return h + self.mlp_out_norm(self.feed_forward(h))


BLOCKS: dict[str, type[Block]] = {
    "pre": PreNormBlock,
    "post": PostNormBlock,
    "peri": PeriNormBlock,
    "reordered": ReorderedBlock,
}


def block_class(placement: str) -> type[Block]:
    try:
        return BLOCKS[placement]
    except KeyError:
        raise ValueError(f"unknown norm.placement {placement!r}; choose one of: {', '.join(BLOCKS)}") from None
