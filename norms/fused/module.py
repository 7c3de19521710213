"""``FusedRMSNorm``: the module behind ``norm=fused_rmsnorm``."""

from __future__ import annotations

import torch

from norms.fused.ops import fused_add_rms_norm, fused_rms_norm
from norms.modules import RMSNorm, resolve_partial_k


class FusedRMSNorm(RMSNorm):
    """RMSNorm (or pRMSNorm with ``k``/``p``) computed by the fused Triton kernel.

    Same parameters and numerics as :class:`norms.RMSNorm`, so checkpoints move between the
    two. With a residual it adds and normalizes in one pass.
    """

    def __init__(
        self,
        dim: int,
        eps: float = 1e-6,
        k: int | None = None,
        p: float | None = None,
        cast_before_weight: bool = False,
    ) -> None:
        super().__init__(dim, eps, cast_before_weight)
        self.k = dim if k is None and p is None else resolve_partial_k(dim, p, k)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return fused_rms_norm(x, self.weight, self.eps, self.k, cast_before_weight=self.cast_before_weight)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return self.normalize(x)
        return fused_add_rms_norm(
            x, residual, self.weight, self.eps, self.k, cast_before_weight=self.cast_before_weight
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, k={self.k}"
