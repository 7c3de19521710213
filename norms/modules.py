"""nn.Module wrappers around the reference ops, with learned gains (and biases and scalars).

Every norm accepts an optional ``residual``: ``norm(x, residual)`` returns
``(norm(x + residual), x + residual)``. A pre-norm block adds its branch output to the
residual stream and normalizes the sum in one call, which the fused kernel does in a single
pass and the reference norms do in two; the block code is the same for all of them.

What a norm can do beyond computing (its gain, an equivalent plain RMSNorm for export, the
backend that runs it) is asked of the class, so code elsewhere never lists norm names.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from norms import cpu
from norms.functional import _check_k, derf, dyt, l2_norm, layer_norm, partial_rms_norm

GAINS = ("standard", "one_plus", "none")


class Norm(nn.Module):
    """Base class: subclasses implement ``normalize``; the residual-add contract lives here.

    ``role`` is a free-form tag that whoever places the norm may set (a model sets
    ``"attn_in"``, ``"q"``, ...), so that statistics can say what the norm sees.
    ``output_scale`` multiplies the normalized output by a constant (LayerNorm Scaling sets
    1/sqrt(layer)); at 1 it costs nothing.
    """

    role: str | None = None
    output_scale: float = 1.0
    unit_sphere = False  # whether every output vector has L2 norm 1 (what nGPT's block needs)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def scaled(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.output_scale == 1.0 else y * self.output_scale

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return self.scaled(self.normalize(x))
        total = x + residual
        return self.scaled(self.normalize(total)), total

    def effective_gain(self) -> torch.Tensor | None:
        """The per-feature gain the output is multiplied by, in float32, or None without one."""
        weight = getattr(self, "weight", None)
        return None if weight is None else weight.detach().float()

    def plain_rms_norm_weight(self) -> torch.Tensor | None:
        """The weight ``w`` of an equivalent ``x * rsqrt(mean(x**2) + eps) * w`` over all features, or None.

        What exporting to a Hugging Face class with an RMSNorm (Llama, Qwen3, OLMo 2) needs.
        """
        return None

    def backend(self, device: torch.device | str) -> str:
        """The implementation that runs this norm on ``device`` (recorded in a run's config)."""
        return "pytorch"


def _check_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim must be a positive int (the feature size), got {dim!r}")


def _gain_parameter(dim: int, gain: str) -> nn.Parameter | None:
    """The learned gain: ones (standard), zeros applied as 1 + w (one_plus, Gemma), or none."""
    if gain not in GAINS:
        raise ValueError(f"gain must be one of {', '.join(GAINS)}, got {gain!r}")
    if gain == "none":
        return None
    return nn.Parameter(torch.zeros(dim) if gain == "one_plus" else torch.ones(dim))


class _GainedNorm(Norm):
    """A norm with a gain parametrization (``standard``, ``one_plus`` or ``none``)."""

    def __init__(self, dim: int, eps: float, gain: str) -> None:
        super().__init__()
        _check_dim(dim)
        self.dim, self.eps, self.gain = dim, eps, gain
        self.register_parameter("weight", _gain_parameter(dim, gain))

    @property
    def zero_centered(self) -> bool:
        return self.gain == "one_plus"

    def effective_gain(self) -> torch.Tensor | None:
        gain = super().effective_gain()
        return gain + 1.0 if gain is not None and self.zero_centered else gain

    def gain_or_ones(self) -> torch.Tensor:
        gain = self.effective_gain()
        return torch.ones(self.dim) if gain is None else gain


class _RMSFamily(_GainedNorm):
    """RMSNorm over the first ``k`` features: the C kernel on float32 CPU tensors, else the reference op.

    The two agree to float32 rounding (tests/unit/norms/test_cpu_kernels.py); in float32 the cast order
    makes no difference, so ``cast_before_weight`` only matters on the reference path.
    """

    k: int
    cast_before_weight: bool

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
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
        return "c-kernel" if torch.device(device).type == "cpu" and cpu.available() else "pytorch"


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
        return _check_k(k, dim)
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


class LayerNorm(_GainedNorm):
    """LayerNorm with a gain (ones; or zeros applied as 1 + w; or none) and an optional bias (zeros)."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True, gain: str = "standard") -> None:
        super().__init__(dim, eps, gain)
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """torch's native layer_norm kernel: the reference op's numerics to within one rounding, and
        several times faster (scripts/bench_norms.py). It refuses float64 inputs with float32
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
        _check_dim(dim)
        _check_alpha_init(alpha_init)
        self.dim, self.alpha_init = dim, alpha_init
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def squash_argument(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x

    def _c_kernel_runs(self, x: torch.Tensor) -> bool:
        return cpu.pointwise.applies(x, self.weight)

    def backend(self, device: torch.device | str) -> str:
        return "c-kernel" if torch.device(device).type == "cpu" and cpu.pointwise.available() else "pytorch"

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
            return cpu.cpu_pointwise(x, self.alpha, self.weight, self.bias)
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
            return cpu.cpu_pointwise(x, self.alpha, self.weight, self.bias, self.shift)
        return derf(x, self.alpha, self.shift, self.weight, self.bias)


class Identity(Norm):
    """No normalization at all: the baseline that shows what the norms are for."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        _check_dim(dim)
        self.dim = dim

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"{self.dim}"


class L2Norm(Norm):
    """x / ||x||: every vector onto the unit sphere, no gain (nGPT's normalization; ``norms.l2_norm``)."""

    unit_sphere = True

    def __init__(self, dim: int, eps: float = 1e-12) -> None:
        super().__init__()
        _check_dim(dim)
        self.dim, self.eps = dim, eps

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return l2_norm(x, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"
