"""The paper's statistics over finetuning results (§5.2: Tables 1 and 6, Figs. 2 right, 4 left, 17, 18).

- ``table6``: per dataset and configuration, the test accuracy at the best learning rate of the
  grid, as mean and standard deviation over seeds (numpy's ``np.std``, ddof=0, as the authors'
  code; ``ddof=1`` for the sample deviation). The paper picks the learning rate by test
  accuracy ("best top-1 accuracy on the test set over the learning grid"); ``select="val"``
  picks it by validation accuracy instead, the choice that does not look at the test set.
- ``table1``: mean decrease (accuracy points) between MHA and each other component over the
  benchmarks, with a Wilcoxon signed-rank test across benchmarks (scipy), significant at 5%: one-sided
  (MHA better) by default, as the authors' code (``alternative="greater"``; the paper says only "a
  Wilcoxon signed-rank test"), ``alternative="two-sided"`` for the two-sided test.
  Beyond the paper, ``p_holm``: the p-values adjusted for its four comparisons (Holm).
- ``pairwise``: every pair of configurations, the same test, Holm-adjusted over all the pairs.
- ``relative_gain``: percentage improvement over linear probing (Fig. 2 right); ``with_probing``
  adds Table 6's linear-probing column (``PROBE``, from ``probe.table6_column``)
- ``average``: mean over benchmarks with the pooled standard error (Fig. 17), as the authors compute it.

Beyond the paper, its Takeaway 2 as a test: "a higher plasticity ... leads to better and more
stable finetuning performance" (§5.2).

- ``grid_spread``: per dataset and component, the spread of test accuracy over the grid (Figs. 4 left, 18).
- ``plasticity_correlation``: per dataset, Kendall's tau (scipy) between the components' P(f)
  and a finetuning result (accuracy, spread...), with its exact p-value over the five components.
- ``correlation_summary``: the taus across benchmarks, with a Wilcoxon signed-rank test of their
  median against 0 (the test of Table 1, over the same benchmarks), and a sign test over dataset families
  (a corruption counts with the dataset it corrupts).
- ``early_gradient_norm``: per run, the mean gradient norm over the first part of training (Fig. 4
  middle: "the higher plasticity, the larger gradient norms"), to correlate with P(f) in turn.
- ``paper_order``: the paper's ranking as scores, for a Table 6 without measured plasticity
  (the paper finds MHA > FC1 > FC2 > LN2 > LN1 on every benchmark, Fig. 2 middle).

Whether a cheaper training precision (tf32, autocast, bf16) changes these results: ``precision``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from paperlib.analysis import plasticity_table
from paperlib.analysis.significance import holm, kendall, kendall_tau, sign_test, wilcoxon_p
from paperlib.records import cli, paths, runs_table, specs, storage
from paperlib.records.methods import METHODS
from paperlib.records.names import ADAPTABLE, COMPONENTS, LABELS, PAPER_SCORES, RUN_COMPONENTS, family
from paperlib.records.runs_table import KEYS

SELECTIONS = ("test", "val")

PROBE = "probe"
"""Table 6's linear-probing column (the paper's "Linear"): the authors' probe of the pretrained model
(``probe.table6_column``), not a finetuning run; the baseline of every relative gain (Fig. 2 right).
The ``linear`` configuration is another thing: a new head trained with SGD by the protocol."""

COLUMNS = RUN_COMPONENTS + (PROBE,)
"""Table 6's columns, in order: the finetuning configurations, then linear probing."""

SETTING = tuple(key for key in KEYS if key not in ("dataset", "component", "lr", "seed"))
"""The run keys that make one setting (model, precision, optimizer, LoRA, normalisation, tag): runs
that differ in them are not seeds or learning rates of one another."""


def table6(runs: pd.DataFrame, select: str = "test", ddof: int = 0) -> pd.DataFrame:
    """Table 6: one row per dataset and component with the ``lr`` chosen and its accuracy over seeds.

    Columns ``lr``, ``mean`` and ``std`` (%, over seeds; with ``ddof=0`` numpy's ``np.std``, as the authors' code
    computed Table 6's ±; ``ddof=1`` the sample standard deviation, 1.22x larger for three seeds), ``seeds``.

    ``runs``: the runs table of ``runs_table.load`` for one model, precision, optimizer, LoRA setting, normalisation
    and tag (a ValueError otherwise: their runs are not seeds of one another). As the authors' selection, every
    run counts with its best-validation checkpoint's test accuracy, diverged ones too (one without, diverged
    before any validation, makes its learning rate's mean NaN, never chosen), and a tie keeps the smaller
    learning rate; a learning rate with fewer seeds than another (an unfinished sweep) is not chosen.
    """
    if select not in SELECTIONS:
        raise ValueError(f"unknown selection {select!r}; valid selections: {', '.join(SELECTIONS)}")
    check_one_setting(runs, "table6")
    finished = runs[runs["status"].isin(["finished", "diverged"])].copy()
    finished["test"] = finished["test_accuracy"] * 100
    finished["val"] = finished["best_val_accuracy"] * 100
    per_lr = (
        finished.groupby(["dataset", "component", "lr"])
        .agg(
            mean=("test", lambda s: s.mean(skipna=False)),
            std=("test", lambda s: s.std(ddof=ddof)),
            seeds=("test", "size"),
            score=(select, lambda s: s.mean(skipna=False)),
        )
        .reset_index()
    )
    complete = per_lr["seeds"] == per_lr.groupby(["dataset", "component"])["seeds"].transform("max")
    best = (
        per_lr[complete]
        .dropna(subset=["score"])
        .sort_values(["score", "lr"], ascending=[False, True])
        .groupby(["dataset", "component"])
        .head(1)
    )
    return best.drop(columns="score").sort_values(["dataset", "component"], key=component_order).reset_index(drop=True)


def formatted(table: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """``table6`` output as the paper prints it, datasets x components.

    Each cell "mean ± std (seeds)", or "mean (1)" for a single seed."""

    def cell(row) -> str:
        spread = f" ± {row['std']:.{digits}f}" if row["seeds"] > 1 and pd.notna(row["std"]) else ""
        return f"{row['mean']:.{digits}f}{spread} ({int(row['seeds'])})"

    return wide(table.assign(text=table.apply(cell, axis=1)), "text")


def component_order(column: pd.Series) -> pd.Series:
    """A ``sort_values`` key: a ``component`` column as positions in ``COLUMNS``, another column as it is."""
    return column.map({c: i for i, c in enumerate(COLUMNS)}) if column.name == "component" else column


def wide(accuracies: pd.DataFrame, value: str = "accuracy") -> pd.DataFrame:
    """datasets x components, components in plasticity order (then ``full``, ``linear`` and ``PROBE``)."""
    table = accuracies.pivot(index="dataset", columns="component", values=value)
    return table[[c for c in COLUMNS if c in table.columns]]


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
        difference, p_value, datasets = _signed_rank(table["mha"], table[component], alternative)
        rows.append(
            {
                "component": component,
                "decrease": difference,
                "p_value": p_value,
                "significant": bool(p_value < level),
                "datasets": datasets,
            }
        )
    out = pd.DataFrame(rows, columns=TABLE1_COLUMNS[:5])
    out["p_holm"] = holm(out["p_value"])
    out["significant_holm"] = out["p_holm"] < level
    return out


def _signed_rank(first: pd.Series, second: pd.Series, alternative: str) -> tuple[float, float, int]:
    """Mean of ``first - second`` over the datasets both have, its Wilcoxon p-value, and that number of datasets.

    The p-value is scipy's signed-rank test's; 1 when every difference is 0."""
    pair = pd.concat([first, second], axis=1).dropna()
    if pair.empty:  # no dataset in common: no test (NaN, which Holm does not count)
        return float("nan"), float("nan"), 0
    difference = pair.iloc[:, 0] - pair.iloc[:, 1]
    p_value = wilcoxon_p(difference.to_numpy(), alternative) if (difference != 0).any() else 1.0
    return float(difference.mean()), float(p_value), len(pair)


def pairwise(
    accuracies: pd.DataFrame, components=COMPONENTS, alternative: str = "two-sided", level: float = 0.05
) -> pd.DataFrame:
    """Table 1 for every pair of ``components`` (beyond the paper, which compares MHA with each).

    One row per pair (``first``, ``second``, in the order given): ``difference`` (mean over datasets of first minus
    second, accuracy points), ``wins`` (datasets where first is higher), ``datasets``, ``p_value`` (Wilcoxon signed-rank
    over the datasets both have), ``p_holm`` (Holm-adjusted over all the pairs) and ``significant_holm`` (``p_holm`` <
    ``level``). ``accuracies``: columns ``dataset``, ``component``, ``accuracy``."""
    unknown = [c for c in components if c not in COLUMNS]
    if unknown:
        raise ValueError(
            f"unknown configuration(s) {', '.join(map(repr, unknown))}; valid configurations: {', '.join(COLUMNS)}"
        )
    table = wide(accuracies)
    present = [c for c in components if c in table]
    rows = []
    for i, first in enumerate(present):
        for second in present[i + 1 :]:
            difference, p_value, datasets = _signed_rank(table[first], table[second], alternative)
            both = table[[first, second]].dropna()
            rows.append(
                {
                    "first": first,
                    "second": second,
                    "difference": difference,
                    "wins": int((both[first] > both[second]).sum()),
                    "datasets": datasets,
                    "p_value": p_value,
                }
            )
    out = pd.DataFrame(rows, columns=["first", "second", "difference", "wins", "datasets", "p_value"])
    out["p_holm"] = holm(out["p_value"])
    out["significant_holm"] = out["p_holm"] < level
    return out


def with_probing(table: pd.DataFrame, probing: pd.DataFrame) -> pd.DataFrame:
    """``table`` (``table6``'s) with Table 6's linear-probing column.

    ``probing`` (``dataset``, ``accuracy`` in %, as ``probe.table6_column`` gives it) as the rows of ``PROBE``, for the
    datasets ``table`` has. One value per dataset (the probe is of the pretrained model): no spread."""
    rows = probing[probing["dataset"].isin(table["dataset"])].rename(columns={"accuracy": "mean"})
    rows = rows.assign(component=PROBE, std=np.nan, seeds=1)[["dataset", "component", "mean", "std", "seeds"]]
    both = pd.concat([table[table["component"] != PROBE], rows], ignore_index=True)
    return both.sort_values(["dataset", "component"], key=component_order).reset_index(drop=True)


def relative_gain(accuracies: pd.DataFrame, baseline: str = PROBE, value: str = "accuracy") -> pd.DataFrame:
    """Percentage improvement of each component over ``baseline`` per dataset (Fig. 2 right).

    Datasets x components (``value``: the column of ``accuracies`` to compare, e.g. ``table6``'s ``mean``; ``baseline``:
    linear probing, ``PROBE``, as in the paper, or another column, e.g. ``linear``)."""
    table = wide(accuracies, value)
    if baseline not in table:
        hint = " (add linear probing with stats.with_probing)" if baseline == PROBE else ""
        raise ValueError(f"relative_gain needs the baseline column {baseline!r}{hint}; the table has {list(table)}")
    gain = table.drop(columns=baseline).sub(table[baseline], axis=0).div(table[baseline], axis=0) * 100
    return gain


STANDARD_ERRORS = ("pooled", "of_average")


def average(table: pd.DataFrame, standard_error: str = "pooled") -> pd.DataFrame:
    """Mean over datasets per component, with a standard error.

    As Fig. 17 ( "the pooled standard error computed over 3 finetuning runs").

    ``table``: ``table6`` output (``mean``, ``std``, ``seeds`` per dataset and component). With k datasets,
    each over s seeds with deviation sd_i, ``pooled_se`` is ``sqrt(mean_i sd_i^2 / s)``: the
    deviation pooled over the datasets, as the standard error of a mean over s runs (the authors' code,
    the default ``"pooled"``); ``"of_average"`` gives the standard error of the average over the k
    datasets, ``sqrt(sum_i sd_i^2 / s) / k`` (sqrt(k) times smaller). NaN when a dataset has a single
    seed (no deviation).
    """
    if standard_error not in STANDARD_ERRORS:
        raise ValueError(f"unknown standard_error {standard_error!r}; valid choices: {', '.join(STANDARD_ERRORS)}")
    rows = []
    for component, part in table.groupby("component", sort=False):
        k = len(part)
        pooled = math.sqrt(((part["std"] ** 2) / part["seeds"]).mean(skipna=False))
        se = (
            (pooled if standard_error == "pooled" else pooled / math.sqrt(k))
            if (part["seeds"] > 1).all()
            else float("nan")
        )
        rows.append({"component": component, "mean": part["mean"].mean(), "pooled_se": se, "datasets": k})
    out = pd.DataFrame(rows)
    return out.sort_values("component", key=component_order).reset_index(drop=True)


DIVERGED = ("kept", "cell", "run")  # what grid_spread does with a run that diverged (its docstring)


def grid_spread(runs: pd.DataFrame, components=COMPONENTS, diverged: str = "kept") -> pd.DataFrame:
    """The spread of test accuracy (%) over the grid, per dataset and component.

    One row per dataset and component of ``components``; the grid is every learning rate and seed (Fig. 4 left,
    Fig. 18). Columns ``std`` (sample deviation, ddof=1), ``iqr`` (interquartile range), ``range``, ``median``, over
    ``runs`` counted; ``diverged`` and ``cells`` (counted).

    The configurations are compared on one grid: the (learning rate, seed) cells where every one of them
    has a test accuracy (an unfinished sweep leaves no configuration a grid of its own). A diverged run
    counts with its best-validation checkpoint's, as in the authors' boxes (``diverged="kept"``);
    ``"cell"`` leaves its cell out for all, ``"run"`` for its own configuration only (``DIVERGED``).
    ``runs``: ``runs_table.load``'s table for one setting (a ValueError otherwise)."""
    if diverged not in DIVERGED:
        raise ValueError(f"unknown diverged {diverged!r}; valid choices: {', '.join(DIVERGED)}")
    check_one_setting(runs, "grid_spread")
    columns = ["dataset", "component", "std", "iqr", "range", "median", "runs", "diverged", "cells"]
    rows = []
    for dataset, part in runs[runs["component"].isin(components)].groupby("dataset", sort=True):
        present = [c for c in components if c in set(part["component"])]
        if part.duplicated(["lr", "seed", "component"]).any():
            raise ValueError(
                f"{dataset}: more than one run of a configuration at one learning rate and seed; "
                "select one setting first"
            )
        status = part.pivot(index=["lr", "seed"], columns="component", values="status")[present]
        accuracy = part.pivot(index=["lr", "seed"], columns="component", values="test_accuracy")[present] * 100
        went_wrong = status == "diverged"
        complete = (status.isin(["finished", "diverged"]) & accuracy.notna()).all(axis=1)
        kept = complete & ~went_wrong.any(axis=1) if diverged == "cell" else complete
        for component in present:
            counted = kept & ~went_wrong[component] if diverged == "run" else kept
            values = accuracy.loc[counted, component]
            rows.append(
                {
                    "dataset": dataset,
                    "component": component,
                    "std": values.std(),
                    "iqr": values.quantile(0.75) - values.quantile(0.25),
                    "range": values.max() - values.min(),
                    "median": values.median(),
                    "runs": len(values),
                    "diverged": int((status[component] == "diverged").sum()),
                    "cells": int(complete.sum()),
                }
            )
    return pd.DataFrame(rows, columns=columns)


def one_model(runs: pd.DataFrame, model: str = "") -> str:
    """``model`` if ``runs`` has runs of it, else their one model; a ValueError naming them (``-p model``)."""
    found = sorted(runs["model"].unique())
    if (model and model not in found) or (not model and len(found) != 1):
        raise ValueError(f"choose one model with -p model <name>; runs of: {', '.join(found) or 'none'}")
    return model or found[0]


def check_one_setting(runs: pd.DataFrame, what: str, keys=SETTING) -> None:
    """A ValueError if ``runs`` hold several values of a key of ``keys`` (``what``: who needs one)."""
    for key in keys:
        if key in runs and runs[key].nunique() > 1:
            raise ValueError(
                f"{what} needs the runs of one {key}, got {', '.join(map(str, sorted(runs[key].unique())))}: "
                f"select one first (e.g. runs[runs['{key}'] == ...])"
            )


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
    ``table6``'s ``mean`` renamed ``accuracy``, or ``grid_spread``'s ``std``). Over the components
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
    plasticity = plasticity.rename(columns={predictor: "plasticity"}) if predictor != "plasticity" else plasticity
    table = plasticity.merge(results[["dataset", "component", value]], on=["dataset", "component"]).dropna(
        subset=["plasticity", value]
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
        "mean": float(taus.mean()) if len(taus) else float("nan"),
        "median": float(taus.median()) if len(taus) else float("nan"),
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


def early_gradient_norm(histories: pd.DataFrame, runs: pd.DataFrame, fraction: float = 0.2) -> pd.DataFrame:
    """Per finished run, the mean gradient norm over its first ``fraction`` of steps.

    ``histories`` and ``runs``: ``runs_table.load``'s tables. The gradient norm is taken before clipping, over the steps
    <= fraction x the run's length (at least its first logged step): one row per run with its keys and ``grad_norm``.
    A diverged run is left out (one whose loss turned NaN stopped early: its first fraction is another window)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    finished = runs.loc[runs["status"] == "finished", KEYS]
    history = histories.merge(finished, on=KEYS)
    steps = history.groupby(KEYS, dropna=False)["step"]
    early = history[
        (history["step"] <= fraction * steps.transform("max")) | (history["step"] == steps.transform("min"))
    ]
    return early.groupby(KEYS, dropna=False)["grad_norm"].mean().reset_index()


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


# Beyond the paper: LoRA against the components' own weights (notebook 09)


def with_method(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs_table.load``'s runs of the components LoRA adapts (``ADAPTABLE``), their ``method`` as tables name it.

    The label of each run's method (``records.methods``: "weights", "LoRA r=8"...); a label already there is kept, so
    that a labelled table can be passed on (``comparison``)."""
    runs = runs[runs["component"].isin(ADAPTABLE)]
    records = runs[KEYS].to_dict("records")
    labelled = [METHODS[r["method"]].label(r) if r["method"] in METHODS else r["method"] for r in records]
    return runs.assign(method=labelled)


def comparison(runs: pd.DataFrame, select: str = "test") -> pd.DataFrame:
    """Table 6 for each method of ``runs`` (one model and precision; ``with_method``).

    One row per dataset, configuration and method with the learning rate chosen by ``select``, the mean and standard
    deviation (%) over seeds, the seeds, and the trainable parameters."""
    runs = with_method(runs)
    tables = []
    for name, group in runs.groupby("method", sort=False):
        table = table6(group.drop(columns="method"), select=select)
        trainable = group.groupby(["dataset", "component"], as_index=False)["trainable_parameters"].max()
        tables.append(table.merge(trainable, on=["dataset", "component"], how="left").assign(method=name))
    columns = ["dataset", "component", "method", "lr", "mean", "std", "seeds", "trainable_parameters"]
    if not tables:
        return pd.DataFrame(columns=columns)
    order = {component: i for i, component in enumerate(ADAPTABLE)}
    table = pd.concat(tables, ignore_index=True)[columns]
    table["_order"] = table["component"].map(order)
    table["_lora"] = table["method"] != "weights"
    return (
        table.sort_values(["dataset", "_order", "_lora", "method"])
        .drop(columns=["_order", "_lora"])
        .reset_index(drop=True)
    )


# Every table of a sweep's runs, and the command line


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


def summary(
    runs: pd.DataFrame, select: str = "test", reference: str | None = None, probing: pd.DataFrame | None = None
) -> dict[str, pd.DataFrame]:
    """Notebook 07's tables for the runs of one setting.

    ``table6`` (with the linear-probing column ``probing``, when given: ``with_probing``) and its ``comparisons``, with
    P(f) from ``plasticity_for`` and the spread of each component over the grid (``grid_spread``)."""
    accuracy_table = table6(runs, select=select)
    if probing is not None:
        accuracy_table = with_probing(accuracy_table, probing)
    measured, source = plasticity_for(runs, reference)
    return {
        "table6": accuracy_table,
        **comparisons(accuracy_table, measured, source, grid_spread(runs), "spread over the grid"),
    }


PAPER_TABLE6 = paths.PARAMETERS / "paper" / "table6.csv"
"""The paper's own Table 6 (appendix D.2), transcribed: dataset, component, mean, std."""


def paper_accuracy(dataset: str, component: str) -> float | None:
    """The paper's Table 6 entry (mean test accuracy, %) for ``dataset`` and ``component``.

    ``component`` may be ``PROBE``; None where the paper has none (the demo world, your own data)."""
    paper = pd.read_csv(PAPER_TABLE6, comment="#")
    entry = paper[(paper["dataset"] == dataset) & (paper["component"] == component)]["mean"]
    return float(entry.iloc[0]) if len(entry) else None


def pooled_order(summary: pd.DataFrame) -> pd.DataFrame:
    """Per model of a ``plasticity_table.collect`` table: its components ordered by pooled P(f).

    P(f) averaged over its datasets (``order``, e.g. "MHA > FC1 > FC2 > LN2 > LN1") and Kendall's tau of that order with
    the paper's (``tau``: 1 the same, -1 reversed)."""
    rows = []
    for model, part in summary.groupby("model", sort=True):
        mean = part.groupby("component", observed=True)["plasticity"].mean().reindex(list(COMPONENTS))
        tau = kendall_tau(mean, [PAPER_SCORES[c] for c in mean.index])
        order = " > ".join(LABELS[c] for c in mean.sort_values(ascending=False).index)
        rows.append({"model": model, "order": order, "tau": tau})
    return pd.DataFrame(rows, columns=["model", "order", "tau"])


def paper_summary() -> dict[str, pd.DataFrame]:
    """The tables of ``summary`` computed on the paper's own Table 6 (``PAPER_TABLE6``).

    With the paper's ranking in place of P(f) (``paper_order``) and its standard deviation over seeds as the spread."""
    paper = pd.read_csv(PAPER_TABLE6, comment="#")
    order = paper_order(sorted(paper["dataset"].unique()))
    return {"table6": paper, **comparisons(paper, order, "paper", paper, "std over seeds")}


def comparisons(
    accuracy_table: pd.DataFrame, measured: pd.DataFrame, source: str, spread: pd.DataFrame, spread_name: str
) -> dict[str, pd.DataFrame]:
    """The tables that compare components across datasets, from a Table 6.

    From ``mean`` per dataset and component: ``table1`` (with Holm), ``pairwise``, and the Takeaway 2 test against P(f)
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
    has_mha = "mha" in set(accuracies["component"])  # without it no Table 1 (``main`` says so)
    return {
        "table1": table1(accuracies) if has_mha else pd.DataFrame(columns=TABLE1_COLUMNS),
        "pairwise": pairwise(accuracies),
        "accuracy_tau": accuracy_tau,
        "spread_tau": spread_tau,
        "takeaway2": takeaway2,
    }


def argument_parser():
    """``main``'s command line: ``cli.tables_parser``'s and the reference images of P(f)."""
    spec = "a finetuning sweep spec, e.g. parameters/sweeps/finetune_paper.yaml"
    parser = cli.tables_parser("python -m paperlib stats", main.__doc__.split(":", 1)[1].strip(), spec, SELECTIONS)
    parser.add_argument(
        "--reference", help="the dataset P(f) was measured against (its reference images); default: each dataset's own"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib stats``: notebook 07's tables for a finetuning sweep's runs.

    ``python -m paperlib stats SPEC [--select val] [--reference R] [--csv DIR]``, without the notebook: what is finished
    and missing, Table 6, Table 1 with Holm's adjustment, every pair of components, and the Takeaway 2 test; for a spec
    of several precisions (a precision check: ``python -m paperlib precision``), these of its fp32 runs."""
    args = argument_parser().parse_args(argv)
    try:
        spec = specs.load_spec(args.spec)
        found, missing = runs_table.for_spec(spec)
        runs_table.at_least_one(found, args.spec, missing)
        several = found["precision"].nunique() > 1
        if several:  # a precision check (precision_check.main): here, the paper's tables of its fp32 runs
            found = found[found["precision"] == "fp32"]
        tables = summary(found, args.select, args.reference)
    except cli.BAD_INPUT as error:
        return cli.fail(error)
    counts = ", ".join(f"{n} {s}" for s, n in found["status"].value_counts().items())
    why = missing["reason"].str.split(":").str[0].value_counts()
    why = f" ({', '.join(f'{n} {reason}' for reason, n in why.items())})" if len(missing) else ""
    print(f"{len(found)} {'fp32 ' if several else ''}runs of {args.spec}: {counts}; {len(missing)} missing{why}")
    differ = missing[missing["reason"] != "no run"]
    if len(differ):  # folders that hold a run of other parameters than the spec's: not counted as its runs
        print(differ[["dataset", "component", "lr", "seed", "reason"]].to_string(index=False))
    print()
    if tables["table1"].empty:
        print("Table 1 needs finished MHA runs: none yet (the other tables are of the runs there are)\n")
    shown = {
        "Table 6: test accuracy (%) at the best learning rate": formatted(tables["table6"]),
        "Table 1: MHA against each component (Wilcoxon; p_holm: Holm over the four)": tables["table1"].round(4),
        "Every pair of components (difference, Holm-adjusted p over the pairs)": formatted_pairs(tables["pairwise"]),
        "Takeaway 2: Kendall's tau of P(f) with the result, per dataset": tables["accuracy_tau"].round(3),
        "Takeaway 2 across datasets (Wilcoxon of the taus against 0)": tables["takeaway2"].round(3),
    }
    for title, table in shown.items():
        print(f"{title}\n{table.to_string()}\n")
    if several:
        print(f"several precisions: their effect on these results is python -m paperlib precision {args.spec}\n")
    if (found["method"] == "subset").any():
        print("equal-capacity runs: their LN2 and LN1 are the ordinary runs; notebook 10 compares the two designs\n")
    if args.csv:
        write_csv(tables, args.csv, indexed=("takeaway2",))
    return 0


def write_csv(tables: dict[str, pd.DataFrame], folder: str | Path, indexed: tuple[str, ...] = ()) -> None:
    """Each table as ``<folder>/<name>.csv``, atomically, with its index for the ``indexed`` ones; says where."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        storage.atomic_write(
            folder / f"{name}.csv", lambda tmp, table=table, index=name in indexed: table.to_csv(tmp, index=index)
        )
    print(f"tables written to {paths.display(folder)}")
