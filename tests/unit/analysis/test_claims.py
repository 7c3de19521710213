"""analysis/claims.py: a claim's verdict follows its interval."""

import pytest

from analysis.claims import verdict


@pytest.mark.parametrize(
    "expect, ci, margin, expected",
    [
        ("lower", (-0.3, -0.1), 0.0, "agrees"),
        ("lower", (0.1, 0.3), 0.0, "disagrees"),
        ("lower", (-0.1, 0.2), 0.0, "inconclusive"),
        ("higher", (0.1, 0.3), 0.0, "agrees"),
        ("higher", (-0.3, -0.1), 0.0, "disagrees"),
        ("similar", (-0.02, 0.03), 0.05, "agrees"),
        ("similar", (0.08, 0.2), 0.05, "disagrees"),
        ("similar", (-0.02, 0.2), 0.05, "inconclusive"),
        ("lower", None, 0.0, "inconclusive"),
    ],
)
def test_the_verdict_follows_the_interval(expect, ci, margin, expected):
    assert verdict(expect, ci, margin) == expected
