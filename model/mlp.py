"""The SwiGLU feed-forward branch (Shazeer 2020), as in LLaMA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); a variant changes it through ``project_in`` and ``project_out``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # gate and up projections in one matmul: rows [gate | up].
        self.gate_up_proj = nn.Linear(cfg.d_model, 2 * cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.d_model, bias=False)

    def fused_rows(self) -> dict[str, list[tuple[str, int]]]:
        """The logical matrices stacked in the fused weight, in row order (an initialization or an optimizer that
        treats each matrix on its own splits it here: model/matrices.py)."""
        hidden = self.down_proj.in_features
        return {"gate_up_proj.weight": [("gate", hidden), ("up", hidden)]}

    def input_linears(self) -> list[nn.Linear]:
        """The linear layers that read the branch's input (and nothing else does)."""
        return [self.gate_up_proj]

    def project_in(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Slot: the gate's and the up projection's outputs."""
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return gate, up

    def project_out(self, hidden: torch.Tensor) -> torch.Tensor:
        """Slot: the down projection."""
        return self.down_proj(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.project_in(x)
        return self.project_out(F.silu(gate) * up)
