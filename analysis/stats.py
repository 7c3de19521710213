"""The statistics that claims rest on: Welch's and paired t-tests, bootstrap intervals.

Student's t distribution comes from mpmath's regularized incomplete beta (mpmath ships with
torch's sympy); bootstrap resampling from numpy with a fixed seed, so a report is reproducible.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import numpy as np


def _t_two_sided(t: float, df: float) -> float:
    """P(|T| > |t|) for Student's t with ``df`` degrees of freedom."""
    import mpmath

    return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's t-test; None with fewer than two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    var_a, var_b = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    if var_a + var_b == 0:
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    t = (statistics.fmean(a) - statistics.fmean(b)) / math.sqrt(var_a + var_b)
    df = (var_a + var_b) ** 2 / (var_a**2 / (len(a) - 1) + var_b**2 / (len(b) - 1))
    return _t_two_sided(t, df)


def paired_p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test on a[i] - b[i] (runs of one seed share weights and
    batches across variants, so their differences are the unit); None with fewer than two pairs."""
    if len(a) != len(b):
        raise ValueError(f"paired samples need equal lengths, got {len(a)} and {len(b)}")
    if len(a) < 2:
        return None
    diffs = [x - y for x, y in zip(a, b)]
    sd = statistics.stdev(diffs)
    if sd == 0:
        return 1.0 if statistics.fmean(diffs) == 0 else 0.0
    return _t_two_sided(statistics.fmean(diffs) / (sd / math.sqrt(len(diffs))), len(diffs) - 1)


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
    rng = np.random.default_rng(seed)
    samples = data[rng.integers(0, data.size, size=(resamples, data.size))]
    estimates = np.apply_along_axis(statistic, 1, samples) if statistic is not np.mean else samples.mean(axis=1)
    tail = (1 - level) / 2
    low, high = np.quantile(estimates, [tail, 1 - tail])
    return float(low), float(high)


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho: the Pearson correlation of the ranks (ties share their mean rank); None below three pairs."""
    if len(a) < 3:
        return None

    def ranks(values: Sequence[float]) -> np.ndarray:
        order = np.argsort(values, kind="stable")
        r = np.empty(len(values))
        r[order] = np.arange(len(values), dtype=float)
        for value in set(values):  # ties: the mean of their ranks
            tied = np.asarray(values) == value
            r[tied] = r[tied].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return None
    return float(np.corrcoef(ra, rb)[0, 1])
