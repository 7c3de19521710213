"""The SwiGLU feed-forward branch (Shazeer 2020), as in LLaMA."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.norm_roles import norm_for


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)); with ``after_linear_norm`` (SimpleNorm) each projection's output is
    normalized: down_n(silu(gate_n(gate(x))) * up_n(up(x)))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        # gate and up projections in one matmul: rows [gate | up].
        self.gate_up_proj = nn.Linear(cfg.d_model, 2 * cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.d_model, bias=False)
        if cfg.after_linear_norm is not None:
            self.gate_proj_norm = norm_for(cfg, "gate_proj", cfg.hidden_dim)
            self.up_proj_norm = norm_for(cfg, "up_proj", cfg.hidden_dim)
            self.down_proj_norm = norm_for(cfg, "down_proj", cfg.d_model)

    def fused_rows(self) -> dict[str, list[tuple[str, int]]]:
        """The logical matrices stacked in the fused weight, in row order (an optimizer that treats each
        matrix on its own, as Muon's authors recommend, splits it here)."""
        hidden = self.down_proj.in_features
        return {"gate_up_proj.weight": [("gate", hidden), ("up", hidden)]}

    def input_linears(self) -> list[nn.Linear]:
        """The linear layers that read the branch's input (and nothing else does)."""
        return [self.gate_up_proj]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        if not hasattr(self, "down_proj_norm"):
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj_norm(self.down_proj(F.silu(self.gate_proj_norm(gate)) * self.up_proj_norm(up)))
