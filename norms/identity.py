"""No norm at all."""

from __future__ import annotations

import torch

from norms.base import Norm, check_dim


class Identity(Norm):
    """No normalization at all: the baseline that shows what the norms are for."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        check_dim(dim)
        self.dim = dim

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"{self.dim}"
