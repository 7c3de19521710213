"""Reference normalization ops: plain tensor code that defines what every norm computes.

These are the numerics the rest of the project (the modules, the fused Triton kernel, the
model) is checked against. They work over any number of leading axes and normalize the
last one.

Cast order, one rule for all three ops: half-precision inputs (float16, bfloat16) are
upcast to float32; the statistic, the normalization and the gain (and bias) all run in
float32; the result is rounded once, to the input dtype, at the very end. That is what
``torch.nn.RMSNorm`` and ``torch.nn.LayerNorm`` do (torch >= 2.8's fused kernels).
Hugging Face's ``LlamaRMSNorm`` instead rounds the normalized value to the input dtype
*before* the gain multiply; ``cast_before_weight=True`` reproduces that, to the bit.

The gain may be the input's dtype or float32 (mixed-precision training keeps float32
master weights); the result is always returned in the input dtype.
"""

from __future__ import annotations

import torch

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def check_input(x: torch.Tensor, eps: float = 1.0) -> int:
    """Validate what every op shares and return D, the size of the normalized axis (eps: for ops that have one)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got dtype {x.dtype}; cast it with x.float()")
    if x.dim() == 0:
        raise ValueError("x must have at least one axis: norms normalize over the last axis")
    dim = x.shape[-1]
    if dim == 0:
        raise ValueError("the normalized (last) axis of x has size 0; there is nothing to normalize")
    if not eps > 0:
        raise ValueError(f"eps must be > 0 (it keeps the division finite for all-zero rows), got {eps}")
    return dim


def check_affine(param: torch.Tensor | None, name: str, x: torch.Tensor, dim: int) -> None:
    """A per-feature gain or bias (or None) that fits ``x``: shape (dim,), x's device, x's dtype or float32."""
    if param is None:
        return
    if param.shape != (dim,):
        raise ValueError(f"{name} must have shape ({dim},) to match the last axis of x, got {tuple(param.shape)}")
    if param.device != x.device:
        raise ValueError(f"{name} is on {param.device} but x is on {x.device}; move both to the same device")
    if param.dtype not in (x.dtype, torch.float32):
        raise ValueError(f"{name} has dtype {param.dtype}; it must be x's dtype ({x.dtype}) or torch.float32")


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in _HALF_DTYPES else x.dtype


def check_k(k: object, dim: int) -> int:
    """pRMSNorm's count of leading features, an int in [1, dim] (a bool, an int subclass, is refused: True is no 1)."""
    if isinstance(k, bool) or not isinstance(k, int):
        raise ValueError(f"k must be an int in [1, {dim}] (the number of leading features in the statistic), got {k!r}")
    if not 1 <= k <= dim:
        raise ValueError(f"k must be in [1, {dim}] for a last axis of size {dim}, got k={k}")
    return k


def gain_mode(weight: torch.Tensor | None, zero_centered: bool) -> int:
    """The kernels' gain constant: 0 applies ``weight``, 1 applies ``1 + weight``, 2 applies no gain."""
    return 2 if weight is None else int(zero_centered)


def _gain(weight: torch.Tensor, dtype: torch.dtype, zero_centered: bool) -> torch.Tensor:
    """The gain in the compute dtype: ``weight``, or ``1 + weight`` added there (so a tiny w still counts)."""
    gain = weight.to(dtype)
    return gain + 1.0 if zero_centered else gain


def _apply_gain(
    x_hat: torch.Tensor,
    weight: torch.Tensor | None,
    out_dtype: torch.dtype,
    cast_before_weight: bool,
    zero_centered: bool = False,
) -> torch.Tensor:
    """Multiply the (compute-dtype) normalized rows by the gain and round to ``out_dtype``."""
    if weight is None:
        return x_hat.to(out_dtype)
    if cast_before_weight:
        x_hat = x_hat.to(out_dtype).to(x_hat.dtype)
    return (x_hat * _gain(weight, x_hat.dtype, zero_centered)).to(out_dtype)


def partial_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    k: int,
    eps: float = 1e-6,
    *,
    cast_before_weight: bool = False,
    zero_centered: bool = False,
) -> torch.Tensor:
    """pRMSNorm (Zhang & Sennrich 2019, Eq. 4): the RMS of the first ``k`` features scales all D.

    The statistic is an ordinary differentiable function of the prefix, so gradients of any
    output feature reach the prefix inputs. ``k == D`` is exactly :func:`rms_norm`.
    ``zero_centered=True`` applies the gain as ``1 + weight`` (Gemma's parametrization).
    """
    dim = check_input(x, eps)
    k = check_k(k, dim)
    check_affine(weight, "weight", x, dim)
    xc = x.to(_compute_dtype(x))
    inv_rms = torch.rsqrt(xc[..., :k].pow(2).mean(dim=-1, keepdim=True) + eps)
    return _apply_gain(xc * inv_rms, weight, x.dtype, cast_before_weight, zero_centered)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    *,
    cast_before_weight: bool = False,
    zero_centered: bool = False,
) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x**2) + eps) * weight``.

    eps sits inside the square root, as in ``torch.nn.RMSNorm``; no mean is subtracted and
    there is no bias.
    """
    dim = check_input(x, eps)
    return partial_rms_norm(x, weight, dim, eps, cast_before_weight=cast_before_weight, zero_centered=zero_centered)


def l2_norm(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``x / sqrt(sum(x**2) + eps)``: each vector onto the unit sphere (the normalized Transformer's norm).

    The sum, not the mean: the output has L2 norm 1 (RMSNorm's has RMS 1, norm sqrt(D)). No gain.
    """
    check_input(x, eps)
    xc = x.to(_compute_dtype(x))
    return (xc * torch.rsqrt(xc.pow(2).sum(dim=-1, keepdim=True) + eps)).to(x.dtype)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    zero_centered: bool = False,
) -> torch.Tensor:
    """LayerNorm (Ba et al. 2016): subtract the mean, divide by the (biased) standard deviation."""
    dim = check_input(x, eps)
    check_affine(weight, "weight", x, dim)
    check_affine(bias, "bias", x, dim)
    xc = x.to(_compute_dtype(x))
    centred = xc - xc.mean(dim=-1, keepdim=True)
    y = centred * torch.rsqrt(centred.pow(2).mean(dim=-1, keepdim=True) + eps)
    if weight is not None:
        y = y * _gain(weight, y.dtype, zero_centered)
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype)


def check_scalar(param: torch.Tensor, name: str, x: torch.Tensor) -> None:
    """A learned scalar (DyT's and Derf's alpha, Derf's shift): one element, on x's device."""
    if param.numel() != 1:
        raise ValueError(f"{name} must be a single learned scalar (shape (1,)), got shape {tuple(param.shape)}")
    if param.device != x.device:
        raise ValueError(f"{name} is on {param.device} but x is on {x.device}; move both to the same device")


def _pointwise_affine(
    squashed: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, out_dtype: torch.dtype
) -> torch.Tensor:
    if weight is not None:
        squashed = squashed * weight.to(squashed.dtype)
    if bias is not None:
        squashed = squashed + bias.to(squashed.dtype)
    return squashed.to(out_dtype)


def dyt(
    x: torch.Tensor, alpha: torch.Tensor, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """DyT (Zhu et al., CVPR 2025): ``weight * tanh(alpha * x) + bias``, element by element.

    No statistic: a learned scalar ``alpha`` sets how early tanh squashes large activations,
    which is the S-shape that LayerNorm's input-output map takes in trained Transformers.
    Computed in float32 for half inputs and rounded once, like the norms above.
    """
    dim = check_input(x)
    check_scalar(alpha, "alpha", x)
    check_affine(weight, "weight", x, dim)
    check_affine(bias, "bias", x, dim)
    xc = x.to(_compute_dtype(x))
    return _pointwise_affine(torch.tanh(alpha.to(xc.dtype) * xc), weight, bias, x.dtype)


def derf(
    x: torch.Tensor,
    alpha: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Derf (Chen et al. 2025, arXiv 2512.10938): ``weight * erf(alpha * x + shift) + bias``.

    Like DyT with erf in place of tanh (a steeper, Gaussian-CDF-shaped squash) and a learned
    scalar shift inside it.
    """
    dim = check_input(x)
    check_scalar(alpha, "alpha", x)
    check_scalar(shift, "shift", x)
    check_affine(weight, "weight", x, dim)
    check_affine(bias, "bias", x, dim)
    xc = x.to(_compute_dtype(x))
    return _pointwise_affine(torch.erf(alpha.to(xc.dtype) * xc + shift.to(xc.dtype)), weight, bias, x.dtype)
