"""DeepNorm (DeepNet, Wang et al. 2022, arXiv 2203.00555): post-norm with the residual up-weighted, and
DeepNet's initialization, which bounds the model update at any depth.

    deepnorm   h = N(alpha x + F(x)), alpha = (2L)^(1/4)     no final norm
"""

from __future__ import annotations

import math

import torch

from model.attention import KVCache
from model.blocks import Block
from model.matrices import logical_matrices


class DeepNormBlock(Block):
    """h = N(alpha x + attn(x)); out = N(alpha h + mlp(h)), alpha = (2L)^(1/4).

    Post-norm with the residual up-weighted, and DeepNet's initialization (Wang et al. 2022, arXiv
    2203.00555, Figure 2 and Table 1, decoder-only constants): every branch matrix Xavier-normal, std
    gain * sqrt(2 / (fan_in + fan_out)), with gain beta = (8L)^(-1/4) for the value, output and MLP
    matrices and 1 for q and k, which bounds the model update at any depth.
    """

    roles = ("attn_out", "mlp_out")
    has_final_norm = False
    QK_MATRICES = ("attn.qkv_proj.weight[q]", "attn.qkv_proj.weight[k]")

    @property
    def alpha(self) -> float:
        return (2 * self.cfg.n_layers) ** 0.25

    @property
    def beta(self) -> float:
        return (8 * self.cfg.n_layers) ** -0.25

    def forward(self, x, cos, sin, cache: KVCache | None = None, start_pos: int = 0) -> torch.Tensor:
        h, _ = self.attn_out_norm(self.attention(x, cos, sin, cache, start_pos), residual=self.alpha * x)
        out, _ = self.mlp_out_norm(self.feed_forward(h), residual=self.alpha * h)
        return out

    def init_stds(self) -> dict[str, float]:
        return {}  # drawn at init_std, then rescaled to Xavier-normal by after_init

    @torch.no_grad()
    def after_init(self) -> None:
        """Each logical matrix (q, k and v of the fused weight on their own) rescaled from its N(0, init_std)
        draw to DeepNet's std: the same draws as every other placement's, so a seed's weights differ by scale."""
        for name, weight, rows in logical_matrices(self):
            fan_out, fan_in = weight[rows].shape
            gain = 1.0 if name in self.QK_MATRICES else self.beta
            weight[rows] *= gain * math.sqrt(2 / (fan_in + fan_out)) / self.cfg.init_std
