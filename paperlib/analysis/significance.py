"""The tests behind the tables' p-values, each scipy's test.

Wilcoxon's signed-rank test (Table 1, every pair of components, Takeaway 2 across datasets), Kendall's tau
(Takeaway 2 per dataset) and Holm's adjustment of a family of p-values, the sign test. Where scipy's exact
permutation test computes its statistic one permutation at a time, the same test with the statistic vectorised (the
same p-value).

Kendall's tau itself is computed here alone (``kendall_tau``): every tau of the package's tables (a ranking's
agreement with the paper's, Takeaway 2, the capacity tests) calls it.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

DECIMALS = 9
"""The differences a test compares are rounded to this many decimals first: a subtraction of values carried at a few
decimals leaves errors near 1e-14 (98.91 - 98.73 is 0.18000000000000682), which would part ties and zeros."""


def wilcoxon_p(difference: np.ndarray, alternative: str = "two-sided") -> float:
    """scipy's Wilcoxon signed-rank p-value of paired ``difference``s, compared at ``DECIMALS``.

    With ``stats.wilcoxon``'s defaults (zeros left out); 1 where every difference is 0. Where scipy runs its exact
    permutation test (ties or zeros, at most 13 differences: every one of the 2^n sign changes), the same test with
    the statistic vectorised: scipy's computes it one sign change at a time."""
    d = np.round(np.asarray(difference, dtype=float), DECIMALS) + 0.0  # + 0.0: -0.0 is 0
    nonzero = np.abs(d[d != 0])
    if not len(nonzero):
        return 1.0
    if len(d) > 13 or (len(np.unique(nonzero)) == len(nonzero) == len(d)):  # scipy's exact or normal p-value
        return float(stats.wilcoxon(d, alternative=alternative).pvalue)
    test = stats.permutation_test(
        (d,),
        _rank_sum_of_positives,
        permutation_type="samples",
        n_resamples=np.inf,
        alternative=alternative,
        vectorized=True,
    )
    return float(test.pvalue)


def _rank_sum_of_positives(d: np.ndarray, axis: int = -1) -> np.ndarray:
    """Wilcoxon's statistic along ``axis``: the sum of the ranks of ``|d|`` where ``d`` is positive.

    Ties get average ranks and zeros are left out, as scipy's ``zero_method="wilcox"``."""
    d = np.moveaxis(np.asarray(d, dtype=float), axis, -1)
    ranks = stats.rankdata(np.where(d == 0, np.nan, np.abs(d)), axis=-1, nan_policy="omit")
    return np.nansum(np.where(d > 0, ranks, 0.0), axis=-1)


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values.

    It controls the family-wise error rate: the i-th smallest of m is multiplied by m - i + 1, then made
    non-decreasing in that order and capped at 1. NaNs stay NaN and do not count in m."""
    p = np.asarray(p_values, dtype=float)
    adjusted = np.full_like(p, np.nan)
    present = np.flatnonzero(~np.isnan(p))
    order = present[np.argsort(p[present], kind="stable")]
    m = len(order)
    adjusted[order] = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * p[order]))
    return adjusted


def kendall_tau(x, y) -> float:
    """Kendall's tau-b of ``x`` and ``y`` (scipy's ``kendalltau``).

    The package's one place that computes it. NaN where either side is constant (or holds a NaN); 1 where
    they order alike, -1 where reversed."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(stats.kendalltau(x, y).statistic)


def kendall(x: np.ndarray, y: np.ndarray, alternative: str) -> tuple[float, float]:
    """Kendall's tau-b (``kendall_tau``) and its p-value.

    The p-value is exact over every pairing of the values for up to 8 of them (scipy's permutation test;
    with ties, scipy's own p-value uses a normal approximation that understates p at five components),
    scipy's ``kendalltau`` beyond; NaN for constant values."""
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan"), float("nan")
    tau_b = kendall_tau(x, y)
    if len(x) > 8:
        return tau_b, float(stats.kendalltau(x, y, alternative=alternative).pvalue)
    test = stats.permutation_test(
        (x, y), _tau_b, permutation_type="pairings", n_resamples=np.inf, alternative=alternative, vectorized=True
    )
    return tau_b, float(test.pvalue)


def kendall_s(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Kendall's S along the last axis: concordant minus discordant pairs (a tie counts 0).

    Broadcast over the other axes: ``x`` one ranking, ``y`` a row per permutation of another."""
    x, y = np.broadcast_arrays(np.asarray(x, float), np.asarray(y, float))
    i, j = np.triu_indices(x.shape[-1], 1)
    return (np.sign(x[..., i] - x[..., j]) * np.sign(y[..., i] - y[..., j])).sum(axis=-1)


def _tau_b(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Kendall's tau-b along ``axis``, vectorised for the permutation test.

    scipy's ``kendalltau`` takes one pair of samples a call. Tau-b is ``kendall_s`` /
    sqrt((pairs untied in x) (pairs untied in y))."""
    x, y = np.broadcast_arrays(np.moveaxis(np.asarray(x, float), axis, -1), np.moveaxis(np.asarray(y, float), axis, -1))
    i, j = np.triu_indices(x.shape[-1], 1)
    untied = [(v[..., i] != v[..., j]).sum(axis=-1) for v in (x, y)]
    return kendall_s(x, y) / np.sqrt(untied[0] * untied[1])


def sign_test(positive: int, negative: int) -> float:
    """The exact two-sided sign test of ``positive`` against ``negative`` outcomes.

    scipy's ``binomtest`` at 1/2, ties left out before; NaN where there is none."""
    return float(stats.binomtest(positive, positive + negative, 0.5).pvalue) if positive + negative else math.nan
