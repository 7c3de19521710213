"""nn.Module wrappers around the reference ops, with a learned gain (and LayerNorm's bias).

Every norm accepts an optional ``residual``: ``norm(x, residual)`` returns
``(norm(x + residual), x + residual)``. A pre-norm block adds its branch output to the
residual stream and normalizes the sum in one call, which the fused kernel does in a single
pass and the reference norms do in two; the block code is the same for all of them.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from norms.functional import _check_k, layer_norm, partial_rms_norm, rms_norm


class Norm(nn.Module):
    """Base class: subclasses implement ``normalize``; the residual-add contract lives here."""

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self.normalize(x)
        total = x + residual
        return self.normalize(total), total


def _check_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int (the feature size), got {dim!r}")


class RMSNorm(Norm):
    """RMSNorm with a gain initialised to ones."""

    def __init__(self, dim: int, eps: float = 1e-6, cast_before_weight: bool = False) -> None:
        super().__init__()
        _check_dim(dim)
        self.dim, self.eps, self.cast_before_weight = dim, eps, cast_before_weight
        self.weight = nn.Parameter(torch.ones(dim))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps, cast_before_weight=self.cast_before_weight)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, cast_before_weight={self.cast_before_weight}"


def resolve_partial_k(dim: int, p: float | None, k: int | None) -> int:
    """The number of prefix features pRMSNorm uses: an explicit ``k`` wins, else ``ceil(p * dim)``.

    Rounding up keeps at least one feature and never uses fewer than the fraction asked for
    (the paper's p = 6.25% of 512 features is k = 32).
    """
    if k is not None:
        return _check_k(k, dim)
    if p is None or isinstance(p, bool) or not 0 < p <= 1:
        raise ValueError(f"p must be a fraction in (0, 1] (the paper uses 0.0625), got {p!r}; or give k explicitly")
    # Round p*dim to 9 decimals first so binary noise (0.07 * 100 = 7.000000000000001) is no extra feature.
    return max(1, math.ceil(round(p * dim, 9)))


class PartialRMSNorm(Norm):
    """pRMSNorm: the RMS of the first ``k`` features normalizes all ``dim`` features."""

    def __init__(
        self,
        dim: int,
        p: float | None = 0.0625,
        k: int | None = None,
        eps: float = 1e-6,
        cast_before_weight: bool = False,
    ) -> None:
        super().__init__()
        _check_dim(dim)
        self.dim, self.eps, self.cast_before_weight = dim, eps, cast_before_weight
        self.k = resolve_partial_k(dim, p, k)
        self.weight = nn.Parameter(torch.ones(dim))

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return partial_rms_norm(x, self.weight, self.k, self.eps, cast_before_weight=self.cast_before_weight)

    def extra_repr(self) -> str:
        return f"{self.dim}, k={self.k}, eps={self.eps}, cast_before_weight={self.cast_before_weight}"


class LayerNorm(Norm):
    """LayerNorm with a gain (ones) and an optional bias (zeros)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        _check_dim(dim)
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm(x, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, bias={self.bias is not None}"
