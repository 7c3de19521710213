"""HybridNorm and HybridNorm* (Zhuo et al. 2025, arXiv 2503.04598): QKV-norm inside attention, post-norm in the FFN.

    hybrid       h = x + A_qkv(x)             A_qkv: q, k and v normalized
                 out = N(h) + M(N(h))
    pre_qkv      h = x + A_qkv(N(x))          HybridNorm*'s first block
                 out = h + M(N(h))
    hybrid_star  pre_qkv in the first layer, hybrid after it

q, k and v take norm.qk / norm.v where set, the stream's norm otherwise.
"""

from __future__ import annotations

import torch

from model.attention import KVCache
from model.blocks import Block, PreNormBlock
from model.config import ModelConfig


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

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        normed, _ = self.mlp_norm(self.attention(x, cos, sin, cache, start_pos), residual=x)
        return normed + self.feed_forward(normed)


class PreQKVNormBlock(PreNormBlock):
    """Pre-norm with q, k and v normalized inside attention: HybridNorm*'s first block (the paper's Sec. 3.3:
    its authors' code gives layer 0 an attention input norm and a pre-norm MLP)."""

    attention_norms = ("q", "k", "v")


def hybrid_star(cfg: ModelConfig) -> list[str]:
    """HybridNorm*'s layers: ``pre_qkv`` in the first, ``hybrid`` after it."""
    return ["pre_qkv"] + ["hybrid"] * (cfg.n_layers - 1)


def label(placement: str, get) -> str:
    """The placement's name, with ``_all`` where q, k and v are normalized over all heads (and no norm.qk says so)."""
    over_all = placement in ("hybrid", "hybrid_star") and get("norm.qk_axis") == "all" and not get("norm.qk")
    return f"{placement}_all" if over_all else placement
