"""Triton kernels for RMSNorm, partial RMSNorm and the fused residual add.

Forward, rows that fit one block (D <= 8192): each program normalizes a tile of ROWS rows x
BLOCK features at once. Small rows (QK-norm's head_dim of 32-128, a CPU-sized model's 192)
get many rows per program, so a program's threads are not mostly idle; large rows get one.
The statistic (mean of squares over the first K features, in float32) and the output come
from one read of the tile. Longer rows: one program per row, in two loops over column
blocks, so there is no cap on the hidden size. The per-row reciprocal RMS is saved.

Backward: each program owns a contiguous range of rows and accumulates its share of the
weight gradient in float32, which the caller reduces across programs. Rows that fit one
block are processed ROWS at a time as tiles. Longer rows take two phases: first each row's
``sum(g * x)`` (stored per row in DOT), then, column block by column block, dx for every row
of the range while that block's weight gradient accumulates in registers and is written
once, instead of being read and written back for every row. With a partial statistic
(K < N) the gradient of the statistic only flows into the first K features:

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
def _output(Y, W, cols, N, x, rstd, CAST_BEFORE_WEIGHT: tl.constexpr, GAIN: tl.constexpr):
    """y = x * rstd * gain in float32, for Y's dtype: the gain applied in float32 and one rounding
    at the store (or, with CAST_BEFORE_WEIGHT, HF's rounding before the gain). ``cols`` indexes
    the gain."""
    y = x * rstd
    if CAST_BEFORE_WEIGHT:
        y = y.to(Y.dtype.element_ty).to(tl.float32)
    if GAIN != 2:
        y = y * _load_gain(W, cols, cols < N, GAIN)
    return y


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
    M,
    N,
    K,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    CAST_BEFORE_WEIGHT: tl.constexpr,
    GAIN: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    SINGLE_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    if SINGLE_BLOCK:  # a tile of ROWS rows, each in one block
        rows = pid * ROWS + tl.arange(0, ROWS)
        tile = (rows < M)[:, None] & (cols < N)[None, :]
        x = _load_input(
            X + rows[:, None] * stride_x,
            R + rows[:, None] * stride_r,
            S + rows[:, None] * stride_s,
            cols[None, :],
            tile,
            HAS_RESIDUAL,
            True,
        )
        rstd = 1.0 / tl.sqrt(tl.sum(tl.where(cols[None, :] < K, x * x, 0.0), axis=1) / K + eps)
        y = _output(Y, W, cols[None, :], N, x, rstd[:, None], CAST_BEFORE_WEIGHT, GAIN)
        tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=tile)
        tl.store(RSTD + rows, rstd, mask=rows < M)
    else:  # one long row, in column blocks
        X += pid * stride_x
        Y += pid * stride_y
        if HAS_RESIDUAL:
            R += pid * stride_r
            S += pid * stride_s
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, K, BLOCK):
            c = start + cols
            x = _load_input(X, R, S, c, c < K, HAS_RESIDUAL, False)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / K + eps)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = _load_input(X, R, S, c, c < N, HAS_RESIDUAL, True)
            y = _output(Y, W, c, N, x, rstd, CAST_BEFORE_WEIGHT, GAIN)
            tl.store(Y + c, y.to(Y.dtype.element_ty), mask=c < N)
        tl.store(RSTD + pid, rstd)


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
    DOT,
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
    ROWS: tl.constexpr,
    SINGLE_BLOCK: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    # int64 bounds make the loop variable int64 when compiled (the interpreter uses Python ints).
    row_start = pid * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK)
    DW_PARTIAL += pid * N

    if SINGLE_BLOCK:  # tiles of ROWS rows
        w = _load_gain(W, cols, cols < N, GAIN)[None, :]
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for first in range(row_start, row_end, ROWS):
            rows = first + tl.arange(0, ROWS)
            tile = (rows < row_end)[:, None] & (cols < N)[None, :]
            x = _load_f32(X + rows[:, None] * stride_x, cols[None, :], tile)
            dy = _load_f32(DY + rows[:, None] * stride_dy, cols[None, :], tile)
            rstd = tl.load(RSTD + rows, mask=rows < row_end, other=0.0)[:, None]
            g = dy * w
            coef = rstd * rstd * rstd * tl.sum(g * x, axis=1)[:, None] / K
            dx = rstd * g - tl.where(cols[None, :] < K, x, 0.0) * coef
            _store_dx(
                DX + rows[:, None] * stride_dx, DS + rows[:, None] * stride_ds, cols[None, :], tile, dx, HAS_DRESIDUAL
            )
            dw += tl.sum(dy * x * rstd, axis=0)
        if GAIN != 2:
            tl.store(DW_PARTIAL + cols, dw, mask=cols < N)
    else:
        # Phase 1: sum(g * x) of every row of the range.
        for row in range(row_start, row_end):
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                c = start + cols
                x = _load_f32(X + row * stride_x, c, c < N)
                acc += _load_f32(DY + row * stride_dy, c, c < N) * _load_gain(W, c, c < N, GAIN) * x
            tl.store(DOT + row, tl.sum(acc, axis=0))
        # Phase 2: block by block, dx of every row and the block's weight gradient, written once.
        for start in range(0, N, BLOCK):
            c = start + cols
            mask = c < N
            w = _load_gain(W, c, mask, GAIN)
            dw = tl.zeros([BLOCK], dtype=tl.float32)
            for row in range(row_start, row_end):
                rstd = tl.load(RSTD + row)
                coef = rstd * rstd * rstd * tl.load(DOT + row) / K
                x = _load_f32(X + row * stride_x, c, mask)
                dy = _load_f32(DY + row * stride_dy, c, mask)
                dx = rstd * dy * w - tl.where(c < K, x, 0.0) * coef
                _store_dx(DX + row * stride_dx, DS + row * stride_ds, c, mask, dx, HAS_DRESIDUAL)
                dw += dy * x * rstd
            if GAIN != 2:
                tl.store(DW_PARTIAL + c, dw, mask=mask)
