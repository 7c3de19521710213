"""The OP block's down-weighted residual branches (He et al. 2024, "Understanding and minimising outlier
features in transformer training", arXiv 2405.19279).

``model.residual_scale=beta`` multiplies each residual branch's output by beta (the paper: 0.2, of order
1/sqrt(depth)), so a stack without norms (norm=identity) keeps its stream's scale; the OP block's norms at
both ends of the stack are the core's ``model.outer_norm`` (configs/variant/op_block.yaml sets both).
"""

from __future__ import annotations

import torch

from model.blocks import Block


class ScaledBranches(Block):
    def attention(self, x, cos, sin, cache, start_pos: int) -> torch.Tensor:
        return super().attention(x, cos, sin, cache, start_pos) * self.cfg.residual_scale

    def feed_forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().feed_forward(x) * self.cfg.residual_scale


BLOCK = ScaledBranches
