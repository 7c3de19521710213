"""The reference ops against torch's own norms, hand calculations, properties and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from norms import derf, dyt, l2_norm, layer_norm, partial_rms_norm, rms_norm

TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def _close(actual, expected, dtype):
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(actual, expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("dim", [1, 3, 123, 1500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("lead", [(), (5,), (2, 3), (2, 1, 4)])
def test_rms_norm_matches_torch(dim, dtype, lead):
    x = torch.randn(*lead, dim, dtype=dtype)
    w = torch.randn(dim, dtype=dtype)
    _close(rms_norm(x, w, 1e-6), F.rms_norm(x, (dim,), w, 1e-6), dtype)
    _close(rms_norm(x, None, 1e-6), F.rms_norm(x, (dim,), None, 1e-6), dtype)


@pytest.mark.parametrize("dim", [1, 3, 123, 1500])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("lead", [(), (5,), (2, 3)])
def test_layer_norm_matches_torch(dim, dtype, lead):
    x = torch.randn(*lead, dim, dtype=dtype) * 3 + 1
    w, b = torch.randn(dim, dtype=dtype), torch.randn(dim, dtype=dtype)
    _close(layer_norm(x, w, b), F.layer_norm(x, (dim,), w, b, 1e-5), dtype)


def test_bfloat16_rms_norm_is_bitwise_torch():
    """Default cast order (gain in float32, one rounding) is torch.nn.RMSNorm's, bit for bit."""
    x, w = torch.randn(64, 1000).bfloat16(), torch.randn(1000).bfloat16()
    assert torch.equal(rms_norm(x, w), F.rms_norm(x, (1000,), w, 1e-6))


def test_cast_before_weight_is_hugging_face_llama_rounding():
    x, w = torch.randn(64, 1000).bfloat16(), torch.randn(1000).bfloat16()
    xf = x.float()
    hf = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, w, cast_before_weight=True), hf)
    assert not torch.equal(rms_norm(x, w), hf)  # the two orders really differ in bfloat16


def test_half_inputs_return_input_dtype_with_float32_gain():
    x = torch.randn(4, 16).bfloat16()
    for out in (rms_norm(x, torch.ones(16)), layer_norm(x, torch.ones(16), torch.zeros(16))):
        assert out.dtype == torch.bfloat16


def test_strided_and_non_contiguous_inputs():
    base = torch.randn(6, 40)
    row_strided = base[:, :17]
    transposed = torch.randn(17, 6).t()
    for x in (row_strided, transposed, base[::2, 3:20]):
        assert not x.is_contiguous()
        # Equal up to summation order, which torch vectorizes differently for strided rows.
        torch.testing.assert_close(rms_norm(x), rms_norm(x.contiguous()), rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(layer_norm(x), layer_norm(x.contiguous()), rtol=1e-6, atol=1e-6)


def test_empty_batch():
    x = torch.randn(0, 8)
    assert rms_norm(x, torch.ones(8)).shape == (0, 8)
    assert partial_rms_norm(x, torch.ones(8), 2).shape == (0, 8)
    assert layer_norm(torch.randn(3, 0, 8)).shape == (3, 0, 8)


def test_inputs_are_not_mutated():
    x, w = torch.randn(4, 9), torch.randn(9)
    x0, w0 = x.clone(), w.clone()
    rms_norm(x, w), partial_rms_norm(x, w, 3), layer_norm(x, w, w)
    assert torch.equal(x, x0) and torch.equal(w, w0)


def test_hand_calculations():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    # rms = sqrt(30 / 4) = 2.7386
    expected_rms = torch.tensor([0.36515, 0.73030, 1.09545, 1.46059], dtype=torch.float64)
    torch.testing.assert_close(rms_norm(x, eps=1e-12), expected_rms, atol=1e-4, rtol=0)
    # mean 2.5, variance 1.25
    expected_ln = torch.tensor([-1.34164, -0.44721, 0.44721, 1.34164], dtype=torch.float64)
    torch.testing.assert_close(layer_norm(x, eps=1e-12), expected_ln, atol=1e-4, rtol=0)

    y = torch.tensor([-3.0, 4.0, 12.0], dtype=torch.float64)
    full = rms_norm(y, eps=1e-12)
    prefix = partial_rms_norm(y, None, k=2, eps=1e-12)
    torch.testing.assert_close(full, y / math.sqrt(169 / 3))
    torch.testing.assert_close(prefix, y / math.sqrt(25 / 2))


def test_partial_with_k_equal_dim_is_rms_norm_exactly():
    x, w = torch.randn(5, 33), torch.randn(33)
    assert torch.equal(partial_rms_norm(x, w, 33), rms_norm(x, w))


def test_scale_invariance():
    x = torch.randn(8, 64, dtype=torch.float64)
    a, eps = 7.5, 1e-6
    # Exact when eps scales with a**2: the statistic of a*x with a**2*eps is a times that of x.
    torch.testing.assert_close(rms_norm(a * x, eps=eps * a * a), rms_norm(x, eps=eps))
    torch.testing.assert_close(partial_rms_norm(a * x, None, 4, eps=eps * a * a), partial_rms_norm(x, None, 4, eps=eps))
    torch.testing.assert_close(layer_norm(a * x, eps=eps * a * a), layer_norm(x, eps=eps))
    # Approximate with a fixed eps.
    torch.testing.assert_close(rms_norm(a * x), rms_norm(x), atol=1e-5, rtol=1e-5)


def test_shift_invariance_of_layer_norm_only():
    x = torch.randn(8, 64, dtype=torch.float64)
    torch.testing.assert_close(layer_norm(x + 5.0), layer_norm(x))
    assert (rms_norm(x + 5.0) - rms_norm(x)).abs().max() > 0.1


def test_layer_norm_output_is_centred_and_unit_variance():
    y = layer_norm(torch.randn(16, 100, dtype=torch.float64) * 4 + 3, eps=1e-12)
    torch.testing.assert_close(y.mean(-1), torch.zeros(16, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(y.var(-1, correction=0), torch.ones(16, dtype=torch.float64))


@pytest.mark.parametrize("op", [rms_norm, layer_norm, lambda x: partial_rms_norm(x, None, 3)])
def test_rows_are_independent(op):
    x = torch.randn(6, 12)
    changed = x.clone()
    changed[2] = torch.randn(12) * 10
    a, b = op(x), op(changed)
    keep = [0, 1, 3, 4, 5]
    assert torch.equal(a[keep], b[keep]) and not torch.equal(a[2], b[2])


@pytest.mark.parametrize("op", [rms_norm, layer_norm, lambda x: partial_rms_norm(x, None, 3)])
def test_zero_input_gives_zero_output(op):
    y = op(torch.zeros(3, 10))
    assert torch.equal(y, torch.zeros(3, 10))


def test_gradcheck_all_ops():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w), (x, w))
    assert torch.autograd.gradcheck(lambda x, w: partial_rms_norm(x, w, 3), (x, w))
    assert torch.autograd.gradcheck(lambda x, w, b: layer_norm(x, w, b), (x, w, b))


def test_dyt_and_derf_by_hand():
    x = torch.tensor([[0.0, 1.0, -2.0]], dtype=torch.float64)
    alpha, shift = torch.tensor([0.5], dtype=torch.float64), torch.tensor([0.25], dtype=torch.float64)
    w, b = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64), torch.tensor([0.0, 0.1, -0.1], dtype=torch.float64)
    expected_dyt = [0.0, 2 * math.tanh(0.5) + 0.1, 3 * math.tanh(-1.0) - 0.1]
    torch.testing.assert_close(dyt(x, alpha, w, b)[0], torch.tensor(expected_dyt, dtype=torch.float64))
    expected_derf = [math.erf(0.25), 2 * math.erf(0.75) + 0.1, 3 * math.erf(-0.75) - 0.1]
    torch.testing.assert_close(derf(x, alpha, shift, w, b)[0], torch.tensor(expected_derf, dtype=torch.float64))


def test_pointwise_ops_compute_half_inputs_in_float32():
    x = torch.randn(4, 64).bfloat16()
    alpha = torch.tensor([0.7])
    assert torch.equal(dyt(x, alpha), torch.tanh(0.7 * x.float()).bfloat16())
    assert dyt(x, alpha).dtype == torch.bfloat16


def test_gradcheck_pointwise_ops_including_the_learned_scalars():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    b = torch.randn(7, dtype=torch.float64, requires_grad=True)
    alpha = torch.tensor([0.6], dtype=torch.float64, requires_grad=True)
    shift = torch.tensor([0.1], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(dyt, (x, alpha, w, b))
    assert torch.autograd.gradcheck(derf, (x, alpha, shift, w, b))
    # d/dalpha of sum(tanh(alpha x)) = sum(x (1 - tanh^2(alpha x))), by hand.
    (grad,) = torch.autograd.grad(dyt(x, alpha).sum(), alpha)
    torch.testing.assert_close(grad, (x * (1 - torch.tanh(alpha * x) ** 2)).sum().reshape(1))


def test_gradcheck_zero_centred_gains():
    x = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    w = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: rms_norm(x, w, zero_centered=True), (x, w))
    assert torch.autograd.gradcheck(lambda x, w: layer_norm(x, w, zero_centered=True), (x, w))
    torch.testing.assert_close(rms_norm(x, w, zero_centered=True), rms_norm(x, w + 1))


def test_partial_statistic_carries_gradient_from_suffix_to_prefix():
    x = torch.randn(1, 8, dtype=torch.float64, requires_grad=True)
    partial_rms_norm(x, None, 2)[0, 5].backward()
    grad = x.grad[0]
    assert grad[:2].abs().min() > 0  # the prefix feeds the statistic that scales feature 5
    assert torch.equal(grad[2:5], torch.zeros(3, dtype=torch.float64))  # other suffix features do not


@pytest.mark.parametrize("k", [True, 2.0, "2", 0, 9, -1])
def test_bad_k(k):
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        partial_rms_norm(torch.randn(2, 8), None, k)


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda: rms_norm(torch.ones(2, 4, dtype=torch.int64)), TypeError, "floating-point"),
        (lambda: rms_norm(torch.randn(2, 4), torch.ones(5)), ValueError, r"shape \(4,\)"),
        (lambda: rms_norm(torch.randn(2, 4), torch.ones(4, dtype=torch.float64)), ValueError, "dtype"),
        (lambda: rms_norm(torch.randn(2, 4), torch.ones(4, device="meta")), ValueError, "same device"),
        (lambda: rms_norm(torch.randn(2, 0)), ValueError, "size 0"),
        (lambda: rms_norm(torch.randn(2, 4), eps=0.0), ValueError, "eps must be > 0"),
        (lambda: layer_norm(torch.randn(2, 4), eps=-1.0), ValueError, "eps must be > 0"),
        (lambda: layer_norm(torch.randn(2, 4), None, torch.ones(3)), ValueError, "bias must have shape"),
        (lambda: partial_rms_norm(torch.randn(2, 4), None, 2, eps=0), ValueError, "eps"),
        (lambda: dyt(torch.randn(2, 4), torch.ones(2)), ValueError, "alpha must be a single learned scalar"),
        (lambda: derf(torch.randn(2, 4), torch.ones(1), torch.ones(1), torch.ones(3)), ValueError, "shape \\(4,\\)"),
    ],
)
def test_error_paths(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_l2_norm_by_hand_and_against_rms_norm():
    x = torch.tensor([[3.0, 4.0], [0.0, -2.0]])
    torch.testing.assert_close(l2_norm(x), torch.tensor([[0.6, 0.8], [0.0, -1.0]]))
    y = torch.randn(4, 10, 64, dtype=torch.float64)
    # The same direction as RMSNorm's output, 1/sqrt(D) its length (up to where eps sits).
    torch.testing.assert_close(l2_norm(y, eps=0.0 + 1e-300), rms_norm(y, eps=1e-300) / 64**0.5)
    half = l2_norm(y.to(torch.bfloat16))
    assert half.dtype == torch.bfloat16 and torch.allclose(half.float().norm(dim=-1), torch.ones(4, 10), atol=1e-2)
    assert torch.autograd.gradcheck(l2_norm, (torch.randn(3, 5, dtype=torch.float64, requires_grad=True),))
