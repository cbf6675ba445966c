"""The paper's statistics over finetuning results (§5.2: Tables 1 and 6, Figs. 2 right, 4 left, 17, 18).

- ``table6``: per dataset and configuration, the test accuracy at the best learning rate of the
  grid, as mean and standard deviation over seeds. The paper picks the learning rate by test
  accuracy ("best top-1 accuracy on the test set over the learning grid"); ``select="val"``
  picks it by validation accuracy instead, the choice that does not look at the test set.
- ``table1``: mean decrease (accuracy points) between MHA and each other component over the
  benchmarks, with a Wilcoxon signed-rank test across benchmarks (scipy), significant at 5%.
- ``relative_gain``: percentage improvement over linear probing (Fig. 2 right).
- ``average``: mean over benchmarks with the pooled standard error (Fig. 17).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy import stats

from .components import COMPONENTS, CONFIGS

SELECTIONS = ("test", "val")


def table6(runs: pd.DataFrame, select: str = "test") -> pd.DataFrame:
    """One row per dataset and config: ``lr`` chosen, ``mean`` and ``std`` (%, over seeds; the
    sample standard deviation, ddof=1), ``seeds``.

    ``runs``: the runs table of ``results.load`` for one model, precision, optimizer, LoRA setting, normalisation and tag (a ValueError
    otherwise: their runs are not seeds of one another). Only ``finished`` runs count; diverged
    runs of a learning rate make its mean NaN, so it is never chosen; a learning rate with fewer
    seeds than another of its dataset and config (an unfinished sweep) is not chosen either, so
    that every cell rests on the same seeds.
    """
    if select not in SELECTIONS:
        raise ValueError(f"unknown selection {select!r}; valid selections: {', '.join(SELECTIONS)}")
    for key in ("model", "precision", "optimizer", "weight_decay", "lora_rank", "lora_alpha", "lora_dropout", "normalize", "tag"):
        if key in runs and runs[key].nunique() > 1:
            raise ValueError(f"table6 needs the runs of one {key}, got {', '.join(map(str, sorted(runs[key].unique())))}: "
                             f"select one first (e.g. runs[runs['{key}'] == ...])")
    finished = runs[runs["status"].isin(["finished", "diverged"])].copy()
    finished["test"] = np.where(finished["status"] == "finished", finished["test_accuracy"] * 100, np.nan)
    finished["val"] = np.where(finished["status"] == "finished", finished["best_val_accuracy"] * 100, np.nan)
    per_lr = finished.groupby(["dataset", "config", "lr"]).agg(
        mean=("test", lambda s: s.mean(skipna=False)), std=("test", "std"), seeds=("test", "size"), score=(select, lambda s: s.mean(skipna=False))
    ).reset_index()
    complete = per_lr["seeds"] == per_lr.groupby(["dataset", "config"])["seeds"].transform("max")
    best = per_lr[complete].dropna(subset=["score"]).sort_values("score", ascending=False).groupby(["dataset", "config"]).head(1)
    return best.drop(columns="score").sort_values(["dataset", "config"], key=_config_order).reset_index(drop=True)


def formatted(table: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """``table6`` output as the paper prints it, datasets x configs: "mean ± std (seeds)", or
    "mean (1)" for a single seed."""
    def cell(row) -> str:
        spread = f" ± {row['std']:.{digits}f}" if row["seeds"] > 1 and pd.notna(row["std"]) else ""
        return f"{row['mean']:.{digits}f}{spread} ({int(row['seeds'])})"

    return wide(table.assign(text=table.apply(cell, axis=1)), "text")


def _config_order(column: pd.Series) -> pd.Series:
    if column.name == "config":
        return column.map({c: i for i, c in enumerate(CONFIGS)})
    return column


def wide(accuracies: pd.DataFrame, value: str = "accuracy") -> pd.DataFrame:
    """datasets x configs, configs in plasticity order."""
    table = accuracies.pivot(index="dataset", columns="config", values=value)
    return table[[c for c in CONFIGS if c in table.columns]]


def table1(accuracies: pd.DataFrame, alternative: str = "two-sided", level: float = 0.05) -> pd.DataFrame:
    """Table 1: MHA against each other component across benchmarks.

    ``accuracies``: columns ``dataset``, ``config``, ``accuracy`` (one value per dataset and
    config). Returns one row per other component present: ``config``, ``decrease`` (mean over
    datasets of MHA minus it, in accuracy points), ``p_value`` (Wilcoxon signed-rank over the
    datasets where both are present), ``significant`` (p < ``level``).
    """
    table = wide(accuracies)
    if "mha" not in table:
        raise ValueError("table1 needs MHA accuracies (config 'mha')")
    rows = []
    for config in COMPONENTS[1:]:
        if config not in table:
            continue
        pair = table[["mha", config]].dropna()
        difference = pair["mha"] - pair[config]
        p_value = stats.wilcoxon(pair["mha"], pair[config], alternative=alternative).pvalue if (difference != 0).any() else 1.0
        rows.append({"config": config, "decrease": difference.mean(), "p_value": float(p_value), "significant": bool(p_value < level), "datasets": len(pair)})
    return pd.DataFrame(rows)


def relative_gain(accuracies: pd.DataFrame, baseline: str = "linear") -> pd.DataFrame:
    """Percentage improvement of each config over ``baseline`` per dataset (Fig. 2 right): datasets x configs."""
    table = wide(accuracies)
    if baseline not in table:
        raise ValueError(f"relative_gain needs the baseline config {baseline!r}")
    gain = table.drop(columns=baseline).sub(table[baseline], axis=0).div(table[baseline], axis=0) * 100
    return gain


def average(table: pd.DataFrame) -> pd.DataFrame:
    """Mean over datasets per config, with the pooled standard error of that mean (Fig. 17).

    ``table``: ``table6`` output (``mean``, ``std``, ``seeds`` per dataset and config). The
    standard error of an average of k independent means, each over s seeds with deviation sd_i,
    is ``sqrt(sum_i sd_i^2 / s) / k``; it is NaN when a dataset has a single seed (no deviation).
    """
    rows = []
    for config, part in table.groupby("config", sort=False):
        k = len(part)
        se = math.sqrt(((part["std"] ** 2) / part["seeds"]).sum(skipna=False)) / k if (part["seeds"] > 1).all() else float("nan")
        rows.append({"config": config, "mean": part["mean"].mean(), "pooled_se": se, "datasets": k})
    out = pd.DataFrame(rows)
    return out.sort_values("config", key=_config_order).reset_index(drop=True)
