"""LayerNorm Scaling (Sun et al. 2025, arXiv 2502.05795): the norms of layer l (1-based) scaled by 1/sqrt(l).

``norm.depth_scaling=inverse_sqrt`` multiplies each block norm's output by 1/sqrt(l), which keeps the
variance of a deep pre-norm stream from growing with depth (the paper's "curse of depth").
"""

from __future__ import annotations

import math

from model.blocks import Block
from model.config import ModelConfig
from norms import Norm


class LayerNormScaling(Block):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__(cfg, layer)
        for norm in self.children():
            if isinstance(norm, Norm):
                norm.output_scale = 1 / math.sqrt(layer + 1)


BLOCK = LayerNormScaling
