"""The L2 norm onto the unit sphere, nGPT's normalization."""

from __future__ import annotations

import torch

from norms.base import Norm, check_dim
from norms.functional import l2_norm


class L2Norm(Norm):
    """x / ||x||: every vector onto the unit sphere, no gain (nGPT's normalization; ``norms.l2_norm``)."""

    unit_sphere = True

    def __init__(self, dim: int, eps: float = 1e-12) -> None:
        super().__init__()
        check_dim(dim)
        self.dim, self.eps = dim, eps

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return l2_norm(x, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
