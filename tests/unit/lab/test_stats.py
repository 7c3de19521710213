"""lab/stats.py: the t-tests, the bootstrap and Spearman's rho against hand calculations."""

import math
import statistics

import numpy as np
import pytest
from scipy import stats

from lab.stats import (
    bootstrap_ci,
    holm,
    paired_comparison,
    paired_p_value,
    rank_correlation,
    unpaired_comparison,
)


def test_paired_t_test_by_hand():
    # Differences 1, 2, 3: mean 2, sd 1, t = 2 / (1 / sqrt 3) = 3.464 with 2 df; P(|T| > t) = 1 - t / sqrt(t^2 + 2).
    t = 2 * 3**0.5
    assert paired_p_value([2, 4, 6], [1, 2, 3]) == pytest.approx(1 - t / (t * t + 2) ** 0.5, rel=1e-9)
    assert paired_p_value([1.0], [0.0]) is None
    assert paired_p_value([1, 2], [1, 2]) == 1.0
    with pytest.raises(ValueError, match="equal lengths"):
        paired_p_value([1, 2], [1])
    # Pairing removes what the seeds share: the same gap buried in seed-to-seed spread.
    a, b = [4.0, 5.0, 6.0, 7.0], [4.1, 5.1, 6.12, 7.09]
    assert paired_p_value(a, b) < 0.001 < 0.5 < unpaired_comparison(a, b).p


def test_bootstrap_interval_holds_the_mean_and_narrows_with_more_values():
    values = [0.1, -0.2, 0.3, 0.05, 0.15, -0.05]
    low, high = bootstrap_ci(values)
    assert low < statistics.fmean(values) < high and min(values) <= low and high <= max(values)
    assert bootstrap_ci(values) == bootstrap_ci(values)  # seeded: a report is reproducible
    wide = bootstrap_ci(values[:3])
    narrow = bootstrap_ci(values * 10)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    assert bootstrap_ci([1.0]) is None


def test_unpaired_comparison_by_hand():
    # a = [1, 3], b = [4, 6]: difference -3, se = sqrt(2/2 + 2/2) = sqrt 2, t = -3 / sqrt(2), df = 2 (Welch);
    # for df = 2, P(|T| > t) = 1 - t / sqrt(t^2 + 2), and the 97.5% quantile is 4.3027.
    t = 3 / math.sqrt(2)
    result = unpaired_comparison([1, 3], [4, 6])
    assert result.p == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-9)
    assert result.ci95 == pytest.approx((-3 - 4.3027 * 2**0.5, -3 + 4.3027 * 2**0.5), abs=1e-3)
    assert (result.difference, result.verdict, result.seeds) == (-3, "inconclusive", 2)
    assert unpaired_comparison([1.0, 1.1, 0.9], [3.0, 3.1, 2.9]).verdict == "agrees"  # reads as expect="lower"
    assert unpaired_comparison([1.0], [2.0, 3.0]) is None  # one run a side is no test


def test_rank_correlation_by_hand():
    assert rank_correlation([1, 2, 3, 4], [10, 20, 30, 40])[0] == pytest.approx(1.0)
    assert rank_correlation([1, 2, 3, 4], [4, 3, 2, 1])[0] == pytest.approx(-1.0)
    # ranks 0,1,2,3 against 0,2,1,3: d^2 = 0+1+1+0, rho = 1 - 6*2 / (4*15) = 0.8. Of the 24 pairings, |rho| >= 0.8
    # (sum of d^2 at most 2 or at least 18) in 1 + 3 + 3 + 1 = 8: exact p = 1/3 (the t approximation says 0.2)
    assert rank_correlation([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx((0.8, 1 / 3))
    # five in the same order: only it and its reverse reach |rho| = 1, p = 2 / 120
    assert rank_correlation([1, 2, 3, 4, 5], [2, 4, 8, 16, 32]) == pytest.approx((1.0, 2 / 120))
    assert rank_correlation([1, 2], [1, 2]) is None and rank_correlation([1, 1, 1], [1, 2, 3]) is None
    # ten units: 9999 random pairings, close to scipy's t approximation there, and the same on every call
    a, b = list(range(10)), [0, 2, 1, 3, 5, 4, 6, 9, 7, 8]
    rho, p = rank_correlation(a, b)
    assert rho == pytest.approx(stats.spearmanr(a, b).statistic) and p == rank_correlation(a, b)[1]
    assert p == pytest.approx(stats.spearmanr(a, b).pvalue, abs=0.002)


TRIALS = 1500
SLACK = 3 * (0.05 * 0.95 / TRIALS) ** 0.5  # three binomial standard errors at 5%


@pytest.mark.parametrize("seeds", [3, 5, 8])
def test_the_verdict_engine_covers_and_rarely_points_the_wrong_way(seeds):
    """Simulated studies with a known answer: Gaussian per-seed differences of mean 0.4 (sd 1)."""
    rng = np.random.default_rng(seeds)
    truth = 0.4
    results = [paired_comparison(rng.normal(truth, 1.0, seeds), "lower") for _ in range(TRIALS)]
    coverage = np.mean([r.ci95[0] <= truth <= r.ci95[1] for r in results])
    assert coverage >= 0.95 - SLACK
    # The truth is "higher": agreeing with "lower" is the false direction.
    assert np.mean([r.verdict == "agrees" for r in results]) <= 0.05 + SLACK
    assert all((r.verdict != "inconclusive") == (r.p < 0.05) for r in results)  # the verdict is the test's
    nulls = [paired_comparison(rng.normal(0.0, 1.0, seeds), "higher") for _ in range(TRIALS)]
    assert np.mean([r.verdict != "inconclusive" for r in nulls]) <= 0.05 + SLACK


@pytest.mark.parametrize("seeds", [3, 5, 8])
def test_similar_agrees_rarely_at_the_margin_and_often_inside_it(seeds):
    rng = np.random.default_rng(10 + seeds)
    at_margin = [paired_comparison(rng.normal(0.1, 0.05, seeds), "similar", margin=0.1) for _ in range(TRIALS)]
    assert np.mean([r.verdict == "agrees" for r in at_margin]) <= 0.05 + SLACK
    inside = [paired_comparison(rng.normal(0.0, 0.02, seeds), "similar", margin=0.1) for _ in range(500)]
    assert np.mean([r.verdict == "agrees" for r in inside]) > 0.9
    assert all((r.verdict != "inconclusive") == (r.p < 0.05) for r in at_margin + inside)
    far = [paired_comparison(rng.normal(0.3, 0.02, seeds), "similar", margin=0.1) for _ in range(100)]
    assert all(r.verdict == "disagrees" and r.p < 0.05 for r in far)


@pytest.mark.parametrize("seeds", [3, 5, 8])
def test_not_worse_agrees_rarely_at_the_margin_and_often_when_better(seeds):
    """Non-inferiority: at a true difference equal to the margin, 'agrees' is the false verdict (at most
    2.5%, the one-sided level); a better arm agrees often; an arm clearly worse than the margin disagrees."""
    rng = np.random.default_rng(20 + seeds)
    at_margin = [paired_comparison(rng.normal(0.05, 0.03, seeds), "not_worse", margin=0.05) for _ in range(TRIALS)]
    assert np.mean([r.verdict == "agrees" for r in at_margin]) <= 0.025 + SLACK
    better = [paired_comparison(rng.normal(-0.02, 0.01, seeds), "not_worse", margin=0.05) for _ in range(500)]
    assert np.mean([r.verdict == "agrees" for r in better]) > 0.9
    worse = [paired_comparison(rng.normal(0.3, 0.01, seeds), "not_worse", margin=0.05) for _ in range(200)]
    assert all(r.verdict == "disagrees" for r in worse)
    assert all((r.verdict != "inconclusive") == (r.p < 0.05) for r in at_margin + better + worse)


def test_not_worse_by_hand():
    # Differences 0.01, 0.02, 0.03: mean 0.02, se 0.01/sqrt(3); the interval's upper end 0.02 + 4.3027 * 0.00577
    # = 0.0448 lies below the margin 0.05 (agrees), not below 0.04; p is the t-test against the margin.
    result = paired_comparison([0.01, 0.02, 0.03], "not_worse", margin=0.05)
    assert result.ci95[1] == pytest.approx(0.02 + 4.3027 * 0.01 / 3**0.5, abs=1e-4) and result.verdict == "agrees"
    assert result.p == pytest.approx(stats.ttest_1samp([0.01, 0.02, 0.03], 0.05).pvalue)
    assert paired_comparison([0.01, 0.02, 0.03], "not_worse", margin=0.04).verdict == "inconclusive"
    with pytest.raises(ValueError, match="needs a margin"):
        paired_comparison([0.1, 0.2], "not_worse")


def test_holm_by_hand():
    # sorted 0.01, 0.02, 0.04, 0.3 times 4, 3, 2, 1: 0.04, 0.06, 0.08, 0.3; step-down keeps them non-decreasing
    assert holm([0.04, 0.01, 0.3, 0.02]) == pytest.approx([0.08, 0.04, 0.3, 0.06])
    assert holm([0.5, 0.5]) == [1.0, 1.0] and holm([]) == []
    assert holm([0.03, 0.02]) == pytest.approx([0.04, 0.04])  # 0.02 * 2 = 0.04; then max(0.04, 0.03 * 1)


def test_a_percentile_bootstrap_over_three_seeds_does_not_cover():
    """Why the engine uses Student's t: with three seeds the bootstrap's '95%' interval holds the truth
    far less often (about 70%), so verdicts read from it would claim too much."""
    rng = np.random.default_rng(0)
    hits = [low <= 0 <= high for low, high in (bootstrap_ci(rng.normal(0, 1, 3), resamples=999) for _ in range(400))]
    assert np.mean(hits) < 0.85


def test_paired_comparison_by_hand():
    # Differences -1, -2, -3: mean -2, sd 1, se 1/sqrt(3); t(2) at 97.5% = 4.303 -> [-4.484, 0.484].
    result = paired_comparison([-1, -2, -3], "lower")
    assert result.difference == pytest.approx(-2) and result.seeds == 3
    assert result.ci95 == pytest.approx((-2 - 4.3027 / 3**0.5, -2 + 4.3027 / 3**0.5), abs=1e-3)
    assert result.p == pytest.approx(paired_p_value([0, 0, 0], [1, 2, 3])) and result.verdict == "inconclusive"
    assert paired_comparison([-1.0, -1.1, -0.9, -1.05], "lower").verdict == "agrees"
    assert paired_comparison([-1.0, -1.1, -0.9, -1.05], "higher").verdict == "disagrees"
    one = paired_comparison([0.5], "lower")
    assert (one.verdict, one.ci95, one.p, one.difference) == ("inconclusive", None, None, 0.5)
    with pytest.raises(ValueError, match="needs a margin"):
        paired_comparison([0.1, 0.2], "similar")
