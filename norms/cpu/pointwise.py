"""The C DyT and Derf (norms/cpu/pointwise.c) as torch custom ops with autograd, for float32 CPU tensors.

Eager DyT is five elementwise passes forward and more backward (4-6x the time of
``torch.nn.LayerNorm`` on CPU); the kernel is one pass each way. Other dtypes and devices, and
machines where the kernel cannot be built, take the reference ops.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from norms.cpu.build import load_library
from norms.cpu.rms_norm import pointer
from norms.functional import check_affine, check_input, check_scalar


@functools.cache
def _library() -> ctypes.CDLL | None:
    library = load_library("pointwise")
    if library is not None:
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        library.pointwise_fwd_f32.argtypes = [p, p, p, p, i64, i64, f32, f32, i32, i32, i32]
        library.pointwise_bwd_f32.argtypes = [p, p, p, p, p, p, p, i64, i64, f32, f32, i32, i32]
    return library


@torch.compiler.assume_constant_result  # torch.compile treats it as a constant, not a graph break
def available() -> bool:
    return _library() is not None


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the C kernel runs for these tensors (float32 on CPU, kernel built)."""
    return x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and available()


@torch.library.custom_op("normlab::cpu_pointwise_fwd", mutates_args=())
def _fwd(
    x: torch.Tensor,
    alpha: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    erf: bool,
) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    y = torch.empty_like(x2)
    b = weight if bias is None else bias.contiguous()  # not read without a bias
    _library().pointwise_fwd_f32(
        pointer(x2), pointer(weight.contiguous()), pointer(b), pointer(y), *x2.shape, alpha.item(), shift.item(),
        int(erf), int(bias is not None), torch.get_num_threads(),
    )  # fmt: skip
    return y.view(x.shape)


@_fwd.register_fake
def _(x, alpha, shift, weight, bias, erf):
    return torch.empty_like(x)


@torch.library.custom_op("normlab::cpu_pointwise_bwd", mutates_args=())
def _bwd(
    dy: torch.Tensor, x: torch.Tensor, alpha: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor, erf: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (dx, dalpha, dshift, dweight, dbias)."""
    x2, dy2 = x.reshape(-1, x.shape[-1]).contiguous(), dy.reshape(-1, dy.shape[-1]).contiguous()
    threads = torch.get_num_threads()
    dx = torch.empty_like(x2)
    dw, db = torch.zeros(threads, x2.shape[1]), torch.zeros(threads, x2.shape[1])
    scalars = torch.zeros(threads, 2, dtype=torch.float64)
    _library().pointwise_bwd_f32(
        pointer(dy2), pointer(x2), pointer(weight.contiguous()), pointer(dx), pointer(dw), pointer(db),
        pointer(scalars), *x2.shape, alpha.item(), shift.item(), int(erf), threads,
    )  # fmt: skip
    totals = scalars.sum(0).float()
    return dx.view(x.shape), totals[:1].clone(), totals[1:].clone(), dw.sum(0), db.sum(0)


@_bwd.register_fake
def _(dy, x, alpha, shift, weight, erf):
    return (
        torch.empty_like(x),
        alpha.new_empty(1),
        alpha.new_empty(1),
        torch.empty_like(weight),
        torch.empty_like(weight),
    )


def _setup_context(ctx, inputs, output):
    x, alpha, shift, weight, bias, erf = inputs
    ctx.save_for_backward(x, alpha, shift, weight)
    ctx.erf, ctx.has_bias = erf, bias is not None


def _backward(ctx, dy):
    x, alpha, shift, weight = ctx.saved_tensors
    dx, dalpha, dshift, dw, db = _bwd(dy, x, alpha, shift, weight, ctx.erf)
    return dx, dalpha, dshift, dw, (db if ctx.has_bias else None), None


_fwd.register_autograd(_backward, setup_context=_setup_context)


def cpu_pointwise(
    x: torch.Tensor,
    alpha: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """DyT (``shift`` None) or Derf through the C kernel; the numerics of ``norms.dyt`` / ``norms.derf``."""
    dim = check_input(x)
    check_scalar(alpha, "alpha", x)
    check_affine(weight, "weight", x, dim)
    check_affine(bias, "bias", x, dim)
    if shift is None:
        return _fwd(x, alpha, alpha.new_zeros(1), weight, bias, False)
    check_scalar(shift, "shift", x)
    return _fwd(x, alpha, shift, weight, bias, True)
