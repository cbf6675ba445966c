"""The paper's tests across benchmarks: which components finetune best, and whether it is the more plastic (§5.2).

``comparisons`` makes every table below from a Table 6 (``tables.table6``) and P(f).

- ``table1``: mean decrease (accuracy points) between MHA and each other component over the
  benchmarks, with a Wilcoxon signed-rank test across benchmarks (scipy), significant at 5%: one-sided
  (MHA better) by default, as the authors' code (``alternative="greater"``; the paper says only "a
  Wilcoxon signed-rank test"), ``alternative="two-sided"`` for the two-sided test.
  Beyond the paper, ``p_holm``: the p-values adjusted for its four comparisons (Holm).
- ``pairwise``: every pair of configurations, the same test, Holm-adjusted over all the pairs.

Beyond the paper, its Takeaway 2 as a test: "a higher plasticity ... leads to better and more
stable finetuning performance" (§5.2).

- ``plasticity_correlation``: per dataset, Kendall's tau (scipy) between the components' P(f)
  and a finetuning result (accuracy, spread...), with its exact p-value over the five components.
- ``correlation_summary``: the taus across benchmarks, with a Wilcoxon signed-rank test of their
  median against 0 (the test of Table 1, over the same benchmarks), and a sign test over dataset families
  (a corruption counts with the dataset it corrupts).
- ``plasticity_for``: the P(f) of the runs' model, or where none is saved ``paper_order``: the paper's ranking as
  scores (the paper finds MHA > FC1 > FC2 > LN2 > LN1 on every benchmark, Fig. 2 middle).
"""

from __future__ import annotations

import pandas as pd

from paperlib.analysis import plasticity_table
from paperlib.analysis.significance import holm, kendall, sign_test, wilcoxon_p
from paperlib.analysis.tables import COLUMNS, wide
from paperlib.records.names import COMPONENTS, LABELS, PAPER_SCORES, family

TABLE1_COLUMNS = ["component", "decrease", "p_value", "significant", "datasets", "p_holm", "significant_holm"]


def table1(accuracies: pd.DataFrame, alternative="greater", level=0.05, decimals: int | None = 2) -> pd.DataFrame:
    """Table 1: MHA against each other component across benchmarks.

    ``accuracies``: columns ``dataset``, ``component``, ``accuracy`` (one value per dataset and component),
    rounded to ``decimals`` first as the authors' test read Table 6's printed means (a difference that rounds
    to 0 drops out, scipy's default ``zero_method``; None: unrounded). Returns one row per other component:
    ``component``, ``decrease`` (mean over datasets of MHA minus it, in accuracy points), ``p_value``
    (Wilcoxon signed-rank over the datasets where both are present; ``alternative="greater"``, the authors'
    one-sided test that MHA is better, or ``"two-sided"``), ``significant`` (p < ``level``), ``datasets``, and the same
    adjusted for the four comparisons (``p_holm``, ``significant_holm``).
    """
    table = wide(accuracies)
    table = table if decimals is None else table.round(decimals)
    if "mha" not in table:
        raise ValueError("table1 needs MHA accuracies (component 'mha')")
    rows = []
    for component in COMPONENTS[1:]:
        if component not in table:
            continue
        difference, p_value = _signed_rank(table["mha"], table[component], alternative)
        rows.append(
            {
                "component": component,
                "decrease": float(difference.mean()),
                "p_value": p_value,
                "significant": bool(p_value < level),
                "datasets": len(difference),
            }
        )
    out = pd.DataFrame(rows, columns=TABLE1_COLUMNS[:5])
    out["p_holm"] = holm(out["p_value"])
    out["significant_holm"] = out["p_holm"] < level
    return out


def _signed_rank(first: pd.Series, second: pd.Series, alternative: str) -> tuple[pd.Series, float]:
    """``first - second`` over the datasets both have, and its Wilcoxon p-value (``wilcoxon_p``)."""
    difference = (first - second).dropna()
    if difference.empty:  # no dataset in common: no test (NaN, which Holm does not count)
        return difference, float("nan")
    return difference, wilcoxon_p(difference.to_numpy(), alternative)


def pairwise(
    accuracies: pd.DataFrame,
    components=COMPONENTS,
    alternative: str = "two-sided",
    level: float = 0.05,
    decimals: int | None = 2,
) -> pd.DataFrame:
    """Table 1 for every pair of ``components`` (beyond the paper, which compares MHA with each).

    One row per pair (``first``, ``second``, in the order given): ``difference`` (mean over datasets of first minus
    second, accuracy points), ``wins`` (datasets where first is higher), ``datasets``, ``p_value`` (Wilcoxon signed-rank
    over the datasets both have: two-sided, or with ``alternative="greater"`` one-sided that the first is better),
    ``p_holm`` (Holm-adjusted over all the pairs) and ``significant_holm`` (``p_holm`` < ``level``). ``accuracies``:
    columns ``dataset``, ``component``, ``accuracy``, rounded to ``decimals`` first as ``table1`` rounds them, so that
    a pair both test gets one p-value."""
    unknown = [c for c in components if c not in COLUMNS]
    if unknown:
        raise ValueError(
            f"unknown configuration(s) {', '.join(map(repr, unknown))}; valid configurations: {', '.join(COLUMNS)}"
        )
    table = wide(accuracies)
    table = table if decimals is None else table.round(decimals)
    present = [c for c in components if c in table]
    rows = []
    for i, first in enumerate(present):
        for second in present[i + 1 :]:
            difference, p_value = _signed_rank(table[first], table[second], alternative)
            rows.append(
                {
                    "first": first,
                    "second": second,
                    "difference": float(difference.mean()),
                    "wins": int((difference > 0).sum()),
                    "datasets": len(difference),
                    "p_value": p_value,
                }
            )
    out = pd.DataFrame(rows, columns=["first", "second", "difference", "wins", "datasets", "p_value"])
    out["p_holm"] = holm(out["p_value"])
    out["significant_holm"] = out["p_holm"] < level
    return out


def below(pairs: pd.DataFrame, alternative: str, level: float = 0.05) -> str:
    """Which of ``pairwise``'s pairs (computed with ``alternative``) stay below ``level`` once Holm-adjusted, in words.

    Named with its test, so that a sentence about them is printed from the numbers."""
    sides = "two-sided" if alternative == "two-sided" else "one-sided"
    found = pairs[pairs["significant_holm"]]
    named = [
        f"{LABELS.get(r.first, r.first)} {'over' if r.difference > 0 else 'under'} {LABELS.get(r.second, r.second)} "
        f"({r.p_holm:.3f})"
        for r in found.itertuples()
    ]
    head = f"Wilcoxon signed-rank, {sides}, Holm over the {len(pairs)} pairs: "
    count = f"{len(found)} pair{'s' if len(found) != 1 else ''} below {level:.0%}"
    return head + count + (": " + ", ".join(named) if named else "")


def formatted_pairs(pairs: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """``pairwise`` output as a matrix, first configuration x second.

    "difference (p_holm)", with ``*`` where ``significant_holm``; configurations in plasticity order, empty cells where
    no pair."""
    text = pairs.apply(
        lambda r: f"{r['difference']:+.{digits}f} ({r['p_holm']:.3f}){'*' if r['significant_holm'] else ''}", axis=1
    )
    matrix = pairs.assign(text=text).pivot(index="first", columns="second", values="text")
    matrix = matrix.reindex(
        index=[c for c in COLUMNS if c in matrix.index], columns=[c for c in COLUMNS if c in matrix.columns]
    ).fillna("")
    return matrix.rename_axis(index=None, columns=None)


def paper_order(datasets) -> pd.DataFrame:
    """The paper's plasticity ranking (``names.PAPER_SCORES``) as a ``plasticity`` column.

    Scores 5..1 per dataset: for ``plasticity_correlation``, which uses only the order, when P(f) was not measured (the
    paper prints no P(f) table)."""
    return pd.DataFrame(
        [{"dataset": d, "component": c, "plasticity": score} for d in datasets for c, score in PAPER_SCORES.items()]
    )


def plasticity_correlation(
    plasticity: pd.DataFrame,
    results: pd.DataFrame,
    value: str = "accuracy",
    alternative: str = "two-sided",
    predictor: str = "plasticity",
) -> pd.DataFrame:
    """Per dataset, how the components' finetuning ``value`` follows their plasticity.

    Or any other per-component ``predictor`` column of the first table (``capacity.predictor_table``: the parameter
    share).

    ``plasticity``: columns ``dataset``, ``component``, ``plasticity`` (``plasticity_table.collect()`` for
    one model, or ``paper_order``); ``results``: columns ``dataset``, ``component`` and ``value`` (e.g.
    ``tables.table6``'s ``mean`` renamed ``accuracy``, or ``tables.grid_spread``'s ``std``). Over the components
    both have (``full`` and ``linear`` have no plasticity), one row per dataset: ``tau`` (Kendall's
    tau-b, scipy; +1: the more plastic, the higher the value; NaN if either side is constant),
    ``p_value`` (exact, over the 120 pairings of five components: the smallest two-sided p-value is
    2/120 = 0.017, so one benchmark alone can barely be significant; see ``correlation_summary``), ``components``,
    ``most_plastic`` and ``highest`` (the component of the highest value).
    """
    if "model" in plasticity and plasticity["model"].nunique() > 1:
        raise ValueError(
            "plasticity_correlation needs the plasticity of one model, "
            f"got {', '.join(sorted(plasticity['model'].unique()))}"
        )
    if value not in results:
        raise ValueError(f"no column {value!r} in the results; columns: {', '.join(results.columns)}")
    plasticity = plasticity.assign(component=plasticity["component"].astype(str))
    for name, table in (("plasticity", plasticity), ("results", results)):
        repeated = table[table.duplicated(["dataset", "component"], keep=False)]
        if not repeated.empty:
            raise ValueError(
                f"the {name} have more than one row for "
                f"{', '.join(sorted(set(repeated['dataset'] + '/' + repeated['component'])))}: "
                "select one model, setting and measurement first"
            )
    table = (
        plasticity.rename(columns={predictor: "plasticity"})
        .merge(results[["dataset", "component", value]], on=["dataset", "component"])
        .dropna(subset=["plasticity", value])
    )
    rows = []
    for dataset, part in table.groupby("dataset", sort=True):
        if len(part) < 3:  # two points always agree or disagree: no test
            continue
        tau, p_value = kendall(part["plasticity"].to_numpy(float), part[value].to_numpy(float), alternative)
        rows.append(
            {
                "dataset": dataset,
                "tau": tau,
                "p_value": p_value,
                "components": len(part),
                "most_plastic": part.loc[part["plasticity"].idxmax(), "component"],
                "highest": part.loc[part[value].idxmax(), "component"],
            }
        )
    return pd.DataFrame(rows, columns=["dataset", "tau", "p_value", "components", "most_plastic", "highest"])


def correlation_summary(per_dataset: pd.DataFrame, alternative: str = "two-sided", level: float = 0.05) -> dict:
    """The per-dataset taus of ``plasticity_correlation`` across benchmarks, summarised and tested.

    ``datasets``: how many have a tau (those of constant values, without one, are counted as ``undefined``). Their
    ``mean`` and ``median``, how many are ``positive``, ``negative`` and zero, and a Wilcoxon signed-rank test
    (scipy; zeros left out, as in ``table1``) of their median against 0: ``p_value`` (NaN with fewer than two
    non-zero taus), ``significant`` (p < ``level``). That test counts each benchmark as independent; the corruptions
    of one test set are not (five of the paper's eleven corrupt Cifar10's): with a ``dataset`` column, the same taus
    by family (``names.family``: a family's mean tau) give ``families``, ``family_positive``, ``family_negative`` and
    a two-sided sign test, ``family_p_value``."""
    taus = per_dataset["tau"].dropna()
    nonzero = taus[taus != 0]
    p_value = wilcoxon_p(nonzero, alternative) if len(nonzero) >= 2 else float("nan")
    summary = {
        "datasets": len(taus),
        "undefined": int(per_dataset["tau"].isna().sum()),
        "mean": float(taus.mean()),
        "median": float(taus.median()),
        "positive": int((taus > 0).sum()),
        "negative": int((taus < 0).sum()),
        "zero": int((taus == 0).sum()),
        "p_value": p_value,
        "significant": bool(p_value < level),
    }
    if "dataset" not in per_dataset and per_dataset.index.name == "dataset":
        per_dataset = per_dataset.reset_index()
    if "dataset" not in per_dataset:
        return summary
    known = per_dataset.dropna(subset=["tau"])
    by_family = known.groupby(known["dataset"].map(family))["tau"].mean()
    positive, negative = int((by_family > 0).sum()), int((by_family < 0).sum())
    return summary | {
        "families": len(by_family),
        "family_positive": positive,
        "family_negative": negative,
        "family_p_value": sign_test(positive, negative),
    }


def plasticity_for(runs: pd.DataFrame, reference: str | None = None) -> tuple[pd.DataFrame, str]:
    """P(f) of the runs' model on their datasets, and where it comes from.

    Measured on images normalised as the runs' were (``plasticity_table.collect``: the paper's pairs, against
    ``reference``, None: each dataset's default). Where it comes from: ``"measured"``, or, where none is saved,
    ``"paper"``: the ranking the paper finds on every benchmark (``paper_order``), which uses the order only, as the
    Takeaway 2 test does. ``runs``: one model and normalisation (a ValueError otherwise)."""
    for key in ("model", "normalize"):
        if runs[key].nunique() != 1:
            raise ValueError(
                f"plasticity_for needs the runs of one {key}, got {', '.join(map(str, sorted(runs[key].unique())))}"
            )
    model, normalize = runs["model"].iloc[0], runs["normalize"].iloc[0]
    datasets = sorted(runs["dataset"].unique())
    measured = plasticity_table.collect(normalize=normalize, reference=reference or "default")
    measured = measured[(measured["model"] == model) & measured["dataset"].isin(datasets)]
    if measured.empty:
        return paper_order(datasets).assign(model=model), "paper"
    return measured, "measured"


def comparisons(
    accuracy_table: pd.DataFrame,
    measured: pd.DataFrame,
    source: str,
    spread: pd.DataFrame,
    spread_name: str,
    pairwise_alternative: str = "two-sided",
) -> dict[str, pd.DataFrame]:
    """The tables that compare components across datasets, from a Table 6.

    From ``mean`` per dataset and component: ``table1`` (with Holm, one-sided), ``pairwise`` (with
    ``pairwise_alternative``), and the Takeaway 2 test against P(f)
    (``measured``; ``source`` says where it comes from): ``accuracy_tau`` and ``spread_tau`` (per
    dataset; ``spread``: a ``std`` per dataset and component) and ``takeaway2`` (their summaries)."""
    accuracies = accuracy_table.rename(columns={"mean": "accuracy"})
    accuracy_tau = plasticity_correlation(measured, accuracies)
    spread_tau = plasticity_correlation(measured, spread, value="std")
    takeaway2 = (
        pd.DataFrame.from_dict(
            {"accuracy": correlation_summary(accuracy_tau), spread_name: correlation_summary(spread_tau)},
            orient="index",
        )
        .rename_axis("Kendall's tau of P(f) with")
        .assign(plasticity=source)
    )
    has_mha = "mha" in set(accuracies["component"])  # without it no Table 1 (``summary.main`` says so)
    return {
        "table1": table1(accuracies) if has_mha else pd.DataFrame(columns=TABLE1_COLUMNS),
        "pairwise": pairwise(accuracies, alternative=pairwise_alternative),
        "accuracy_tau": accuracy_tau,
        "spread_tau": spread_tau,
        "takeaway2": takeaway2,
    }
