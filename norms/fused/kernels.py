"""Triton kernels for RMSNorm, partial RMSNorm and the fused residual add.

How they are launched (block sizes, rows per program, warps, pipeline depth, the backward's grid)
is norms/fused/launch.py's table; why, and what the compiled code looks like, docs/fused_rmsnorm.md.

Forward (``rms_norm_fwd_kernel``): each program normalizes a tile of ROWS rows x BLOCK features
from one read of the tile: the statistic (mean of squares over the first K features, in
float32), then the output. Short rows (QK-norm's head_dim of 64-128) share a program, so its
threads are not mostly idle; long rows get one each. The per-row reciprocal RMS is saved for the
backward.

Backward (``rms_norm_bwd_kernel``): a persistent grid, one wave of programs, each taking every
``programs``-th tile of rows. The row loop is software-pipelined (``tl.range(num_stages=...)``),
so the next tiles' x and dy are already on their way (cp.async on sm_80+) while this one is
computed. Each tile is read once and dx written once: 3 passes over memory. The weight
gradient accumulates in a ROWS x BLOCK float32 tile, reduced over its rows once after the loop
(a reduction across rows inside the loop would cost barriers every iteration); each program
writes one row of partial sums, and ``sum_partials_kernel`` adds them up in float32 and rounds
once to the weight's dtype. With a partial statistic (K < N) the statistic's gradient only flows
into the first K features:

    dx_j = rstd * g_j - [j < K] * x_j * rstd**3 * sum_i(g_i * x_i) / K,   g = dy * w

A row of the widest single block (32 KB) leaves a thread no registers for that: its backward,
``rms_norm_bwd_wide_kernel``, takes each row in two passes over two halves, the second from L1.
Longer rows take ``rms_norm_fwd_looping_kernel`` and ``rms_norm_bwd_looping_kernel``, which loop
over column blocks: no cap on the hidden size, at the price of reading each row twice.

The gain is a compile-time choice, GAIN: 0 applies w, 1 applies 1 + w (zero-centred, the
addition in float32, so a small w is not lost to a half-precision rounding), 2 applies none.
With one_plus the weight gradient is unchanged (d(1 + w)/dw = 1); with none there is none.
PARTIAL (K < N) is one too, so that full RMSNorm carries no masking by K.

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
def _store_dx(DX, DS, cols, mask, dx, HAS_DRESIDUAL: tl.constexpr):
    """Write dx, plus the gradient arriving through the residual sum's own output when fused."""
    if HAS_DRESIDUAL:
        dx += _load_f32(DS, cols, mask)
    tl.store(DX + cols, dx.to(DX.dtype.element_ty), mask=mask)


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
    PARTIAL: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    # Column indices in the tile's own shape, so that the gain is loaded in the layout x has (a
    # [1, BLOCK] load gets one of its own, and converting it costs shared memory and barriers).
    cols = tl.broadcast_to(tl.arange(0, BLOCK)[None, :], (ROWS, BLOCK))
    tile = (rows < M)[:, None] & (cols < N)
    x = _load_input(
        X + rows[:, None] * stride_x,
        R + rows[:, None] * stride_r,
        S + rows[:, None] * stride_s,
        cols,
        tile,
        HAS_RESIDUAL,
        True,
    )
    squares = tl.where(cols < K, x * x, 0.0) if PARTIAL else x * x
    rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=1) / K + eps)
    y = _output(Y, W, cols, N, x, rstd[:, None], CAST_BEFORE_WEIGHT, GAIN)
    tl.store(Y + rows[:, None] * stride_y + cols, y.to(Y.dtype.element_ty), mask=tile)
    tl.store(RSTD + rows, rstd, mask=rows < M)


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
    HAS_DRESIDUAL: tl.constexpr,
    GAIN: tl.constexpr,
    BLOCK: tl.constexpr,
    ROWS: tl.constexpr,
    PARTIAL: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    in_row = (cols < N)[None, :]
    in_prefix = (cols < K)[None, :]  # only read when PARTIAL
    # The gain in the tile's own layout, loaded once: a [1, BLOCK] load would get a layout of its own, and
    # converting it costs shared memory and barriers every iteration.
    w = _load_gain(W, tl.broadcast_to(cols[None, :], (ROWS, BLOCK)), tl.broadcast_to(in_row, (ROWS, BLOCK)), GAIN)
    dw = tl.zeros([ROWS, BLOCK], dtype=tl.float32)
    for tile in tl.range(pid, tl.cdiv(M, ROWS), tl.num_programs(0), num_stages=NUM_STAGES):
        rows = (tile * ROWS + tl.arange(0, ROWS)).to(tl.int64)  # tile * ROWS < M fits int32; offsets need 64 bits
        mask = (rows < M)[:, None] & in_row
        x = _load_f32(X + rows[:, None] * stride_x, cols[None, :], mask)
        dy = _load_f32(DY + rows[:, None] * stride_dy, cols[None, :], mask)
        rstd = tl.load(RSTD + rows, mask=rows < M, other=0.0)[:, None]
        x_hat = x * rstd
        dw += dy * x_hat  # before the row sum: dy is then dead, and fewer values are live across it
        g = dy * w
        dx = rstd * g
        if HAS_DRESIDUAL:  # read before the row sum, so that its buffer needs no barrier of its own
            dx += _load_f32(DS + rows[:, None] * stride_ds, cols[None, :], mask)
        dot = tl.sum(g * x_hat, axis=1)[:, None] / K
        if PARTIAL:
            x_hat = tl.where(in_prefix, x_hat, 0.0)
        dx -= rstd * dot * x_hat
        tl.store(DX + rows[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
    if GAIN != 2:
        tl.store(DW_PARTIAL + pid * N + cols, tl.sum(dw, axis=0), mask=cols < N)


@triton.jit
def _half_row_products(X, DY, W, rows, cols, stride_x, stride_dy, N, GAIN: tl.constexpr):
    """dy * gain * x over one half of a row, to be summed with the other half's."""
    mask = cols < N
    x = _load_f32(X + rows * stride_x, cols, mask)
    dy = _load_f32(DY + rows * stride_dy, cols, mask)
    return dy * _load_gain(W, cols, mask, GAIN) * x


@triton.jit
def _half_row_gradient(X, DY, W, DS, DX, rows, cols, strides, N, K, rstd, coef, GAIN: tl.constexpr,
                       HAS_DRESIDUAL: tl.constexpr, PARTIAL: tl.constexpr):  # fmt: skip
    """dx over one half of a row, read again (from L1, where the row sum just brought it: the ".ca" loads are
    other loads than the row sum's, so they are not merged with them); returns the half's dy * x_hat."""
    stride_x, stride_dy, stride_ds, stride_dx = strides
    mask = cols < N
    x_hat = tl.load(X + rows * stride_x + cols, mask=mask, other=0.0, cache_modifier=".ca").to(tl.float32) * rstd
    dy = tl.load(DY + rows * stride_dy + cols, mask=mask, other=0.0, cache_modifier=".ca").to(tl.float32)
    dx = rstd * dy * _load_gain(W, cols, mask, GAIN)
    if HAS_DRESIDUAL:
        dx += _load_f32(DS + rows * stride_ds, cols, mask)
    dx -= coef * (tl.where(cols < K, x_hat, 0.0) if PARTIAL else x_hat)
    tl.store(DX + rows * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
    return dy * x_hat


@triton.jit
def rms_norm_bwd_wide_kernel(
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
    HAS_DRESIDUAL: tl.constexpr,
    GAIN: tl.constexpr,
    PARTIAL: tl.constexpr,
    HALF: tl.constexpr,
):
    """The backward of the widest single block (32 KB a row): rows one at a time, each in two passes over its
    two halves. The first pass only sums g * x over the row; the second reads the row again, from L1, for dx
    and the weight gradient. A thread then holds the weight-gradient accumulator and one half's values, which
    fits its registers; DRAM traffic stays three passes."""
    pid = tl.program_id(0)
    lo = tl.arange(0, HALF)[None, :]
    hi = lo + HALF
    strides = (stride_x, stride_dy, stride_ds, stride_dx)
    dw_lo = tl.zeros([1, HALF], dtype=tl.float32)
    dw_hi = tl.zeros([1, HALF], dtype=tl.float32)
    for row in tl.range(pid, M, tl.num_programs(0)):
        rows = (row + tl.arange(0, 1)).to(tl.int64)[:, None]  # a [1, 1] tile: 64-bit row offsets
        rstd = tl.load(RSTD + rows)
        products = _half_row_products(X, DY, W, rows, lo, stride_x, stride_dy, N, GAIN)
        products += _half_row_products(X, DY, W, rows, hi, stride_x, stride_dy, N, GAIN)
        # One reduction for both halves; x_hat brings the third rstd.
        coef = rstd * rstd * tl.sum(products, axis=1)[:, None] / K
        dw_lo += _half_row_gradient(X, DY, W, DS, DX, rows, lo, strides, N, K, rstd, coef, GAIN, HAS_DRESIDUAL, PARTIAL)
        dw_hi += _half_row_gradient(X, DY, W, DS, DX, rows, hi, strides, N, K, rstd, coef, GAIN, HAS_DRESIDUAL, PARTIAL)
    if GAIN != 2:
        tl.store(DW_PARTIAL + pid * N + lo, dw_lo, mask=lo < N)
        tl.store(DW_PARTIAL + pid * N + hi, dw_hi, mask=hi < N)


@triton.jit
def sum_partials_kernel(PARTIAL, DW, programs, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    """DW[j] = sum over programs of PARTIAL[p, j], added in float32 and rounded once to DW's dtype."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for start in range(0, programs, BLOCK_P):
        p = start + tl.arange(0, BLOCK_P)
        acc += tl.load(PARTIAL + p[:, None] * N + cols[None, :], mask=(p < programs)[:, None] & (cols < N)[None, :])
    tl.store(DW + cols, tl.sum(acc, axis=0).to(DW.dtype.element_ty), mask=cols < N)


@triton.jit
def rms_norm_fwd_looping_kernel(
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
):
    """One long row per program, in two loops over column blocks: the statistic, then the output."""
    row = tl.program_id(0).to(tl.int64)
    X += row * stride_x
    Y += row * stride_y
    if HAS_RESIDUAL:
        R += row * stride_r
        S += row * stride_s
    cols = tl.arange(0, BLOCK)
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
    tl.store(RSTD + row, rstd)


@triton.jit
def rms_norm_bwd_looping_kernel(
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
    HAS_DRESIDUAL: tl.constexpr,
    GAIN: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Each program owns a contiguous range of rows. Phase 1: every row's ``sum(g * x)`` (into DOT).
    Phase 2, column block by column block: dx of every row of the range, while that block's weight
    gradient accumulates in registers and is written once."""
    pid = tl.program_id(0)
    rows_per_program = tl.cdiv(M, tl.num_programs(0))
    # int64 bounds make the loop variable int64 when compiled (the interpreter uses Python ints).
    row_start = pid.to(tl.int64) * rows_per_program
    row_end = tl.minimum(row_start + rows_per_program, M)
    cols = tl.arange(0, BLOCK)
    for row in range(row_start, row_end):
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, N, BLOCK):
            c = start + cols
            x = _load_f32(X + row * stride_x, c, c < N)
            acc += _load_f32(DY + row * stride_dy, c, c < N) * _load_gain(W, c, c < N, GAIN) * x
        tl.store(DOT + row, tl.sum(acc, axis=0))
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
            tl.store(DW_PARTIAL + pid * N + c, dw, mask=mask)
