"""The C RMSNorm (norms/cpu/rms_norm.c) as torch custom ops with autograd, for float32 CPU tensors.

Custom ops, so ``torch.compile`` sees one opaque node per call. Other dtypes and devices, and
machines where the kernel cannot be built, take the reference ops; ``applies`` says which.
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch

from norms.cpu.build import load_library
from norms.functional import check_affine, check_input, check_k, gain_mode


@functools.cache
def _library() -> ctypes.CDLL | None:
    library = load_library("rms_norm")
    if library is not None:
        pointer, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        library.rms_norm_fwd_f32.argtypes = [*[pointer] * 4, i64, i64, i64, ctypes.c_float, i32, i32]
        library.rms_norm_bwd_f32.argtypes = [*[pointer] * 6, i64, i64, i64, i32, i32]
    return library


@torch.compiler.assume_constant_result  # torch.compile treats it as a constant, not a graph break
def available() -> bool:
    """Whether the kernel is built and loaded on this machine."""
    return _library() is not None


def applies(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    """Whether the C kernel runs for these tensors (float32 on CPU, kernel built)."""
    float32_cpu = x.device.type == "cpu" and x.dtype == torch.float32
    return float32_cpu and (weight is None or weight.dtype == torch.float32) and available()


def pointer(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


@torch.library.custom_op("normlab::cpu_rms_norm_fwd", mutates_args=())
def _fwd(
    x: torch.Tensor, weight: torch.Tensor | None, k: int, eps: float, gain: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (y, per-row 1/rms)."""
    x2 = x.reshape(-1, x.shape[-1]).contiguous()
    rows, dim = x2.shape
    y = torch.empty_like(x2)
    rstd = torch.empty(rows, dtype=torch.float32)
    w = x2 if weight is None else weight.contiguous()  # not read without a gain
    _library().rms_norm_fwd_f32(
        pointer(x2),
        pointer(w),
        pointer(y),
        pointer(rstd),
        rows,
        dim,
        k,
        ctypes.c_float(eps),
        gain,
        torch.get_num_threads(),
    )
    return y.view(x.shape), rstd


@_fwd.register_fake
def _(x, weight, k, eps, gain):
    return torch.empty_like(x), x.new_empty(math.prod(x.shape[:-1]), dtype=torch.float32)


@torch.library.custom_op("normlab::cpu_rms_norm_bwd", mutates_args=())
def _bwd(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, rstd: torch.Tensor, k: int, gain: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dx, dweight); dweight is empty without a gain."""
    x2, dy2 = x.reshape(-1, x.shape[-1]).contiguous(), dy.reshape(-1, dy.shape[-1]).contiguous()
    rows, dim = x2.shape
    threads = torch.get_num_threads()
    dx = torch.empty_like(x2)
    dw_partial = torch.zeros(threads if weight is not None else 1, dim)
    w = x2 if weight is None else weight.contiguous()
    _library().rms_norm_bwd_f32(
        pointer(dy2),
        pointer(x2),
        pointer(w),
        pointer(rstd),
        pointer(dx),
        pointer(dw_partial),
        rows,
        dim,
        k,
        gain,
        threads,
    )
    return dx.view(x.shape), (dw_partial.sum(0) if weight is not None else x.new_empty(0))


@_bwd.register_fake
def _(dy, x, weight, rstd, k, gain):
    return torch.empty_like(x), x.new_empty(0) if weight is None else torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, weight, k, _eps, gain = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.k, ctx.gain = k, gain


def _backward(ctx, dy, _drstd):
    x, weight, rstd = ctx.saved_tensors
    dx, dw = _bwd(dy, x, weight, rstd, ctx.k, ctx.gain)
    return dx, (dw if weight is not None else None), None, None, None


_fwd.register_autograd(_backward, setup_context=_setup_context)


def cpu_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    k: int | None = None,
    *,
    zero_centered: bool = False,
) -> torch.Tensor:
    """RMSNorm (pRMSNorm when ``k`` < D) through the C kernel; the numerics of ``norms.partial_rms_norm``."""
    dim = check_input(x, eps)
    check_affine(weight, "weight", x, dim)
    k = dim if k is None else check_k(k, dim)
    return _fwd(x, weight, k, eps, gain_mode(weight, zero_centered))[0]
