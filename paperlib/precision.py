"""Does a cheaper training precision change the paper's results? (beyond the paper; notebook 07)

The paper trains in fp32 (Table 4's text); on an H100, TF32 runs the same step about 2.9x faster and bf16
autocast about 6x (docs/benchmarks.md). ``effect`` pairs each run in another precision with the reference
precision's run of the same grid point and answers with the paired differences, an equivalence test and
the paper's conclusions (Table 1's pattern, Table 6's best configuration) in both precisions.

    python -m paperlib.precision parameters/sweeps/precision_paper.yaml [--margin 0.5] [--select val] [--csv DIR]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from . import cli, runs, specs
from .names import RUN_COMPONENTS
from .speed.options import PRECISIONS
from .stats import COLUMNS, SELECTIONS, SETTING, check_one_setting, component_order, table1, table6, write_csv

PAIR = ["dataset", "component", "lr", "seed"]
"""What pairs a run in one precision with the reference precision's run: the same grid point."""

EQUAL = 1e-9
"""Paired differences (accuracy points) that spread less than this are equal: float rounding, not seed noise."""

EQUIVALENCE = ["pairs", "mean", "ci_low", "ci_high", "p_equivalence", "equivalent", "diverged"]
"""``effect``'s columns for a set of pairs (``_equivalence``)."""


def effect(
    runs: pd.DataFrame, reference: str = "fp32", margin: float = 0.5, level: float = 0.05, select: str = "test"
) -> dict[str, pd.DataFrame]:
    """Whether finetuning in another precision (tf32, autocast, bf16...) changes the results of ``reference``'s.

    ``runs``: ``runs.load``'s runs of one setting except precision (one model, optimizer, LoRA setting,
    normalisation and tag; a ValueError otherwise), in ``reference`` and at least one other precision.
    Each run is paired with the reference's run of its dataset, component, learning rate and seed; a pair
    counts where both ``finished`` (a run's ``test_accuracy`` is that of its best-validation checkpoint),
    and a pair where either diverged is counted in ``diverged``, not in the mean. Returns:

    - ``differences``: per other precision, dataset and component: ``pairs``, ``mean`` (the precision's
      test accuracy minus the reference's, accuracy points), ``ci_low`` and ``ci_high`` (two-sided
      1 - ``level`` t interval of the mean), ``p_equivalence`` (two one-sided t tests, TOST, of the
      mean against -``margin`` and +``margin``: the larger p-value), ``equivalent`` (p < ``level``:
      the difference is within ±``margin``: its 1 - 2 x ``level`` interval lies inside), ``diverged``.
      One pair: no interval nor test (NaN; not equivalent). Differences all equal (to ``EQUAL``, e.g.
      identical results) have no variance: the interval is [mean, mean], p is 0 if |mean| < margin, else 1.
    - ``overall``: the same per other precision, over all its pairs pooled. The pairs of one dataset
      share its test set, so they are not independent: the pooled test is a summary, the per-cell
      tests of ``differences`` are the test.
    - ``conclusions``: per other precision, whether the paper's conclusions are those of the reference:
      ``table1_same`` (Table 1's sign of the decrease from MHA and its significance, for each component
      both have; None where either Table 1 has no test: no MHA, or fewer than 2 datasets),
      ``table1_differs`` (the components where not), ``best_same`` (Table 6's best finetuning
      configuration, the highest ``mean``, on every dataset both have), ``best_differs`` (the datasets
      where not). Each precision's Table 6 is ``table6`` of its own runs (``select``), over its own
      datasets and components: compare sweeps of one grid.
    - ``table1``: each precision's Table 1 (``table1``), stacked, with a ``precision`` column; ``best``:
      datasets x precisions, the best configuration.

    ``margin`` is in accuracy points. The default, 0.5, is the largest seed-to-seed standard deviation
    of the components in the paper's Table 6, on its noisiest benchmarks (Gaussian Noise: MHA 0.53, FC2
    0.51; Clipart: full finetuning 0.49); most of them are smaller (median 0.15 of the 66, from 0.02
    to 1.16). It is also more than Table 1's decrease from MHA to FC2 (0.44): a difference within the
    margin can still move the conclusions, which ``conclusions`` checks.
    """
    if select not in SELECTIONS:
        raise ValueError(f"unknown selection {select!r}; valid selections: {', '.join(SELECTIONS)}")
    check_one_setting(runs, "precision.effect", [key for key in SETTING if key != "precision"])
    precisions = sorted(runs["precision"].unique())
    others = [precision for precision in precisions if precision != reference]
    if reference not in precisions or not others:
        raise ValueError(
            f"precision.effect needs runs in the reference precision {reference!r} and at least one other; "
            f"found: {', '.join(map(str, precisions)) or 'none'}"
        )
    pairs = _precision_pairs(runs, reference)
    cells = [
        {"precision": p, "dataset": d, "component": c, **_equivalence(part, margin, level)}
        for (p, d, c), part in pairs.groupby(["precision", "dataset", "component"])
    ]
    differences = pd.DataFrame(cells, columns=["precision", "dataset", "component", *EQUIVALENCE])
    differences = differences.sort_values(["precision", "dataset", "component"], key=component_order)
    overall = [{"precision": p, **_equivalence(pairs[pairs["precision"] == p], margin, level)} for p in others]

    tables = {p: table6(runs[runs["precision"] == p], select=select) for p in [reference, *others]}
    ones = {p: _table1_or_none(table) for p, table in tables.items()}
    best = pd.concat({p: _best(table) for p, table in tables.items()}, axis=1).rename_axis(columns="precision")
    stacked = [t.assign(precision=p)[["precision", *t.columns]] for p, t in ones.items() if t is not None]
    return {
        "differences": differences.reset_index(drop=True),
        "overall": pd.DataFrame(overall, columns=["precision", *EQUIVALENCE]),
        "conclusions": pd.DataFrame([_conclusions(best, ones, reference, p) for p in others]),
        "table1": pd.concat(stacked, ignore_index=True) if stacked else pd.DataFrame(columns=["precision"]),
        "best": best,
    }


def _conclusions(best: pd.DataFrame, ones: dict, reference: str, precision: str) -> dict:
    """``effect``'s ``conclusions`` row of ``precision``: does its Table 1 (``ones``) keep the reference's
    pattern, and its Table 6 the reference's best component on every dataset (``best``)?"""
    both = best[[reference, precision]].dropna()
    best_differs = both.index[both[reference] != both[precision]].tolist()
    table1_differs = _pattern_differs(ones[reference], ones[precision])
    return {
        "precision": precision,
        "table1_same": None if table1_differs is None else not table1_differs,
        "table1_differs": None if table1_differs is None else ", ".join(table1_differs),
        "best_same": not best_differs,
        "best_differs": ", ".join(best_differs),
    }


def _precision_pairs(runs: pd.DataFrame, reference: str) -> pd.DataFrame:
    """Each run of another precision that finished or diverged, with the reference's run of its grid point
    (``PAIR``): ``precision``, ``PAIR``, ``difference`` (test accuracy, points; NaN where either
    diverged) and ``diverged``."""
    ended = runs[runs["status"].isin(["finished", "diverged"])]
    repeated = ended[ended.duplicated(["precision", *PAIR], keep=False)]
    if not repeated.empty:
        raise ValueError(
            f"more than one run of precision {repeated['precision'].iloc[0]!r} at {repeated[PAIR].iloc[0].tolist()}: "
            "select one setting first"
        )
    columns = ["precision", *PAIR, "status", "test_accuracy"]
    base = ended.loc[ended["precision"] == reference, columns].drop(columns="precision")
    pairs = ended.loc[ended["precision"] != reference, columns].merge(base, on=PAIR, suffixes=("", "_reference"))
    finished = (pairs["status"] == "finished") & (pairs["status_reference"] == "finished")
    difference = (pairs["test_accuracy"] - pairs["test_accuracy_reference"]) * 100
    return pairs.assign(difference=difference.where(finished), diverged=~finished)


def _equivalence(pairs: pd.DataFrame, margin: float, level: float) -> dict:
    """``EQUIVALENCE`` over ``pairs`` (``_precision_pairs``'s rows): the mean difference of the finished
    pairs, its t interval and TOST against ±``margin`` (see ``effect``), the diverged pairs."""
    d = pairs["difference"].dropna().to_numpy(float)
    n = len(d)
    mean = float(d.mean()) if n else float("nan")
    if n < 2:
        low = high = p_value = float("nan")
    elif np.ptp(d) <= EQUAL:  # no variance: scipy's t tests would give NaN
        low = high = mean
        p_value = 0.0 if abs(mean) < margin else 1.0
    else:
        low, high = scipy_stats.t.interval(1 - level, n - 1, loc=mean, scale=scipy_stats.sem(d))
        above = scipy_stats.ttest_1samp(d, -margin, alternative="greater").pvalue
        below = scipy_stats.ttest_1samp(d, margin, alternative="less").pvalue
        p_value = max(float(above), float(below))
    return {
        "pairs": n,
        "mean": mean,
        "ci_low": float(low),
        "ci_high": float(high),
        "p_equivalence": p_value,
        "equivalent": bool(p_value < level),
        "diverged": int(pairs["diverged"].sum()),
    }


def _table1_or_none(table: pd.DataFrame) -> pd.DataFrame | None:
    """``table1`` of a ``table6`` output, or None where it has no test (no MHA, or fewer than 2 datasets)."""
    if "mha" not in set(table["component"]) or table["dataset"].nunique() < 2:
        return None
    return table1(table.rename(columns={"mean": "accuracy"}))


def _best(table: pd.DataFrame) -> pd.Series:
    """Per dataset of a ``table6`` output, the finetuning configuration of the highest ``mean``."""
    table = table[table["component"].isin(RUN_COMPONENTS)].dropna(subset=["mean"])
    return table.loc[table.groupby("dataset")["mean"].idxmax()].set_index("dataset")["component"]


def _pattern_differs(first: pd.DataFrame | None, second: pd.DataFrame | None) -> list[str] | None:
    """The components both Table 1s have whose decrease from MHA has another sign or significance (None
    where either Table 1 is None)."""
    if first is None or second is None:
        return None
    both = first.merge(second, on="component", suffixes=("", "_other"))
    differs = (np.sign(both["decrease"]) != np.sign(both["decrease_other"])) | (
        both["significant"] != both["significant_other"]
    )
    return both.loc[differs, "component"].tolist()


def formatted(differences: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """``effect``'s ``differences`` as (precision, dataset) x components: "mean [ci_low, ci_high]",
    ``=`` where equivalent, and the diverged pairs; empty cells where no pair."""

    def cell(row) -> str:
        text = f"{row['mean']:+.{digits}f}"
        if pd.notna(row["ci_low"]):
            text += f" [{row['ci_low']:+.{digits}f}, {row['ci_high']:+.{digits}f}]"
        text += " =" if row["equivalent"] else ""
        return text + (f" ({int(row['diverged'])} diverged)" if row["diverged"] else "")

    matrix = differences.assign(text=differences.apply(cell, axis=1)).pivot(
        index=["precision", "dataset"], columns="component", values="text"
    )
    return matrix[[c for c in COLUMNS if c in matrix.columns]].fillna("").rename_axis(columns=None)


def argument_parser():
    """``main``'s command line: ``cli.tables_parser``'s, the reference precision and the equivalence margin."""
    spec = "a finetuning sweep spec of several precisions, e.g. parameters/sweeps/precision_paper.yaml"
    description = main.__doc__.split(":", 1)[1].strip()
    parser = cli.tables_parser("python -m paperlib.precision", description, spec, SELECTIONS)
    parser.add_argument(
        "--reference",
        default="fp32",
        help=f"the precision the others are compared with, one of {', '.join(PRECISIONS)}",
    )
    parser.add_argument("--margin", type=float, default=0.5, help="equivalence margin, accuracy points")
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib.precision SPEC [--reference fp32] [--margin 0.5] [--select val] [--csv DIR]``:
    ``effect`` of a finetuning sweep spec's runs in several precisions (e.g. ``precision_paper.yaml``)."""
    args = argument_parser().parse_args(argv)
    try:
        found, missing = runs.for_spec(specs.load_spec(args.spec))
        runs.at_least_one(found, args.spec)
        tables = effect(found, args.reference, args.margin, select=args.select)
    except cli.BAD_INPUT as error:
        return cli.fail(error)
    counts = ", ".join(f"{n} {p} {s}" for (p, s), n in found.groupby(["precision", "status"]).size().items())
    print(f"{len(found)} runs of {args.spec} ({counts}); {len(missing)} missing\n")
    shown = {
        f"Test accuracy difference from {args.reference} (points), 95% interval, '=' equivalent within "
        f"{args.margin:g} points (TOST)": formatted(tables["differences"]),
        "All pairs": tables["overall"].round(3),
        "Table 6's best configuration": tables["best"],
        "Does the precision change the conclusions? (Table 1's pattern, Table 6's best configuration)": tables[
            "conclusions"
        ],
    }
    for title, table in shown.items():
        print(f"{title}\n{table.to_string()}\n")
    if args.csv:
        write_csv(tables, args.csv, indexed=("best",))
    return 0


if __name__ == "__main__":  # the package's module, not this __main__ copy of it
    from paperlib.precision import main as _main

    raise SystemExit(_main())
