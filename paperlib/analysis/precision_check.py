"""Whether a cheaper training precision changes the paper's results (beyond the paper; notebook 11).

The paper trains in fp32 (Table 4's text); on a GPU, TF32 and bf16 autocast run the same step faster
(docs/benchmarks.md). ``effect`` pairs each run in another precision with the reference
precision's run of the same grid point and answers with the paired differences, an equivalence test, and
whether the paper's conclusions hold: "same", "differs" or "inconclusive", each conclusion (a decrease from
MHA, Table 6's best configuration on a dataset, divergence) decided with its uncertainty, never by exact
equality of patterns, which seed noise alone changes. ``power`` says what a number of seeds can show.
``benchmarks/precision_calibration.py`` measures how often the verdict is wrong in simulated worlds.

    python -m paperlib precision parameters/sweeps/precision_paper.yaml [--margin 0.5] [--select val] [--csv DIR]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import special
from scipy import stats as scipy_stats

from paperlib.analysis.component_tests import table1
from paperlib.analysis.significance import holm
from paperlib.analysis.summary import write_csv
from paperlib.analysis.tables import COLUMNS, SETTING, check_one_setting, component_order, table6, wide
from paperlib.records import cli, commands, paths, runs_table, specs
from paperlib.records.names import COMPONENTS, LABELS, RUN_COMPONENTS

PAIR = ["dataset", "component", "lr", "seed"]
"""What pairs a run in one precision with the reference precision's run: the same grid point."""

EQUAL = 1e-9
"""Paired differences (accuracy points) that spread less than this are equal: float rounding, not seed noise."""

FEWEST = 3
"""The fewest values (finished pairs of a cell, datasets of a Table 1 comparison, seeds of a best
configuration) a verdict is drawn from: with two, one unlucky pair decides, and identical differences
would give p = 0."""

DIVERGENCE_MARGIN = 0.05
"""The share of pairs where only the other precision diverged that divergence is shown below to be "the same"."""

TABLE1_DATASETS = 5
"""Table 1's one-sided Wilcoxon test over n datasets cannot give p below 1 / 2^n: it needs 5 to reach 0.05."""

CELL = ["pairs", "mean", "low", "high", "margin", "p_equivalence", "diverged", "diverged_reference", "verdict"]
"""``effect``'s ``differences`` columns for a dataset and component (``_cell``)."""

CONCLUSION = ["precision", "conclusion", "reference", "other", "units", "change", "low", "high", "margin"]
CONCLUSION += ["p_equivalence", "p_difference", "p_holm", "verdict", "lead", "detectable", "spread"]
"""``effect``'s ``conclusions`` columns (``_conclusions``)."""


def effect(
    runs: pd.DataFrame, reference: str = "fp32", margin: float = 0.5, level: float = 0.05, select: str = "test"
) -> dict[str, pd.DataFrame]:
    """Whether finetuning in another precision (tf32, autocast, bf16...) changes the results of ``reference``'s.

    ``runs``: ``runs_table.load``'s runs of one setting except precision (one model, optimizer, LoRA setting,
    normalisation and tag; a ValueError otherwise), in ``reference`` and at least one other precision.
    Each run is paired with the reference's run of its dataset, component, learning rate and seed (a run
    without its twin is counted in ``unpaired``, never dropped silently). Every interval is the 1 - 2 x
    ``level`` t interval that an equivalence test (two one-sided t tests, TOST) at ``level`` decides on:
    "equivalent" means it lies inside ±margin. ``margin`` (accuracy points) is raised, per dataset, to one
    test image's worth where that is larger (``margins``). Returns:

    - ``differences``: per other precision, dataset and component (``CELL``): the finished pairs, the
      ``mean`` test-accuracy difference (other minus reference, points), its interval (``low``, ``high``),
      TOST's ``p_equivalence``, the runs that ``diverged`` in the other precision and in the reference,
      and a ``verdict``: "equivalent", "not shown", "too few pairs" (fewer than ``FEWEST``) or "diverges
      more" (the other precision diverged in more pairs: never equivalent).
    - ``overall``: per other precision, the same over datasets: one mean difference per dataset (its
      pairs share its test set, so they are not independent units), the interval across datasets.
    - ``conclusions``: per other precision, whether the paper's conclusions hold (``_conclusions``):
      each of Table 1's decreases from MHA, Table 6's best configuration on each dataset, the overall level
      (``overall``'s mean change) and divergence, each "same" (shown within the margin by a test), "differs"
      (shown different: Holm-adjusted over the rows of the precision) or "inconclusive"; never decided by
      exact equality of patterns, which seed noise alone changes. ``detectable``: the change its decision
      rule (its test or tests, then Holm) detects with 80% chance (``_decided_detectable``).
    - ``verdicts``: per other precision, the answer ("same", "differs", "inconclusive") and why, the
      unpaired runs, the spread of the paired differences and the power it gives (``power``).
    - ``margins``: per dataset, its test images, one image's worth and the margin used.
    - ``table1``: each precision's Table 1 (``table1``, where it has two datasets and MHA), stacked;
      ``best``: datasets x precisions, Table 6's best configuration (``table6`` of each precision's runs).
    """
    check_one_setting(runs, "precision_check.effect", [key for key in SETTING if key != "precision"])
    precisions = sorted(runs["precision"].unique())
    others = [precision for precision in precisions if precision != reference]
    if reference not in precisions or not others:
        raise ValueError(
            f"precision_check.effect needs runs in the reference precision {reference!r} and at least one other; "
            f"found: {', '.join(map(str, precisions)) or 'none'}"
        )
    ended = runs[runs["status"].isin(["finished", "diverged"])]
    pairs, unpaired = _precision_pairs(ended, reference)
    margins = _margins(runs, margin)
    cells = [
        {"precision": p, "dataset": d, "component": c, **_cell(part, margins.at[d, "margin"], level)}
        for (p, d, c), part in pairs.groupby(["precision", "dataset", "component"])
    ]
    differences = pd.DataFrame(cells, columns=["precision", "dataset", "component", *CELL])
    differences = differences.sort_values(["precision", "dataset", "component"], key=component_order)
    tables = {p: table6(runs[runs["precision"] == p], select=select) for p in [reference, *others]}
    conclusions = pd.concat(
        [_conclusions(tables, ended, pairs, reference, p, margins, level) for p in others], ignore_index=True
    )
    verdicts = [_verdict(conclusions, differences, pairs, unpaired, p, margin, level) for p in others]
    ones = {p: _table1_or_none(table) for p, table in tables.items()}
    best = pd.concat({p: _best(table) for p, table in tables.items()}, axis=1).rename_axis(columns="precision")
    stacked = [t.assign(precision=p)[["precision", *t.columns]] for p, t in ones.items() if t is not None]
    return {
        "differences": differences.reset_index(drop=True),
        "overall": pd.DataFrame([_overall(pairs, p, margins, level) for p in others]).drop(columns="_values"),
        "conclusions": conclusions,
        "verdicts": pd.DataFrame(verdicts),
        "margins": margins,
        "table1": pd.concat(stacked, ignore_index=True) if stacked else pd.DataFrame(columns=["precision"]),
        "best": best,
    }


def _precision_pairs(ended: pd.DataFrame, reference: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(pairs, unpaired): each run of another precision paired with the reference's run of its grid point.

    Pairs: each of the ``ended`` runs (finished or diverged) of another precision, with the reference's run of its
    grid point (``PAIR``): ``precision``, ``PAIR``, ``difference`` (test accuracy, points; NaN where either
    diverged), ``diverged`` and ``diverged_reference``. Unpaired: per other precision, its ended runs without a
    reference twin and the reference's without a twin in it."""
    repeated = ended[ended.duplicated(["precision", *PAIR], keep=False)]
    if not repeated.empty:
        raise ValueError(
            f"more than one run of precision {repeated['precision'].iloc[0]!r} at {repeated[PAIR].iloc[0].tolist()}: "
            "select one setting first"
        )
    columns = ["precision", *PAIR, "status", "test_accuracy"]
    base = ended.loc[ended["precision"] == reference, columns].drop(columns="precision")
    other = ended.loc[ended["precision"] != reference, columns]
    unpaired = []
    for precision, part in other.groupby("precision"):
        both = part.merge(base, on=PAIR, how="outer", indicator=True)
        counts = both["_merge"].value_counts()
        unpaired.append(
            {
                "precision": precision,
                "without reference": counts["left_only"],
                "reference without": counts["right_only"],
            }
        )
    pairs = other.merge(base, on=PAIR, suffixes=("", "_reference"))
    finished = (pairs["status"] == "finished") & (pairs["status_reference"] == "finished")
    difference = (pairs["test_accuracy"] - pairs["test_accuracy_reference"]) * 100
    pairs = pairs.assign(
        difference=difference.where(finished),
        diverged=pairs["status"] == "diverged",
        diverged_reference=pairs["status_reference"] == "diverged",
    )
    return pairs, pd.DataFrame(unpaired, columns=["precision", "without reference", "reference without"])


def _margins(runs: pd.DataFrame, margin: float) -> pd.DataFrame:
    """Per dataset, the equivalence margin: ``test_images``, ``one_image``, ``margin`` and a ``note``.

    ``test_images`` is the fewest its runs report (NaN for runs that do not record it), ``one_image`` its worth
    (accuracy points), ``margin`` the larger of ``one_image`` and the margin asked."""
    images = runs.reindex(columns=["dataset", "test_images"]).groupby("dataset")["test_images"].min()
    table = pd.DataFrame({"test_images": images, "one_image": 100 / images})
    table["margin"] = np.fmax(table["one_image"], margin)
    note = np.where(
        table["one_image"] > margin,
        [
            f"one of {n:.0f} test images is worth {w:.3f} points, more than the margin {margin:g}"
            for n, w in zip(table["test_images"], table["one_image"])
        ],
        np.where(table["test_images"].isna(), "test images not recorded: the margin is not checked against them", ""),
    )
    return table.assign(note=note)


def _one_sided(values: np.ndarray, bound: float, alternative: str) -> float:
    """The one-sided t test's p-value that ``values``' mean is below or above ``bound``.

    Below for ``alternative="less"``, above for ``"greater"``: scipy's ``ttest_1samp``, computed directly (without
    scipy's wrapper, which a simulation calls many times); values that are all equal (``EQUAL``) have no variance:
    0 or 1, a mean within ``EQUAL`` of ``bound`` (float rounding) being on it."""
    mean = float(np.mean(values))
    if np.ptp(values) <= EQUAL:  # the t statistic is infinite or undefined
        return 0.0 if (mean < bound - EQUAL if alternative == "less" else mean > bound + EQUAL) else 1.0
    t = (mean - bound) / (np.std(values, ddof=1) / np.sqrt(len(values)))
    return float(special.stdtr(len(values) - 1, t if alternative == "less" else -t))


def _tost(values: np.ndarray, margin: float, level: float) -> dict:
    """``values``' mean, its t interval, TOST's ``p_equivalence`` against ±``margin`` and ``p_difference`` against 0.

    The interval is 1 - 2 x ``level`` (``low``, ``high``; [mean, mean] without variance); ``p_equivalence`` is the
    larger of two one-sided p-values, ``p_difference`` two-sided (twice the smaller one-sided p); NaN with fewer than
    ``FEWEST`` values."""
    n = len(values)
    nan = float("nan")
    test = {"mean": float(np.mean(values)) if n else nan, "low": nan, "high": nan}
    if n < FEWEST:
        return test | {"p_equivalence": nan, "p_difference": nan}
    if np.ptp(values) > EQUAL:
        half = special.stdtrit(n - 1, 1 - level) * np.std(values, ddof=1) / np.sqrt(n)  # scipy's t.interval
        test["low"], test["high"] = test["mean"] - half, test["mean"] + half
    else:
        test["low"] = test["high"] = test["mean"]
    p_equivalence = max(_one_sided(values, -margin, "greater"), _one_sided(values, margin, "less"))
    p_difference = min(1.0, 2 * min(_one_sided(values, 0.0, "greater"), _one_sided(values, 0.0, "less")))
    return test | {"p_equivalence": p_equivalence, "p_difference": p_difference}


def _cell(pairs: pd.DataFrame, margin: float, level: float) -> dict:
    """``CELL`` and ``p_difference`` over one dataset and component's ``pairs`` (``_precision_pairs``'s rows)."""
    d = pairs["difference"].dropna().to_numpy(float)
    test = _tost(d, margin, level)
    diverged, diverged_reference = int(pairs["diverged"].sum()), int(pairs["diverged_reference"].sum())
    if diverged > diverged_reference:
        verdict = "diverges more"
    elif len(d) < FEWEST:
        verdict = "too few pairs"
    else:
        verdict = "equivalent" if test["p_equivalence"] < level else "not shown"
    return {
        "pairs": len(d),
        **test,
        "margin": margin,
        "diverged": diverged,
        "diverged_reference": diverged_reference,
        "verdict": verdict,
    }


def _overall(pairs: pd.DataFrame, precision: str, margins: pd.DataFrame, level: float) -> dict:
    """``overall``'s row of ``precision``: the mean difference across datasets, its interval and TOST.

    One mean difference per dataset (its pairs share its test set), then their mean, interval and TOST across
    datasets (at ``pooled_margin``), and the change it detects with 80% chance (``detectable``)."""
    mine = pairs[pairs["precision"] == precision]
    per_dataset = mine.groupby("dataset")["difference"].mean().dropna()
    margin = pooled_margin(margins, per_dataset.index)
    test = _tost(per_dataset.to_numpy(float), margin, level)
    verdict = (
        "too few datasets"
        if len(per_dataset) < FEWEST
        else ("equivalent" if test["p_equivalence"] < level else "not shown")
    )
    return {
        "precision": precision,
        "datasets": len(per_dataset),
        "pairs": int(mine["difference"].notna().sum()),
        **test,
        "margin": margin,
        "verdict": verdict,
        "detectable": detectable(per_dataset.to_numpy(float), level / 2),
        "_values": per_dataset.to_numpy(float),  # the level row's own detectable change (``_decided_detectable``)
    }


def pooled_margin(margins: pd.DataFrame, datasets) -> float:
    """The margin of a mean over ``datasets`` (a pooled row): the mean of their margins (``_margins``); NaN if none.

    A change within each dataset's margin is within it; one small test set raises it by its share alone, never to
    its own margin (the largest would let a uniform loss on many datasets read "same")."""
    return float(margins.loc[list(datasets), "margin"].mean()) if len(datasets) else float("nan")


def _conclusions(tables, ended, pairs, reference, precision, margins, level) -> pd.DataFrame:
    """``CONCLUSION`` rows of ``precision`` against ``reference``, Holm-adjusted together.

    The rows: Table 1's decreases (``_table1_rows``), Table 6's best configurations (``_best_rows``), the overall level
    (``_level_row``) and divergence (``_divergence_row``). A row "differs" where its Holm p is below ``level``, whatever
    its margin (a difference the data show is never "same"), else "same" where shown equivalent, "inconclusive"
    otherwise (or the reason it has no test)."""
    rows = _table1_rows(tables[reference], tables[precision], margins, level)
    rows += _best_rows(tables[reference], tables[precision], ended, (reference, precision), margins, level)
    rows.append(_level_row(_overall(pairs, precision, margins, level)))
    rows.append(_divergence_row(pairs[pairs["precision"] == precision], level))
    _decided_detectable(rows, level)
    table = pd.DataFrame(rows).assign(precision=precision).reindex(columns=CONCLUSION)
    table["p_holm"] = holm(table["p_difference"])
    decided = np.where(
        table["p_holm"] < level, "differs", np.where(table["p_equivalence"] < level, "same", "inconclusive")
    )
    table["verdict"] = np.where(table["verdict"].isna(), decided, table["verdict"].astype(object))
    return table


def detectable(values: np.ndarray, level: float, chance: float = 0.8, tests: int = 1) -> float:
    """The shift of a mean that ``tests`` independent one-sided t tests at ``level`` all detect with ``chance``.

    Each test on as many values as ``values``, at their spread, detects it with ``chance`` ** (1 / ``tests``): the
    t test's exact power (the noncentral t distribution, scipy's ``nctdtrinc``); NaN with fewer than ``FEWEST``
    values."""
    n = len(values)
    if n < FEWEST:
        return float("nan")
    noncentrality = special.nctdtrinc(n - 1, 1 - chance ** (1 / tests), special.stdtrit(n - 1, 1 - level))
    return float(noncentrality * np.std(values, ddof=1) / np.sqrt(n))


def _decided_detectable(rows: list[dict], level: float) -> None:
    """Each row's ``detectable`` for the rule that decides it "differs", from its values (``_values``, removed).

    The row's p must pass Holm at its first step (``level`` / the rows: a change it detects with 80% chance there is
    detected wherever it stands): one two-sided t test (each side at half that), or for a best configuration both
    one-sided t tests (``_best_rows``), each on the reference's spread of the gap. ``spread``: the standard deviation
    of the values it rests on."""
    for row in rows:
        values = row.pop("_values", None)
        if values is not None:
            row["spread"] = float(np.std(values, ddof=1)) if len(values) > 1 else float("nan")
            best = row["conclusion"].startswith("Table 6's best")
            row["detectable"] = detectable(values, level / len(rows) / (1 if best else 2), tests=2 if best else 1)


def _table1_rows(reference: pd.DataFrame, other: pd.DataFrame, margins: pd.DataFrame, level: float) -> list[dict]:
    """Per configuration, how the precision changes its decrease from MHA.

    The decreases are Table 1's, and full finetuning's and linear probing's in Table 6. Per dataset (Table 6's means),
    the other's decrease minus the reference's; their mean, interval and tests across datasets (``_tost`` at
    ``pooled_margin``; fewer than ``FEWEST`` datasets: "too few datasets")."""
    first, second = wide(reference, "mean"), wide(other, "mean")
    rows = []
    for component in [c for c in RUN_COMPONENTS if c != "mha"]:
        if not {"mha", component} <= set(first.columns) & set(second.columns):
            continue
        ours = (first["mha"] - first[component]).rename("reference")
        theirs = (second["mha"] - second[component]).rename("other")
        both = pd.concat([ours, theirs], axis=1).dropna()
        changes = (both["other"] - both["reference"]).to_numpy(float)
        margin = pooled_margin(margins, both.index)
        test = _tost(changes, margin, level)
        rows.append(
            {
                "conclusion": f"Table {1 if component in COMPONENTS else 6}: MHA - {LABELS[component]}",
                "reference": f"{both['reference'].mean():+.2f}",
                "other": f"{both['other'].mean():+.2f}",
                "units": len(both),
                "change": test.pop("mean"),
                "margin": margin,
                **test,
                "verdict": "too few datasets" if len(both) < FEWEST else None,
                "_values": changes,  # its detectable change: ``_decided_detectable``
            }
        )
    return rows


def _best_rows(reference, other, ended, names, margins, level) -> list[dict]:
    """Per dataset, Table 6's best configuration in both precisions (``names``: reference, other), tested by seeds.

    Each configuration at its Table 6 learning rate (``_seed_gap``). The rival is the other's best, or its runner-up
    where both precisions pick the same: "same" if, in the other precision, the reference's best is within the margin
    of the rival (one-sided t test, ``p_equivalence``; ``change``: the rival minus it); "differs" if the two bests are
    in reverse order in both precisions (a one-sided t test in each; both must hold, so ``p_difference`` is the larger
    p). ``lead``: the reference's best minus its runner-up (Table 6's means); ``detectable``: the lead of one
    configuration over another that the seeds show with 80% chance, at the reference's spread of that gap."""
    best = {name: _best(table) for name, table in zip(names, (reference, other))}
    rows = []
    for dataset in best[names[0]].index.intersection(best[names[1]].index):
        mine, theirs = best[names[0]][dataset], best[names[1]][dataset]
        runner_up = _runner_up(reference, dataset, mine)
        rival = theirs if theirs != mine else _runner_up(other, dataset, mine)
        means = reference[reference["dataset"] == dataset].set_index("component")["mean"]
        lead = _seed_gap(ended, reference, names[0], dataset, mine, runner_up)
        row = {
            "conclusion": f"Table 6's best on {dataset}",
            "reference": LABELS.get(mine, mine),
            "other": LABELS.get(theirs, theirs),
            "margin": margins.at[dataset, "margin"],
            "lead": means[mine] - means[runner_up] if runner_up else float("nan"),
            "_values": lead,  # its detectable reversal: ``_decided_detectable``
        }
        ahead = _seed_gap(ended, other, names[1], dataset, rival, mine)  # in the other: the rival minus ours
        behind = _seed_gap(ended, reference, names[0], dataset, mine, rival)  # in the reference: ours minus it
        test = _tost(ahead, row["margin"], level)
        row |= {"units": len(ahead), "change": test["mean"], "low": test["low"], "high": test["high"]}
        if rival is None or len(ahead) < FEWEST or (theirs != mine and len(behind) < FEWEST):
            rows.append(row | {"verdict": "too few seeds" if rival else "not tested: one configuration"})
            continue
        row["p_equivalence"] = _one_sided(ahead, row["margin"], "less")
        if theirs != mine:
            row["p_difference"] = max(_one_sided(ahead, 0.0, "greater"), _one_sided(behind, 0.0, "greater"))
        rows.append(row)
    return rows


def _runner_up(table: pd.DataFrame, dataset: str, best: str) -> str | None:
    """The configuration of ``table`` (``table6``'s) second to ``best`` on ``dataset``; None where it has no other."""
    rest = table[(table["dataset"] == dataset) & (table["component"] != best)]
    rest = rest[rest["component"].isin(RUN_COMPONENTS)].dropna(subset=["mean"])
    return rest.loc[rest["mean"].idxmax(), "component"] if len(rest) else None


def _seed_gap(ended: pd.DataFrame, table: pd.DataFrame, precision: str, dataset: str, first: str, second: str):
    """Per seed, ``first``'s test accuracy minus ``second``'s (points), in ``precision``'s runs of ``dataset``.

    Each is taken at its learning rate of ``table`` (a ``table6`` output)."""
    lrs = table[table["dataset"] == dataset].set_index("component")["lr"]
    if first not in lrs or second not in lrs:
        return np.array([])
    runs = ended[(ended["precision"] == precision) & (ended["dataset"] == dataset)]
    accuracy = {
        c: runs[(runs["component"] == c) & (runs["lr"] == lrs[c])].set_index("seed")["test_accuracy"] * 100
        for c in (first, second)
    }
    return (accuracy[first] - accuracy[second]).dropna().to_numpy(float)


def _level_row(overall: dict) -> dict:
    """The overall level as a conclusion: ``_overall``'s test of the mean change across every configuration."""
    row = {key: overall[key] for key in ("low", "high", "margin", "p_equivalence", "p_difference", "_values")}
    return row | {
        "conclusion": "overall level (mean accuracy change, every configuration)",
        "units": overall["datasets"],
        "change": overall["mean"],
        "verdict": "too few datasets" if overall["datasets"] < FEWEST else None,
    }


def _divergence_row(pairs: pd.DataFrame, level: float) -> dict:
    """Whether the precision diverges more than the reference.

    The pairs where only one of the two diverged: "differs" by an exact two-sided McNemar test (``binomtest``) where
    the precision diverged alone more often; "same" where an exact one-sided binomial test shows that it diverged alone
    in fewer than ``DIVERGENCE_MARGIN`` of the pairs (``p_equivalence``). ``detectable``: the fewest pairs where it
    diverged alone (and the reference never) that McNemar's test finds at ``level``."""
    alone = int((pairs["diverged"] & ~pairs["diverged_reference"]).sum())
    reference = int((~pairs["diverged"] & pairs["diverged_reference"]).sum())
    row = {
        "conclusion": "runs that diverged (pairs where only one did)",
        "reference": str(reference),
        "other": str(alone),
        "units": len(pairs),
        "change": alone - reference,
        "margin": DIVERGENCE_MARGIN,
        "detectable": int(np.floor(np.log2(1 / level))) + 2,  # binomtest(k, k)'s p is 0.5 ** (k - 1)
    }
    if len(pairs):
        row["p_equivalence"] = float(scipy_stats.binomtest(alone, len(pairs), DIVERGENCE_MARGIN, "less").pvalue)
    if alone > reference:
        row["p_difference"] = float(scipy_stats.binomtest(alone, alone + reference).pvalue)
    return row


def _verdict(conclusions, differences, pairs, unpaired, precision, margin, level) -> dict:
    """``verdicts``' row of ``precision``: its verdict, "differs", "same" or "inconclusive", and what it rests on.

    "differs" if any conclusion differs, "same" if all are the same, else "inconclusive"; the reasons; the unpaired
    runs; the spread of the paired differences within cells and the chance it gives a cell of being shown equivalent
    (``power``)."""
    mine = conclusions[conclusions["precision"] == precision]
    cells = differences[differences["precision"] == precision]
    found = {v: mine.loc[mine["verdict"] == v, "conclusion"].tolist() for v in ("differs", "same")}
    if found["differs"]:
        answer, why = "differs", "differs: " + "; ".join(found["differs"])
    elif len(found["same"]) == len(mine):
        answer, why = "same", "every conclusion shown the same"
    else:
        answer = "inconclusive"
        why = f"not shown either way: {'; '.join(mine.loc[mine['verdict'] != 'same', 'conclusion'])}"
    spread = spread_of(pairs[pairs["precision"] == precision])
    pairs = int(cells["pairs"].median()) if len(cells) else 0
    row = unpaired.set_index("precision").reindex([precision]).iloc[0].fillna(0).astype(int).to_dict()
    return {
        "precision": precision,
        "verdict": answer,
        "why": why,
        **row,
        "spread": spread,
        "pairs_per_cell": pairs,
        "power": power(pairs, spread, margin, level) if pairs >= FEWEST else float("nan"),
        "pairs_needed": pairs_needed(spread, margin, level),
    }


def spread_of(pairs: pd.DataFrame) -> float:
    """The pooled standard deviation of the paired differences (points) within cells.

    A cell is a (dataset, component); the pool is over the cells of two pairs or more. This is the seed
    noise the equivalence test works against."""
    groups = pairs.dropna(subset=["difference"]).groupby(["dataset", "component"])["difference"]
    dof = groups.size() - 1  # a cell of one pair has none (its variance is NaN, weighted by 0)
    if dof.sum() == 0:
        return float("nan")
    return float(np.sqrt((groups.var(ddof=1).fillna(0) * dof).sum() / dof.sum()))


def power(pairs: int, spread: float, margin: float = 0.5, level: float = 0.05) -> float:
    """The chance that TOST shows a cell equivalent when the precision changes nothing.

    TOST is at ``level``, equivalence within ±``margin``; the cell has ``pairs`` paired differences, normal
    with mean 0 and standard deviation ``spread`` (points). Given the sample standard deviation s, TOST
    passes when |mean| < margin - t s / sqrt(n); the chance of that is integrated over s's scaled chi
    distribution (4,000 quantiles)."""
    if pairs < 2 or not np.isfinite(spread):
        return float("nan")
    if spread <= 0:
        return 1.0
    dof = pairs - 1
    quantiles = special.chdtri(dof, 1 - (np.arange(4000) + 0.5) / 4000)  # scipy.stats.chi2.ppf
    s = spread * np.sqrt(quantiles / dof)
    half_width = margin - special.stdtrit(dof, 1 - level) * s / np.sqrt(pairs)  # t.ppf
    inside = 2 * special.ndtr(np.clip(half_width, 0, None) * np.sqrt(pairs) / spread) - 1  # norm.cdf
    return float(inside.mean())


def pairs_needed(spread: float, margin: float = 0.5, level: float = 0.05, chance: float = 0.8) -> int | None:
    """The fewest pairs a cell needs to be shown equivalent with ``chance``.

    Pairs are seeds at one learning rate; the chance is ``power``'s. None if more than
    100 or the spread is unknown."""
    if not np.isfinite(spread):
        return None
    return next((n for n in range(FEWEST, 101) if power(n, spread, margin, level) >= chance), None)


def power_statement(
    verdicts: pd.DataFrame, margin: float, datasets: int, level: float = 0.05, conclusions: pd.DataFrame | None = None
) -> str:
    """What the check can show (``effect``'s ``verdicts`` and ``conclusions``), in sentences.

    Per precision, the chance that a cell is shown equivalent with its pairs at the spread measured, the pairs needed
    for 80%, and whether Table 1's own test can be significant with ``datasets`` datasets; per conclusion, the change
    the change its decision rule detects with 80% chance, Holm's adjustment included (``_detectable_line``)."""
    lines = [] if conclusions is None else [_detectable_line(row) for row in conclusions.to_dict("records")]
    for row in verdicts.to_dict("records"):
        if not np.isfinite(row["spread"]):
            lines.append(
                f"{row['precision']}: no cell has two finished pairs: the spread of the differences is unknown"
            )
            continue
        needed = row["pairs_needed"]
        lines.append(
            f"{row['precision']}: paired differences spread by {row['spread']:.2f} points within a cell; with "
            f"{row['pairs_per_cell']} pairs a cell, one where the precision changes nothing is shown equivalent "
            f"within {margin:g} points with probability {row['power']:.0%}; 80% needs "
            + (f"{needed} pairs (seeds) a cell" if needed else "more than 100 pairs a cell: a larger margin")
        )
    if datasets < TABLE1_DATASETS:
        lines.append(
            f"Table 1's one-sided Wilcoxon test over {datasets} dataset(s) cannot reach p < {level:g} (its smallest "
            f"p is {0.5**datasets:.4g}; it needs {TABLE1_DATASETS}): its significance pattern is not compared, "
            f"its decreases are, by intervals over datasets ({FEWEST} at least)"
        )
    return "\n".join(lines)


def _detectable_line(row: dict) -> str:
    """One sentence: what ``row`` (a ``conclusions`` row) can detect with 80% chance (its ``detectable``)."""
    name, found = f"{row['precision']}, {row['conclusion']}", row["detectable"]
    if row["conclusion"].startswith("runs that diverged"):
        return (
            f"{name}: more divergence is shown from {found:.0f} pairs where only it diverged (none where only the "
            f"reference did); the same, where it diverged alone in fewer than {row['margin']:.0%} of the "
            f"{row['units']} pairs (binomial test)"
        )
    if not np.isfinite(found):
        return f"{name}: too few units to test"
    if not row["conclusion"].startswith("Table 6's best"):
        return f"{name}: a change of {found:.2f} points across its {row['units']} datasets, with 80% chance"
    if not row["lead"] >= found:
        return (
            f"{name}: {row['reference']} leads the runner-up by {row['lead']:.2f} points in the reference, below the "
            f"{found:.2f} its seeds show with 80% chance: a change of the best configuration cannot be shown"
        )
    return (
        f"{name}: {row['reference']} leads the runner-up by {row['lead']:.2f} points; a change of the best is shown "
        f"with 80% chance where the seeds show the reference's lead and the other precision's reversal each about "
        f"{found:.2f} points or more (both one-sided t tests, then Holm)"
    )


def _table1_or_none(table: pd.DataFrame) -> pd.DataFrame | None:
    """``table1`` of a ``table6`` output, or None where it has no test (no MHA, or fewer than 2 datasets)."""
    if "mha" not in set(table["component"]) or table["dataset"].nunique() < 2:
        return None
    return table1(table.rename(columns={"mean": "accuracy"}))


def _best(table: pd.DataFrame) -> pd.Series:
    """Per dataset of a ``table6`` output, the finetuning configuration of the highest ``mean``."""
    table = table[table["component"].isin(RUN_COMPONENTS)].dropna(subset=["mean"])
    return table.loc[table.groupby("dataset")["mean"].idxmax()].set_index("dataset")["component"]


def formatted(differences: pd.DataFrame, digits: int = 2) -> pd.DataFrame:
    """``effect``'s ``differences`` as (precision, dataset) x components.

    "mean [low, high]" (the interval the equivalence test decides on), ``=`` where equivalent, the runs that diverged in
    each precision where any did, and the pairs where too few for a verdict; empty cells where no pair."""

    def cell(row) -> str:
        text = f"{row['mean']:+.{digits}f}" if pd.notna(row["mean"]) else "no pair finished"
        if pd.notna(row["low"]):
            text += f" [{row['low']:+.{digits}f}, {row['high']:+.{digits}f}]"
        text += " =" if row["verdict"] == "equivalent" else ""
        text += f" ({row['pairs']} pair{'s' * (row['pairs'] != 1)})" if row["verdict"] == "too few pairs" else ""
        if row["diverged"] or row["diverged_reference"]:
            text += f" (diverged: {row['diverged']}, reference {row['diverged_reference']})"
        return text

    matrix = differences.assign(text=differences.apply(cell, axis=1)).pivot(
        index=["precision", "dataset"], columns="component", values="text"
    )
    return matrix[[c for c in COLUMNS if c in matrix.columns]].fillna("").rename_axis(columns=None)


def missing_precisions(runs: pd.DataFrame, missing: pd.DataFrame, reference: str = "fp32") -> str | None:
    """Why ``effect`` cannot check a spec's runs yet, in one line; None when it can.

    ``runs`` and ``missing``: ``runs_table.for_spec``'s of the spec. ``effect`` needs runs in ``reference`` and in
    another precision: the line names the precisions that have none and how many of their runs are missing (after a
    paper grid in fp32 and before its TF32 and autocast runs, say)."""
    found = set(runs["precision"])
    if reference in found and len(found) > 1:
        return None
    absent = missing["precision"].value_counts()
    asked = sorted(found | set(absent.index) | {reference}, key=lambda precision: (precision != reference, precision))
    if len(asked) == 1:
        return f"precision check skipped: the spec asks for {reference} runs alone, nothing to compare them with"
    lacking = ", ".join(
        f"{p} ({absent[p]} missing)" if p in absent else f"{p} (not in the spec)" for p in asked if p not in found
    )
    return f"precision check skipped: no runs in {lacking} yet; it compares each run with its {reference} twin"


def main(argv: list[str] | None = None) -> int:
    """``python -m paperlib precision``: ``effect`` of a sweep's runs in several precisions.

    ``python -m paperlib precision SPEC [--reference fp32] [--margin 0.5] [--select val] [--accuracy exact]
    [--csv DIR]``, SPEC a finetuning sweep spec (e.g. ``precision_paper.yaml``)."""
    args = commands.precision().parse_args(argv)
    try:
        found, missing = runs_table.for_spec(specs.load_spec(args.spec), accuracy=args.accuracy)
        runs_table.at_least_one(found, args.spec, missing)
        tables = effect(found, args.reference, args.margin, select=args.select)
        if args.csv:  # before anything is printed: a refused folder is the one line the command prints
            write_csv(tables, args.csv, indexed=("best", "margins"), overwrite=args.overwrite)
    except cli.BAD_INPUT as error:
        return cli.fail(error)
    counts = ", ".join(f"{n} {p} {s}" for (p, s), n in found.groupby(["precision", "status"]).size().items())
    print(f"{len(found)} runs of {args.spec} ({counts}); {len(missing)} missing\n")
    margins = tables["margins"]
    shown = {
        f"Test accuracy difference from {args.reference} (points) with its 90% interval, the one the equivalence "
        f"test decides on; '=' shown within {args.margin:g} points (TOST)": formatted(tables["differences"]),
        "Margins raised to one test image's worth, or not checked": margins[margins["note"] != ""][["note"]],
        "Over datasets: one mean difference per dataset (its pairs share its test set)": tables["overall"].round(3),
        "Table 6's best configuration": tables["best"],
        "Does the precision change the conclusions?": tables["conclusions"].round(3),
        "Verdict": tables["verdicts"].round(3),
    }
    for title, table in shown.items():
        if not table.empty:
            print(f"{title}\n{table.to_string()}\n")
    print(
        power_statement(tables["verdicts"], args.margin, found["dataset"].nunique(), conclusions=tables["conclusions"])
    )
    if args.csv:
        print(f"tables written to {paths.display(args.csv)}")
    return 0
