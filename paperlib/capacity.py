"""Plasticity or capacity? Takeaway 2 against its rival (beyond the paper).

Takeaway 2 (§5.2): "a higher plasticity ... leads to better and more stable finetuning performance".
On ViT-Base/16 the paper's plasticity order (MHA > FC1 > FC2 > LN2 > LN1) is also nearly the order
of the components' parameters (MHA, FC1 and FC2 hold about 4d² per block each, LN2 and LN1 2d), so
its evidence cannot tell plasticity from capacity. Two analyses separate them:

- ``within_capacity``: Kendall's tau between P(f) and accuracy inside each group of components of
  nearly the same number of parameters (``capacity_groups``), per dataset, pooled across datasets
  with the package's test for pooled taus (``stats.correlation_summary``: Wilcoxon of the taus
  against 0). Capacity cannot explain an order inside a group.
- ``discordant_pairs``: the pairs of components that plasticity and capacity order differently,
  and how often finetuning followed each, with a two-sided sign test (scipy's ``binomtest``) over
  datasets (and seeds, for a table of runs).

The capacity of a model's components is ``components.parameter_share``; ``predictor_table`` puts it
(or any per-component score) in the layout of P(f), for ``stats.plasticity_correlation``'s
Takeaway-2 test with another predictor.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from .names import COMPONENTS, LABELS
from .stats import correlation_summary

TOLERANCE = 0.1
"""Components whose parameter counts differ by less than this fraction of the larger have the same
capacity: MHA, FC1 and FC2 (4d² + 4d, 4d² + 4d and 4d² + d per block), LN2 and LN1 (2d each)."""


def predictor_table(scores: pd.Series | dict, datasets, name: str = "capacity") -> pd.DataFrame:
    """A per-component score (``components.parameter_share(model)``, or one of yours) as a table of
    ``dataset``, ``component`` and ``name``, the same for every dataset: the layout of P(f)."""
    scores = pd.Series(scores, dtype=float)
    rows = [{"dataset": d, "component": c, name: float(v)} for d in datasets for c, v in scores.items()]
    return pd.DataFrame(rows, columns=["dataset", "component", name])


def capacity_groups(capacity: pd.Series | dict, tolerance: float = TOLERANCE) -> list[tuple[str, ...]]:
    """The groups of two or more components of the same capacity (``TOLERANCE``), largest first, each
    in plasticity-table order (``COMPONENTS``)."""
    capacity = pd.Series(capacity, dtype=float).sort_values(ascending=False)
    groups, current = [], []
    for component, value in capacity.items():
        if current and value < capacity[current[0]] * (1 - tolerance):
            groups.append(current)
            current = []
        current.append(component)
    groups.append(current)
    order = {c: i for i, c in enumerate(COMPONENTS)}
    return [tuple(sorted(g, key=lambda c: order.get(c, len(order)))) for g in groups if len(g) > 1]


def _merged(plasticity: pd.DataFrame, results: pd.DataFrame, value: str, keys: list[str]) -> pd.DataFrame:
    if value not in results:
        raise ValueError(f"no column {value!r} in the results; columns: {', '.join(results.columns)}")
    if results.duplicated(keys + ["component"]).any():
        raise ValueError(f"the results have several rows per {', '.join(keys)} and component: choose one learning rate")
    table = results[keys + ["component", value]].merge(
        plasticity[["dataset", "component", "plasticity"]].astype({"component": str}), on=["dataset", "component"]
    )
    return table.dropna(subset=["plasticity", value])


def within_capacity(
    plasticity: pd.DataFrame,
    results: pd.DataFrame,
    capacity: pd.Series | dict,
    value: str = "accuracy",
    tolerance: float = TOLERANCE,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per dataset, pooled): inside each group of equal capacity (``capacity_groups``), Kendall's tau
    between P(f) (``plasticity``: ``dataset``, ``component``, ``plasticity``) and ``value`` (``results``:
    ``dataset``, ``component``, ``value``, one row each). ``tau`` +1: the more plastic finetuned better
    throughout the group (with two components, +1 or -1); NaN where either side is constant. Pooled:
    per group and for all groups together, ``stats.correlation_summary`` of the taus over datasets."""
    table = _merged(plasticity, results, value, ["dataset"])
    rows = []
    for group in capacity_groups(capacity, tolerance):
        name = " / ".join(LABELS.get(c, c) for c in group)
        for dataset, part in table[table["component"].isin(group)].groupby("dataset", sort=True):
            if len(part) < 2:
                continue
            x, y = part["plasticity"].to_numpy(float), part[value].to_numpy(float)
            tau = float(scipy_stats.kendalltau(x, y).statistic) if np.ptp(x) and np.ptp(y) else float("nan")
            rows.append({"group": name, "dataset": dataset, "tau": tau, "components": len(part)})
    per_dataset = pd.DataFrame(rows, columns=["group", "dataset", "tau", "components"])
    pooled = {group: correlation_summary(part) for group, part in per_dataset.groupby("group", sort=False)}
    if len(pooled) > 1:
        pooled["all groups"] = correlation_summary(per_dataset)
    summary = pd.DataFrame.from_dict(pooled, orient="index").rename_axis("Kendall's tau of P(f) with accuracy in")
    return per_dataset, summary


def discordant_pairs(
    plasticity: pd.DataFrame,
    results: pd.DataFrame,
    capacity: pd.Series | dict,
    value: str = "accuracy",
    tolerance: float = TOLERANCE,
    level: float = 0.05,
) -> pd.DataFrame:
    """The pairs of components that P(f) and capacity order differently (one more plastic, the other
    larger by more than ``tolerance``), each over every dataset (and seed, if ``results`` has a ``seed``
    column: one row per run) where both have a result and the pair is discordant: ``cases``, how often
    finetuning ``followed_plasticity`` (the more plastic did better), ``followed_capacity`` or ``ties``,
    a two-sided sign test of the two counts (``p_value``, scipy's ``binomtest``; ties left out) and its
    ``verdict`` at ``level``; the last row pools every pair (a run enters several pairs: read its p-value
    as descriptive). Empty where the two orders agree (the
    paper's ViT-Base: then its evidence cannot tell them apart)."""
    capacity = pd.Series(capacity, dtype=float)
    keys = ["dataset"] + (["seed"] if "seed" in results else [])
    counts: dict[tuple[str, str], list[int]] = {}
    for _, part in _merged(plasticity, results, value, keys).groupby(keys, sort=True):
        row = part.set_index("component")
        for a, b in itertools.combinations([c for c in row.index if c in capacity], 2):
            small, large = sorted((a, b), key=lambda c: capacity[c])
            if (
                capacity[small] >= capacity[large] * (1 - tolerance)
                or row.at[a, "plasticity"] == row.at[b, "plasticity"]
            ):
                continue  # the same capacity, or the same plasticity: no disagreement to test
            plastic = a if row.at[a, "plasticity"] > row.at[b, "plasticity"] else b
            if plastic == large:
                continue  # both predictors agree
            tally = counts.setdefault((small, large), [0, 0, 0])
            better = row.at[small, value] - row.at[large, value]
            tally[0 if better > 0 else 1 if better < 0 else 2] += 1
    rows = [_pair_row(LABELS.get(s, s), LABELS.get(b, b), *tally, level) for (s, b), tally in counts.items()]
    if rows:
        totals = np.sum([tally for tally in counts.values()], axis=0)
        rows.append(_pair_row("every pair", "", *totals.tolist(), level))
    columns = ["more_plastic", "larger", "cases", "followed_plasticity", "followed_capacity", "ties", "p_value"]
    return pd.DataFrame(rows, columns=columns + ["verdict"])


def _pair_row(plastic: str, large: str, plasticity: int, capacity: int, ties: int, level: float) -> dict:
    decided = plasticity + capacity
    p_value = scipy_stats.binomtest(plasticity, decided, 0.5).pvalue if decided else math.nan
    verdict = (
        ("plasticity" if plasticity > capacity else "capacity") if p_value < level else f"neither (p >= {level:g})"
    )
    return {
        "more_plastic": plastic,
        "larger": large,
        "cases": decided + ties,
        "followed_plasticity": plasticity,
        "followed_capacity": capacity,
        "ties": ties,
        "p_value": float(p_value),
        "verdict": verdict if decided else "no case",
    }


def verdict(
    plasticity: pd.Series, capacity: pd.Series, accuracy: pd.Series, tolerance: float = TOLERANCE
) -> tuple[pd.DataFrame, str]:
    """One model on one dataset (notebook 08): per component its P(f), parameter share and finetuning
    accuracy side by side (Series indexed by component), and one sentence: whether the two predictors
    order the components alike and, where they do not (``discordant_pairs``), which one the runs followed,
    with Kendall's tau of each predictor with the accuracy."""
    names = [c for c in COMPONENTS if c in accuracy.index and c in plasticity.index and c in capacity.index]
    table = pd.DataFrame(
        {"P(f)": plasticity[names], "parameter share": capacity[names], "accuracy": accuracy[names]}
    ).astype(float)
    taus = {
        column: scipy_stats.kendalltau(table[column], table["accuracy"]).statistic
        for column in ("P(f)", "parameter share")
    }
    measured = predictor_table(table["P(f)"], ["here"], "plasticity")
    results = pd.DataFrame({"dataset": "here", "component": names, "accuracy": table["accuracy"].to_numpy()})
    pairs = discordant_pairs(measured, results, table["parameter share"], tolerance=tolerance)
    if pairs.empty:
        text = "plasticity and capacity order these components alike: these runs cannot tell them apart"
    else:
        total = pairs.iloc[-1]
        by = {"capacity": total["followed_capacity"], "plasticity": total["followed_plasticity"]}
        followed = max(by, key=by.get) if by["capacity"] != by["plasticity"] else "neither more often"
        text = (
            f"plasticity and capacity disagree on {len(pairs) - 1} pair(s) of components: finetuning followed "
            f"capacity in {total['followed_capacity']}, plasticity in {total['followed_plasticity']} "
            f"({total['ties']} tie(s)): here it followed {followed}"
        )
    text += f" (Kendall's tau with accuracy: P(f) {taus['P(f)']:+.2f}, parameter share {taus['parameter share']:+.2f})"
    return table.rename(index=LABELS), text
