"""The attention scores' soft-cap (Gemma 2, arXiv 2408.00118): pre-softmax scores c * tanh(s / c).

``model.attn_softcap=c`` bounds every score by c. SDPA cannot apply it, so the attention forms its scores
explicitly. (The final logits' soft-cap, ``model.logit_softcap``, is the fused loss's: model/loss.py.)
"""

from __future__ import annotations

import torch

from model.attention import Attention, masked_scores
from model.config import ModelConfig


class SoftCappedAttention(Attention):
    explicit_scores = True

    def __init__(self, cfg: ModelConfig, normed: tuple[str, ...] = ()) -> None:
        super().__init__(cfg, normed)
        self.softcap = cfg.attn_softcap

    def scores(self, q: torch.Tensor, k: torch.Tensor, start_pos: int) -> torch.Tensor:
        return masked_scores(q, k, start_pos, self.softcap, self.score_scale)


ATTENTION = SoftCappedAttention
