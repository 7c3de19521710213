"""The norm modules and the registry that builds them by name."""

import pytest
import torch

from norms import NORM_NAMES, LayerNorm, PartialRMSNorm, RMSNorm, build_norm, layer_norm, partial_rms_norm, rms_norm


def test_modules_apply_their_functional_op():
    x = torch.randn(3, 64)
    rms, prms, ln = RMSNorm(64), PartialRMSNorm(64), LayerNorm(64)
    for m in (rms, prms, ln):
        torch.nn.init.normal_(m.weight)
    torch.nn.init.normal_(ln.bias)
    assert torch.equal(rms(x), rms_norm(x, rms.weight, 1e-6))
    assert torch.equal(prms(x), partial_rms_norm(x, prms.weight, 4, 1e-6))
    assert torch.equal(ln(x), layer_norm(x, ln.weight, ln.bias, 1e-5))


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
    assert set(NORM_NAMES) == {"layernorm", "rmsnorm", "prmsnorm", "fused_rmsnorm"}
    assert isinstance(build_norm("rmsnorm", 8), RMSNorm)
    assert build_norm("prmsnorm", 64, p=0.25).k == 16
    assert build_norm("layernorm", 8, bias=False).bias is None


def test_registry_unknown_name_lists_known_ones():
    with pytest.raises(ValueError, match="layernorm, rmsnorm, prmsnorm, fused_rmsnorm"):
        build_norm("batchnorm", 8)


def test_registry_unknown_option_names_the_allowed_ones():
    with pytest.raises(ValueError, match="does not take option.*p.*options are: eps"):
        build_norm("rmsnorm", 8, p=0.5)


@pytest.mark.parametrize("dim", [0, -3, 2.5, True])
def test_bad_dim(dim):
    with pytest.raises(ValueError, match="dim must be a positive int"):
        RMSNorm(dim)
