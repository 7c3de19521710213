"""The SwiGLU feed-forward branch (Shazeer 2020), as in LLaMA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # gate and up projections in one matmul: rows [gate | up].
        self.gate_up_proj = nn.Linear(cfg.d_model, 2 * cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.d_model, bias=False)

    def fused_rows(self) -> dict[str, list[tuple[str, int]]]:
        """The logical matrices stacked in the fused weight, in row order (an optimizer that treats each
        matrix on its own, as Muon's authors recommend, splits it here)."""
        hidden = self.down_proj.in_features
        return {"gate_up_proj.weight": [("gate", hidden), ("up", hidden)]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
