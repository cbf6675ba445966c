"""The paper's tables over finetuning runs (§5.2: Table 6, Figs. 2 right, 4 left and middle, 17, 18).

- ``table6``: per dataset and configuration, the test accuracy at the best learning rate of the
  grid, as mean and standard deviation over seeds (numpy's ``np.std``, ddof=0, as the authors'
  code; ``ddof=1`` for the sample deviation). The paper picks the learning rate by test
  accuracy ("best top-1 accuracy on the test set over the learning grid"); ``select="val"``
  picks it by validation accuracy instead, the choice that does not look at the test set.
- ``relative_gain``: percentage improvement over linear probing (Fig. 2 right); ``with_probing``
  adds Table 6's linear-probing column (``PROBE``, from ``probe.table6_column``)
- ``average``: mean over benchmarks with the pooled standard error (Fig. 17), as the authors compute it.
- ``grid_spread``: per dataset and component, the spread of test accuracy over the grid (Figs. 4 left, 18).
- ``early_gradient_norm``: per run, the mean gradient norm over the first part of training (Fig. 4
  middle: "the higher plasticity, the larger gradient norms"), to correlate with P(f) in turn.
- ``paper_accuracy``: an entry of the paper's own Table 6 (``PAPER_TABLE6``).
- ``authors_ablation``: the authors' Adam ablation as their code reports it (``apps/plots/ablation.py``, not in the
  paper): seed 0, mean ± std over the learning rates, SGD beside AdamW (``authors_ablation_numbers``: its numbers).

The tests across benchmarks (Table 1, Takeaway 2) are ``component_tests``'; whether a cheaper training precision (tf32,
autocast, bf16) changes these results, ``precision_check``'s.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from paperlib.records import paths
from paperlib.records.names import COMPONENTS, LABELS, RUN_COMPONENTS, SELECTIONS, check_choice
from paperlib.records.runs_table import KEYS

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
    run counts with its best-validation checkpoint's test accuracy, diverged ones too (a learning rate whose mean is
    NaN is never chosen), with their arithmetic: means of accuracies as fractions (then in %), learning rates in
    ascending order, one replacing the kept one only if its mean is strictly greater (a tie keeps the smaller). A
    learning rate with fewer seeds than another (an unfinished sweep) is not chosen.
    """
    check_choice(select, SELECTIONS, "selection", "selections")
    check_one_setting(runs, "table6")
    finished = runs[runs["status"].isin(["finished", "diverged"])].sort_values("seed")
    finished = finished.assign(test=finished["test_accuracy"], val=finished["best_val_accuracy"])
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
    candidates = per_lr[complete].dropna(subset=["score"]).sort_values("lr")
    best = candidates.loc[candidates.groupby(["dataset", "component"])["score"].idxmax()]  # the first of a tie
    best = best.assign(mean=best["mean"] * 100, std=best["std"] * 100).drop(columns="score")
    return best.sort_values(["dataset", "component"], key=component_order).reset_index(drop=True)


def formatted(table: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """``table6`` output as the paper prints it, datasets x components.

    Each cell "mean ± std (seeds)", or "mean (1)" for a single seed."""

    def cell(row) -> str:
        spread = f" ± {row['std']:.{digits}f}" if row["seeds"] > 1 and pd.notna(row["std"]) else ""
        return f"{row['mean']:.{digits}f}{spread} ({int(row['seeds'])})"

    texts = table.apply(cell, axis=1) if len(table) else pd.Series(dtype=str)  # no run ended: an empty table
    return wide(table.assign(text=texts), "text")


def component_order(column: pd.Series) -> pd.Series:
    """A ``sort_values`` key: a ``component`` column as positions in ``COLUMNS``, another column as it is."""
    return column.map({c: i for i, c in enumerate(COLUMNS)}) if column.name == "component" else column


def wide(accuracies: pd.DataFrame, value: str = "accuracy") -> pd.DataFrame:
    """datasets x components, components in plasticity order (then ``full``, ``linear`` and ``PROBE``)."""
    table = accuracies.pivot(index="dataset", columns="component", values=value)
    return table[[c for c in COLUMNS if c in table.columns]]


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
        hint = " (add linear probing with tables.with_probing)" if baseline == PROBE else ""
        raise ValueError(f"relative_gain needs the baseline column {baseline!r}{hint}; the table has {list(table)}")
    return table.drop(columns=baseline).sub(table[baseline], axis=0).div(table[baseline], axis=0) * 100


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
    check_choice(standard_error, STANDARD_ERRORS, "standard_error")
    rows = []
    for component, part in table.groupby("component", sort=False):
        k = len(part)
        se = math.sqrt(((part["std"] ** 2) / part["seeds"]).mean(skipna=False))
        if standard_error == "of_average":
            se /= math.sqrt(k)
        if not (part["seeds"] > 1).all():
            se = float("nan")
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
    check_choice(diverged, DIVERGED, "diverged")
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
                    "diverged": int(went_wrong[component].sum()),
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


PAPER_TABLE6 = paths.PARAMETERS / "paper" / "table6.csv"
"""The paper's own Table 6 (appendix D.2), transcribed: dataset, component, mean, std."""


def paper_accuracy(dataset: str, component: str) -> float | None:
    """The paper's Table 6 entry (mean test accuracy, %) for ``dataset`` and ``component``.

    ``component`` may be ``PROBE``; None where the paper has none (the demo world, your own data)."""
    paper = pd.read_csv(PAPER_TABLE6, comment="#")
    entry = paper[(paper["dataset"] == dataset) & (paper["component"] == component)]["mean"]
    return float(entry.iloc[0]) if len(entry) else None


ABLATION_ORDER = ("full", "ln1", "ln2", "fc2", "fc1", "mha")
"""The configurations in the order the authors' ablation table prints them (their ``apps/plots/ablation.py``)."""

ABLATION_SIDES = {"sgd": "SGD", "adamw": "Adam"}
"""The two sides of the authors' Adam ablation, by the runs' ``optimizer``, with the names their table prints."""

AVERAGE = "Average"
"""The ablation table's last rows: each configuration's mean over the datasets (the authors' "Average accuracy")."""


def authors_ablation_numbers(
    adam_runs: pd.DataFrame, sgd_runs: pd.DataFrame | None = None, seed: int = 0, missing: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The authors' Adam ablation as numbers: one row per side, dataset and configuration, then the averages.

    The reading of their ``ablation.py`` (``table_results``, not in the paper), not Table 6's: per dataset and
    configuration, the test accuracies of one ``seed`` (theirs: 0) at every learning rate of the grid, as fractions,
    their numpy mean and standard deviation (ddof=0) times 100, rounded to one decimal (``np.round``); then an
    ``AVERAGE`` row per configuration, the mean over the datasets of the unrounded means and of the unrounded
    deviations, times 100 and rounded. A diverged run counts with its test accuracy (the best-validation
    checkpoint's), as their table reads every run's evaluation.

    ``adam_runs``: the runs table (``runs_table.for_spec``) of the AdamW ablation (``parameters/sweeps/
    ablation_adam.yaml``), one setting; its datasets are the table's. ``sgd_runs``: the SGD runs of the main grid
    (``finetune_paper.yaml``), of those datasets (others are left out); None or empty: the Adam side alone.
    ``missing``: ``for_spec``'s missing runs of either spec: their learning rates belong to the grid as well.

    Columns ``side`` ("SGD", "Adam"), ``dataset``, ``component`` (``ABLATION_ORDER``), ``mean`` and ``std`` (%, one
    decimal), ``runs`` (the accuracies averaged), ``grid`` (the learning rates of the grid: those of the side's runs
    and missing runs on the dataset, at any seed and configuration) and ``diverged`` (of the runs averaged). Never an
    average of fewer: a cell with fewer accuracies than learning rates (a run missing, unfinished, or diverged
    before any checkpoint), or none, has NaN ``mean`` and ``std``, and so has the average of a configuration with
    such a cell (its ``runs`` and ``grid`` are the datasets' sums)."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise ValueError(f"seed must be a whole number (the authors': 0), got {seed!r}")
    sides = {"adamw": _ablation_side(adam_runs, "adamw", "adam_runs")}
    if sgd_runs is not None and len(sgd_runs):
        sides["sgd"] = _ablation_side(sgd_runs, "sgd", "sgd_runs")
    if sides["adamw"].empty:
        raise ValueError("adam_runs holds no run: give the runs of parameters/sweeps/ablation_adam.yaml")
    seeds = sorted(sides["adamw"]["seed"].unique())
    if seed not in seeds:
        raise ValueError(f"no Adam run of seed {seed}; valid seeds (those of adam_runs): {', '.join(map(str, seeds))}")
    if len(sides) == 2:
        _check_same_setting(sides["adamw"], sides["sgd"])
    missing = pd.DataFrame(columns=["dataset", "lr", "optimizer"]) if missing is None else missing
    if not {"dataset", "lr", "optimizer"} <= set(missing.columns):
        raise ValueError("missing must be runs_table.for_spec's missing runs (columns dataset, lr, optimizer...)")
    datasets = sorted(set(sides["adamw"]["dataset"]) | set(missing.loc[missing["optimizer"] == "adamw", "dataset"]))
    rows = []
    for optimizer in ("sgd", "adamw"):
        if optimizer not in sides:
            continue
        runs = sides[optimizer]
        absent = missing[missing["optimizer"] == optimizer]
        per_dataset = []
        for dataset in datasets:
            grid = set(runs.loc[runs["dataset"] == dataset, "lr"]) | set(absent.loc[absent["dataset"] == dataset, "lr"])
            for component in ABLATION_ORDER:
                at = runs[(runs["dataset"] == dataset) & (runs["component"] == component) & (runs["seed"] == seed)]
                at = at[at["status"].isin(["finished", "diverged"]) & at["test_accuracy"].notna()].sort_values("lr")
                values = at["test_accuracy"].to_numpy(dtype=float)
                whole = len(values) == len(grid) and len(values) > 0
                per_dataset.append(
                    {
                        "dataset": dataset,
                        "component": component,
                        "mean": values.mean() if whole else np.nan,
                        "std": values.std() if whole else np.nan,
                        "runs": len(values),
                        "grid": len(grid),
                        "diverged": int((at["status"] == "diverged").sum()),
                    }
                )
        cells = pd.DataFrame(per_dataset)
        averages = cells.groupby("component", sort=False).agg(
            mean=("mean", lambda s: np.mean(s.to_numpy())),  # NaN where a dataset's cell is
            std=("std", lambda s: np.mean(s.to_numpy())),
            runs=("runs", "sum"),
            grid=("grid", "sum"),
            diverged=("diverged", "sum"),
        )
        averages = averages.reset_index().assign(dataset=AVERAGE)
        both = pd.concat([cells, averages[cells.columns]], ignore_index=True)
        both[["mean", "std"]] = np.round(both[["mean", "std"]].to_numpy(dtype=float) * 100, 1)
        rows.append(both.assign(side=ABLATION_SIDES[optimizer]))
    columns = ["side", "dataset", "component", "mean", "std", "runs", "grid", "diverged"]
    return pd.concat(rows, ignore_index=True)[columns]


def authors_ablation(
    adam_runs: pd.DataFrame, sgd_runs: pd.DataFrame | None = None, seed: int = 0, missing: pd.DataFrame | None = None
) -> pd.DataFrame:
    """The authors' Adam ablation table as their ``ablation.py`` prints it: SGD and Adam side by side.

    Rows: (dataset, configuration) in their order (``ABLATION_ORDER``: All, LN1, LN2, FC2, FC1, MHA), then the
    ``AVERAGE`` rows; a column per side (SGD first, as they print it; Adam alone without SGD runs), each cell "mean ±
    std" at one decimal over the learning rates of ``seed`` (``authors_ablation_numbers``, whose arguments these are).
    A cell short of learning rates says how many it has ("3 of 4 lrs"; "no run" where the side has no run of the
    dataset), never a mean of fewer; the average of a configuration with such a cell says how many of its datasets
    are whole ("3 of 4 datasets whole")."""
    numbers = authors_ablation_numbers(adam_runs, sgd_runs, seed, missing)

    def cell(row) -> str:
        if pd.notna(row["mean"]):
            return f"{row['mean']:.1f} ± {row['std']:.1f}"
        if row["dataset"] == AVERAGE:
            part = numbers[(numbers["side"] == row["side"]) & (numbers["dataset"] != AVERAGE)]
            whole = part[(part["component"] == row["component"]) & part["mean"].notna()]
            return f"{len(whole)} of {part['dataset'].nunique()} datasets whole"
        return f"{row['runs']} of {row['grid']} lrs" if row["grid"] else "no run"

    table = numbers.assign(text=numbers.apply(cell, axis=1), configuration=numbers["component"].map(LABELS))
    wide = table.pivot(index=["dataset", "configuration"], columns="side", values="text")
    order = [(d, LABELS[c]) for d in dict.fromkeys(numbers["dataset"]) for c in ABLATION_ORDER]
    sides = [side for side in ABLATION_SIDES.values() if side in wide.columns]
    return wide.loc[order, sides].rename_axis(columns=None)


def _ablation_side(runs: pd.DataFrame, optimizer: str, what: str) -> pd.DataFrame:
    """``runs`` if they are the runs of ``optimizer``, of one setting, with the columns the ablation reads."""
    needed = ["dataset", "component", "lr", "seed", "status", "test_accuracy", "optimizer"]
    lacking = [column for column in needed if column not in runs]
    if lacking:
        raise ValueError(f"{what} lacks the column(s) {', '.join(lacking)}; give a runs table (runs_table.for_spec)")
    others = sorted(set(runs["optimizer"]) - {optimizer})
    if others:
        raise ValueError(
            f"{what} holds runs of optimizer {', '.join(map(str, others))}; valid: adam_runs of optimizer adamw "
            "(parameters/sweeps/ablation_adam.yaml), sgd_runs of optimizer sgd (finetune_paper.yaml)"
        )
    check_one_setting(runs, f"the Adam ablation's {what}")
    if runs.duplicated(["dataset", "component", "lr", "seed"]).any():
        raise ValueError(f"{what} holds two runs of one dataset, configuration, learning rate and seed")
    return runs


def _check_same_setting(adam_runs: pd.DataFrame, sgd_runs: pd.DataFrame) -> None:
    """A ValueError if the two sides' runs differ in a key of ``SETTING`` but the optimizer's."""
    for key in SETTING:
        if key in ("optimizer", "weight_decay") or key not in adam_runs or key not in sgd_runs:
            continue
        adam, sgd = set(adam_runs[key].dropna()), set(sgd_runs[key].dropna())
        if adam and sgd and adam != sgd:
            raise ValueError(
                f"the Adam and SGD runs differ in {key} ({', '.join(map(str, sorted(adam)))} against "
                f"{', '.join(map(str, sorted(sgd)))}): give the SGD runs of the same {key}"
            )
