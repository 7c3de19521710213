"""RMSNorm and partial RMSNorm (Zhang & Sennrich, NeurIPS 2019): ``x / sqrt(mean(x[..., :k]^2) + eps) * g``."""

from __future__ import annotations

import math

import torch

from norms import registry
from norms.base import GainedNorm
from norms.functional import check_k, partial_rms_norm


class _RMSFamily(GainedNorm):
    """RMSNorm over the first ``k`` features: the C kernel on float32 CPU tensors, else the reference op.

    The two agree to float32 rounding (tests/unit/norms/test_cpu_kernels.py); in float32 the cast order
    makes no difference, so ``cast_before_weight`` only matters on the reference path.
    """

    k: int
    cast_before_weight: bool

    def __init__(self, dim: int, eps: float, gain: str) -> None:
        super().__init__(dim, eps, gain)
        registry.backend("cpu_rms_norm")  # loaded (and built, once per machine) with the first such norm

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        cpu = registry.backend("cpu_rms_norm")
        if cpu.applies(x, self.weight):
            return cpu.cpu_rms_norm(x, self.weight, self.eps, self.k, zero_centered=self.zero_centered)
        return partial_rms_norm(
            x,
            self.weight,
            self.k,
            self.eps,
            cast_before_weight=self.cast_before_weight,
            zero_centered=self.zero_centered,
        )

    def backend(self, device: torch.device | str) -> str:
        available = registry.backend("cpu_rms_norm").available()
        return "c-kernel" if torch.device(device).type == "cpu" and available else "pytorch"


class RMSNorm(_RMSFamily):
    """RMSNorm with a gain initialised to ones (or zeros applied as 1 + w, or none)."""

    def __init__(self, dim: int, eps: float = 1e-6, cast_before_weight: bool = False, gain: str = "standard") -> None:
        super().__init__(dim, eps, gain)
        self.cast_before_weight = cast_before_weight
        self.k = dim

    def plain_rms_norm_weight(self) -> torch.Tensor | None:
        return self.gain_or_ones() * self.output_scale

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, cast_before_weight={self.cast_before_weight}, gain={self.gain}"


def resolve_partial_k(dim: int, p: float | None, k: int | None) -> int:
    """The number of prefix features pRMSNorm uses: an explicit ``k`` wins, else ``ceil(p * dim)``.

    Rounding up keeps at least one feature and never uses fewer than the fraction asked for
    (the paper's p = 6.25% of 512 features is k = 32).
    """
    if k is not None:
        return check_k(k, dim)
    if p is None or isinstance(p, bool) or not 0 < p <= 1:
        raise ValueError(f"p must be a fraction in (0, 1] (the paper uses 0.0625), got {p!r}; or give k explicitly")
    # Round p*dim to 9 decimals first so binary noise (0.07 * 100 = 7.000000000000001) is no extra feature.
    return max(1, math.ceil(round(p * dim, 9)))


class PartialRMSNorm(_RMSFamily):
    """pRMSNorm: the RMS of the first ``k`` features normalizes all ``dim`` features."""

    def __init__(
        self,
        dim: int,
        p: float | None = 0.0625,
        k: int | None = None,
        eps: float = 1e-6,
        cast_before_weight: bool = False,
        gain: str = "standard",
    ) -> None:
        super().__init__(dim, eps, gain)
        self.cast_before_weight = cast_before_weight
        self.k = resolve_partial_k(dim, p, k)

    def plain_rms_norm_weight(self) -> torch.Tensor | None:
        return self.gain_or_ones() * self.output_scale if self.k == self.dim else None

    def extra_repr(self) -> str:
        return f"{self.dim}, k={self.k}, eps={self.eps}, cast_before_weight={self.cast_before_weight}, gain={self.gain}"
