"""Statistic-free replacements for a norm: DyT (``g * tanh(alpha x) + b``) and Derf (``g * erf(alpha x + s) + b``)."""

from __future__ import annotations

import torch
from torch import nn

from norms import registry
from norms.base import Norm, check_dim
from norms.functional import derf, dyt


def _check_alpha_init(alpha_init: float) -> None:
    if isinstance(alpha_init, bool) or not isinstance(alpha_init, (int, float)) or not alpha_init > 0:
        raise ValueError(
            f"alpha_init must be a number > 0 (the initial slope of the squashing function; the papers use "
            f"0.5, and 0.8 / 0.2 for attention / other norms in LLaMA), got {alpha_init!r}"
        )


class _PointwiseNorm(Norm):
    """A statistic-free replacement for a norm: ``weight * squash(alpha * x [+ shift]) + bias``.

    On float32 CPU tensors the C kernel runs it (one pass each way); elsewhere the reference op.
    """

    SATURATION = 2.0  # |argument| past which tanh and erf are within 4% (resp. 0.5%) of their limit

    def __init__(self, dim: int, alpha_init: float, bias: bool) -> None:
        super().__init__()
        check_dim(dim)
        _check_alpha_init(alpha_init)
        self.dim, self.alpha_init = dim, alpha_init
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        registry.backend("cpu_pointwise")  # loaded (and built, once per machine) with the first such norm

    def squash_argument(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x

    def _c_kernel_runs(self, x: torch.Tensor) -> bool:
        return registry.backend("cpu_pointwise").applies(x, self.weight)

    def backend(self, device: torch.device | str) -> str:
        available = registry.backend("cpu_pointwise").available()
        return "c-kernel" if torch.device(device).type == "cpu" and available else "pytorch"

    @torch.no_grad()
    def saturated_fraction(self, x: torch.Tensor) -> float:
        """The share of inputs in the flat part of the squash (|argument| > 2): what no longer passes through."""
        return (self.squash_argument(x.float()).abs() > self.SATURATION).float().mean().item()

    def extra_repr(self) -> str:
        return f"{self.dim}, alpha_init={self.alpha_init}, bias={self.bias is not None}"


class DyT(_PointwiseNorm):
    """Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias`` with a learned scalar alpha."""

    def __init__(self, dim: int, alpha_init: float = 0.5, bias: bool = True) -> None:
        super().__init__(dim, alpha_init, bias)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if self._c_kernel_runs(x):
            return registry.backend("cpu_pointwise").cpu_pointwise(x, self.alpha, self.weight, self.bias)
        return dyt(x, self.alpha, self.weight, self.bias)


class Derf(_PointwiseNorm):
    """Dynamic erf (Chen et al. 2025): ``weight * erf(alpha * x + shift) + bias``, alpha and shift learned scalars."""

    def __init__(self, dim: int, alpha_init: float = 0.5, shift_init: float = 0.0, bias: bool = True) -> None:
        super().__init__(dim, alpha_init, bias)
        self.shift = nn.Parameter(torch.full((1,), float(shift_init)))

    def squash_argument(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x + self.shift

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        if self._c_kernel_runs(x):
            return registry.backend("cpu_pointwise").cpu_pointwise(x, self.alpha, self.weight, self.bias, self.shift)
        return derf(x, self.alpha, self.shift, self.weight, self.bias)
