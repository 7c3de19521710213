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

Row offsets are 64-bit, so tensors past 2**31 elements index correctly.
"""

import triton
import triton.language as tl


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
        x = tl.load(X + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            # Added in float32 and rounded to the input dtype, exactly like eager `x + residual`.
            r = tl.load(R + cols, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
            tl.store(S + cols, x, mask=mask)
        xf = x.to(tl.float32)
        sum_sq = tl.sum(tl.where(cols < K, xf * xf, 0.0), axis=0)
        rstd = 1.0 / tl.sqrt(sum_sq / K + eps)
        y = xf * rstd
        if CAST_BEFORE_WEIGHT:
            y = y.to(Y.dtype.element_ty).to(tl.float32)
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(Y + cols, (y * w).to(Y.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, K, BLOCK):
            c = start + cols
            mask = c < K
            x = tl.load(X + c, mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(R + c, mask=mask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
            xf = x.to(tl.float32)
            acc += xf * xf
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / K + eps)
        for start in range(0, N, BLOCK):
            c = start + cols
            mask = c < N
            x = tl.load(X + c, mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(R + c, mask=mask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
                tl.store(S + c, x, mask=mask)
            y = x.to(tl.float32) * rstd
            if CAST_BEFORE_WEIGHT:
                y = y.to(Y.dtype.element_ty).to(tl.float32)
            w = tl.load(W + c, mask=mask, other=0.0).to(tl.float32)
            tl.store(Y + c, (y * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


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
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        for row in range(row_start, row_end):
            x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(DY + row * stride_dy + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = tl.load(RSTD + row)
            g = dy * w
            c = tl.sum(g * x, axis=0)
            dx = rstd * g - tl.where(cols < K, x, 0.0) * (rstd * rstd * rstd * c / K)
            if HAS_DRESIDUAL:
                dx += tl.load(DS + row * stride_ds + cols, mask=mask, other=0.0).to(tl.float32)
            tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
            dw += dy * x * rstd
        tl.store(DW_PARTIAL + cols, dw, mask=mask)
    else:
        for row in range(row_start, row_end):
            rstd = tl.load(RSTD + row)
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, N, BLOCK):
                c = start + cols
                mask = c < N
                x = tl.load(X + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + row * stride_dy + c, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=mask, other=0.0).to(tl.float32)
                acc += dy * w * x
            coef = rstd * rstd * rstd * tl.sum(acc, axis=0) / K
            for start in range(0, N, BLOCK):
                c = start + cols
                mask = c < N
                x = tl.load(X + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + row * stride_dy + c, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(W + c, mask=mask, other=0.0).to(tl.float32)
                dx = rstd * dy * w - tl.where(c < K, x, 0.0) * coef
                if HAS_DRESIDUAL:
                    dx += tl.load(DS + row * stride_ds + c, mask=mask, other=0.0).to(tl.float32)
                tl.store(DX + row * stride_dx + c, dx.to(DX.dtype.element_ty), mask=mask)
                # This program alone owns its partial row, so read-modify-write needs no atomics.
                dw = tl.load(DW_PARTIAL + c, mask=mask, other=0.0)
                tl.store(DW_PARTIAL + c, dw + dy * x * rstd, mask=mask)
