"""Gated attention (Qiu et al. 2025, arXiv 2505.06708): each head's output times sigmoid(x W_g).

``model.attn_gate=headwise`` gives one gate logit per head, ``elementwise`` one per feature of each head, both
from the attention's input x and applied to SDPA's output before the output projection. The paper's best
(elementwise, after SDPA) removes attention sinks and massive activations in its models, and lowers the loss.
"""

from __future__ import annotations

import torch
from torch import nn

from model.attention import Attention
from model.config import ModelConfig


class GatedAttention(Attention):
    def __init__(self, cfg: ModelConfig, normed: tuple[str, ...] = ()) -> None:
        super().__init__(cfg, normed)
        with torch.random.fork_rng(devices=[]):  # drawing it must not shift the weights every arm shares
            self.gate_proj = nn.Linear(
                cfg.d_model, cfg.n_heads * (cfg.head_dim if cfg.attn_gate == "elementwise" else 1), bias=False
            )
        self.gate_proj.drawn_last = True  # Transformer.reset_parameters: after the weights every arm shares

    def input_linears(self) -> list[nn.Linear]:
        return [*super().input_linears(), self.gate_proj]

    def mix_heads(self, out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape  # a gate per head broadcasts over its features
        return super().mix_heads(out, x) * torch.sigmoid(self.gate_proj(x)).view(batch, seq, self.n_heads, -1)


ATTENTION = GatedAttention
