"""Learned attention sinks (gpt-oss, OpenAI 2025; Xiao et al. 2023, arXiv 2309.17453).

``model.attn_sink=learned`` gives each head a learned logit s_h that joins the softmax's denominator and
attends to nothing: weights exp(z_j) / (exp(s_h) + sum_i exp(z_i)), which sum to less than one. SDPA cannot
add the extra logit, so the attention forms its scores explicitly (``scripts/bench_variants.py`` measures
what that costs).
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import Attention
from model.config import ModelConfig


def sink_softmax(scores: torch.Tensor, sink_logits: torch.Tensor) -> torch.Tensor:
    """softmax over the keys of ``scores`` (batch, heads, queries, keys) with each head's sink logit in the
    denominator (the weights then sum to less than one: the rest goes to the sink)."""
    sink = sink_logits.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:3], 1)
    return torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]


class SinkAttention(Attention):
    explicit_scores = True

    def __init__(self, cfg: ModelConfig, normed: tuple[str, ...] = ()) -> None:
        super().__init__(cfg, normed)
        self.sink_logits = nn.Parameter(torch.zeros(cfg.n_heads))

    def softmax(self, scores: torch.Tensor) -> torch.Tensor:
        return sink_softmax(scores, self.sink_logits)


ATTENTION = SinkAttention
