"""The C RMSNorm for float32 CPU tensors against the float64 reference, and its fallbacks."""

import copy
import warnings

import pytest
import torch

from norms import Derf, DyT, PartialRMSNorm, RMSNorm, dyt, partial_rms_norm
from norms.cpu import build, pointwise
from norms.cpu import rms_norm as cpu_ops
from norms.cpu.denormals import flush_denormals
from norms.cpu.rms_norm import cpu_rms_norm

pytestmark = pytest.mark.skipif(not cpu_ops.available(), reason="the C kernel could not be built here")


def _grads(fn, x, weight, dy):
    x = x.detach().clone().requires_grad_()
    weight = None if weight is None else weight.detach().clone().requires_grad_()
    y = fn(x, weight)
    y.backward(dy)
    return y, x.grad, None if weight is None else weight.grad


@pytest.mark.parametrize("dim", [1, 7, 123, 1500, 3000])
@pytest.mark.parametrize("partial", [False, True])
@pytest.mark.parametrize("gain", ["standard", "one_plus", "none"])
def test_matches_the_float64_reference(dim, partial, gain):
    torch.manual_seed(0)
    k = max(1, dim // 16) if partial else dim
    x, dy = torch.randn(2, 5, dim), torch.randn(2, 5, dim)
    weight = None if gain == "none" else torch.rand(dim) + 0.5
    zero_centered = gain == "one_plus"

    def reference(x, w):
        return partial_rms_norm(x, w, k, 1e-6, zero_centered=zero_centered)

    kernel = _grads(lambda x, w: cpu_rms_norm(x, w, 1e-6, k, zero_centered=zero_centered), x, weight, dy)
    same_dtype = _grads(reference, x, weight, dy)
    exact = _grads(reference, x.double(), None if weight is None else weight.double(), dy.double())
    for got, torch_float32, truth in zip(kernel, same_dtype, exact):
        if truth is None:
            assert got is None
            continue
        assert got.dtype == torch.float32 and got.shape == truth.shape
        err = (got.double() - truth).abs().max().item()
        ref_err = (torch_float32.double() - truth).abs().max().item()
        assert err <= 2 * ref_err + 1e-5 * max(1.0, truth.abs().max().item())


def test_strided_input_and_empty_batch():
    x = torch.randn(6, 40)[:, 3:35]  # rows 40 apart, 32 features
    torch.testing.assert_close(cpu_rms_norm(x, torch.ones(32)), partial_rms_norm(x, torch.ones(32), 32))
    assert cpu_rms_norm(torch.randn(0, 8), torch.ones(8)).shape == (0, 8)


def test_single_thread_and_incoming_gradient_untouched():
    torch.manual_seed(0)
    x, w = torch.randn(64, 48, requires_grad=True), torch.rand(48, requires_grad=True)
    dy = torch.randn(64, 48)
    kept = dy.clone()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        cpu_rms_norm(x, w).backward(dy)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(dy, kept)
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    partial_rms_norm(ref_x, ref_w, 48).backward(dy)
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(w.grad, ref_w.grad)


def test_custom_ops_pass_opcheck_and_compile_without_graph_breaks():
    x, w = torch.randn(3, 24, requires_grad=True), torch.rand(24, requires_grad=True)
    torch.library.opcheck(cpu_ops._fwd, (x, w, 24, 1e-6, 0))
    torch.library.opcheck(cpu_ops._fwd, (x, w, 6, 1e-6, 1))
    torch.library.opcheck(cpu_ops._fwd, (x, None, 24, 1e-6, 2))
    alpha, shift = torch.tensor([0.5], requires_grad=True), torch.tensor([0.1], requires_grad=True)
    torch.library.opcheck(pointwise._fwd, (x, alpha, shift, w, torch.zeros(24, requires_grad=True), True))
    torch.library.opcheck(pointwise._fwd, (x, alpha, shift, w, None, False))
    for norm in (RMSNorm(24), DyT(24), Derf(24)):
        compiled = torch.compile(norm, backend="eager", fullgraph=True)
        torch.testing.assert_close(compiled(x), norm(x))


def test_modules_use_it_for_float32_on_cpu_and_say_so():
    norm, partial = RMSNorm(64), PartialRMSNorm(64)
    assert norm.backend("cpu") == partial.backend("cpu") == "c-kernel"
    assert cpu_ops.applies(torch.randn(2, 64), norm.weight)
    assert not cpu_ops.applies(torch.randn(2, 64, dtype=torch.bfloat16), norm.weight)
    assert not cpu_ops.applies(torch.randn(2, 64, dtype=torch.float64), norm.weight.double())


@pytest.fixture
def fresh_kernels():
    """Forget the loaded libraries before and after, so environment changes take effect."""

    def clear():
        for cached in (build.load_library, cpu_ops._library, pointwise._library):
            cached.cache_clear()

    clear()
    yield
    clear()


def test_turned_off_or_unbuildable_it_falls_back_to_the_reference(monkeypatch, tmp_path, fresh_kernels):
    x = torch.randn(4, 16)
    monkeypatch.setenv("NORMLAB_CPU_KERNEL", "0")
    assert RMSNorm(16).backend("cpu") == DyT(16).backend("cpu") == "pytorch"
    assert torch.equal(RMSNorm(16)(x), partial_rms_norm(x, torch.ones(16), 16))

    for cached in (build.load_library, cpu_ops._library, pointwise._library):
        cached.cache_clear()
    monkeypatch.delenv("NORMLAB_CPU_KERNEL")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing cached: it must build
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not cpu_ops.available() and not pointwise.available()
    assert any("could not be built" in str(w.message) for w in caught)
    assert torch.equal(RMSNorm(16)(x), partial_rms_norm(x, torch.ones(16), 16))
    norm = DyT(16)
    assert torch.equal(norm(x), dyt(x, norm.alpha, norm.weight, norm.bias))


def test_a_fresh_cache_builds_the_kernels(monkeypatch, tmp_path, fresh_kernels):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cpu_ops.available() and pointwise.available()
    built = sorted(p.name.split("_")[0] for p in (tmp_path / "normlab" / "kernels").glob("*.so"))
    assert built == ["pointwise", "rms"]


@pytest.mark.parametrize("kind", ["dyt", "derf"])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dim", [1, 123, 1500])
def test_pointwise_norms_match_the_float64_reference_with_scalar_gradients(kind, bias, dim):
    torch.manual_seed(0)
    module = (DyT if kind == "dyt" else Derf)(dim, alpha_init=0.7, bias=bias)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
        if bias:
            module.bias.normal_()
        if kind == "derf":
            module.shift.fill_(0.2)
    assert module.backend("cpu") == "c-kernel"
    x, dy = torch.randn(4, 9, dim), torch.randn(4, 9, dim)
    exact = copy.deepcopy(module).double()
    results = []
    for norm, xi, dyi in ((module, x, dy), (exact, x.double(), dy.double())):
        xi = xi.clone().requires_grad_()
        norm(xi).backward(dyi)
        results.append([xi.grad] + [p.grad for p in norm.parameters()])
    for got, truth in zip(*results):
        tolerance = 1e-5 * max(1.0, truth.abs().max().item()) * (1 if got.numel() > 1 else x.numel() ** 0.5)
        assert (got.double() - truth).abs().max().item() <= tolerance


def test_flush_denormals_reaches_every_thread():
    """Subnormal floats are flushed to zero in torch's parallel ops too, not only on the calling thread.

    Results are checked by their bits: with denormals off, comparisons already read subnormals as zero.
    """
    subnormal = torch.full((1 << 20,), 1, dtype=torch.int32).view(torch.float32)  # 1.4e-45, from its bits
    assert flush_denormals()
    assert (subnormal * 1.0).view(torch.int32).count_nonzero() == 0  # read as zero, on every thread
    assert (torch.full((1 << 20,), 1e-30) * 1e-9).view(torch.int32).count_nonzero() == 0  # results flushed
