"""Plasticity or capacity? Takeaway 2 against its rival (beyond the paper).

Takeaway 2 (§5.2): "a higher plasticity ... leads to better and more stable finetuning performance".
On ViT-Base/16 the paper's plasticity order (MHA > FC1 > FC2 > LN2 > LN1) is also nearly the order
of the components' parameters (MHA, FC1 and FC2 hold about 4d² per block each, LN2 and LN1 2d), so
its evidence cannot tell plasticity from capacity. Two analyses separate them, both with tests whose
null is a permutation of the accuracies among the components of one dataset (and seed):

- ``within_capacity``: inside each group of components of the same capacity (``capacity_groups``),
  whether the more plastic finetuned better. Kendall's S (concordant minus discordant pairs of P(f)
  and accuracy) summed over the dataset x group strata, with its exact null distribution: the
  accuracies permuted among the components, one permutation for every dataset of a family
  (``names.family``: Cifar10 and its corruptions share a test set's images and count once), families
  independent, convolved; beside it the same with every dataset permuted on its own, labelled as
  counting each dataset as independent; per adjacent pair of the plasticity order
  (``adjacent_pairs``), a sign test over datasets and over families, with Holm's adjustment over the
  pairs.
- ``discordant_pairs``: the pairs of components that P(f) and capacity order differently, how often
  finetuning followed each, and an exact permutation test pooled over the pairs (a run enters several
  pairs: a sign test over pairs would count it several times), per pair with Holm's adjustment. On a
  ViT every such pair sets a LayerNorm against a module of linear layers (``layernorm_confound``):
  "followed capacity" there cannot be told from "LayerNorms adapt worse as a kind of module".

Capacity orders components only by ``capacity_levels``: parameter counts within ``TOLERANCE`` of
each other tie (FC2, 3d per block fewer than FC1, is not smaller). The capacity of a model's
components is ``components.parameter_share``; ``predictor_table`` puts it (or any per-component
score) in the layout of P(f), for ``component_tests.plasticity_correlation``'s Takeaway-2 test with another
predictor. ``verdict`` (one model, one dataset, one run per component) counts and does not test.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np
import pandas as pd

from paperlib.analysis import component_tests, tables
from paperlib.analysis.significance import holm, kendall_s, kendall_tau, sign_test
from paperlib.records.names import COMPONENTS, LABELS, family

TOLERANCE = 0.1
"""Components whose parameter counts differ by less than this fraction of the larger have the same
capacity: MHA, FC1 and FC2 (4d² + 4d, 4d² + 4d and 4d² + d per block), LN2 and LN1 (2d each)."""

LAYERNORMS = ("ln2", "ln1")

CONFOUND = (
    "Every pair that plasticity and capacity order differently sets a LayerNorm against a component that is "
    "not one (MHA, FC1 or FC2): capacity and being a LayerNorm are one variable here, so finetuning that "
    "followed capacity (or plasticity) cannot be told from LayerNorms, a per-channel scale and shift, adapting "
    "worse (or better) as a kind of module."
)
"""What a discordant-pairs verdict cannot tell apart when every pair is a LayerNorm against another
component (``layernorm_confound``)."""

MAX_EXACT = 8
"""The most components of one dataset (and seed) whose permutations the exact tests enumerate (8!)."""


def capacity_groups(capacity: pd.Series | dict, tolerance: float = TOLERANCE) -> list[tuple[str, ...]]:
    """The groups of two or more components of the same capacity (``TOLERANCE``), largest first.

    Each group is in plasticity-table order (``COMPONENTS``)."""
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


def capacity_levels(capacity: pd.Series | dict, tolerance: float = TOLERANCE) -> pd.Series:
    """Each component's capacity, the components of one group (``capacity_groups``) tied at its largest.

    The order capacity predicts, FC2 level with FC1 and MHA on a ViT."""
    capacity = pd.Series(capacity, dtype=float)
    levels = capacity.copy()
    for group in capacity_groups(capacity, tolerance):
        levels[list(group)] = capacity[list(group)].max()
    return levels


def predictor_table(
    scores: pd.Series | dict, datasets, name: str = "capacity", tolerance: float | None = TOLERANCE
) -> pd.DataFrame:
    """A per-component score as a table of ``dataset``, ``component`` and ``name``: the layout of P(f).

    The score is ``components.parameter_share(model)``, or one of yours, the same for every dataset. Scores within
    ``tolerance`` of each other tie (``capacity_levels``); ``tolerance=None`` keeps them raw (for a score that is not
    a capacity)."""
    scores = pd.Series(scores, dtype=float)
    if tolerance is not None:
        scores = capacity_levels(scores, tolerance)
    rows = [{"dataset": d, "component": c, name: float(v)} for d in datasets for c, v in scores.items()]
    return pd.DataFrame(rows, columns=["dataset", "component", name])


def _merged(plasticity: pd.DataFrame, results: pd.DataFrame, value: str, keys: list[str]) -> pd.DataFrame:
    if value not in results:
        raise ValueError(f"no column {value!r} in the results; columns: {', '.join(results.columns)}")
    if results.duplicated(keys + ["component"]).any():
        raise ValueError(f"the results have several rows per {', '.join(keys)} and component: choose one learning rate")
    table = results[keys + ["component", value]].merge(
        plasticity[["dataset", "component", "plasticity"]].astype({"component": str}), on=["dataset", "component"]
    )
    return table.dropna(subset=["plasticity", value])


def _group_name(group) -> str:
    return " / ".join(LABELS.get(c, c) for c in group)


def _permuted(y: np.ndarray) -> np.ndarray:
    """Every ordering of ``y`` (k! rows, the identity first), each equally likely under the null."""
    if len(y) > MAX_EXACT:
        raise ValueError(f"{len(y)} components in one dataset: the exact test enumerates at most {MAX_EXACT}")
    return y[np.array(list(itertools.permutations(range(len(y)))), dtype=int)]


def _distribution(values: np.ndarray) -> tuple[int, np.ndarray]:
    """Integer statistics, one per equally likely permutation, as (lowest value, probabilities).

    The probabilities are those of the values from the lowest up."""
    values = np.rint(values).astype(int)
    low = int(values.min())
    counts = np.bincount(values - low)
    return low, counts / counts.sum()


def _convolved(distributions) -> tuple[int, np.ndarray]:
    """The distribution of the sum of independent integer statistics (``_distribution``'s form)."""
    low, probabilities = 0, np.ones(1)
    for start, part in distributions:
        low, probabilities = low + start, np.convolve(probabilities, part)
    return low, probabilities


def _two_sided(null: tuple[int, np.ndarray], observed: float) -> float:
    """P(|statistic| >= |observed|) under ``null`` (a statistic of mean 0 under the permutations)."""
    low, probabilities = null
    support = np.arange(low, low + len(probabilities))
    return float(min(1.0, probabilities[np.abs(support) >= abs(observed) - 1e-9].sum()))


class WithinCapacity(NamedTuple):
    """``within_capacity``'s tables (a tuple: ``[1]`` is the summary)."""

    per_dataset: pd.DataFrame
    summary: pd.DataFrame
    per_family: pd.DataFrame
    pairs: pd.DataFrame
    family_pairs: pd.DataFrame


def within_capacity(
    plasticity: pd.DataFrame,
    results: pd.DataFrame,
    capacity: pd.Series | dict,
    value: str = "accuracy",
    tolerance: float = TOLERANCE,
    level: float = 0.05,
) -> WithinCapacity:
    """Whether the more plastic finetuned better inside each group of equal capacity (``capacity_groups``).

    P(f) from ``plasticity`` (``dataset``, ``component``, ``plasticity``), ``value`` from ``results`` (``dataset``,
    ``component``, ``value``, one row each).

    - ``per_dataset``: per group and dataset (a stratum), ``family``, ``components``, Kendall's ``tau``
      (descriptive; NaN where either side is constant; with two components +1 or -1) and ``S``.
    - ``summary``, per group and for ``all groups``: ``strata``, ``pairs`` (S lies in ±pairs),
      ``mean_tau`` (per group only: taus of two and three components are not averaged together),
      strata of ``positive``, ``negative`` and ``zero`` S, the summed ``S`` and its exact two-sided
      permutation ``p_value`` (the accuracies permuted among the components, one permutation for every
      dataset of a family, ``names.family``: the corruptions of one test set are not independent; families
      independent; each permutation equally likely), ``significant`` (p < ``level``), and
      ``p_value_by_dataset``, the same test with each dataset permuted on its own (every dataset counted as
      independent); then by family,
      each family's S (the mean of its datasets' S), ``families``, ``family_positive``,
      ``family_negative`` and a two-sided sign test, ``family_p_value``.
    - ``per_family``: per family and group (and ``all groups``), ``datasets``, ``mean_tau`` and ``mean_S``.
    - ``pairs`` and ``family_pairs``: ``adjacent_pairs`` by dataset and by family."""
    table = _merged(plasticity, results, value, ["dataset"])
    rows, nulls, families = [], {}, {}
    for group in capacity_groups(capacity, tolerance):
        name = _group_name(group)
        for dataset, part in table[table["component"].isin(group)].groupby("dataset", sort=True):
            if len(part) < 2:
                continue
            part = part.sort_values("component")  # one order of the components: a family shares its permutations
            x, y = part["plasticity"].to_numpy(float), part[value].to_numpy(float)
            null = kendall_s(x, _permuted(y))
            nulls[name, dataset] = _distribution(null)
            unit = (name, family(dataset), tuple(part["component"]))
            families[unit] = families.get(unit, 0) + null
            row = {"group": name, "dataset": dataset, "family": family(dataset)}
            rows.append(row | {"components": len(part), "tau": kendall_tau(x, y), "S": int(kendall_s(x, y))})
    per_dataset = pd.DataFrame(rows, columns=["group", "dataset", "family", "components", "tau", "S"])
    parts = dict(list(per_dataset.groupby("group", sort=False)))
    if len(parts) > 1:
        parts["all groups"] = per_dataset
    summary = {name: _within_row(part, nulls, families, name != "all groups", level) for name, part in parts.items()}
    summary = pd.DataFrame.from_dict(summary, orient="index").rename_axis("within capacity group")
    pairs = [adjacent_pairs(plasticity, results, capacity, value, tolerance, level, by) for by in ("dataset", "family")]
    return WithinCapacity(per_dataset, summary, _per_family(parts), *pairs)


def _family_s(part: pd.DataFrame) -> pd.Series:
    """Per family, the mean over its datasets of a dataset's S (summed over the groups in ``part``)."""
    return part.groupby(["family", "dataset"])["S"].sum().groupby("family").mean()


def _within_row(part: pd.DataFrame, nulls: dict, families: dict, one_group: bool, level: float) -> dict:
    s = int(part["S"].sum())
    by_dataset = _two_sided(_convolved(nulls[key] for key in zip(part["group"], part["dataset"])), s)
    groups = set(part["group"])
    p_value = _two_sided(_convolved(_distribution(v) for key, v in families.items() if key[0] in groups), s)
    by_family = _family_s(part)
    positive, negative = int((by_family > 0).sum()), int((by_family < 0).sum())
    return {
        "strata": len(part),
        "pairs": int((part["components"] * (part["components"] - 1) // 2).sum()),
        "mean_tau": float(part["tau"].mean()) if one_group else math.nan,
        "positive": int((part["S"] > 0).sum()),
        "negative": int((part["S"] < 0).sum()),
        "zero": int((part["S"] == 0).sum()),
        "S": s,
        "p_value": p_value,
        "significant": bool(p_value < level),
        "p_value_by_dataset": by_dataset,
        "families": len(by_family),
        "family_positive": positive,
        "family_negative": negative,
        "family_p_value": sign_test(positive, negative),
    }


def _per_family(parts: dict) -> pd.DataFrame:
    rows = []
    for name, part in parts.items():
        taus = part.groupby("family")["tau"].mean() if name != "all groups" else None
        for fam, s in _family_s(part).items():
            datasets = part.loc[part["family"] == fam, "dataset"].nunique()
            mean_tau = float(taus[fam]) if taus is not None else math.nan
            rows.append({"family": fam, "group": name, "datasets": datasets, "mean_tau": mean_tau, "mean_S": s})
    return pd.DataFrame(rows, columns=["family", "group", "datasets", "mean_tau", "mean_S"])


def adjacent_pairs(
    plasticity: pd.DataFrame,
    results: pd.DataFrame,
    capacity: pd.Series | dict,
    value: str = "accuracy",
    tolerance: float = TOLERANCE,
    level: float = 0.05,
    by: str = "dataset",
) -> pd.DataFrame:
    """Sign tests of the components adjacent in plasticity order inside each group of equal capacity.

    Per pair of components adjacent in a dataset's plasticity order inside a group of equal capacity (the paper's order:
    MHA-FC1, FC1-FC2, LN2-LN1; components of equal P(f) are not a pair): ``group``, ``more_plastic``, ``less_plastic``,
    ``datasets`` (``families`` with ``by="family"``: a family's difference is the mean over its datasets), how often the
    more plastic ``won``, ``lost`` or ``tied``, the ``mean_difference`` of ``value`` (more plastic minus less), a
    two-sided exact sign test (``p_value``, scipy's ``binomtest``, ties left out), ``p_holm`` (Holm over the pairs) and
    ``significant`` (``p_holm`` < ``level``)."""
    if by not in ("dataset", "family"):
        raise ValueError(f"by is 'dataset' or 'family', got {by!r}")
    table = _merged(plasticity, results, value, ["dataset"])
    rows = []
    for group in capacity_groups(capacity, tolerance):
        for dataset, part in table[table["component"].isin(group)].groupby("dataset", sort=True):
            part = part.sort_values("plasticity", ascending=False, kind="stable")
            ranked = list(zip(part["component"], part["plasticity"], part[value]))
            for (upper, p_upper, v_upper), (lower, p_lower, v_lower) in itertools.pairwise(ranked):
                if p_upper > p_lower:
                    rows.append((_group_name(group), upper, lower, family(dataset), v_upper - v_lower))
    differences = pd.DataFrame(rows, columns=["group", "more_plastic", "less_plastic", "family", "difference"])
    pair = ["group", "more_plastic", "less_plastic"]
    if by == "family":
        differences = differences.groupby(pair + ["family"], sort=False, as_index=False)["difference"].mean()
    units = "datasets" if by == "dataset" else "families"
    out = []
    for (group, upper, lower), part in differences.groupby(pair, sort=False):
        won, lost = int((part["difference"] > 0).sum()), int((part["difference"] < 0).sum())
        out.append(
            {
                "group": group,
                "more_plastic": LABELS.get(upper, upper),
                "less_plastic": LABELS.get(lower, lower),
                units: len(part),
                "won": won,
                "lost": lost,
                "tied": len(part) - won - lost,
                "mean_difference": float(part["difference"].mean()),
                "p_value": sign_test(won, lost),
            }
        )
    columns = pair + [units, "won", "lost", "tied", "mean_difference", "p_value"]
    out = pd.DataFrame(out, columns=columns)
    out["p_holm"] = holm(out["p_value"].to_numpy(float))
    out["significant"] = out["p_holm"] < level
    return out


def _discordant_units(table: pd.DataFrame, levels: pd.Series, value: str, keys: list[str]) -> list:
    """One unit of ``discordant_pairs``' test per dataset (and seed) with a discordant pair.

    Its family (``names.family``), its components, their accuracies and, per discordant pair (more plastic, larger),
    their positions in them."""
    units = []
    for (dataset, *_), part in table[table["component"].isin(levels.index)].groupby(keys, sort=True):
        names = part["component"].tolist()
        x, y, size = part["plasticity"].to_numpy(float), part[value].to_numpy(float), levels[names].to_numpy()
        pairs = {}
        for i, j in itertools.combinations(range(len(names)), 2):
            if size[i] == size[j] or x[i] == x[j]:
                continue  # the same capacity, or the same plasticity: no disagreement to test
            plastic, other = (i, j) if x[i] > x[j] else (j, i)
            if size[plastic] < size[other]:  # else both predictors agree
                pairs[names[plastic], names[other]] = (plastic, other)
        if pairs:
            units.append((family(dataset), tuple(names), y, pairs))
    return units


def discordant_pairs(
    plasticity: pd.DataFrame,
    results: pd.DataFrame,
    capacity: pd.Series | dict,
    value: str = "accuracy",
    tolerance: float = TOLERANCE,
    level: float = 0.05,
) -> pd.DataFrame:
    """The pairs of components that P(f) and capacity order differently, and which order finetuning followed.

    A pair is discordant when one component is more plastic and the other larger by ``capacity_levels``. Each pair is
    taken over every dataset (and seed, if ``results`` has a ``seed`` column: one row per run) where both have a result
    and the pair is discordant: ``cases``, how often finetuning ``followed_plasticity`` (the more plastic did better),
    ``followed_capacity`` or ``ties``; the statistic followed_capacity - followed_plasticity and its exact two-sided
    permutation ``p_value`` (the accuracies permuted among the components, each of the k! orderings equally likely, one
    permutation for every dataset and seed of a family, ``names.family``: the runs of one test set, or of its
    corruptions, are not independent, so the family is the unit; families independent; a run that enters several pairs
    is permuted once), ``p_holm`` (Holm over the pairs) and the ``verdict`` at ``level`` from ``p_holm``: "capacity",
    "plasticity" or "neither". The last row, ``every pair``, pools the pairs' statistics (one test: its ``p_value`` is
    unadjusted and gives its verdict). Empty where the two orders agree (the paper's ViT-Base: then its evidence cannot
    tell them apart). ``layernorm_confound`` says what a verdict cannot tell apart."""
    keys = ["dataset"] + (["seed"] if "seed" in results else [])
    units = _discordant_units(
        _merged(plasticity, results, value, keys), capacity_levels(capacity, tolerance), value, keys
    )
    counts: dict[tuple[str, str], list[int]] = {}
    nulls: dict[tuple[str, str], list] = {}
    pooled = []
    families: dict[tuple, list] = {}  # the units of one family (and set of components): one relabelling
    for name, names, y, pairs in units:
        families.setdefault((name, names), []).append((y, pairs))
    for members in families.values():
        followed: dict[tuple[str, str], np.ndarray] = {}
        for y, pairs in members:
            permuted = _permuted(y)  # every member's orderings in the same order: one permutation of the labels
            for pair, (a, b) in pairs.items():
                signs = np.sign(permuted[:, b] - permuted[:, a])  # +1: capacity
                tally = counts.setdefault(pair, [0, 0, 0])
                tally[{-1: 0, 1: 1, 0: 2}[int(signs[0])]] += 1  # the identity, first: the observed
                followed[pair] = followed.get(pair, 0) + signs
        for pair, signs in followed.items():
            nulls.setdefault(pair, []).append(_distribution(signs))
        pooled.append(_distribution(sum(followed.values())))
    rows = [
        _pair_row(pair, *tally, _two_sided(_convolved(nulls[pair]), tally[1] - tally[0]))
        for pair, tally in counts.items()
    ]
    columns = ["more_plastic", "larger", "cases", "followed_plasticity", "followed_capacity", "ties", "p_value"]
    table = pd.DataFrame(rows, columns=columns)
    table["p_holm"] = holm(table["p_value"].to_numpy(float))
    if len(table):
        totals = np.sum(list(counts.values()), axis=0).tolist()
        every = _pair_row(("every pair", ""), *totals, _two_sided(_convolved(pooled), totals[1] - totals[0]))
        table = pd.concat([table, pd.DataFrame([every | {"p_holm": math.nan}])], ignore_index=True)
    decisive = table["p_holm"].fillna(table["p_value"]) < level
    direction = np.where(table["followed_capacity"] > table["followed_plasticity"], "capacity", "plasticity")
    table["verdict"] = np.where(decisive, direction, "neither")
    return table


def _pair_row(pair: tuple[str, str], plasticity: int, capacity: int, ties: int, p_value: float) -> dict:
    return {
        "more_plastic": LABELS.get(pair[0], pair[0]),
        "larger": LABELS.get(pair[1], pair[1]),
        "cases": plasticity + capacity + ties,
        "followed_plasticity": plasticity,
        "followed_capacity": capacity,
        "ties": ties,
        "p_value": p_value,
    }


def layernorm_confound(pairs: pd.DataFrame) -> str:
    """``CONFOUND`` where every discordant pair sets a LayerNorm against another component, else "".

    ``pairs``: a ``discordant_pairs`` table. Where every pair is such, capacity and "is a LayerNorm" are the same
    variable."""
    rows = pairs[pairs["more_plastic"] != "every pair"]
    norms = {LABELS.get(c, c) for c in LAYERNORMS}
    one_norm = rows["more_plastic"].isin(norms) != rows["larger"].isin(norms)
    return CONFOUND if len(rows) and one_norm.all() else ""


def verdict(
    plasticity: pd.Series, capacity: pd.Series, accuracy: pd.Series, tolerance: float = TOLERANCE
) -> tuple[pd.DataFrame, str]:
    """P(f), parameter share and accuracy of one model on one dataset, and which of the two predicts.

    For notebook 08: per component, the three side by side (Series indexed by component; the accuracy is
    finetuning's), and one sentence: whether the two predictors order the components alike (capacity by
    ``capacity_levels``: components within ``tolerance`` tie) and, where they do not (``discordant_pairs``), how often
    the runs followed each: a count, not a test (one run per component), with Kendall's tau of each predictor with the
    accuracy and, where it applies, ``CONFOUND``."""
    names = [c for c in COMPONENTS if c in accuracy.index and c in plasticity.index and c in capacity.index]
    table = pd.DataFrame(
        {"P(f)": plasticity[names], "parameter share": capacity[names], "accuracy": accuracy[names]}
    ).astype(float)
    levels = capacity_levels(table["parameter share"], tolerance)
    taus = [kendall_tau(x, table["accuracy"]) for x in (table["P(f)"], levels)]
    measured = predictor_table(table["P(f)"], ["here"], "plasticity", tolerance=None)
    results = pd.DataFrame({"dataset": "here", "component": names, "accuracy": table["accuracy"].to_numpy()})
    pairs = discordant_pairs(measured, results, table["parameter share"], tolerance=tolerance)
    equal = f"parameter counts within {tolerance:.0%} of each other counted as equal"
    if pairs.empty:
        text = f"plasticity and capacity order these components alike ({equal}): these runs cannot tell them apart"
    else:
        total = pairs.iloc[-1]
        text = (
            f"plasticity and capacity disagree on {len(pairs) - 1} pair(s) of components ({equal}): the larger "
            f"finetuned better in {total['followed_capacity']}, the more plastic in {total['followed_plasticity']} "
            f"({total['ties']} tie(s)); with one run per component this is a count, not a test of which one "
            "finetuning follows (that needs seeds or datasets: discordant_pairs)"
        )
    said = ["undefined (constant)" if math.isnan(tau) else f"{tau:+.2f}" for tau in taus]
    text += f" (Kendall's tau with accuracy: P(f) {said[0]}, capacity {said[1]})"
    confound = layernorm_confound(pairs)
    return table.rename(index=LABELS), text + (f". {confound}" if confound else "")


def equal_capacity_results(ordinary: pd.DataFrame, equal: pd.DataFrame) -> pd.DataFrame:
    """The five components at equal capacity (``paperlib.vit.equal_capacity``), one row per dataset and component.

    ``equal``'s MHA, FC1 and FC2 (each trained on a subset as large as a LayerNorm) with ``ordinary``'s LN2 and LN1
    (which train whole in either design), for the datasets ``equal`` has. Both tables in ``table6``'s layout
    (``dataset``, ``component`` and the result)."""
    subset = equal[~equal["component"].isin(LAYERNORMS) & equal["component"].isin(COMPONENTS)]
    norms = ordinary[ordinary["component"].isin(LAYERNORMS) & ordinary["dataset"].isin(set(subset["dataset"]))]
    return pd.concat([subset, norms], ignore_index=True)


class AtEqualCapacity(NamedTuple):
    """``at_equal_capacity``'s tables."""

    per_dataset: pd.DataFrame
    summary: pd.DataFrame
    reordered: pd.DataFrame
    accuracies: pd.DataFrame
    difference: pd.DataFrame


DESIGNS = ("ordinary", "equal capacity")
"""The two finetuning designs ``at_equal_capacity`` compares: each component whole (the paper's), and
every component on as many parameters per block as a LayerNorm has."""


def at_equal_capacity(
    plasticity: pd.DataFrame, ordinary: pd.DataFrame, equal: pd.DataFrame, value: str = "accuracy", level: float = 0.05
) -> AtEqualCapacity:
    """Takeaway 2 with size taken out: Kendall's tau of P(f) with ``value`` over the five components.

    Per dataset, in both ``DESIGNS``, on the datasets that have equal-capacity runs.

    ``ordinary`` and ``equal`` are ``table6``'s of the ordinary and the equal-capacity runs (one value per
    dataset and component, e.g. ``mean`` renamed ``accuracy``); the equal design's LayerNorms are the
    ordinary runs (``equal_capacity_results``).
    - ``per_dataset``: ``dataset``, ``family`` and each design's ``tau``.
    - ``summary``, per design: ``within_capacity``'s test with the five components as one group: the
      taus' ``mean_tau``, the summed ``S`` with its exact permutation ``p_value`` (the accuracies permuted
      among the components, one permutation for every dataset of a family; ``p_value_by_dataset``: each dataset
      on its own), and the same by family (a dataset family counts once:
      ``family_positive``, ``family_negative``, ``family_p_value``).
    - ``reordered``: the pairs of components the two designs order differently on a dataset, each
      design's difference (first minus second, in the paper's order of components), the ``more plastic``
      of the two by P(f) on that dataset, and whether the equal design ``follows plasticity`` (puts it ahead).
    - ``accuracies``: ``value`` of both designs side by side (dataset x design and component label).
    - ``difference``: whether the designs differ in Takeaway 2 (``design_difference``)."""
    one_group = {component: 1.0 for component in COMPONENTS}
    datasets = set(equal["dataset"])
    designs = {
        "ordinary": ordinary[ordinary["dataset"].isin(datasets) & ordinary["component"].isin(COMPONENTS)],
        "equal capacity": equal_capacity_results(ordinary, equal),
    }
    tests = {name: within_capacity(plasticity, table, one_group, value, level=level) for name, table in designs.items()}
    per_dataset = pd.concat(
        [test.per_dataset.set_index(["dataset", "family"])["tau"].rename(name) for name, test in tests.items()], axis=1
    ).reset_index()
    columns = ["strata", "mean_tau", "S", "pairs", "p_value", "significant", "p_value_by_dataset"]
    columns += ["families", "family_positive", "family_negative", "family_p_value"]
    summary = pd.DataFrame({name: test.summary.iloc[0][columns] for name, test in tests.items()}).T
    wide = {
        name: table.pivot_table(index="dataset", columns="component", values=value) for name, table in designs.items()
    }
    accuracies = pd.concat(wide, axis=1).reindex(columns=[(d, c) for d in DESIGNS for c in COMPONENTS])
    reordered = _reordered(wide, plasticity)
    accuracies = accuracies.rename(columns=LABELS, level=1)
    difference = design_difference(wide, plasticity)
    return AtEqualCapacity(per_dataset, summary.rename_axis("design"), reordered, accuracies, difference)


def design_difference(wide: dict[str, pd.DataFrame], plasticity: pd.DataFrame) -> pd.DataFrame:
    """A test of the difference between the two designs (``wide``: dataset x component of each, ``DESIGNS``).

    The statistic: Kendall's S of P(f) with the value in the equal design minus in the ordinary one, summed over the
    datasets. Its null: the design labels swapped or not, for each component, one swap for every dataset of a family
    (the family is the unit), families independent: exact over the 2^components swaps of each family. One row:
    ``S_difference``, ``families``, the two-sided ``p_value`` and ``smallest_p``, the smallest p-value these families
    could give (their most extreme difference): where it is above 0.05 no outcome of the design is significant."""
    scores = plasticity.pivot_table(index="dataset", columns="component", values="plasticity")
    names = list(COMPONENTS)
    swaps = np.array(list(itertools.product([False, True], repeat=len(names))))
    totals: dict[str, np.ndarray] = {}
    for dataset in wide["equal capacity"].index.intersection(wide["ordinary"].index).intersection(scores.index):
        rows = [
            w.reindex(columns=names).loc[dataset].to_numpy(float) for w in (wide["equal capacity"], wide["ordinary"])
        ]
        x = scores.reindex(columns=names).loc[dataset].to_numpy(float)
        kept = np.isfinite(x) & np.isfinite(rows[0]) & np.isfinite(rows[1])
        if kept.sum() < 2:
            continue
        equal, ordinary = (np.where(swaps[:, kept], b[kept], a[kept]) for a, b in (rows, rows[::-1]))
        gap = kendall_s(x[kept], equal) - kendall_s(x[kept], ordinary)  # one per swap, none first
        totals[family(dataset)] = totals.get(family(dataset), 0) + gap
    null = _convolved(_distribution(t) for t in totals.values())
    observed = int(sum(t[0] for t in totals.values()))
    extreme = null[0] + len(null[1]) - 1
    row = {"S_difference": observed, "families": len(totals), "p_value": _two_sided(null, observed)}
    return pd.DataFrame([row | {"smallest_p": _two_sided(null, max(abs(null[0]), extreme)) if totals else math.nan}])


def _reordered(wide: dict[str, pd.DataFrame], plasticity: pd.DataFrame) -> pd.DataFrame:
    """The pairs of components the two designs (``wide``: dataset x component each) order differently on a dataset."""
    scores = plasticity.pivot_table(index="dataset", columns="component", values="plasticity")
    datasets = wide["equal capacity"].index
    aligned = [w.reindex(index=datasets, columns=list(COMPONENTS)) for w in (*wide.values(), scores)]  # NaN: none
    rows = []
    for dataset in datasets:
        for first, second in itertools.combinations(COMPONENTS, 2):
            differences = [w.loc[dataset, first] - w.loc[dataset, second] for w in aligned]
            if np.sign(differences[0]) * np.sign(differences[1]) < 0:
                row = {"dataset": dataset, "pair": f"{LABELS[first]} / {LABELS[second]}"}
                row |= dict(zip(DESIGNS, differences))
                more = first if differences[2] > 0 else second if differences[2] < 0 else "tie"
                follows = bool(np.sign(differences[1]) == np.sign(differences[2])) if more != "tie" else math.nan
                rows.append(row | {"more plastic": LABELS.get(more, more), "follows plasticity": follows})
    return pd.DataFrame(rows, columns=["dataset", "pair", *DESIGNS, "more plastic", "follows plasticity"])


def at_equal_capacity_of_runs(
    ordinary: pd.DataFrame, equal: pd.DataFrame, select: str = "val", reference: str | None = None
) -> tuple[AtEqualCapacity, str]:
    """``at_equal_capacity`` of two sweeps' runs (``runs_table.for_spec``'s; one model).

    ``table6`` of each, every component at the learning rate ``select`` chooses (``val``: its own best on validation),
    against P(f) (``component_tests.plasticity_for``). Returns the result (its ``accuracies`` in %) and where P(f)
    comes from ("measured" or the paper's order)."""
    datasets = set(equal["dataset"])
    ordinary = ordinary[ordinary["dataset"].isin(datasets) & ordinary["component"].isin(COMPONENTS)]
    accuracies = [tables.table6(runs, select=select).rename(columns={"mean": "accuracy"}) for runs in (ordinary, equal)]
    measured, source = component_tests.plasticity_for(ordinary, reference)
    return at_equal_capacity(measured, *accuracies), source


def how_they_trained(ordinary: pd.DataFrame, equal: pd.DataFrame, select: str = "val") -> pd.DataFrame:
    """How the runs that ``at_equal_capacity_of_runs`` compares trained, per design, dataset and component.

    The learning rate ``select`` chose (``tables.table6``) and ``at top``: whether it is the largest of the grid
    tried (a better one may lie above it; a one-rate grid is always at its top); over that rate's seeds, the mean
    share of steps whose gradient norm clipping cut (``clipped_steps``) and the component's share of that norm
    (``component_grad_share``: an equal-capacity run's subset gets a small share where the head sets the norm, so
    the designs can be clipped differently). ``ordinary`` and ``equal``: ``runs_table.for_spec``'s runs."""
    keys = ["dataset", "component", "lr"]
    ordinary = ordinary[ordinary["dataset"].isin(set(equal["dataset"])) & ordinary["component"].isin(COMPONENTS)]
    parts = []
    for design, runs in zip(DESIGNS, (ordinary, equal_capacity_results(ordinary, equal))):
        chosen = pd.concat([tables.table6(part, select=select) for _, part in runs.groupby("method")])[keys]
        top = runs.groupby(["dataset", "component"])["lr"].agg(top="max", rates="nunique").reset_index()
        ended = runs[runs["status"].isin(["finished", "diverged"])]
        clipping = ended.groupby(keys)[["clipped_steps", "component_grad_share"]].mean().reset_index()
        part = chosen.merge(top, on=["dataset", "component"]).merge(clipping, on=keys, how="left")
        parts.append(part.assign(design=design, **{"at top": part["lr"] == part["top"]}))
    table = pd.concat(parts, ignore_index=True)
    table["component"] = table["component"].map(LABELS)
    columns = ["lr", "rates", "at top", "clipped_steps", "component_grad_share"]
    return table.set_index(["design", "dataset", "component"])[columns]


def unreachable(table6: pd.DataFrame, datasets: list[str], seeds: int = 3, worlds: int = 200, seed: int = 0) -> float:
    """How often ``design_difference`` cannot be significant in worlds like an equal-capacity sweep's.

    The share of worlds whose ``smallest_p`` is above 0.05, the designs alike. A world: on each of ``datasets``
    (``table6``'s means and standard deviations over seeds, in points), each component's accuracy averaged over
    ``seeds`` seeds in both designs, drawn alike (LN2 and LN1 train whole either way: one run for both), P(f) in the
    paper's order (``component_tests.paper_order``). Whether a design can decide is a property of its families and
    their ties, not of its result: this says it before any run."""
    rng = np.random.default_rng(seed)
    cells = table6[table6["dataset"].isin(datasets) & table6["component"].isin(COMPONENTS)]
    means = cells.pivot(index="dataset", columns="component", values="mean").reindex(columns=list(COMPONENTS))
    spread = cells.pivot(index="dataset", columns="component", values="std").reindex(columns=list(COMPONENTS))
    order = component_tests.paper_order(list(means.index))
    whole = ["ln2", "ln1"]  # trained whole in both designs: one run for both
    above = 0
    for _ in range(worlds):
        ordinary = means + rng.normal(size=means.shape) * spread / np.sqrt(seeds)
        equal = means + rng.normal(size=means.shape) * spread / np.sqrt(seeds)
        equal[whole] = ordinary[whole]
        smallest = design_difference({"ordinary": ordinary, "equal capacity": equal}, order)["smallest_p"].iloc[0]
        above += bool(smallest > 0.05)
    return above / worlds
