"""lab/norm_properties.py: the invariance table and the pRMSNorm prefix experiment, by hand."""

import math

import pytest
import torch

from lab import norm_properties


def test_norm_properties_values():
    inv = norm_properties.invariances()
    assert inv["rmsnorm"]["scale x10, eps x100"] < 1e-12  # exact with eps scaled by a^2
    assert 1e-12 < inv["rmsnorm"]["scale x10, fixed eps"] < 1e-4  # approximate otherwise
    assert inv["layernorm"]["shift +3"] < 1e-12 and inv["rmsnorm"]["shift +3"] > 0.1
    assert inv["layernorm"]["max abs row mean of output"] < 1e-12
    prefix = norm_properties.prefix_experiment()
    assert prefix["balanced prefix"][-1] == 0 and prefix["low-energy prefix"][-1] == 0  # k = D is RMSNorm
    assert prefix["low-energy prefix"][3] > 10 * prefix["balanced prefix"][3]


def test_prefix_rms_error_by_hand():
    # x = (3, 4, 0, 0): RMS 2.5; the first k features have RMS 3, sqrt(12.5), sqrt(25/3), 2.5.
    errors = norm_properties.prefix_rms_error(torch.tensor([[3.0, 4.0, 0.0, 0.0]]))
    expected = [3 / 2.5 - 1, math.sqrt(12.5) / 2.5 - 1, math.sqrt(25 / 3) / 2.5 - 1, 0.0]
    assert errors == pytest.approx(expected, abs=1e-12)
    rows = torch.tensor([[3.0, 4.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # the second row's prefix is exact
    assert norm_properties.prefix_rms_error(rows) == pytest.approx([e / 2 for e in expected], abs=1e-12)


def test_invariance_table_with_options():
    x = torch.randn(4, 16, dtype=torch.float64)
    ops = norm_properties.registered_norms(16, {"prmsnorm": {"k": 4}, "dyt": {"alpha_init": 2.0}})
    assert torch.allclose(ops["prmsnorm"](x), x / x[:, :4].pow(2).mean(-1, keepdim=True).add(1e-6).sqrt())
    assert torch.allclose(ops["dyt"](x), torch.tanh(2.0 * x))
    table = norm_properties.invariance_table(x, ops, scale=10.0, shift=3.0)
    assert table["layernorm"]["shift +3"] < 1e-12 and table["rmsnorm"]["shift +3"] > 0.1
    assert table["prmsnorm"]["scale x10, eps x100"] < 1e-12
