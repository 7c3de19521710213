"""The fused RMSNorm's calls: a lean eager path, the same kernels visible to torch.compile, and the backend choice.

Eager calls go through one ``torch.autograd.Function`` that launches the kernels itself, with
everything that does not depend on the batch (block sizes, warps, constants, the backward's
grid) computed once per (D, dtype, weight dtype, device, variant) and kept in a dict. Under
``torch.compile`` the same launches are ``torch.library.triton_op``s calling the kernels through
``wrap_triton``, with autograd registered, so Inductor sees the kernels and schedules them
itself instead of calling an opaque op. Both paths run ``_forward`` and ``_backward``; only the
launcher (``wrap``) differs.

Backends, in order: Triton on CUDA tensors; the Triton interpreter on CPU tensors when
``TRITON_INTERPRET=1`` was set before this module was imported (that is how CI runs the
kernel code without a GPU); otherwise the reference ``norms.rms_norm`` runs instead, with a
single warning that says so. float64 inputs always take the reference op, since the kernel
accumulates in float32. ``kernel_backend(device)`` names the one that will run, so a
training run can record it.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import torch

from norms.functional import check_affine, check_input, check_k, gain_mode, partial_rms_norm
from norms.fused.launch import (
    INTERPRETER_PROGRAMS,
    SUM_BLOCK,
    SUM_ROWS,
    SUM_WARPS,
    SMLimits,
    programs_per_sm,
    row_settings,
)

try:
    import triton

    from norms.fused import kernels
except ImportError:  # a CPU-only torch install brings no Triton
    triton = None

# Read once: Triton decides at kernel-definition time whether it interprets.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_BACKENDS = {"cuda": "triton", "cpu": "triton-interpreter" if _INTERPRETED else "reference"}


def kernel_backend(device: torch.device | str) -> str:
    """Which implementation a tensor on ``device`` gets: 'triton', 'triton-interpreter' or 'reference'."""
    if triton is None:
        return "reference"
    kind = device.type if isinstance(device, torch.device) else torch.device(device).type
    return _BACKENDS.get(kind, "reference")


@dataclass
class Launch:
    """Everything about one variant's launches that does not depend on the batch."""

    forward: object  # the kernel
    forward_rows: int
    forward_constants: dict
    backward: object
    backward_rows: int
    backward_constants: dict
    looping: bool
    sum_grid: tuple[int]
    programs: int | None = field(default=None)  # the backward's one wave, found at its first launch


_LAUNCHES: dict[tuple, Launch] = {}


def launch_for(dim: int, dtype: torch.dtype, weight: torch.Tensor | None, device, residual: bool, gain: int,
               cast_before_weight: bool, partial: bool) -> Launch:  # fmt: skip
    """The cached ``Launch`` of one variant (made on its first call). The constants are compile-time ones, so under
    torch.compile's dynamic shapes D (and whether k < D) are specialized on (int() guards on them)."""
    dim, partial = int(dim), bool(partial)
    key = (dim, dtype, None if weight is None else weight.dtype, device, residual, gain, cast_before_weight, partial)
    launch = _LAUNCHES.get(key)
    if launch is None:
        launch = _LAUNCHES[key] = _new_launch(dim, dtype, residual, gain, cast_before_weight, partial)
    return launch


_BACKWARD_KERNELS = {
    "tile": "rms_norm_bwd_kernel",
    "wide": "rms_norm_bwd_wide_kernel",
    "looping": "rms_norm_bwd_looping_kernel",
}


def _new_launch(dim, dtype, residual, gain, cast_before_weight, partial) -> Launch:
    settings = row_settings(dim, torch.empty((), dtype=dtype).element_size())
    fwd, bwd = settings.forward, settings.backward
    forward_constants = {"GAIN": gain, "BLOCK": fwd.block, "HAS_RESIDUAL": residual, "num_warps": fwd.warps}
    forward_constants["CAST_BEFORE_WEIGHT"] = cast_before_weight
    backward_constants = {"GAIN": gain, "HAS_DRESIDUAL": residual, "num_warps": bwd.warps}
    if fwd.kind == "tile":
        forward_constants.update(ROWS=fwd.rows, PARTIAL=partial)
    if bwd.kind == "tile":
        backward_constants.update(BLOCK=bwd.block, ROWS=bwd.rows, PARTIAL=partial, NUM_STAGES=bwd.stages)
    elif bwd.kind == "wide":
        backward_constants.update(PARTIAL=partial, HALF=bwd.block // 2)
    else:
        backward_constants.update(BLOCK=bwd.block)
    forward_kernel = kernels.rms_norm_fwd_kernel if fwd.kind == "tile" else kernels.rms_norm_fwd_looping_kernel
    return Launch(
        forward_kernel,
        fwd.rows,
        forward_constants,
        getattr(kernels, _BACKWARD_KERNELS[bwd.kind]),
        bwd.rows,
        backward_constants,
        bwd.kind == "looping",
        (-(-dim // SUM_BLOCK),),
    )


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """``t`` as evenly spaced rows of D features: (the tensor to pass, rows, row stride). A contiguous tensor is
    passed as it is; another is viewed as (rows, D), copied only when its last stride is not 1."""
    n = t.shape[-1]
    if t.is_contiguous():
        return t, t.numel() // n, n
    rows = t.reshape(-1, n)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows, rows.shape[0], rows.stride(0)


def _eager(kernel):
    """The launcher of the eager path: the kernel itself (``kernel[grid](...)``)."""
    return kernel


def _forward(x, residual, weight, k, eps, cast_before_weight, gain, wrap=_eager):
    """(y, x + residual or None, per-row 1/rms in float32, the variant's Launch)."""
    x2, m, stride_x = _rows(x)
    n = x.shape[-1]
    launch = launch_for(n, x.dtype, weight, x.device, residual is not None, gain, cast_before_weight, k < n)
    y = torch.empty_like(x, memory_format=torch.contiguous_format)
    rstd = x.new_empty(m, dtype=torch.float32)
    if residual is None:
        r2 = s = x2  # not read or written without a residual; any tensor fills the slots
        stride_r = stride_s = stride_x
        total = None
    else:
        r2, _, stride_r = _rows(residual)
        s = total = torch.empty_like(x, memory_format=torch.contiguous_format)
        stride_s = n
    if m > 0:
        wrap(launch.forward)[(-(-m // launch.forward_rows),)](
            x2,
            r2,
            x2 if weight is None else weight,  # not read without a gain
            y,
            s,
            rstd,
            stride_x,
            stride_r,
            n,
            stride_s,
            m,
            n,
            k,
            eps,
            **launch.forward_constants,
        )
    return y, total, rstd, launch


def _backward(launch, dy, dsum, x, weight, rstd, k, wrap=_eager):
    """(dx, dweight or None). ``x`` is the normalized input (x + residual when fused); dx is a new buffer."""
    x2, m, stride_x = _rows(x)
    n = x.shape[-1]
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    if m == 0:
        return dx, None if weight is None else torch.zeros_like(weight)
    dy2, _, stride_dy = _rows(dy)
    ds2, stride_ds = (dy2, stride_dy) if dsum is None else _rows(dsum)[::2]  # not read without a residual
    w = x2 if weight is None else weight  # not read without a gain
    programs = min(_wave(launch, x.dtype, w.dtype, n, x.device), -(-m // launch.backward_rows))
    # A row of weight-gradient partial sums per program (every program writes its row: no zeros needed).
    partial = dx if weight is None else x.new_empty((programs, n), dtype=torch.float32)
    args = [dy2, x2, w, rstd, ds2, dx, partial]
    if launch.looping:  # per-row scratch for the row sums of the first phase
        args.append(rstd.new_empty(m))
    args += [stride_dy, stride_x, stride_ds, n, m, n, k]
    wrap(launch.backward)[(programs,)](*args, **launch.backward_constants)
    if weight is None:
        return dx, None
    dw = torch.empty_like(weight)
    wrap(kernels.sum_partials_kernel)[launch.sum_grid](
        partial, dw, programs, n, BLOCK_P=SUM_ROWS, BLOCK_N=SUM_BLOCK, num_warps=SUM_WARPS
    )
    return dx, dw


def _wave(launch: Launch, dtype, weight_dtype, n: int, device: torch.device) -> int:
    """The backward's persistent grid: as many programs as the GPU holds at once (its compiled kernel's
    registers, shared memory and warps against the SM's), found once per variant."""
    if launch.programs is None:
        if device.type != "cuda":
            launch.programs = INTERPRETER_PROGRAMS
        else:
            launch.programs = _programs_on(device, launch, dtype, weight_dtype, n)
    return launch.programs


def _programs_on(device: torch.device, launch: Launch, dtype, weight_dtype, n: int) -> int:
    """Compile (without launching) the backward for contiguous rows of ``n`` features and aligned tensors, the
    common case, and size the grid from what the compiled kernel uses."""
    pointers = [dtype, dtype, weight_dtype, torch.float32, dtype, dtype, torch.float32]  # dtypes stand for tensors
    if launch.looping:
        pointers.append(torch.float32)
    with torch.cuda.device(device):
        compiled = launch.backward.warmup(*pointers, n, n, n, n, 4096, n, n, grid=(1,), **launch.backward_constants)
        compiled._init_handles()
    props = torch.cuda.get_device_properties(device)
    limits = SMLimits(  # 64K registers an SM, the default, on every NVIDIA GPU since sm_50
        sms=props.multi_processor_count,
        shared_bytes=props.shared_memory_per_multiprocessor,
        threads=props.max_threads_per_multi_processor,
    )
    per_sm = programs_per_sm(compiled.n_regs, compiled.metadata.shared, compiled.metadata.num_warps, limits)
    return max(per_sm, 1) * limits.sms


class _FusedRMSNorm(torch.autograd.Function):
    """The eager path: normed, or (normed, x + residual), from ``_forward``; dx and dweight from ``_backward``."""

    @staticmethod
    def forward(ctx, x, residual, weight, k, eps, cast_before_weight, gain):
        y, total, rstd, launch = _forward(x, residual, weight, k, eps, cast_before_weight, gain)
        ctx.save_for_backward(x if total is None else total, weight, rstd)
        ctx.launch, ctx.k = launch, k
        return y if total is None else (y, total)

    @staticmethod
    def backward(ctx, dy, dtotal=None):
        normalized_input, weight, rstd = ctx.saved_tensors
        dx, dw = _backward(ctx.launch, dy, dtotal, normalized_input, weight, rstd, ctx.k)
        return dx, (None if dtotal is None else dx), dw, None, None, None, None


# Function.apply's Python wrapper does functorch's bookkeeping (2-3 us of a 14 us call); outside torch.func's
# transforms the C++ apply it ends in is called directly.
_apply_directly = super(torch.autograd.Function, _FusedRMSNorm).apply


# --- the same launches as triton_ops, for torch.compile ----------------------------------------------------
#
# Inductor decomposes a triton_op into its kernels by running its body on fake tensors, with wrap_triton
# turning each launch into a node. The interpreter cannot run on fake tensors (and wrap_triton passes an
# interpreted kernel through as it is), so with TRITON_INTERPRET=1 the same bodies become opaque custom ops
# whose fake implementation allocates the outputs and launches nothing.


def _no_launch(kernel):
    return _NoLaunch()


class _NoLaunch:
    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


_define_op = torch.library.custom_op if _INTERPRETED or triton is None else torch.library.triton_op
_compile_launcher = _eager if _INTERPRETED else torch.library.wrap_triton


def _fwd_op(x, residual, weight, k, eps, cast_before_weight, gain, wrap):
    y, total, rstd, _ = _forward(x, residual, weight, k, eps, cast_before_weight, gain, wrap)
    return y, x.new_empty(0) if total is None else total, rstd


def _bwd_op(dy, dsum, x, weight, rstd, k, gain, wrap):
    n = x.shape[-1]
    launch = launch_for(n, x.dtype, weight, x.device, dsum is not None, gain, False, k < n)  # the cast is forward's
    dx, dw = _backward(launch, dy, dsum, x, weight, rstd, k, wrap)
    return dx, x.new_empty(0) if dw is None else dw


@_define_op("normlab::fused_rms_norm_fwd", mutates_args=())
def _fused_rms_norm_fwd(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor | None,
    k: int,
    eps: float,
    cast_before_weight: bool,
    gain: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y, x + residual or an empty tensor, per-row 1/rms in float32)."""
    return _fwd_op(x, residual, weight, k, eps, cast_before_weight, gain, _compile_launcher)


@_define_op("normlab::fused_rms_norm_bwd", mutates_args=())
def _fused_rms_norm_bwd(
    dy: torch.Tensor,
    dsum: torch.Tensor | None,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    k: int,
    gain: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx, dweight or an empty tensor)."""
    return _bwd_op(dy, dsum, x, weight, rstd, k, gain, _compile_launcher)


if _define_op is torch.library.custom_op:
    _fused_rms_norm_fwd.register_fake(lambda *args: _fwd_op(*args, _no_launch))
    _fused_rms_norm_bwd.register_fake(lambda *args: _bwd_op(*args, _no_launch))


def _setup_context(ctx, inputs, output):
    x, residual, weight, k, _eps, _cast, gain = inputs
    _y, total, rstd = output
    ctx.save_for_backward(x if residual is None else total, weight, rstd)
    ctx.k, ctx.gain, ctx.has_residual = k, gain, residual is not None


def _compiled_backward(ctx, dy, dtotal, _drstd):
    normalized_input, weight, rstd = ctx.saved_tensors
    dsum = dtotal if ctx.has_residual else None
    dx, dw = _fused_rms_norm_bwd(dy, dsum, normalized_input, weight, rstd, ctx.k, ctx.gain)
    return dx, (dx if ctx.has_residual else None), (dw if weight is not None else None), None, None, None, None


_fused_rms_norm_fwd.register_autograd(_compiled_backward, setup_context=_setup_context)


def _normalized(x, residual, weight, k, eps, cast_before_weight, gain):
    """normed, or (normed, x + residual), through the path that fits: the triton_op while torch.compile traces."""
    if torch.compiler.is_compiling():
        y, total, _ = _fused_rms_norm_fwd(x, residual, weight, k, eps, cast_before_weight, gain)
    elif torch.is_grad_enabled():
        apply = _FusedRMSNorm.apply if torch._C._are_functorch_transforms_active() else _apply_directly
        return apply(x, residual, weight, k, eps, cast_before_weight, gain)
    else:  # no graph to record: the autograd.Function's own cost is saved
        y, total, _, _ = _forward(x, residual, weight, k, eps, cast_before_weight, gain)
    return y if residual is None else (y, total)


# --- the public functions -----------------------------------------------------------------------------------

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
    return _normalized(x, None, weight, k, eps, cast_before_weight, gain_mode(weight, zero_centered))


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
    return _normalized(x, residual, weight, k, eps, cast_before_weight, gain_mode(weight, zero_centered))
