"""The statistics that claims rest on, all from ``scipy.stats``: the verdict engine, t-tests, Spearman's rho.

``paired_comparison`` is what every report calls: Student's t on per-seed paired differences
(``unpaired_comparison``, Welch's, only where runs do not pair by seed). The
rest are thin wrappers that fix what a report needs and scipy leaves open: too few values give None
(no test, no interval) instead of NaN and a warning, constant differences give a definite p. The
percentile bootstrap stays for its simulation test, which shows why no report uses it at 3-8 seeds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats


def paired_p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test on a[i] - b[i] (runs of one seed share weights and
    batches across variants, so their differences are the unit); None with fewer than two pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    if len(a) < 2:
        return None
    diffs = [x - y for x, y in zip(a, b)]
    if statistics.pstdev(diffs) == 0:  # scipy: NaN; every pair differs by the same amount
        return 1.0 if diffs[0] == 0 else 0.0
    return float(stats.ttest_rel(a, b).pvalue)


def bootstrap_ci(
    values: Sequence[float],
    statistic: Callable[[np.ndarray], float] = np.mean,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
) -> tuple[float, float] | None:
    """Percentile bootstrap interval of ``statistic`` over ``values`` (None with fewer than two).

    For a paired comparison pass the per-seed differences. With a handful of seeds the interval
    is narrow-biased (it cannot reach beyond the values seen): read it with the p-value.
    """
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return None
    if np.all(data == data[0]):  # every resample is the data itself
        value = float(statistic(data))
        return value, value
    result = stats.bootstrap(
        (data,),
        statistic,
        n_resamples=resamples,
        confidence_level=level,
        method="percentile",
        vectorized=statistic is np.mean,
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> tuple[float, float] | None:
    """Spearman's rho (ties share their mean rank) and its two-sided permutation p-value: exact over every
    pairing up to 7 units (5040), else from 9999 random pairings with a fixed seed. The t approximation
    scipy's spearmanr gives is off at the 5-8 units a study has. None below three pairs or where either
    side is constant. Pass one value per unit that varies (a variant, its seeds averaged), never seeds as
    if they were independent units."""
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    ranks_a, ranks_b = stats.rankdata(a), stats.rankdata(b)

    centred_b = ranks_b - ranks_b.mean()

    def rho(x: np.ndarray, axis: int = -1) -> np.ndarray:  # Pearson's r of the ranks is Spearman's rho
        x = x - x.mean(axis=axis, keepdims=True)
        return (x * centred_b).sum(axis=axis) / np.sqrt((x * x).sum(axis=axis) * (centred_b * centred_b).sum())

    # one sample, re-paired with the fixed other: n! pairings (both samples would count each twice over)
    result = stats.permutation_test(
        (ranks_a,), rho, permutation_type="pairings", vectorized=True, n_resamples=9999, random_state=0
    )
    return float(result.statistic), float(result.pvalue)


def _no_spread(data: np.ndarray) -> bool:
    """Values equal up to float rounding (a difference computed two ways), where t is infinite or undefined."""
    return float(np.ptp(data)) <= 1e-12 * max(1.0, float(np.abs(data).max()))


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """Student's t 95% interval of the mean of ``values`` (None below two; a point where they are all equal)."""
    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return None
    if _no_spread(data):
        return float(data.mean()), float(data.mean())
    low, high = stats.ttest_1samp(data, 0.0).confidence_interval(0.95)
    return float(low), float(high)


EXPECTATIONS = ("lower", "higher", "not_worse", "similar")


@dataclass(frozen=True)
class Comparison:
    """What per-seed paired differences (arm minus against) say about an expected direction."""

    verdict: str  # agrees | disagrees | inconclusive
    difference: float | None  # the mean paired difference
    ci95: tuple[float, float] | None  # Student's t interval of the mean difference (None below two seeds)
    p: float | None  # the p-value of the test the verdict reads (paired_comparison says which)
    seeds: int


def _two_sided_p(d: np.ndarray, against: float) -> float:
    """The paired t-test's two-sided p of mean(d) = ``against``."""
    return float(stats.ttest_1samp(d, against).pvalue)


def paired_comparison(differences: Sequence[float], expect: str, margin: float = 0.0) -> Comparison:
    """The one verdict engine: per-seed paired differences -> verdict, 95% interval and p-value, which agree.

    Every verdict is read from Student's t 95% interval of the mean difference, and ``p`` is the p-value
    of the test that interval inverts, so a verdict other than inconclusive is exactly ``p < 0.05``:

    - ``lower`` (``higher``): agrees when the interval lies below (above) 0, disagrees when on the other
      side; ``p`` is the two-sided paired t-test against 0.
    - ``not_worse`` (non-inferiority: the arm is at most ``margin`` worse, "worse" being higher): agrees
      when the interval's upper end lies below ``margin``, which is the one-sided test at 2.5% (ICH E9's
      convention for a non-inferiority claim), disagrees when its lower end lies above it (worse by more
      than the margin); ``p`` is the two-sided test against ``margin``.
    - ``similar`` (equivalence within ±``margin``): agrees when the interval lies inside ±margin, two
      one-sided tests at 2.5% each (``p`` is twice the larger one-sided p, capped at 1); disagrees when it
      lies beyond one margin (``p``: the two-sided test against the margin on the mean's side).

    Student's t keeps its coverage at 3 to 8 seeds, where a bootstrap's does not (tests/unit/lab/
    test_stats.py simulates both, and each expectation's false-verdict rate).
    """
    if expect not in EXPECTATIONS:
        raise ValueError(f"expect must be one of {', '.join(EXPECTATIONS)}, got {expect!r}")
    if expect in ("similar", "not_worse") and not margin > 0:
        raise ValueError(
            f"expect: {expect} needs a margin > 0 (the largest difference that still counts as no worse), got {margin}"
        )
    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        return Comparison("inconclusive", float(d.mean()) if d.size else None, None, None, int(d.size))
    mean = float(d.mean())
    spread = not _no_spread(d)  # without spread the t statistic is infinite (or undefined at its point)
    if spread:
        low, high = (float(x) for x in stats.ttest_1samp(d, 0.0).confidence_interval(0.95))
    else:
        low = high = mean

    def p_against(point: float) -> float:
        return _two_sided_p(d, point) if spread else float(mean == point)

    if expect in ("lower", "higher"):
        p = p_against(0.0)
        below, above = high < 0, low > 0
        agrees, disagrees = (below, above) if expect == "lower" else (above, below)
    elif expect == "not_worse":
        p = p_against(margin)
        agrees, disagrees = high < margin, low > margin
    else:
        agrees, disagrees = -margin < low and high < margin, low > margin or high < -margin
        if abs(mean) < margin:  # the equivalence test: both one-sided tests must reject
            one_sided = (
                max(
                    float(stats.ttest_1samp(d, -margin, alternative="greater").pvalue),
                    float(stats.ttest_1samp(d, margin, alternative="less").pvalue),
                )
                if spread
                else 0.0
            )
            p = min(1.0, 2 * one_sided)
        else:
            p = p_against(margin if mean > 0 else -margin)
    verdict = "agrees" if agrees else "disagrees" if disagrees else "inconclusive"
    return Comparison(verdict, mean, (low, high), p, int(d.size))


def paired_by_seed(
    arm: dict[int, float | None], against: dict[int, float | None], expect: str
) -> tuple[list[int], Comparison] | None:
    """``arm`` minus ``against`` on the seeds that have both values, through ``paired_comparison``: runs of one
    seed share their initial weights and batches across arms, so each seed's difference is the unit. The
    seeds compared and the comparison; None where no seed pairs."""
    seeds = sorted(s for s in arm.keys() & against.keys() if arm[s] is not None and against[s] is not None)
    if not seeds:
        return None
    return seeds, paired_comparison([arm[s] - against[s] for s in seeds], expect)


def test_named(expect: str, margin: float = 0.0) -> str:
    """The test behind a verdict of ``paired_comparison``, in words a reader can recompute it from."""
    if expect in ("lower", "higher"):
        return "paired t-test of the per-seed differences against 0, two-sided"
    if expect == "not_worse":
        return f"paired t-test against the margin +{margin:g}, two-sided (non-inferiority: one-sided at 2.5%)"
    return (
        f"two one-sided paired t-tests against ±{margin:g}, each at 2.5% (p: twice the larger one-sided p); "
        "where the mean lies beyond a margin, p is the two-sided test against that margin"
    )


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (Holm 1979), in the order given: the k-th smallest p times
    (m - k + 1), made non-decreasing and capped at 1. Rejecting where the adjusted p < 0.05 keeps the
    chance of any false rejection in the family at 5%, whatever the tests' dependence. scipy.stats has
    Benjamini-Hochberg (false_discovery_control) but not Holm."""
    m = len(p_values)
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def unpaired_comparison(a: Sequence[float], b: Sequence[float]) -> Comparison | None:
    """Welch's t-test of mean(a) - mean(b), for groups whose runs do not pair by seed: the fallback,
    which a caller names as unpaired. The verdict reads as ``expect="lower"`` does; ``seeds`` is the
    smaller side. None with fewer than two values on a side: one run a side is no test."""
    if len(a) < 2 or len(b) < 2:
        return None
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    mean = float(x.mean() - y.mean())
    if _no_spread(x) and _no_spread(y):  # scipy: NaN; no spread, so the means decide
        ci, p = (mean, mean), (1.0 if mean == 0 else 0.0)
    else:
        test = stats.ttest_ind(x, y, equal_var=False)
        low, high = test.confidence_interval(0.95)
        ci, p = (float(low), float(high)), float(test.pvalue)
    verdict = "agrees" if ci[1] < 0 else "disagrees" if ci[0] > 0 else "inconclusive"
    return Comparison(verdict, mean, ci, p, min(x.size, y.size))
