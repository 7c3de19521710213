"""The norm modules and the registry that builds them by name."""

import pytest
import torch

from norms import (
    NORM_NAMES,
    Derf,
    DyT,
    Identity,
    LayerNorm,
    Norm,
    PartialRMSNorm,
    RMSNorm,
    build_norm,
    layer_norm,
    partial_rms_norm,
    rms_norm,
)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_modules_apply_their_functional_op(dtype):
    """Exactly in float64 (the reference ops run); to within rounding where a faster kernel runs."""
    x = torch.randn(3, 64, dtype=dtype)
    rms, prms, ln = RMSNorm(64), PartialRMSNorm(64), LayerNorm(64)
    for m in (rms, prms, ln):
        torch.nn.init.normal_(m.weight)
    torch.nn.init.normal_(ln.bias)
    check = torch.equal if dtype == torch.float64 else torch.testing.assert_close
    check(rms(x), rms_norm(x, rms.weight, 1e-6))
    check(prms(x), partial_rms_norm(x, prms.weight, 4, 1e-6))
    check(ln(x), layer_norm(x, ln.weight, ln.bias, 1e-5))


def test_gains_start_at_identity():
    assert torch.equal(RMSNorm(5).weight, torch.ones(5))
    ln = LayerNorm(5)
    assert torch.equal(ln.weight, torch.ones(5)) and torch.equal(ln.bias, torch.zeros(5))
    assert LayerNorm(5, bias=False).bias is None


@pytest.mark.parametrize(
    "dim, p, k, expected",
    [
        (512, 0.0625, None, 32),
        (64, 0.0625, None, 4),
        (10, 0.0625, None, 1),
        (100, 0.07, None, 7),
        (100, 0.071, None, 8),
        (64, 0.0625, 9, 9),
        (3, 1.0, None, 3),
    ],
)
def test_partial_k_resolution(dim, p, k, expected):
    assert PartialRMSNorm(dim, p=p, k=k).k == expected


@pytest.mark.parametrize("p, k", [(0.0, None), (1.5, None), (None, None), (0.1, 0), (0.1, 65), (0.1, 2.5)])
def test_partial_bad_p_or_k(p, k):
    with pytest.raises(ValueError, match="p must be|k must be"):
        PartialRMSNorm(64, p=p, k=k)


def test_residual_contract():
    """norm(x, residual) returns (norm(x + residual), x + residual) for every norm."""
    x, r = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    for name in NORM_NAMES:
        norm = build_norm(name, 16)
        y, total = norm(x, r)
        assert torch.equal(total, x + r)
        torch.testing.assert_close(y, norm(x + r))


def test_extra_repr_shows_settings():
    assert "k=4" in repr(PartialRMSNorm(64)) and "eps=1e-06" in repr(RMSNorm(8))
    assert "bias=False" in repr(LayerNorm(8, bias=False))


def test_registry_builds_each_name():
    assert set(NORM_NAMES) == {"layernorm", "rmsnorm", "prmsnorm", "fused_rmsnorm", "dyt", "derf", "identity", "l2norm"}
    for name in NORM_NAMES:
        assert isinstance(build_norm(name, 8), Norm)
    assert isinstance(build_norm("rmsnorm", 8), RMSNorm)
    assert build_norm("prmsnorm", 64, p=0.25).k == 16
    assert build_norm("layernorm", 8, bias=False).bias is None


def test_registry_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="layernorm, rmsnorm, prmsnorm, fused_rmsnorm, dyt, derf, identity, l2norm"):
        build_norm("batchnorm", 8)


def test_registry_unknown_option_names_the_allowed_ones():
    with pytest.raises(ValueError, match="does not take option.*p.*options are: eps"):
        build_norm("rmsnorm", 8, p=0.5)


@pytest.mark.parametrize("dim", [0, -3, 2.5, True])
def test_bad_dim(dim):
    with pytest.raises(ValueError, match="dim must be a positive int"):
        RMSNorm(dim)


def test_pointwise_norms_and_identity_start_where_their_papers_do():
    dyt, derf = DyT(4), Derf(4)
    assert dyt.alpha.item() == 0.5 and derf.alpha.item() == 0.5 and derf.shift.item() == 0.0
    assert torch.equal(dyt.weight, torch.ones(4)) and torch.equal(dyt.bias, torch.zeros(4))
    assert DyT(4, bias=False).bias is None
    assert list(Identity(4).parameters()) == []
    x = torch.randn(3, 4)
    assert torch.equal(Identity(4)(x), x)


@pytest.mark.parametrize("cls", [DyT, Derf])
@pytest.mark.parametrize("alpha_init", [0.0, -0.5, True, "0.5"])
def test_alpha_init_must_be_positive(cls, alpha_init):
    with pytest.raises(ValueError, match="alpha_init must be a number > 0"):
        cls(8, alpha_init=alpha_init)


def test_saturated_fraction_counts_inputs_past_the_knee():
    norm = DyT(4, alpha_init=1.0)
    x = torch.tensor([[0.5, -1.9, 2.5, -3.0]])
    assert norm.saturated_fraction(x) == 0.5
    derf = Derf(4, alpha_init=1.0, shift_init=1.0)  # the shift moves the knee: only 2.5 + 1 is past 2
    assert derf.saturated_fraction(x) == 0.25


@pytest.mark.parametrize("cls", [RMSNorm, PartialRMSNorm, LayerNorm])
def test_gain_parametrizations(cls):
    x = torch.randn(5, 64)
    standard, one_plus, none = cls(64), cls(64, gain="one_plus"), cls(64, gain="none")
    assert torch.equal(one_plus.weight, torch.zeros(64)) and none.weight is None
    # With w = 0, 1 + w is exactly the standard gain of ones, and no gain is the same map.
    assert torch.equal(one_plus(x), standard(x)) and torch.equal(none(x), standard(x))
    with torch.no_grad():
        one_plus.weight.fill_(0.5)
        standard.weight.fill_(1.5)
    assert torch.equal(one_plus(x), standard(x))
    assert torch.equal(one_plus.effective_gain(), torch.full((64,), 1.5))


@pytest.mark.parametrize("cls", [RMSNorm, LayerNorm])
def test_zero_centred_gain_adds_in_float32_so_a_small_w_counts_in_bfloat16(cls):
    torch.manual_seed(0)
    x = torch.randn(64, 256, dtype=torch.bfloat16)
    norm = cls(256, gain="one_plus").to(torch.bfloat16)
    before = norm(x)
    with torch.no_grad():
        norm.weight.fill_(2**-8)  # 1 + 2^-8 rounds to 1 in bfloat16, but not in float32
    assert torch.equal((1 + norm.weight)[0], torch.tensor(1.0, dtype=torch.bfloat16))
    assert not torch.equal(norm(x), before)


def test_only_plain_rms_norms_offer_an_equivalent_rms_weight():
    assert torch.equal(RMSNorm(8, gain="none").plain_rms_norm_weight(), torch.ones(8))
    assert PartialRMSNorm(8, k=8).plain_rms_norm_weight() is not None
    assert PartialRMSNorm(8, k=4).plain_rms_norm_weight() is None
    for norm in (LayerNorm(8), DyT(8), Derf(8), Identity(8)):
        assert norm.plain_rms_norm_weight() is None


def test_only_the_l2_norm_puts_vectors_on_the_unit_sphere():
    x = torch.randn(3, 5, 16) * 7
    for name in NORM_NAMES:
        norm = build_norm(name, 16)
        on_sphere = torch.allclose(norm(x).norm(dim=-1), torch.ones(3, 5), atol=1e-6)
        assert on_sphere == norm.unit_sphere, name
