"""Triton kernels for RMSNorm, partial RMSNorm and the fused residual add.

Forward: one program per row. The statistic (mean of squares over the first K features,
in float32) and the output are computed in one pass when the row fits one block, or in
two loops over column blocks when it does not, so there is no cap on the hidden size.
The per-row reciprocal RMS is saved for the backward pass.

Backward: each program owns a contiguous range of rows; it writes dx for each row from
the saved statistic and accumulates its share of the weight gradient in float32, which
the caller reduces across programs. With a partial statistic (K < N) the gradient of
the statistic only flows into the first K features:

    dx_j = rstd * g_j - [j < K] * x_j * rstd**3 * sum_i(g_i * x_i) / K,   g = dy * w

The gain is a compile-time choice, GAIN: 0 applies w, 1 applies 1 + w (zero-centred, the
addition in float32, so a small w is not lost to a half-precision rounding), 2 applies
none. With one_plus the weight gradient is unchanged (d(1 + w)/dw = 1); with none there is
none.

Row offsets are 64-bit, so tensors past 2**31 elements index correctly.
"""

import triton
import triton.language as tl


@triton.jit
def _load_f32(ptr, cols, mask):
    return tl.load(ptr + cols, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _load_input(X, R, S, cols, mask, HAS_RESIDUAL: tl.constexpr, STORE_SUM: tl.constexpr):
    """The normalized input in float32: x, or x + residual rounded to the input dtype exactly like
    eager ``x + residual`` (and written to S when STORE_SUM)."""
    x = tl.load(X + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(R + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        if STORE_SUM:
            tl.store(S + cols, x, mask=mask)
    return x.to(tl.float32)


@triton.jit
def _load_gain(W, cols, mask, GAIN: tl.constexpr):
    """The gain in float32: w (GAIN 0), 1 + w (GAIN 1) or 1 (GAIN 2, W is not read)."""
    if GAIN == 2:
        gain = tl.full(cols.shape, 1.0, tl.float32)
    else:
        gain = _load_f32(W, cols, mask)
        if GAIN == 1:
            gain = gain + 1.0
    return gain


@triton.jit
def _store_output(Y, W, cols, mask, x, rstd, CAST_BEFORE_WEIGHT: tl.constexpr, GAIN: tl.constexpr):
    """y = x * rstd * gain, with the gain applied in float32 and one rounding (or HF's order)."""
    y = x * rstd
    if CAST_BEFORE_WEIGHT:
        y = y.to(Y.dtype.element_ty).to(tl.float32)
    if GAIN != 2:
        y = y * _load_gain(W, cols, mask, GAIN)
    tl.store(Y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_fwd_kernel(
    X,
    R,
    W,
    Y,
    S,
    RSTD,
    stride_x,
    stride_r,
    stride_y,
    stride_s,
    N,
    K,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    CAST_BEFORE_WEIGHT: tl.constexpr,
    GAIN: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x
    Y += row * stride_y
    if HAS_RESIDUAL:
        R += row * stride_r
        S += row * stride_s
    cols = tl.arange(0, BLOCK)

    if SINGLE_BLOCK:
        mask = cols < N
        x = _load_input(X, R, S, cols, mask, HAS_RESIDUAL, True)
        rstd = 1.0 / tl.sqrt(tl.sum(tl.where(cols < K, x * x, 0.0), axis=0) / K + eps)
        _store_output(Y, W, cols, mask, x, rstd, CAST_BEFORE_WEIGHT, GAIN)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, K, BLOCK):
            c = start + cols
            x = _load_input(X, R, S, c, c < K, HAS_RESIDUAL, False)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / K + eps)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = _load_input(X, R, S, c, c < N, HAS_RESIDUAL, True)
            _store_output(Y, W, c, c < N, x, rstd, CAST_BEFORE_WEIGHT, GAIN)
    tl.store(RSTD + row, rstd)


@triton.jit
def _store_dx(DX, DS, cols, mask, dx, HAS_DRESIDUAL: tl.constexpr):
    """Write dx, plus the gradient arriving through the residual sum's own output when fused."""
    if HAS_DRESIDUAL:
        dx += _load_f32(DS, cols, mask)
    tl.store(DX + cols, dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def rms_norm_bwd_kernel(
    DY,
    X,
    W,
    RSTD,
    DS,
    DX,
    DW_PARTIAL,
    stride_dy,
    stride_x,
    stride_ds,
    stride_dx,
    M,
    N,
    K,
    rows_per_program,
    HAS_DRESIDUAL: tl.constexpr,
    GAIN: tl.constexpr,
    BLOCK: tl.constexpr,
    SINGLE_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    # int64 bounds make the loop variable int64 when compiled (the interpreter uses Python ints).
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK)
    DW_PARTIAL += pid * N

    if SINGLE_BLOCK:
        mask = cols < N
        w = _load_gain(W, cols, mask, GAIN)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for row in range(row_start, row_end):
            x = _load_f32(X + row * stride_x, cols, mask)
            dy = _load_f32(DY + row * stride_dy, cols, mask)
            rstd = tl.load(RSTD + row)
            g = dy * w
            coef = rstd * rstd * rstd * tl.sum(g * x, axis=0) / K
            dx = rstd * g - tl.where(cols < K, x, 0.0) * coef
            _store_dx(DX + row * stride_dx, DS + row * stride_ds, cols, mask, dx, HAS_DRESIDUAL)
            dw += dy * x * rstd
        if GAIN != 2:
            tl.store(DW_PARTIAL + cols, dw, mask=mask)
    else:
        for row in range(row_start, row_end):
            rstd = tl.load(RSTD + row)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                c = start + cols
                x = _load_f32(X + row * stride_x, c, c < N)
                acc += _load_f32(DY + row * stride_dy, c, c < N) * _load_gain(W, c, c < N, GAIN) * x
            coef = rstd * rstd * rstd * tl.sum(acc, axis=0) / K
            for start in range(0, N, BLOCK):
                c = start + cols
                mask = c < N
                x = _load_f32(X + row * stride_x, c, mask)
                dy = _load_f32(DY + row * stride_dy, c, mask)
                dx = rstd * dy * _load_gain(W, c, mask, GAIN) - tl.where(c < K, x, 0.0) * coef
                _store_dx(DX + row * stride_dx, DS + row * stride_ds, c, mask, dx, HAS_DRESIDUAL)
                if GAIN != 2:
                    # This program alone owns its partial row, so read-modify-write needs no atomics.
                    tl.store(DW_PARTIAL + c, _load_f32(DW_PARTIAL, c, mask) + dy * x * rstd, mask=mask)
