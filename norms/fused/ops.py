"""The fused RMSNorm as PyTorch custom ops, with autograd, and the backend choice.

The kernels are wrapped with ``torch.library.custom_op`` so that ``torch.compile`` treats
each launch as one opaque node (no graph break) and autograd sees a forward/backward pair.

Backends, in order: Triton on CUDA tensors; the Triton interpreter on CPU tensors when
``TRITON_INTERPRET=1`` was set before this module was imported (that is how CI runs the
kernel code without a GPU); otherwise the reference ``norms.rms_norm`` runs instead, with a
single warning that says so. float64 inputs always take the reference op, since the kernel
accumulates in float32. ``kernel_backend(device)`` names the one that will run, so a
training run can record it.
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from norms.functional import check_affine, check_input, check_k, gain_mode, partial_rms_norm

try:
    import triton

    from norms.fused.kernels import rms_norm_bwd_kernel, rms_norm_fwd_kernel
except ImportError:  # a CPU-only torch install brings no Triton
    triton = None

# Read once: Triton decides at kernel-definition time whether it interprets.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"

# Rows up to this many features are held in registers in one pass; longer rows loop over blocks.
MAX_SINGLE_BLOCK = 8192
# Rows shorter than this share a program: a tile of TILE_ELEMENTS // block rows.
TILE_ELEMENTS = 2048


def kernel_backend(device: torch.device | str) -> str:
    """Which implementation a tensor on ``device`` gets: 'triton', 'triton-interpreter' or 'reference'."""
    device = torch.device(device)
    if triton is None:
        return "reference"
    if device.type == "cuda":
        return "triton"
    if device.type == "cpu" and _INTERPRETED:
        return "triton-interpreter"
    return "reference"


def launch_config(n: int) -> tuple[int, int, bool, int]:
    """(block size, rows per tile, whether the row fits one block, warps) for rows of ``n`` features."""
    block = min(triton.next_power_of_2(n), MAX_SINGLE_BLOCK)
    single = n <= block
    rows = max(1, TILE_ELEMENTS // block) if single else 1
    return block, rows, single, min(max(block * rows // 256, 1), 8)  # 16 warps made ptxas spill (compile_kernels.py)


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """View as (rows, D) without a copy when possible; only a non-unit last stride forces one."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


@torch.library.custom_op("normlab::rms_norm_fwd", mutates_args=())
def _rms_norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    k: int,
    eps: float,
    cast_before_weight: bool,
    gain: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (y, x + residual or an empty tensor, per-row 1/rms in float32)."""
    x2 = _as_rows(x)
    m, n = x2.shape
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x.device)
    if residual is None:
        r2, s = x2, x.new_empty(0)
        s2 = y  # unused by the kernel; any tensor fills the slot
    else:
        r2 = _as_rows(residual)
        s = torch.empty((m, n), dtype=x.dtype, device=x.device)
        s2 = s
    if m > 0:
        block, rows, single, warps = launch_config(n)
        rms_norm_fwd_kernel[(triton.cdiv(m, rows),)](
            x2,
            r2,
            x2 if weight is None else weight,  # not read without a gain
            y,
            s2,
            rstd,
            x2.stride(0),
            r2.stride(0),
            y.stride(0),
            s2.stride(0),
            m,
            n,
            k,
            eps,
            HAS_RESIDUAL=residual is not None,
            CAST_BEFORE_WEIGHT=cast_before_weight,
            GAIN=gain,
            BLOCK=block,
            ROWS=rows,
            SINGLE_BLOCK=single,
            num_warps=warps,
        )
    return y.view(x.shape), s.view(x.shape) if residual is not None else s, rstd


@_rms_norm_fwd.register_fake
def _(x, residual, weight, k, eps, cast_before_weight, gain):
    rows = math.prod(x.shape[:-1])
    s = torch.empty_like(x) if residual is not None else x.new_empty(0)
    return torch.empty_like(x), s, x.new_empty(rows, dtype=torch.float32)


def _num_bwd_programs(m: int, device: torch.device) -> int:
    if device.type == "cuda":
        return min(m, 4 * torch.cuda.get_device_properties(device).multi_processor_count)
    return min(m, 4)  # the interpreter runs programs one after another; few is fastest


@torch.library.custom_op("normlab::rms_norm_bwd", mutates_args=())
def _rms_norm_bwd(
    dy: torch.Tensor,
    dsum: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    k: int,
    gain: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dx, dweight); dweight is empty without a gain. ``x`` is the normalized input
    (x + residual when fused); dx is a new buffer."""
    x2, dy2 = _as_rows(x), _as_rows(dy)
    m, n = x2.shape
    dx = torch.empty((m, n), dtype=x.dtype, device=x.device)
    programs = max(_num_bwd_programs(m, x.device), 1)
    dw_partial = torch.zeros((programs if weight is not None else 1, n), dtype=torch.float32, device=x.device)
    ds2 = _as_rows(dsum) if dsum is not None else dy2
    if m > 0:
        block, rows, single, warps = launch_config(n)
        dot = rstd if single else torch.empty(m, dtype=torch.float32, device=x.device)  # per-row scratch
        rms_norm_bwd_kernel[(programs,)](
            dy2,
            x2,
            x2 if weight is None else weight,  # not read without a gain
            rstd,
            ds2,
            dx,
            dw_partial,
            dot,
            dy2.stride(0),
            x2.stride(0),
            ds2.stride(0),
            dx.stride(0),
            m,
            n,
            k,
            triton.cdiv(m, programs),
            HAS_DRESIDUAL=dsum is not None,
            GAIN=gain,
            BLOCK=block,
            ROWS=rows,
            SINGLE_BLOCK=single,
            num_warps=warps,
        )
    if weight is None:
        return dx.view(x.shape), x.new_empty(0)
    return dx.view(x.shape), dw_partial.sum(0).to(weight.dtype)


@_rms_norm_bwd.register_fake
def _(dy, dsum, x, weight, rstd, k, gain):
    return torch.empty_like(x), x.new_empty(0) if weight is None else torch.empty_like(weight)


def _setup_context(ctx, inputs, output):
    x, residual, weight, k, _eps, _cast, gain = inputs
    _y, total, rstd = output
    ctx.save_for_backward(total if residual is not None else x, weight, rstd)
    ctx.k, ctx.gain, ctx.has_residual = k, gain, residual is not None


def _backward(ctx, dy, dsum, _drstd):
    normalized_input, weight, rstd = ctx.saved_tensors
    dsum = dsum if ctx.has_residual else None
    dx, dw = _rms_norm_bwd(dy, dsum, normalized_input, weight, rstd, ctx.k, ctx.gain)
    return dx, (dx if ctx.has_residual else None), (dw if weight is not None else None), None, None, None, None


_rms_norm_fwd.register_autograd(_backward, setup_context=_setup_context)

_warned_fallback: set[str] = set()


def _use_kernel(x: torch.Tensor) -> bool:
    if x.dtype == torch.float64:
        return False  # the kernel accumulates in float32; float64 callers want float64 accuracy
    backend = kernel_backend(x.device)
    if backend == "reference" and x.device.type not in _warned_fallback:
        _warned_fallback.add(x.device.type)
        warnings.warn(
            f"fused_rmsnorm: no Triton backend for {x.device.type} tensors "
            f"({'Triton is not installed' if triton is None else 'set TRITON_INTERPRET=1 before importing norms to interpret it'}); "
            "running the reference norms.rms_norm instead (same math, unfused).",
            stacklevel=3,
        )
    return backend != "reference"


def _validated_k(x: torch.Tensor, weight: torch.Tensor | None, k: int | None, eps: float) -> int:
    dim = check_input(x, eps)
    check_affine(weight, "weight", x, dim)
    return dim if k is None else check_k(k, dim)


def fused_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    k: int | None = None,
    *,
    cast_before_weight: bool = False,
    zero_centered: bool = False,
) -> torch.Tensor:
    """RMSNorm (pRMSNorm when ``k`` < D) through the Triton kernel; numerics of ``norms.partial_rms_norm``.

    ``weight=None`` applies no gain; ``zero_centered=True`` applies ``1 + weight``.
    """
    k = _validated_k(x, weight, k, eps)
    if not _use_kernel(x):
        return partial_rms_norm(x, weight, k, eps, cast_before_weight=cast_before_weight, zero_centered=zero_centered)
    return _rms_norm_fwd(x, None, weight, k, eps, cast_before_weight, gain_mode(weight, zero_centered))[0]


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    eps: float = 1e-6,
    k: int | None = None,
    *,
    cast_before_weight: bool = False,
    zero_centered: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(rms_norm(x + residual), x + residual)`` in one pass over memory."""
    k = _validated_k(x, weight, k, eps)
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(
            f"residual must match x in shape, dtype and device; got {tuple(residual.shape)} {residual.dtype} "
            f"{residual.device} for x {tuple(x.shape)} {x.dtype} {x.device}"
        )
    if not _use_kernel(x):
        total = x + residual
        normed = partial_rms_norm(
            total, weight, k, eps, cast_before_weight=cast_before_weight, zero_centered=zero_centered
        )
        return normed, total
    y, total, _ = _rms_norm_fwd(x, residual, weight, k, eps, cast_before_weight, gain_mode(weight, zero_centered))
    return y, total
