"""The fused Triton RMSNorm against the float64 reference.

Without a GPU the kernels run in Triton's interpreter on CPU tensors (tests/conftest.py sets
TRITON_INTERPRET=1), so the shapes stay small; the tests marked ``gpu`` run the same checks
at realistic sizes on CUDA.

Tolerance, in the style of the kernel libraries: the kernel's error against float64 may be at
most twice the error of the same-dtype PyTorch reference, plus a small per-dtype atol. (The
interpreter rounds float32 -> bfloat16 toward zero where a GPU rounds to nearest, which the
factor two covers.)
"""

import warnings

import pytest
import torch

import norms.fused.launch as fused_launch
import norms.fused.ops as fused_ops
from norms import FusedRMSNorm, build_norm, fused_add_rms_norm, fused_rms_norm, partial_rms_norm
from norms.fused.ops import kernel_backend

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def _run(x, residual, weight, k, dy, dsum):
    """Forward and backward through the fused op with given upstream gradients."""
    grads = {}
    if residual is None:
        y = fused_rms_norm(x, weight, 1e-6, k)
        y.backward(dy)
        total = None
    else:
        y, total = fused_add_rms_norm(x, residual, weight, 1e-6, k)
        torch.autograd.backward((y, total), (dy, dsum))
        grads["dresidual"] = residual.grad
    grads.update(dx=x.grad, dw=weight.grad)
    return y, total, grads


def _check(kernel, same_dtype, exact, dtype):
    err = (kernel.double() - exact).abs().max().item()
    ref_err = (same_dtype.double() - exact).abs().max().item()
    # The atol scales with the tensor's magnitude: with a small k the prefix gradients grow like 1/k.
    atol = ATOL[dtype] * max(1.0, exact.abs().max().item())
    assert err <= 2 * ref_err + atol, f"kernel error {err:.3g} vs reference error {ref_err:.3g}"


def _compare(shape, k, dtype, with_residual, weight_dtype=None, device=DEVICE, strided=False):
    torch.manual_seed(0)
    dim = shape[-1]

    def make():
        return torch.randn(*shape, device=device).to(dtype)

    if strided:  # a row-strided view: last axis contiguous, rows further apart than dim
        x = torch.randn(*shape[:-1], dim + 5, device=device).to(dtype)[..., 2 : 2 + dim]
    else:
        x = make()
    residual = make() if with_residual else None
    weight = (torch.rand(dim, device=device) + 0.5).to(weight_dtype or dtype)
    dy, dsum = make(), make()

    results = {}
    for name, cast in (("exact", torch.float64), ("torch", None), ("kernel", None)):
        xi = x.to(cast) if cast else x.clone()
        ri = None if residual is None else (residual.to(cast) if cast else residual.clone())
        wi = weight.to(cast) if cast else weight.clone()
        xi.requires_grad_()
        wi.requires_grad_()
        if ri is not None:
            ri.requires_grad_()
        dyi, dsi = (dy.to(cast), dsum.to(cast)) if cast else (dy, dsum)
        if name == "kernel":
            results[name] = _run(xi, ri, wi, k, dyi, dsi)
        else:
            total = xi if ri is None else xi + ri
            y = partial_rms_norm(total, wi, k, 1e-6)
            torch.autograd.backward((y,) if ri is None else (y, total), (dyi,) if ri is None else (dyi, dsi))
            g = {"dx": xi.grad, "dw": wi.grad}
            if ri is not None:
                g["dresidual"] = ri.grad
            results[name] = (y, None if ri is None else total, g)

    (ky, ktotal, kg), (ty, _, tg), (ey, etotal, eg) = results["kernel"], results["torch"], results["exact"]
    assert ky.dtype == dtype and ky.shape == x.shape and ky.device == x.device
    _check(ky, ty, ey, dtype)
    if with_residual:
        if dtype == torch.float32 or device == "cuda":
            assert torch.equal(ktotal, x + residual)  # the sum is rounded exactly as eager `x + residual`
        else:  # the interpreter rounds half-precision sums toward zero
            _check(ktotal, x + residual, etotal, dtype)
    for key in eg:
        assert kg[key].dtype == (weight.dtype if key == "dw" else dtype)
        _check(kg[key], tg[key], eg[key], dtype)


def _small_blocks(monkeypatch, **constants):
    """Shrink the launch table's constants (rows held whole, loop blocks, tiles) so that the interpreter runs each
    code path at small sizes; the cached launches are made afresh."""
    for name, value in constants.items():
        monkeypatch.setattr(fused_launch, name, value)
    monkeypatch.setattr(fused_ops, "_LAUNCHES", {})


def _k_values(dim):
    return sorted({1, max(1, dim // 16), max(1, dim - 1), dim})


CASES = [(dim, k) for dim in (1, 7, 123, 256, 1000, 4096) for k in _k_values(dim)]


@pytest.mark.parametrize("dim, k", CASES)
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_reference_float32(dim, k, with_residual):
    _compare((3, dim), k, torch.float32, with_residual)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [7, 123, 1000])
@pytest.mark.parametrize("with_residual", [False, True])
def test_matches_reference_half(dtype, dim, with_residual):
    _compare((4, dim), max(1, dim // 16), dtype, with_residual)
    _compare((4, dim), dim, dtype, with_residual)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_weight_with_half_input(dtype):
    _compare((4, 123), 123, dtype, True, weight_dtype=torch.float32)


@pytest.mark.parametrize("shape", [(9,), (2, 3, 40), (2, 1, 2, 40)])
def test_leading_axes(shape):
    _compare(shape, shape[-1] // 2, torch.float32, True)


def test_row_strided_input():
    _compare((5, 64), 64, torch.float32, False, strided=True)


def test_rows_longer_than_one_block():
    _compare((2, fused_launch.SINGLE_BLOCK_BYTES // 4 + 100), 300, torch.float32, True)


def test_looping_path_at_small_block(monkeypatch):
    """The multi-block loops on shapes the interpreter runs quickly, by shrinking the block cap."""
    _small_blocks(monkeypatch, SINGLE_BLOCK_BYTES=32 * 4, LOOPING_BLOCK=32)
    for dim, k in [(100, 100), (100, 3), (100, 50), (33, 32)]:
        _compare((3, dim), k, torch.float32, True)
        _compare((3, dim), k, torch.bfloat16, False)
    _compare((11, 70), 70, torch.float32, True)  # several rows per backward program: the two-phase path


def test_widest_block_reads_each_row_twice_in_halves(monkeypatch):
    """The widest single block's own backward (two passes over each row's two halves), at sizes the interpreter
    runs quickly: 64 float32 or 128 bfloat16 features made the widest, and a row of 50 inside a block of 64."""
    _small_blocks(monkeypatch, SINGLE_BLOCK_BYTES=64 * 4)
    assert fused_launch.row_settings(50, 4).backward.kind == "wide" == fused_launch.row_settings(128, 2).backward.kind
    for shape, k in [((13, 64), 64), ((13, 50), 7), ((2, 3, 64), 4)]:
        _compare(shape, k, torch.float32, True)
    _compare((9, 128), 128, torch.bfloat16, False, weight_dtype=torch.float32)
    _compare((9, 128), 8, torch.bfloat16, True)


@pytest.mark.parametrize("dim", [8, 40, 100])
def test_row_tiles_with_a_partial_last_tile(monkeypatch, dim):
    """Many short rows per program (QK-norm sizes), with a row count that does not fill the last tile."""
    tile = 4 * triton_next_power_of_2(dim)
    _small_blocks(monkeypatch, FWD_TILE=tile, BWD_TILE=tile)
    _compare((3, 7, dim), dim, torch.float32, True)
    _compare((23, dim), max(1, dim // 4), torch.bfloat16, False)


def triton_next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_empty_batch():
    w = torch.ones(16, device=DEVICE, requires_grad=True)
    x = torch.randn(0, 16, device=DEVICE, requires_grad=True)
    y = fused_rms_norm(x, w)
    y.sum().backward()
    assert y.shape == (0, 16) and torch.equal(w.grad, torch.zeros(16, device=DEVICE))


def test_backward_does_not_overwrite_the_incoming_gradient():
    x = torch.randn(4, 32, device=DEVICE, requires_grad=True)
    w = torch.ones(32, device=DEVICE, requires_grad=True)
    dy = torch.randn(4, 32, device=DEVICE)
    kept = dy.clone()
    fused_rms_norm(x, w).backward(dy)
    assert torch.equal(dy, kept)


def test_custom_ops_pass_opcheck():
    """Fake tensors, autograd registration and schema are consistent (what torch.compile relies on)."""
    x = torch.randn(3, 24, device=DEVICE)
    r = torch.randn(3, 24, device=DEVICE)
    w = torch.rand(24, device=DEVICE, requires_grad=True)
    op = fused_ops._fused_rms_norm_fwd
    torch.library.opcheck(op, (x.requires_grad_(), None, w, 24, 1e-6, False, 0))
    torch.library.opcheck(op, (x, r.requires_grad_(), w, 6, 1e-6, True, 1))
    torch.library.opcheck(op, (x, r, None, 24, 1e-6, False, 2))  # no gain


def test_traces_under_torch_compile_without_graph_break():
    norm = FusedRMSNorm(24, k=6).to(DEVICE)
    compiled = torch.compile(norm, backend="eager", fullgraph=True)  # fullgraph raises on a graph break
    x = torch.randn(3, 24, device=DEVICE)
    torch.testing.assert_close(compiled(x), norm(x))


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Records the name of every operator dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_eager_calls_launch_the_kernels_without_the_dispatcher_and_compiled_ones_trace_the_op():
    """The eager path is the autograd.Function (no custom-op dispatch); under torch.compile the op is in the graph
    (where Inductor decomposes it into its kernels), and training through it matches eager."""
    torch.manual_seed(0)
    norm = FusedRMSNorm(24, k=6).to(DEVICE)
    x, residual = torch.randn(3, 24, device=DEVICE, requires_grad=True), torch.randn(3, 24, device=DEVICE)
    with _Ops() as seen:
        normed, total = norm(x, residual=residual)
        (normed.square().sum() + total.sum()).backward()
    assert seen.names and not any("normlab" in name for name in seen.names)
    eager_grads = x.grad.clone(), norm.weight.grad.clone()
    graphs = []

    def backend(gm, example_inputs):  # aot_eager, keeping Dynamo's graph to look at
        graphs.append(gm)
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    x.grad = norm.weight.grad = None
    compiled = torch.compile(lambda x: norm(x, residual=residual), backend=backend, fullgraph=True)
    normed_c, total_c = compiled(x)
    (normed_c.square().sum() + total_c.sum()).backward()
    assert "normlab.fused_rms_norm_fwd" in graphs[0].code
    torch.testing.assert_close((normed_c, total_c, x.grad, norm.weight.grad), (normed, total, *eager_grads))


def test_module_is_registered_and_matches_rmsnorm():
    norm = build_norm("fused_rmsnorm", 40).to(DEVICE)
    plain = build_norm("rmsnorm", 40).to(DEVICE)
    assert isinstance(norm, FusedRMSNorm) and norm.k == 40
    plain.load_state_dict(norm.state_dict())  # same parameters: checkpoints move between the two
    x = torch.randn(2, 40, device=DEVICE)
    torch.testing.assert_close(norm(x), plain(x))
    assert build_norm("fused_rmsnorm", 64, p=0.0625).k == 4


def test_fallback_without_a_backend_warns_once_and_runs_the_reference(monkeypatch):
    monkeypatch.setitem(fused_ops._BACKENDS, "cpu", "reference")  # as without TRITON_INTERPRET=1
    monkeypatch.setattr(fused_ops, "_warned_fallback", set())
    assert kernel_backend("cpu") == "reference"
    x, w = torch.randn(3, 8), torch.rand(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        y = fused_rms_norm(x, w)
        fused_rms_norm(x, w)
    assert len(caught) == 1 and "reference norms.rms_norm" in str(caught[0].message)
    assert torch.equal(y, partial_rms_norm(x, w, 8))


def test_float64_takes_the_exact_reference_path():
    x = torch.randn(3, 40, dtype=torch.float64, device=DEVICE, requires_grad=True)
    w = torch.rand(40, dtype=torch.float64, device=DEVICE, requires_grad=True)
    assert torch.equal(fused_rms_norm(x, w, k=5), partial_rms_norm(x, w, 5))
    assert torch.autograd.gradcheck(lambda x, w: fused_add_rms_norm(x, x * 2, w, k=5)[0], (x, w))


def test_a_lower_precision_branch_onto_a_float32_stream_sums_as_torch_promotes():
    """Under bf16 autocast a branch's output is bf16 and the residual stream float32: the fused norm adds them in
    the dtype ``x + residual`` has, as the reference norm does, instead of refusing the pair."""
    torch.manual_seed(0)
    fused, plain = FusedRMSNorm(40).to(DEVICE), build_norm("rmsnorm", 40).to(DEVICE)
    branch = torch.randn(3, 40, device=DEVICE, dtype=torch.bfloat16)
    stream = torch.randn(3, 40, device=DEVICE)
    (normed, total), (want_normed, want_total) = fused(branch, residual=stream), plain(branch, residual=stream)
    assert total.dtype == normed.dtype == torch.float32
    torch.testing.assert_close(total, want_total, rtol=0, atol=0)
    torch.testing.assert_close(normed, want_normed)


def test_interpreter_backend_is_reported():
    expected = "triton" if DEVICE == "cuda" else "triton-interpreter"
    assert kernel_backend(DEVICE) == expected


# Block sizes that send rows of 40 float32 features down each backward kernel: a tile, the widest block, a loop.
PATHS = {
    "tile": {},
    "wide": {"SINGLE_BLOCK_BYTES": 64 * 4},
    "looping": {"SINGLE_BLOCK_BYTES": 16 * 4, "LOOPING_BLOCK": 16},
}


@pytest.mark.parametrize("gain", ["one_plus", "none"])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("path", list(PATHS))
def test_gain_parametrizations_match_the_reference(gain, with_residual, path, monkeypatch):
    """GAIN is a kernel constant: 1 + w, or no gain (and no weight gradient), in every code path."""
    _small_blocks(monkeypatch, **PATHS[path])
    assert fused_launch.row_settings(40, 4).backward.kind == path
    torch.manual_seed(0)
    dim = 40
    fused, plain = FusedRMSNorm(dim, gain=gain).to(DEVICE), build_norm("rmsnorm", dim, gain=gain).to(DEVICE)
    if gain == "one_plus":
        with torch.no_grad():
            fused.weight.normal_(0, 0.3)
            plain.weight.copy_(fused.weight)
    x = torch.randn(6, dim, device=DEVICE, requires_grad=True)
    residual = torch.randn(6, dim, device=DEVICE) if with_residual else None
    outputs = []
    for norm in (fused, plain):
        x.grad = None
        y = norm(x, residual=residual)[0] if with_residual else norm(x)
        y.backward(torch.arange(y.numel(), device=DEVICE).view_as(y).sin())
        outputs.append((y, x.grad.clone(), None if norm.weight is None else norm.weight.grad))
    (fy, fdx, fdw), (py, pdx, pdw) = outputs
    torch.testing.assert_close(fy, py, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fdx, pdx, atol=1e-5, rtol=1e-5)
    if gain == "none":
        assert fused.weight is None and list(fused.parameters()) == []
    else:
        torch.testing.assert_close(fdw, pdw, atol=1e-5, rtol=1e-5)


def test_one_plus_with_zero_weight_is_bit_identical_to_standard():
    torch.manual_seed(0)
    x = torch.randn(8, 48, device=DEVICE, dtype=torch.bfloat16)
    standard = fused_rms_norm(x, torch.ones(48, device=DEVICE))
    assert torch.equal(fused_rms_norm(x, torch.zeros(48, device=DEVICE), zero_centered=True), standard)
    small = torch.full((48,), 2**-8, device=DEVICE)  # 1 + 2^-8 is lost in bfloat16, not in float32
    assert not torch.equal(fused_rms_norm(x, small.bfloat16(), zero_centered=True), standard)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: fused_rms_norm(torch.randn(2, 8), torch.ones(8), k=9), r"\[1, 8\]"),
        (lambda: fused_rms_norm(torch.randn(2, 8), torch.ones(7)), r"shape \(8,\)"),
        (lambda: fused_add_rms_norm(torch.randn(2, 8), torch.randn(2, 7), torch.ones(8)), "residual must match"),
        (lambda: fused_rms_norm(torch.randn(2, 8), torch.ones(8), eps=0), "eps must be > 0"),
    ],
)
def test_error_paths(call, message):
    with pytest.raises((ValueError, TypeError), match=message):
        call()


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [1, 7, 123, 256, 1000, 4096, 8192, 12288, 65536])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_gpu_realistic_sizes(dim, dtype, with_residual):
    for k in _k_values(dim):
        _compare((4096 if dim <= 8192 else 256, dim), k, dtype, with_residual, device="cuda")


@pytest.mark.gpu
def test_gpu_more_than_2_31_elements():
    """64-bit row offsets: a tensor past 2**31 elements (4.3 GB in bfloat16) indexes correctly, forward and backward."""
    dim = 4096
    rows = (2**31) // dim + 8
    x = torch.randn(rows, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    y = fused_rms_norm(x, w)
    dy = torch.randn_like(y)
    y.backward(dy)
    tail = slice(rows - 8, rows)  # rows past the 2**31st element
    x_tail = x.detach()[tail].requires_grad_()
    expected = partial_rms_norm(x_tail, w.detach(), dim)
    expected.backward(dy[tail])
    torch.testing.assert_close(y[tail], expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(x.grad[tail], x_tail.grad, atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
def test_gpu_compiles_under_torch_compile():
    """Inductor launches the kernels itself (the triton_ops decomposed), forward and backward, with the residual."""
    torch.manual_seed(0)
    norm = FusedRMSNorm(1024).cuda()
    x = torch.randn(64, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    residual, dy = torch.randn_like(x), torch.randn_like(x)
    results = []
    for run in (norm, torch.compile(norm, fullgraph=True)):
        x.grad = norm.weight.grad = None
        normed, total = run(x, residual=residual)
        torch.autograd.backward((normed, total), (dy, dy))
        results.append((normed, total, x.grad, norm.weight.grad))
    torch.testing.assert_close(results[1], results[0], atol=2e-2, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("dim", [768, 16384])
def test_gpu_backward_grid_is_one_wave_of_the_compiled_kernel(dim):
    """The persistent grid is sized from the compiled kernel: a whole number of programs per SM, at least one."""
    x = torch.randn(8192, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.ones(dim, device="cuda", requires_grad=True)
    fused_rms_norm(x, weight).sum().backward()
    launch = fused_ops.launch_for(dim, x.dtype, weight, x.device, False, 0, False, False)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    assert launch.programs % sms == 0 and launch.programs >= sms
