"""Statistics of a plasticity ranking: how a measured order compares with the paper's, and how sure it is.

The paper's order of the components is MHA > FC1 > FC2 > LN2 > LN1 (Fig. 2 middle).

- ``paper_agreement``: Kendall's tau between a table's ranking of P(f) and the paper's (notebooks 02
  and 08; ``python -m paperlib plasticity``).
- ``ranking_uncertainty`` (beyond the paper, which reports P(f) alone): a bootstrap over the images of
  the pairs, with intervals for each P(f) and for the tau, and how often each rank holds (notebook 02).
- ``scale_ranking`` and ``paper_order_from`` (beyond the paper): the order of the components at each
  factor of ``plasticity.scale_curve``, and from which factor on it is the paper's (notebook 02's
  scale curve).
- ``layer_means`` and ``depth_band``: the summaries of the paper's plasticity figures as the
  authors draw them. Each box of Fig. 3 (left) and Fig. 2 (middle) holds one value per block, that
  block's P(f) (``layer_means``; pooled over datasets for Fig. 2: ``plasticity_table.collect(by_block=True)``),
  and the band around each curve of Fig. 3 (middle, right) is P(f) ±
  1.96 sd / sqrt(n), sd the standard deviation of the block's per-pair rates and n its number of
  pairs (``depth_band``).

Tables are ``plasticity``'s tidy tables (``plasticity.rates``, ``run``, ``load``): one row per block,
component and pair. Pairs without any rate (identical embeddings, in tables made by
``component_rates.to_table``) are left out with an ``IdenticalPairsWarning``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
from scipy import stats

from paperlib.analysis.significance import kendall_tau
from paperlib.records.names import COMPONENTS, LABELS, PAPER_SCORES

PAPER = [PAPER_SCORES[c] for c in COMPONENTS]
"""The paper's scores of ``COMPONENTS`` in their order: what a P(f) per component is set against (Kendall's tau)."""


def paper_agreement(table: pd.DataFrame) -> float:
    """Kendall's tau between this model's ranking of P(f) and the paper's.

    P(f) is the mean rate over pairs and blocks, as ``plasticity_table.ranked``'s; the paper's ranking is
    MHA > FC1 > FC2 > LN2 > LN1.

    1 means the same order, -1 the reverse.
    """
    table = pairs_with_rates(table)
    means = table.groupby("component", observed=True)["rate"].mean().reindex(list(COMPONENTS))
    return kendall_tau(means, PAPER)


def ranking_uncertainty(
    table: pd.DataFrame, n_resamples: int = 2000, confidence: float = 0.95, seed: int = 0, images=None
) -> pd.DataFrame:
    """How sure the ranking is: a bootstrap over images (an extension; the paper reports P(f) alone).

    Each pair's rates, averaged over blocks, enter for the five components jointly. ``images``: the reference and the
    target image of each pair number (``Measurement.pair_indices``' two lists); a side whose images repeat (a smaller
    test split cycled) is resampled by image, every pair of a drawn image with it (``clustered_weights``), both sides
    where both repeat, and the pairs of images where each image always meets the same one; with ``images`` None, or
    no image repeated, the pairs are. Percentile intervals. Returns, per component in rank
    order: ``plasticity`` and its ``low``/``high`` interval, ``rank``, and ``rank stable`` (the fraction of resamples
    that give the component the same rank). The attribute ``attrs["tau"]`` holds the interval of Kendall's tau with
    the paper's ranking, ``attrs["order stable"]`` the fraction of resamples with the whole order unchanged,
    ``attrs["resampled"]`` what was resampled. Pairs without any rate (identical embeddings) are left out, with a
    warning, so they make no NaN interval.
    """
    table = pairs_with_rates(table)
    per_pair = table.groupby(["pair", "component"], observed=True)["rate"].mean().unstack("component")[list(COMPONENTS)]
    sides = {} if images is None else dict(zip(("reference", "target"), (np.asarray(i) for i in images)))
    sides = {name: ids[per_pair.index.to_numpy()] for name, ids in sides.items()}
    sides = {name: ids for name, ids in sides.items() if len(np.unique(ids)) < len(ids)} or {"pairs": per_pair.index}
    if len(sides) == 2:
        reference, target = sides.values()
        combinations = len(np.unique(np.column_stack([reference, target]), axis=0))
        if combinations == len(np.unique(reference)) == len(np.unique(target)):  # a pair of images repeats, whole
            sides = {"pairs of images": reference}
    rng = np.random.default_rng(seed)
    values = per_pair.to_numpy()
    distribution = []  # (resamples, components), 200 resamples at a time
    for start in range(0, n_resamples, 200):
        weights = clustered_weights(list(sides.values()), min(200, n_resamples - start), rng)
        distribution.append(weights @ values / weights.sum(axis=1, keepdims=True))
    distribution = np.concatenate(distribution)
    tail = (1 - confidence) / 2
    low, high = np.nanquantile(distribution, [tail, 1 - tail], axis=0)
    means = values.mean(axis=0)
    ranks = stats.rankdata(-means, method="min")
    resampled = stats.rankdata(-distribution, method="min", axis=1)
    taus = np.array([kendall_tau(row, PAPER) for row in distribution])  # each resample's P(f)
    out = pd.DataFrame(
        {
            "component": [LABELS[c] for c in COMPONENTS],
            "plasticity": means,
            "low": low,
            "high": high,
            "rank": ranks,
            "rank stable": (resampled == ranks).mean(axis=0),
        }
    )
    out = out.sort_values("rank").set_index("component")
    out.attrs["tau"] = (float(np.nanquantile(taus, tail)), float(np.nanquantile(taus, 1 - tail)))
    out.attrs["order stable"] = float((resampled == ranks).all(axis=1).mean())
    out.attrs["resampled"] = " and ".join(
        f"{name} images" if name in ("reference", "target") else name for name in sides
    )
    return out


def clustered_weights(sides: list[np.ndarray], n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(n_resamples, pairs) bootstrap weights of pairs whose units are ``sides`` (one id per pair each).

    Each side's distinct ids are drawn with replacement, as many as it has (multinomial counts); a pair weighs the
    product of its ids' counts: one side is a cluster bootstrap, two the pigeonhole bootstrap of a two-way crossed
    design (Owen 2007), which errs wide."""
    weights = np.ones((n_resamples, len(sides[0])))
    for ids in sides:
        distinct, index = np.unique(ids, return_inverse=True)
        counts = rng.multinomial(len(distinct), np.full(len(distinct), 1 / len(distinct)), size=n_resamples)
        weights *= counts[:, index]
    return weights


def scale_ranking(curve: pd.DataFrame) -> pd.DataFrame:
    """Per factor of ``plasticity.scale_curve``'s table: the ranking and whether it is the paper's.

    Factors ascending. ``order``: the components by decreasing P(f) ("FC1 > MHA > ..."); ``follows paper``: whether
    that is strictly the paper's ranking MHA > FC1 > FC2 > LN2 > LN1."""
    wide = curve.pivot_table(index="factor", columns="component", values="plasticity", observed=True)
    wide = wide[list(COMPONENTS)].sort_index()
    values = wide.to_numpy()
    order = [" > ".join(LABELS[COMPONENTS[i]] for i in np.argsort(-row, kind="stable")) for row in values]
    return pd.DataFrame({"order": order, "follows paper": (np.diff(values, axis=1) < 0).all(axis=1)}, wide.index)


def paper_order_from(curve: pd.DataFrame) -> float | None:
    """The smallest factor from which on P(f) follows the paper's ranking.

    Factors are those of ``plasticity.scale_curve``'s table; from it on means at it and at every
    larger factor of the table, by ``scale_ranking``. None if it does not at the largest factor."""
    follows = scale_ranking(curve)["follows paper"]
    from_here = follows[::-1].cummin()  # at a factor and at every larger one
    return float(from_here[from_here].index.min()) if from_here.any() else None


Z_95 = 1.96
"""The normal quantile of the authors' band around P(f) along depth (a 95% interval of a mean)."""


def layer_means(table: pd.DataFrame) -> pd.DataFrame:
    """P(f) of each block: what goes in the boxes of Fig. 3 (left) and Fig. 2 (middle).

    One row per block and component (components in ``COMPONENTS`` order within each block):
    ``block``, ``depth`` (percent of depth), ``component`` and ``plasticity``, the mean rate over the
    block's pairs, so each component has one value per block (12 for ViT-Base). The authors' box
    of a component holds these values, not the rates of single pairs (those are
    ``plots.rate_distributions``' violins).
    """
    return depth_band(table)[["block", "depth", "component", "plasticity"]]


def depth_band(table: pd.DataFrame, z: float = Z_95, ddof: int = 0) -> pd.DataFrame:
    """P(f) of each block with the authors' band around it (Fig. 3, middle and right).

    One row per block and component: ``block``, ``depth``, ``component``, ``plasticity`` (the mean
    rate over the block's pairs), ``sd`` (the standard deviation of those rates, with ``ddof``: 0,
    numpy's default, as the authors'), ``n`` (the number of pairs with a rate in the block),
    ``half_width`` = ``z * sd / sqrt(n)`` (``z`` = 1.96: a 95% normal interval of the mean over
    pairs), ``low`` and ``high`` = ``plasticity`` -/+ ``half_width``.
    """
    table = pairs_with_rates(table)
    grouped = table.groupby(["block", "depth", "component"], observed=True)["rate"]
    out = pd.DataFrame({"plasticity": grouped.mean(), "sd": grouped.std(ddof=ddof), "n": grouped.count()})
    out["half_width"] = z * out["sd"] / np.sqrt(out["n"])
    out["low"] = out["plasticity"] - out["half_width"]
    out["high"] = out["plasticity"] + out["half_width"]
    out = out.reset_index()
    out["component"] = pd.Categorical(out["component"], categories=COMPONENTS)
    return out.sort_values(["block", "component"], ignore_index=True)


class IdenticalPairsWarning(UserWarning):
    """Pairs whose two embeddings are equal (x == y) were left out: their rate is 0/0."""


def pairs_with_rates(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` without the pairs that have no rate at all, with a warning naming how many.

    No rate at all means identical embeddings (0/0); the warning is an ``IdenticalPairsWarning``.
    It serves the summaries of tables made otherwise than by ``component_rates.tabulate`` (``to_table`` keeps the
    NaN rates). The warning names the caller of the summary."""
    if "pair" not in table:
        return table
    unmeasured = set(table["pair"].unique()) - set(table.loc[table["rate"].notna(), "pair"].unique())
    if not unmeasured:
        return table
    warnings.warn(
        f"{len(unmeasured)} pairs without any rate left out (identical embeddings, x == y: 0/0)",
        IdenticalPairsWarning,
        stacklevel=3,
    )
    return table[~table["pair"].isin(unmeasured)]


def pooled_order(summary: pd.DataFrame) -> pd.DataFrame:
    """Per model of a ``plasticity_table.collect`` table: its components ordered by pooled P(f).

    P(f) averaged over its datasets (``order``, e.g. "MHA > FC1 > FC2 > LN2 > LN1") and Kendall's tau of that order with
    the paper's (``tau``: 1 the same, -1 reversed)."""
    rows = []
    for model, part in summary.groupby("model", sort=True):
        mean = part.groupby("component", observed=True)["plasticity"].mean().reindex(list(COMPONENTS))
        order = " > ".join(LABELS[c] for c in mean.sort_values(ascending=False).index)
        rows.append({"model": model, "order": order, "tau": kendall_tau(mean, PAPER)})
    return pd.DataFrame(rows, columns=["model", "order", "tau"])
