"""The statistics that claims rest on, all from ``scipy.stats``: t-tests, bootstrap intervals, Spearman's rho.

Thin wrappers that fix what a report needs and scipy leaves open: too few values give None (no
test, no interval) instead of NaN and a warning, constant differences give a definite p, and
the bootstrap is seeded so a report regenerates with the same numbers.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's t-test; None with fewer than two values on a side."""
    if len(a) < 2 or len(b) < 2:
        return None
    if statistics.variance(a) + statistics.variance(b) == 0:  # scipy: NaN; no spread, so the means decide
        return 1.0 if statistics.fmean(a) == statistics.fmean(b) else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


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


def rank_correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho (ties share their mean rank); None below three pairs or where either side is constant."""
    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(stats.spearmanr(a, b).statistic)
