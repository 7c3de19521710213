"""LayerNorm: subtract the mean, divide by the standard deviation; a gain and an optional bias."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from norms.base import GainedNorm
from norms.functional import layer_norm


class LayerNorm(GainedNorm):
    """LayerNorm with a gain (ones; or zeros applied as 1 + w; or none) and an optional bias (zeros)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, gain: str = "standard") -> None:
        super().__init__(dim, eps, gain)
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """torch's native layer_norm kernel: the reference op's numerics to within one rounding, and
        several times faster (python -m lab bench-norms). It refuses float64 inputs with float32
        parameters, which the reference op takes."""
        params = [p for p in (self.weight, self.bias) if p is not None]
        if x.dtype == torch.float64 and any(p.dtype != x.dtype for p in params):
            return layer_norm(x, self.weight, self.bias, self.eps, zero_centered=self.zero_centered)
        weight, bias = self.weight, self.bias
        if self.zero_centered:  # 1 + w added in float32 at least, so a small w is not lost to bfloat16
            weight = weight.to(torch.promote_types(weight.dtype, torch.float32)) + 1.0
            bias = None if bias is None else bias.to(weight.dtype)  # the kernel wants one parameter dtype
        return F.layer_norm(x, (self.dim,), weight, bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}, gain={self.gain}"
